//! The gRPC sync server: accepts connections (plain or TLS), serves both sync protocols and
//! gRPC health, and shuts down by ending every stream with `UNAVAILABLE`.
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;

use crate::tls::ReloadingTls;
use crate::wire::SyncService;

/// A TLS handshake that takes longer than this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Transport settings of the sync port.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Interval of server pings that find dead peers.
    pub keepalive_interval: Duration,
    /// How long a ping may stay unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// The most concurrent streams on one connection.
    pub max_concurrent_streams: u32,
    /// The largest request header block accepted, in bytes.
    pub max_header_list_size: u32,
    /// Close connections after this age, then after a grace period for their streams, so
    /// streams spread over replicas again.
    pub max_connection_age: Option<(Duration, Duration)>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            max_concurrent_streams: 1_000,
            max_header_list_size: 16 * 1024,
            max_connection_age: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("the gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves the sync protocols on `listener` until `shutdown` is cancelled and every stream has
/// ended. Streams end with `UNAVAILABLE` as soon as `shutdown` is cancelled (the services see
/// the same token).
pub async fn run(
    listener: TcpListener,
    tls: Option<Arc<ReloadingTls>>,
    service: SyncService,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    options: ServerOptions,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let (tx, rx) = mpsc::channel(128);
    tokio::spawn(accept(listener, tls, tx, shutdown.clone()));
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(options.keepalive_interval))
        .http2_keepalive_timeout(Some(options.keepalive_timeout))
        .max_concurrent_streams(options.max_concurrent_streams)
        .http2_max_header_list_size(options.max_header_list_size)
        .tcp_nodelay(true);
    if let Some((age, grace)) = options.max_connection_age {
        builder = builder
            .max_connection_age(age)
            .max_connection_age_grace(grace);
    }
    builder
        .add_service(service.flagd_sync_v1())
        .add_service(service.legacy_sync_v1())
        .add_service(health)
        .serve_with_incoming_shutdown(ReceiverStream::new(rx), shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// Accepts TCP connections and completes TLS handshakes off the accept path.
async fn accept(
    listener: TcpListener,
    tls: Option<Arc<ReloadingTls>>,
    tx: mpsc::Sender<io::Result<Connection>>,
    shutdown: CancellationToken,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        match &tls {
            None => {
                if tx.send(Ok(Connection::Plain(tcp))).await.is_err() {
                    return;
                }
            }
            Some(tls) => {
                let acceptor = tls.acceptor();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send(Ok(Connection::Tls(Box::new(stream)))).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        }
    }
}

/// A client connection, plain or TLS.
pub enum Connection {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// What the services can learn about the connection a request came on.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    pub remote_addr: Option<SocketAddr>,
    /// The client certificate chain, when the client presented one.
    pub peer_certificates: Option<Arc<Vec<rustls_pki_types::CertificateDer<'static>>>>,
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        match self {
            Connection::Plain(tcp) => ConnectionInfo {
                remote_addr: tcp.peer_addr().ok(),
                peer_certificates: None,
            },
            Connection::Tls(tls) => {
                let (tcp, session) = tls.get_ref();
                ConnectionInfo {
                    remote_addr: tcp.peer_addr().ok(),
                    peer_certificates: session.peer_certificates().map(|c| Arc::new(c.to_vec())),
                }
            }
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Connection::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Connection::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Connection::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Connection::Plain(s) => s.is_write_vectored(),
            Connection::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Plain(s) => Pin::new(s).poll_flush(cx),
            Connection::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Connection::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
