//! The HTTP stack of the Kubernetes client: HTTP/2 to the API server, watches multiplexed.
//!
//! kube's default client speaks HTTP/1.1, where every open watch holds a TCP connection (and a
//! TLS session) of its own: 10,000 watched resources are 10,000 sockets to the API server. This
//! stack offers `h2` by ALPN (HTTP/1.1 stays possible for servers without it) and spreads
//! requests over a few HTTP/2 connections, each carrying up to [`STREAMS_PER_CONNECTION`]
//! requests at a time. A connection is opened when every open one is full. Dead connections are
//! found by HTTP/2 pings. The layers kube's own client puts in front (base URI, authentication,
//! extra headers, retries of 429/503) are the same.
//!
//! The cap matters: a request over the server's limit of concurrent streams waits in the HTTP/2
//! layer until a stream closes, and a watch's stream stays open for minutes. kube-apiserver
//! v1.34 allows 100 streams per connection (measured: the 101st watch on a connection waited),
//! which is also the smallest limit RFC 9113 recommends; 100 is therefore the most this stack
//! puts on one connection, and 10,000 watches take 100 connections.
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::Config;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

/// Requests in flight on one HTTP/2 connection before another is opened.
pub const STREAMS_PER_CONNECTION: usize = 100;
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
/// What [`client_builder`] builds.
pub type Http2Service = tower::util::BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// A client builder like kube's `ClientBuilder::try_from(config)`, over HTTP/2.
pub fn client_builder(config: Config) -> Result<ClientBuilder<Http2Service>, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    // ALPN offers h2 and http/1.1 (set by the builder).
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|error| {
            kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(error))
        })?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let connector = builder.enable_all_versions().wrap_connector(http);
    let pool = Pool {
        connector,
        connections: Arc::default(),
    };
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| {
            tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())
        }))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .service(pool.map_response(|response: Response<CountedBody>| {
            response.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        }));
    Ok(ClientBuilder::new(
        tower::util::BoxService::new(service),
        config.default_namespace,
    ))
}

/// HTTP/2 connections, each a hyper client of its own (one connection per client and host).
#[derive(Clone)]
struct Pool {
    connector: Connector,
    connections: Arc<Mutex<Vec<Connection>>>,
}

struct Connection {
    client: HyperClient<Connector, Body>,
    /// Requests whose response (body included) is not finished.
    in_flight: Arc<AtomicUsize>,
}

impl Pool {
    /// The first connection with room for another request, opened if there is none.
    fn pick(&self) -> (HyperClient<Connector, Body>, InFlight) {
        let mut connections = self
            .connections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let index = match connections
            .iter()
            .position(|c| c.in_flight.load(Ordering::Relaxed) < STREAMS_PER_CONNECTION)
        {
            Some(index) => index,
            None => {
                let client = HyperClient::builder(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .pool_timer(TokioTimer::new())
                    .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                    .http2_keep_alive_timeout(KEEPALIVE_TIMEOUT)
                    .http2_keep_alive_while_idle(true)
                    .build(self.connector.clone());
                connections.push(Connection {
                    client,
                    in_flight: Arc::default(),
                });
                connections.len() - 1
            }
        };
        let connection = &connections[index];
        connection.in_flight.fetch_add(1, Ordering::Relaxed);
        (
            connection.client.clone(),
            InFlight(connection.in_flight.clone()),
        )
    }
}

/// One request counted against its connection until dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl tower::Service<Request<Body>> for Pool {
    type Response = Response<CountedBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (client, in_flight) = self.pick();
        Box::pin(async move {
            let response = client.request(request).await?;
            Ok(response.map(|body| CountedBody {
                body,
                _in_flight: in_flight,
            }))
        })
    }
}

/// A response body that keeps its request counted on the connection while it is read (a
/// watch's body is open as long as the watch).
pub struct CountedBody {
    body: Incoming,
    _in_flight: InFlight,
}

impl http_body::Body for CountedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
