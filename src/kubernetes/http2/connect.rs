//! Opening one connection: TCP, TLS (ALPN offers `h2`, then `http/1.1`), the HTTP handshake;
//! and sending a request over it.
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1, http2};
use hyper::rt::{Read, Write};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::client::Body;
use rustls_pki_types::{InvalidDnsNameError, ServerName};
use tokio::net::TcpStream;

use super::STREAMS_PER_CONNECTION;
use crate::locks::lock;

const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
const ALPN_H2: &[u8] = b"h2";
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("resolving {host}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("connecting to {address}")]
    Tcp {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("no TCP connection to {host} within {timeout:?}")]
    Timeout { host: String, timeout: Duration },
    #[error("{host:?} is not a TLS server name")]
    ServerName {
        host: String,
        #[source]
        source: InvalidDnsNameError,
    },
    #[error("the TLS handshake with {host}")]
    Tls {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the HTTP handshake with {host}")]
    Handshake {
        host: String,
        #[source]
        source: hyper::Error,
    },
    #[error("the connection was given up before it opened")]
    Abandoned,
}

/// Where a connection goes: requests to one destination share its connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Destination {
    pub tls: bool,
    /// The host, an IPv6 address without its brackets.
    pub host: String,
    pub port: u16,
}

impl Destination {
    /// The destination of an absolute `http` or `https` URI.
    pub fn of(uri: &Uri) -> Option<Self> {
        let tls = match uri.scheme_str()? {
            "https" => true,
            "http" => false,
            _ => return None,
        };
        let host = uri.host()?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Some(Self {
            tls,
            host: host.to_owned(),
            port,
        })
    }
}

/// The protocol a connection speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Protocol {
    #[default]
    Http2,
    Http1,
}

impl Protocol {
    /// Requests a connection of this protocol carries at once.
    pub fn capacity(self) -> usize {
        match self {
            Protocol::Http2 => STREAMS_PER_CONNECTION,
            Protocol::Http1 => 1,
        }
    }
}

/// What opens connections: TLS settings and the TCP connect timeout.
#[derive(Clone)]
pub(super) struct Connector {
    tls: tokio_rustls::TlsConnector,
    /// The name the server's certificate is checked against, when not the URI's host.
    server_name: Option<ServerName<'static>>,
    connect_timeout: Option<Duration>,
}

/// The task that runs a connection: it ends when the connection closes.
pub(super) type Driver = BoxFuture<'static, Result<(), hyper::Error>>;

impl Connector {
    /// ALPN is set here (`h2`, then `http/1.1`) whatever `tls` had.
    pub fn new(
        mut tls: rustls::ClientConfig,
        server_name: Option<ServerName<'static>>,
        connect_timeout: Option<Duration>,
    ) -> Self {
        tls.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
        Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            server_name,
            connect_timeout,
        }
    }

    /// A new connection to `destination`: HTTP/2 where TLS's ALPN chose `h2`, HTTP/1.1 otherwise
    /// (plain `http` included). The driver must be run for the sender to be of use.
    pub async fn connect(
        &self,
        destination: &Destination,
    ) -> Result<(Sender, Driver), ConnectError> {
        let tcp = self.tcp(destination).await?;
        if !destination.tls {
            return handshake(TokioIo::new(tcp), Protocol::Http1, destination).await;
        }
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => ServerName::try_from(destination.host.clone()).map_err(|source| {
                ConnectError::ServerName {
                    host: destination.host.clone(),
                    source,
                }
            })?,
        };
        let tls = self
            .tls
            .connect(name, tcp)
            .await
            .map_err(|source| ConnectError::Tls {
                host: destination.host.clone(),
                source,
            })?;
        let protocol = if tls.get_ref().1.alpn_protocol() == Some(ALPN_H2) {
            Protocol::Http2
        } else {
            Protocol::Http1
        };
        handshake(TokioIo::new(tls), protocol, destination).await
    }

    async fn tcp(&self, destination: &Destination) -> Result<TcpStream, ConnectError> {
        let connect = async {
            let host = destination.host.as_str();
            let addresses = tokio::net::lookup_host((host, destination.port))
                .await
                .map_err(|source| ConnectError::Resolve {
                    host: host.to_owned(),
                    source,
                })?;
            let mut last = ConnectError::NoAddress {
                host: host.to_owned(),
            };
            for address in addresses {
                match TcpStream::connect(address).await {
                    Ok(stream) => {
                        // Requests are small and answered at once: no Nagle delay.
                        stream
                            .set_nodelay(true)
                            .map_err(|source| ConnectError::Tcp { address, source })?;
                        return Ok(stream);
                    }
                    Err(source) => last = ConnectError::Tcp { address, source },
                }
            }
            Err(last)
        };
        match self.connect_timeout {
            Some(timeout) => {
                tokio::time::timeout(timeout, connect)
                    .await
                    .map_err(|_| ConnectError::Timeout {
                        host: destination.host.clone(),
                        timeout,
                    })?
            }
            None => connect.await,
        }
    }
}

