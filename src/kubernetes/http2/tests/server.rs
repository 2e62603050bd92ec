//! A TLS server on loopback that the tests steer: it counts the sockets it accepts, can hold or
//! fail TLS handshakes, and closes its connections on demand.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::client::Body;
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;

use super::super::connect::Connector;
use super::super::pool::Pool;
use super::{GUARD, guarded};
use crate::locks::lock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Handshakes {
    /// TLS handshakes go on.
    Go,
    /// Accepted sockets wait before their TLS handshake.
    Hold,
    /// Accepted sockets are closed before their TLS handshake.
    Fail,
}

type ServerBody = BoxBody<Bytes, Infallible>;

/// A TLS server on loopback: `/hang` is never answered (each one is told on `arrived`, with its
/// HTTP version), `/stream` is answered with a body that never ends, anything else with 200
/// (400 for an HTTP/1.1 request without a `Host` header or in absolute form).
pub(super) struct Server {
    address: SocketAddr,
    roots: rustls::RootCertStore,
    accepted: watch::Receiver<usize>,
    arrived: mpsc::UnboundedReceiver<Version>,
    pub(super) handshakes: watch::Sender<Handshakes>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Server {
    /// `h2`: whether ALPN offers `h2` (else only `http/1.1`).
    pub(super) async fn start(h2: bool) -> Self {
        let certified =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(certified.cert.der().clone()).expect("a root");
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![certified.cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into()),
        )
        .expect("server config");
        tls.alpn_protocols = if h2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let (accepted_tx, accepted) = watch::channel(0);
        let (arrived_tx, arrived) = mpsc::unbounded_channel();
        let (handshakes, handshakes_rx) = watch::channel(Handshakes::Go);
        let connections = Arc::new(Mutex::new(Vec::new()));
        let kept = connections.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                accepted_tx.send_modify(|n| *n += 1);
                let acceptor = acceptor.clone();
                let arrived = arrived_tx.clone();
                let mut handshakes = handshakes_rx.clone();
                let task = tokio::spawn(async move {
                    let go = handshakes
                        .wait_for(|h| *h != Handshakes::Hold)
                        .await
                        .is_ok_and(|h| *h == Handshakes::Go);
                    if !go {
                        return;
                    }
                    let Ok(tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let service =
                        hyper::service::service_fn(move |request| answer(request, arrived.clone()));
                    let io = TokioIo::new(tls);
                    let _ = if h2 {
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, service)
                            .await
                    } else {
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await
                    };
                });
                lock(&kept).push(task.abort_handle());
            }
        });
        Self {
            address,
            roots,
            accepted,
            arrived,
            handshakes,
            connections,
        }
    }

    /// A pool that trusts this server (its certificate names `localhost`, the address is
    /// 127.0.0.1: the server name is set as kubeconfig's `tls-server-name` sets it).
    pub(super) fn pool(&self) -> Pool {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(self.roots.clone())
        .with_no_client_auth();
        let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
        Pool::new(Connector::new(tls, Some(name), Some(GUARD)))
    }

    pub(super) fn get(&self, path: &str) -> Request<Body> {
        Request::get(format!("https://{}{path}", self.address))
            .body(Body::empty())
            .expect("request")
    }

    pub(super) fn accepted(&self) -> usize {
        *self.accepted.borrow()
    }

    pub(super) async fn until_accepted(&mut self, n: usize) {
        guarded("sockets accepted", self.accepted.wait_for(|a| *a >= n))
            .await
            .expect("the server runs");
    }

    pub(super) async fn arrived(&mut self) -> Version {
        guarded("a request arrives", self.arrived.recv())
            .await
            .expect("the server runs")
    }

    /// Closes every connection the server has: their sockets close with no goodbye.
    pub(super) fn close_connections(&self) {
        for connection in lock(&self.connections).drain(..) {
            connection.abort();
        }
    }
}

async fn answer(
    request: Request<Incoming>,
    arrived: mpsc::UnboundedSender<Version>,
) -> Result<Response<ServerBody>, Infallible> {
    let response = |status, body: ServerBody| {
        let mut response = Response::new(body);
        *response.status_mut() = status;
        Ok(response)
    };
    match request.uri().path() {
        "/hang" => {
            let _ = arrived.send(request.version());
            std::future::pending().await
        }
        "/stream" => {
            let body = StreamBody::new(futures::stream::pending::<Result<Frame<Bytes>, _>>());
            response(StatusCode::OK, body.boxed())
        }
        _ => {
            let origin_form = request.uri().authority().is_none()
                && request.headers().contains_key(http::header::HOST);
            let status = if request.version() == Version::HTTP_2 || origin_form {
                StatusCode::OK
            } else {
                StatusCode::BAD_REQUEST
            };
            response(status, Full::new(Bytes::from_static(b"ok")).boxed())
        }
    }
}
