//! The HTTP stack of the Kubernetes client: HTTP/2 to the API server, watches multiplexed.
//!
//! kube's default client speaks HTTP/1.1, where every open watch holds a TCP connection (and a
//! TLS session) of its own: 10,000 watched resources are 10,000 sockets to the API server. This
//! stack offers `h2` by ALPN (HTTP/1.1 stays possible for servers without it) and spreads
//! requests over a few HTTP/2 connections, each carrying up to [`STREAMS_PER_CONNECTION`]
//! requests at a time. Dead connections are found by HTTP/2 pings. The layers kube's own client puts in front (base URI, authentication,
//! extra headers, retries of 429/503) are the same.
//!
//! The cap matters: a request over the server's limit of concurrent streams waits in the HTTP/2
//! layer until a stream closes, and a watch's stream stays open for minutes. kube-apiserver
//! v1.34 allows 100 streams per connection (measured: the 101st watch on a connection waited),
//! which is also the smallest limit RFC 9113 recommends; 100 is therefore the most this stack
//! puts on one connection, and 10,000 watches take 100 connections.
//!
//! Placement keeps it at that: watches (`watch=true`) hold their stream for minutes, everything
//! else (the list before each watch, reviews, events) for moments. A request goes to the first
//! connection with a free stream. When every connection is full but some only because of short
//! requests, it waits for one of them to end (see `place`); a connection is opened only when
//! every one is full of watches. Otherwise a watch placed while lists are in flight would open a
//! connection that keeps holes once the lists end. No request ever waits for a watch to end.
use std::pin::Pin;
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
use tokio::sync::Notify;
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

use crate::locks::lock;

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
        shared: Arc::default(),
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
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    connections: Mutex<Vec<Connection>>,
    /// Notified whenever a request ends: a request waiting for room may find it now.
    ended: Notify,
}

struct Connection {
    client: HyperClient<Connector, Body>,
    load: Load,
    gate: Arc<Gate>,
}

/// Whether a connection's protocol is known. Until a first request has its answer the protocol
/// (HTTP/2, by ALPN) is not, and hyper opens another socket for every request that arrives
/// meanwhile; so one request goes first and the others wait for its answer. A first request that
/// is given up before its answer (its caller cancelled it or timed out) hands the turn on: the
/// next request goes first instead, and nobody waits for an answer that will never come.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Notify,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum GateState {
    /// No request is on its way: the next one goes first.
    #[default]
    Vacant,
    /// A first request is on its way.
    Trying,
    /// A request had its answer: everyone goes.
    Open,
}

impl Gate {
    /// Waits for this request's turn: `Some` when it goes first (the others wait until the
    /// returned value is [`FirstRequest::answered`] or dropped), `None` when the connection is
    /// open.
    async fn enter(self: &Arc<Self>) -> Option<FirstRequest> {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Registered before looking, so a change between the look and the wait is not missed.
            changed.as_mut().enable();
            {
                let mut state = lock(&self.state);
                match *state {
                    GateState::Open => return None,
                    GateState::Vacant => {
                        *state = GateState::Trying;
                        return Some(FirstRequest { gate: self.clone() });
                    }
                    GateState::Trying => {}
                }
            }
            changed.await;
        }
    }

    fn set(&self, to: GateState) {
        *lock(&self.state) = to;
        self.changed.notify_waiters();
    }
}

/// The request that goes first on a connection; dropped before [`answered`](Self::answered),
/// it hands the turn to the next request.
struct FirstRequest {
    gate: Arc<Gate>,
}

impl FirstRequest {
    /// It had its answer (a response or an error): every request may go now.
    fn answered(self) {
        self.gate.set(GateState::Open);
    }
}

impl Drop for FirstRequest {
    fn drop(&mut self) {
        let mut state = lock(&self.gate.state);
        if *state == GateState::Trying {
            *state = GateState::Vacant;
            drop(state);
            self.gate.changed.notify_waiters();
        }
    }
}

/// A place for a request on a connection.
struct Picked {
    client: HyperClient<Connector, Body>,
    in_flight: InFlight,
    gate: Arc<Gate>,
}

/// The requests in flight on one connection (responses, body included, not finished).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Load {
    /// Watches (`watch=true`): they stay open for minutes.
    watches: usize,
    /// Everything else (lists, gets, reviews, events): they end within moments.
    shorts: usize,
}

/// How long a request holds its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lifetime {
    Watch,
    Short,
}

