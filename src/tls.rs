//! TLS for the sync port: a certificate and key (and optionally a client CA) read from files and
//! read again when the files change, so certificates rotate without a restart. Connections
//! already open keep the configuration they were made with.
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How often the files are checked for changes.
const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no PEM private key found ({source})")]
    Key {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("{path}: invalid PEM certificate ({source})")]
    Certificate {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("client CA {path}: {source}")]
    ClientCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("client CA {path}: {source}")]
    ClientVerifier {
        path: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
    #[error("the certificate and key do not form a usable pair: {0}")]
    Config(#[from] rustls::Error),
}

/// Where the TLS material lives.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    fn read_all(&self) -> Result<Vec<Vec<u8>>, TlsError> {
        let mut out = vec![read(&self.cert)?, read(&self.key)?];
        if let Some(ca) = &self.client_ca {
            out.push(read(ca)?);
        }
        Ok(out)
    }
}

/// The current server configuration, swapped when the files change.
pub struct ReloadingTls {
    files: TlsFiles,
    current: RwLock<(Vec<Vec<u8>>, Arc<ServerConfig>)>,
}

impl ReloadingTls {
    /// Loads the files; fails if they do not make a usable configuration.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let contents = files.read_all()?;
        let config = build(&files, &contents)?;
        Ok(Arc::new(Self {
            files,
            current: RwLock::new((contents, config)),
        }))
    }

    /// An acceptor with the newest configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        TlsAcceptor::from(current.1.clone())
    }

    /// Reads the files again; true if the configuration changed. On error the old one stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let contents = self.files.read_all()?;
        if self.current.read().unwrap_or_else(|p| p.into_inner()).0 == contents {
            return Ok(false);
        }
        let config = build(&self.files, &contents)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (contents, config);
        Ok(true)
    }

    /// Checks the files every second until `shutdown`, logging each change and failure once.
    pub fn spawn_reloader(self: &Arc<Self>, shutdown: CancellationToken) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut failing = None;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(RELOAD_INTERVAL) => {}
                }
                match this.reload() {
                    Ok(true) => {
                        failing = None;
                        tracing::info!(cert = %this.files.cert.display(), "TLS certificate reloaded");
                    }
                    Ok(false) => failing = None,
                    Err(error) => {
                        let message = error.to_string();
                        if failing.as_ref() != Some(&message) {
                            tracing::error!(%message, "TLS files changed but cannot be used; keeping the previous certificate");
                            failing = Some(message);
                        }
                    }
                }
            }
        });
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Certificate {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn build(files: &TlsFiles, contents: &[Vec<u8>]) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = certificates(&files.cert, &contents[0])?;
    let key = PrivateKeyDer::from_pem_slice(&contents[1]).map_err(|source| TlsError::Key {
        path: files.key.clone(),
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match (&files.client_ca, contents.get(2)) {
        (Some(path), Some(pem)) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(path, pem)? {
                roots.add(cert).map_err(|source| TlsError::ClientCa {
                    path: path.clone(),
                    source,
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|source| TlsError::ClientVerifier {
                    path: path.clone(),
                    source,
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
