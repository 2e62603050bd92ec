//! TLS for the sync port: a certificate and key (and optionally a client CA) read from files and
//! read again when the files change, so certificates rotate without a restart. Connections
//! already open keep the configuration they were made with.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::gauge::Gauge;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::net::deadlines::PrefaceDeadline;

/// The TLS handshake of a sync connection accepted now, under `limit` (`--handshake-timeout`):
/// the same deadline then bounds the HTTP/2 preface ([`PrefaceDeadline`]), so that the handshake
/// and the preface together take at most `limit`.
pub(crate) async fn handshake<IO>(
    acceptor: &TlsAcceptor,
    io: IO,
    limit: Duration,
) -> std::io::Result<(tokio_rustls::server::TlsStream<IO>, PrefaceDeadline)>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let deadline = tokio::time::Instant::now() + limit;
    match tokio::time::timeout_at(deadline, acceptor.accept(io)).await {
        Ok(Ok(stream)) => Ok((stream, PrefaceDeadline::until(deadline))),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "TLS handshake timed out",
        )),
    }
}

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
    /// The serving certificate's notAfter (seconds since the Unix epoch; 0 if unreadable).
    not_after: AtomicI64,
    expiry_gauge: OnceLock<Gauge>,
}

impl ReloadingTls {
    /// Loads the files; fails if they do not make a usable configuration.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let contents = files.read_all()?;
        let config = build(&files, &contents)?;
        let not_after = check_validity(&files.cert, &contents[0]);
        Ok(Arc::new(Self {
            files,
            current: RwLock::new((contents, config)),
            not_after: AtomicI64::new(not_after),
            expiry_gauge: OnceLock::new(),
        }))
    }

    /// Keeps `gauge` set to the serving certificate's notAfter, now and after every rotation.
    pub fn report_expiry(&self, gauge: Gauge) {
        gauge.set(self.not_after.load(Ordering::Relaxed));
        let _ = self.expiry_gauge.set(gauge);
    }

    /// An acceptor with the newest configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        let current = crate::locks::read(&self.current);
        TlsAcceptor::from(current.1.clone())
    }

    /// Reads the files again; true if the configuration changed. On error the old one stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let contents = self.files.read_all()?;
        if crate::locks::read(&self.current).0 == contents {
            return Ok(false);
        }
        let config = build(&self.files, &contents)?;
        let not_after = check_validity(&self.files.cert, &contents[0]);
        *crate::locks::write(&self.current) = (contents, config);
        self.not_after.store(not_after, Ordering::Relaxed);
        if let Some(gauge) = self.expiry_gauge.get() {
            gauge.set(not_after);
        }
        Ok(true)
    }

    /// Checks the files every second until `shutdown`, logging each change and failure once;
    /// runs on `tasks`.
    pub fn spawn_reloader(self: &Arc<Self>, tasks: &TaskTracker, shutdown: CancellationToken) {
        let this = self.clone();
        tasks.spawn(async move {
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

/// The validity window of the first certificate in `pem` (seconds since the Unix epoch).
fn validity(pem: &[u8]) -> Option<(i64, i64)> {
    let der = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let validity = cert.validity();
    Some((
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    ))
}

/// Logs an error when the serving certificate is expired or not yet valid (clients will refuse
/// it, though the proxy serves it: the files may be fixed at any moment); returns its notAfter.
fn check_validity(path: &Path, pem: &[u8]) -> i64 {
    let Some((not_before, not_after)) = validity(pem) else {
        tracing::warn!(cert = %path.display(), "cannot read the certificate's validity period");
        return 0;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let date = |t: i64| {
        x509_parser::time::ASN1Time::from_timestamp(t)
            .map_or_else(|_| t.to_string(), |t| t.to_string())
    };
    if now > not_after {
        tracing::error!(cert = %path.display(), not_after = %date(not_after), "the serving certificate has expired; TLS clients will refuse it");
    } else if now < not_before {
        tracing::error!(cert = %path.display(), not_before = %date(not_before), "the serving certificate is not valid yet; TLS clients will refuse it");
    }
    not_after
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::AsyncWriteExt;

    use super::handshake;
    use crate::net::h2::PREFACE;

    /// An acceptor with a self-signed certificate, and a connector that trusts it.
    fn pair() -> (tokio_rustls::TlsAcceptor, tokio_rustls::TlsConnector) {
        let certified =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
        let cert: CertificateDer<'static> = certified.cert.der().clone();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.clone()],
                PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into()),
            )
            .expect("server config");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).expect("a root");
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        (
            tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            tokio_rustls::TlsConnector::from(Arc::new(client)),
        )
    }

    /// Row 11 of docs/security.md, on the runtime's paused clock: a client that spends most of
    /// the limit before its handshake, then sends the preface within a fresh limit counted from
    /// the handshake (but after the first one has run out), is refused: the server's read fails
    /// with the deadline before the preface comes. With the same waits but the preface in time,
    /// the server reads it.
    #[tokio::test(start_paused = true)]
    async fn the_handshake_and_the_preface_share_one_deadline() {
        const LIMIT: Duration = Duration::from_secs(3);
        const BEFORE: Duration = Duration::from_millis(2500);
        for (after, in_time) in [(Duration::from_millis(2500), false), (Duration::ZERO, true)] {
            let (acceptor, connector) = pair();
            let (server_io, client_io) = tokio::io::duplex(64 * 1024);
            let server = tokio::spawn(async move {
                let (tls, mut deadline) = handshake(&acceptor, server_io, LIMIT).await?;
                let mut tls = Box::pin(tls);
                let mut buf = [0u8; PREFACE.len()];
                let mut filled = 0;
                while filled < buf.len() {
                    let mut read = tokio::io::ReadBuf::new(&mut buf[filled..]);
                    std::future::poll_fn(|cx| {
                        let result = tokio::io::AsyncRead::poll_read(tls.as_mut(), cx, &mut read);
                        deadline.check(cx, false, result)
                    })
                    .await?;
                    if read.filled().is_empty() {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    filled += read.filled().len();
                }
                Ok::<_, std::io::Error>(buf)
            });
            tokio::time::sleep(BEFORE).await;
            let name = ServerName::try_from("localhost").expect("a name");
            let mut tls = connector.connect(name, client_io).await.expect("handshake");
            tokio::time::sleep(after).await;
            // The server may have given up already: what it read is the verdict.
            let _ = tls.write_all(PREFACE).await;
            let _ = tls.flush().await;
            let read = server.await.expect("the server task");
            match (in_time, read) {
                (true, Ok(bytes)) => assert_eq!(bytes, PREFACE),
                (false, Err(error)) => {
                    assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}")
                }
                (in_time, read) => panic!("preface in time: {in_time}; the server read {read:?}"),
            }
        }
    }
}