impl Lifetime {
    fn of<B>(request: &Request<B>) -> Self {
        let watch = request
            .uri()
            .query()
            .is_some_and(|query| query.split('&').any(|pair| pair == "watch=true"));
        if watch {
            Lifetime::Watch
        } else {
            Lifetime::Short
        }
    }
}

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
enum Placement {
    /// On this connection: it has room.
    Use(usize),
    /// Every connection is full, but some only because of short requests: wait for one of them
    /// to end rather than open a connection that long-lived watches would leave half empty.
    Wait,
    /// Every connection is full of watches: open another.
    Open,
}

/// The first connection with room; else waiting for a short request to end where that makes
/// room; else a new connection. A request never waits for a watch to end.
fn place(loads: impl IntoIterator<Item = Load>) -> Placement {
    let mut short_ends_make_room = false;
    for (index, load) in loads.into_iter().enumerate() {
        if load.watches + load.shorts < STREAMS_PER_CONNECTION {
            return Placement::Use(index);
        }
        short_ends_make_room |= load.watches < STREAMS_PER_CONNECTION;
    }
    if short_ends_make_room {
        Placement::Wait
    } else {
        Placement::Open
    }
}

impl Pool {
    /// A connection for a request, counted against it until the returned guard is dropped.
    async fn pick(&self, lifetime: Lifetime) -> Picked {
        loop {
            let ended = self.shared.ended.notified();
            let mut ended = std::pin::pin!(ended);
            // Registered before looking, so an end between the look and the wait is not missed.
            ended.as_mut().enable();
            if let Some(picked) = self.try_pick(lifetime) {
                return picked;
            }
            ended.await;
        }
    }

    fn try_pick(&self, lifetime: Lifetime) -> Option<Picked> {
        let mut connections = lock(&self.shared.connections);
        let index = match place(connections.iter().map(|c| c.load)) {
            Placement::Use(index) => index,
            Placement::Wait => return None,
            Placement::Open => {
                let client = HyperClient::builder(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .pool_timer(TokioTimer::new())
                    .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                    .http2_keep_alive_timeout(KEEPALIVE_TIMEOUT)
                    .http2_keep_alive_while_idle(true)
                    .build(self.connector.clone());
                connections.push(Connection {
                    client,
                    load: Load::default(),
                    gate: Arc::default(),
                });
                connections.len() - 1
            }
        };
        let connection = &mut connections[index];
        match lifetime {
            Lifetime::Watch => connection.load.watches += 1,
            Lifetime::Short => connection.load.shorts += 1,
        }
        let guard = InFlight {
            shared: self.shared.clone(),
            index,
            lifetime,
        };
        Some(Picked {
            client: connection.client.clone(),
            in_flight: guard,
            gate: connection.gate.clone(),
        })
    }
}

/// One request counted against its connection until dropped.
struct InFlight {
    shared: Arc<Shared>,
    index: usize,
    lifetime: Lifetime,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut connections = lock(&self.shared.connections);
        let load = &mut connections[self.index].load;
        match self.lifetime {
            Lifetime::Watch => load.watches -= 1,
            Lifetime::Short => load.shorts -= 1,
        }
        drop(connections);
        // A short request's end makes the room waited for; a watch's end may make room sooner.
        self.shared.ended.notify_waiters();
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
        let pool = self.clone();
        Box::pin(async move {
            let picked = pool.pick(Lifetime::of(&request)).await;
            let first = picked.gate.enter().await;
            let response = picked.client.request(request).await;
            if let Some(first) = first {
                first.answered();
            }
            Ok(response?.map(|body| CountedBody {
                body,
                _in_flight: picked.in_flight,
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

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: usize = STREAMS_PER_CONNECTION;

    fn load(watches: usize, shorts: usize) -> Load {
        Load { watches, shorts }
    }

    #[test]
    fn requests_go_to_the_first_connection_with_room() {
        assert_eq!(place([]), Placement::Open);
        assert_eq!(place([load(FULL - 1, 0)]), Placement::Use(0));
        assert_eq!(
            place([load(FULL, 0), load(3, 2), load(0, 0)]),
            Placement::Use(1)
        );
    }

    #[test]
    fn a_connection_full_only_of_short_requests_is_waited_for() {
        assert_eq!(place([load(FULL - 5, 5)]), Placement::Wait);
        assert_eq!(place([load(FULL, 0), load(0, FULL)]), Placement::Wait);
    }

    #[test]
    fn connections_full_of_watches_are_never_waited_for() {
        assert_eq!(place([load(FULL, 0)]), Placement::Open);
        assert_eq!(place([load(FULL, 0), load(FULL, 0)]), Placement::Open);
    }

    #[test]
    fn watches_are_told_by_their_query() {
        let request = |uri: &str| Request::get(uri).body(()).expect("request");
        let base = "/apis/core.openfeature.dev/v1beta1/namespaces/a/featureflags";
        assert_eq!(
            Lifetime::of(&request(&format!(
                "{base}?fieldSelector=metadata.name%3Df&resourceVersion=7&watch=true"
            ))),
            Lifetime::Watch
        );
        assert_eq!(
            Lifetime::of(&request(&format!("{base}?watch=true"))),
            Lifetime::Watch
        );
        assert_eq!(
            Lifetime::of(&request(&format!(
                "{base}?fieldSelector=metadata.name%3Df&limit=500"
            ))),
            Lifetime::Short
        );
        assert_eq!(Lifetime::of(&request(base)), Lifetime::Short);
        assert_eq!(
            Lifetime::of(&request(&format!("{base}?watch=false"))),
            Lifetime::Short
        );
    }

    /// A pool of this stack's connections, TLS or plain HTTP.
    fn test_pool() -> Pool {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
            )
            .https_or_http()
            .enable_all_versions()
            .wrap_connector(HttpConnector::new());
        Pool {
            connector,
            shared: Arc::default(),
        }
    }

    /// A plain HTTP server on loopback that never answers `/hang` (telling `arrived` when such a
    /// request is in) and answers anything else with 200.
    async fn server(arrived: tokio::sync::mpsc::UnboundedSender<()>) -> std::net::SocketAddr {
        use hyper::service::service_fn;
        use hyper_util::rt::TokioIo;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let arrived = arrived.clone();
                let service = service_fn(move |request: Request<Incoming>| {
                    let arrived = arrived.clone();
                    async move {
                        if request.uri().path() == "/hang" {
                            let _ = arrived.send(());
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                            Bytes::from_static(b"ok"),
                        )))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service),
                );
            }
        });
        address
    }

