//! A scripted Kubernetes API server for the watch loop's tests: an HTTP server on loopback that
//! hands every request to the test, which answers it (a list, a status, or a watch whose events
//! it sends one by one). A `kube::Client` pointed at it runs the real watcher without a cluster.
use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::client::plain_client;

type Body = BoxBody<Bytes, Infallible>;

/// The server; it stops when dropped.
pub struct ScriptedApi {
    url: String,
    calls: mpsc::UnboundedReceiver<Call>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl ScriptedApi {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let (tx, calls) = mpsc::unbounded_channel();
        let server = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                let service =
                    hyper::service::service_fn(move |request| answer(request, tx.clone()));
                connections.spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        Self { url, calls, server }
    }

    /// A client of this server, over the proxy's own client stack.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().expect("a URL"));
        plain_client(config).expect("a client")
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The next request the client sends.
    pub async fn next_call(&mut self) -> Call {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.calls.recv())
            .await
            .expect("the client sends another request")
            .expect("the server runs")
    }
}

async fn answer(
    request: http::Request<hyper::body::Incoming>,
    calls: mpsc::UnboundedSender<Call>,
) -> Result<http::Response<Body>, Infallible> {
    let (reply, replied) = oneshot::channel();
    let call = Call {
        path: request.uri().path().to_owned(),
        query: request.uri().query().unwrap_or_default().to_owned(),
        reply,
    };
    let response = match calls.send(call) {
        Ok(()) => replied.await.ok(),
        Err(_) => None,
    };
    Ok(response.unwrap_or_else(|| json_response(503, &json!({}))))
}

fn json_response(code: u16, body: &Value) -> http::Response<Body> {
    http::Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("a response")
}

/// One request, waiting for the test's answer.
pub struct Call {
    pub path: String,
    pub query: String,
    reply: oneshot::Sender<http::Response<Body>>,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GET {}?{}", self.path, self.query)
    }
}

impl Call {
    pub fn is_watch(&self) -> bool {
        self.query.split('&').any(|pair| pair == "watch=true")
    }

    /// Answers a list request with these objects, at this resource version.
    pub fn list(self, resource_version: &str, items: Vec<Value>) {
        assert!(!self.is_watch(), "expected a list, got {self:?}");
        let body = json!({
            "apiVersion": "core.openfeature.dev/v1beta1",
            "kind": "FeatureFlagList",
            "metadata": {"resourceVersion": resource_version},
            "items": items,
        });
        let _ = self.reply.send(json_response(200, &body));
    }

    /// Answers with a failure status.
    pub fn status(self, code: u16, reason: &str, message: &str) {
        let _ = self
            .reply
            .send(json_response(code, &status(code, reason, message)));
    }

    /// Answers a watch request with a stream of events, sent through the returned handle.
    pub fn watch(self) -> WatchEvents {
        assert!(self.is_watch(), "expected a watch, got {self:?}");
        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
        let body = StreamBody::new(
            UnboundedReceiverStream::new(rx).map(|line| Ok::<_, Infallible>(Frame::data(line))),
        );
        let response = http::Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(BodyExt::boxed(body))
            .expect("a response");
        let _ = self.reply.send(response);
        WatchEvents(tx)
    }
}

/// A watch's open response; dropping it ends the watch.
pub struct WatchEvents(mpsc::UnboundedSender<Bytes>);

impl WatchEvents {
    /// Sends one watch event (`ADDED`, `MODIFIED`, `DELETED`, `ERROR`).
    pub fn send(&self, kind: &str, object: Value) {
        let line = format!("{}\n", json!({"type": kind, "object": object}));
        let _ = self.0.send(Bytes::from(line));
    }
}

/// A `Status` object as the API server sends it.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// A `FeatureFlag` `ns/name` whose flag `f` defaults to `variant`.
pub fn feature_flag(name: &str, resource_version: &str, variant: &str) -> Value {
    json!({
        "apiVersion": "core.openfeature.dev/v1beta1",
        "kind": "FeatureFlag",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": resource_version},
        "spec": {"flagSpec": {"flags": {"f": {
            "state": "ENABLED",
            "variants": {variant: variant, "other": "other"},
            "defaultVariant": variant
        }}}}
    })
}