/// The HTTP handshake of `protocol` over `io`.
async fn handshake<I>(
    io: I,
    protocol: Protocol,
    destination: &Destination,
) -> Result<(Sender, Driver), ConnectError>
where
    I: Read + Write + Unpin + Send + 'static,
{
    let handshake = async {
        Ok(match protocol {
            Protocol::Http2 => {
                let (sender, connection) = http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .keep_alive_interval(KEEPALIVE_INTERVAL)
                    .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                    .keep_alive_while_idle(true)
                    .handshake(io)
                    .await?;
                (Sender::Http2(sender), Box::pin(connection) as Driver)
            }
            Protocol::Http1 => {
                let (sender, connection) = http1::handshake(io).await?;
                let sender = Sender::Http1(Arc::new(Mutex::new(sender)));
                (sender, Box::pin(connection) as Driver)
            }
        })
    };
    handshake.await.map_err(|source| ConnectError::Handshake {
        host: destination.host.clone(),
        source,
    })
}

/// Sends requests on one connection.
#[derive(Clone)]
pub(super) enum Sender {
    Http2(http2::SendRequest<Body>),
    /// One request at a time; the pool gives it to one request at a time.
    Http1(Arc<Mutex<http1::SendRequest<Body>>>),
}

/// A request that got no response.
pub(super) enum SendError {
    /// The connection was closed before the request was sent: it may go on another.
    NotSent(Box<Request<Body>>, hyper::Error),
    /// The request was sent, or may have been.
    Failed(hyper::Error),
}

impl From<TrySendError<Request<Body>>> for SendError {
    fn from(mut error: TrySendError<Request<Body>>) -> Self {
        match error.take_message() {
            Some(request) => SendError::NotSent(Box::new(request), error.into_error()),
            None => SendError::Failed(error.into_error()),
        }
    }
}

impl Sender {
    pub fn protocol(&self) -> Protocol {
        match self {
            Sender::Http2(_) => Protocol::Http2,
            Sender::Http1(_) => Protocol::Http1,
        }
    }

    /// Sends `request` (an absolute URI) and waits for the response's head.
    pub async fn send(self, mut request: Request<Body>) -> Result<Response<Incoming>, SendError> {
        match self {
            Sender::Http2(mut sender) => Ok(sender.try_send_request(request).await?),
            Sender::Http1(sender) => {
                // Ready once the previous request's response is over.
                if let Err(error) = poll_fn(|cx| lock(&sender).poll_ready(cx)).await {
                    return Err(SendError::NotSent(Box::new(request), error));
                }
                to_origin_form(&mut request);
                let response = lock(&sender).try_send_request(request);
                Ok(response.await?)
            }
        }
    }
}

/// HTTP/1.1 sends the path and query, and the authority as the `Host` header.
fn to_origin_form(request: &mut Request<Body>) {
    let uri = request.uri();
    if let Some(authority) = uri.authority()
        && !request.headers().contains_key(http::header::HOST)
        && let Ok(host) = HeaderValue::from_str(authority.as_str())
    {
        request.headers_mut().insert(http::header::HOST, host);
    }
    let path = request
        .uri()
        .path_and_query()
        .cloned()
        .map_or_else(Uri::default, Uri::from);
    *request.uri_mut() = path;
}