    /// The first request on a new connection is given up mid-flight (its caller timed out) while
    /// another request waits for its answer: the waiting request goes instead, and is answered.
    #[tokio::test]
    async fn a_first_request_given_up_hands_the_connection_on() {
        use tower::Service as _;
        let (arrived_tx, mut arrived) = tokio::sync::mpsc::unbounded_channel();
        let address = server(arrived_tx).await;
        let pool = test_pool();
        let get = |path: &str| {
            Request::get(format!("http://{address}{path}"))
                .body(Body::empty())
                .expect("request")
        };
        let first = tokio::spawn(pool.clone().call(get("/hang")));
        arrived
            .recv()
            .await
            .expect("the first request reaches the server");
        let next = tokio::spawn(pool.clone().call(get("/ok")));
        // The next request is placed on the same connection and waits for the first's answer.
        while lock(&pool.shared.connections)[0].load.shorts < 2 {
            tokio::task::yield_now().await;
        }
        first.abort();
        assert!(first.await.is_err_and(|e| e.is_cancelled()));
        let answer = tokio::time::timeout(Duration::from_secs(30), next)
            .await
            .expect("the waiting request is not left waiting for an answer that never comes")
            .expect("the task")
            .expect("an answer");
        assert_eq!(answer.status(), http::StatusCode::OK);
        assert_eq!(lock(&pool.shared.connections).len(), 1, "one connection");
        // And later requests on that connection go straight through.
        let again = tokio::time::timeout(Duration::from_secs(30), pool.clone().call(get("/ok")))
            .await
            .expect("answered")
            .expect("an answer");
        assert_eq!(again.status(), http::StatusCode::OK);
    }

    /// 250 watches, each after its list, and other short requests among them (reviews, events):
    /// the watches pack 100 a connection.
    #[tokio::test]
    async fn short_requests_do_not_spread_watches() {
        let pool = test_pool();
        let short = |pool: &Pool, takes: usize| {
            let pool = pool.clone();
            async move {
                let request = pool.pick(Lifetime::Short).await;
                for _ in 0..takes {
                    tokio::task::yield_now().await;
                }
                drop(request);
            }
        };
        let (held, mut watches) = tokio::sync::mpsc::unbounded_channel();
        let mut others = Vec::new();
        for i in 0..250 {
            let list = short(&pool, 3);
            let watcher = pool.clone();
            let held = held.clone();
            tokio::spawn(async move {
                list.await;
                let _ = held.send(watcher.pick(Lifetime::Watch).await);
            });
            if i >= 150 {
                others.push(tokio::spawn(short(&pool, 100)));
            }
            tokio::task::yield_now().await;
        }
        let mut open = Vec::new();
        while open.len() < 250 {
            open.push(watches.recv().await.expect("every watch is placed"));
        }
        for other in others {
            other.await.expect("the short request ends");
        }
        let loads: Vec<Load> = lock(&pool.shared.connections)
            .iter()
            .map(|c| c.load)
            .collect();
        assert_eq!(
            loads,
            [load(FULL, 0), load(FULL, 0), load(50, 0)],
            "250 watches"
        );
        drop(open);
    }
}
