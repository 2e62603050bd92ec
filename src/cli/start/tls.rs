//! The flags of TLS on the sync port (`TLS`): certificate, key and client CA files, which
//! become [`TlsFiles`] when a certificate is given.
use std::path::PathBuf;

use clap::Args;

use crate::net::tls::TlsFiles;

/// TLS on the sync port ([`TlsFiles`]).
#[derive(Debug, Args)]
#[command(next_help_heading = "TLS")]
pub struct TlsArgs {
    /// TLS certificate chain (PEM) for the sync port. Reloaded when the file changes.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_SERVER_CERT_PATH",
        requires = "server_key_path"
    )]
    pub server_cert_path: Option<PathBuf>,

    /// TLS private key (PEM) for the sync port. Reloaded when the file changes.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_SERVER_KEY_PATH",
        requires = "server_cert_path"
    )]
    pub server_key_path: Option<PathBuf>,

    /// CA bundle (PEM) for client certificates: when set, clients must present a certificate it signs.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_CLIENT_CA_PATH",
        requires = "server_cert_path"
    )]
    pub client_ca_path: Option<PathBuf>,
}

impl TlsArgs {
    /// The TLS files, when a certificate and key are given (the parser requires both or none).
    pub fn into_settings(self) -> Option<TlsFiles> {
        match (self.server_cert_path, self.server_key_path) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: self.client_ca_path,
            }),
            _ => None,
        }
    }
}
