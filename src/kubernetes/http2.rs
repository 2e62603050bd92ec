//! The HTTP stack of the Kubernetes client: HTTP/2 to the API server, watches multiplexed.
//!
//! kube's default client speaks HTTP/1.1, where every open watch holds a TCP connection (and a
//! TLS session) of its own: 10,000 watched resources are 10,000 sockets to the API server. This
//! stack offers `h2` by ALPN (HTTP/1.1 stays possible for servers without it, and is what a
//! plain `http` URI gets) and spreads requests over a few HTTP/2 connections, each carrying up
//! to [`STREAMS_PER_CONNECTION`] requests at a time; an HTTP/1.1 connection carries one. Dead
//! connections are found by HTTP/2 pings, and a connection that ends (closed, a GOAWAY, a ping
//! unanswered) leaves the pool at once: the next request opens another. The layers kube's own
//! client puts in front (base URI, authentication, extra headers, retries of 429/503) are the
//! same.
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
//!
//! `connect` opens one connection (TCP, TLS, the handshake of the protocol ALPN chose);
//! `placement` decides where a request goes; `pool` keeps the connections and counts the
//! requests on each.
use http::{Request, Response};
use kube::Config;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

mod connect;
mod placement;
mod pool;
#[cfg(test)]
mod tests;

pub use connect::ConnectError;
pub use pool::{CountedBody, PoolError};

/// Requests in flight on one HTTP/2 connection before another is opened.
pub const STREAMS_PER_CONNECTION: usize = 100;

/// What [`client_builder`] builds.
pub type Http2Service = tower::util::BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// A client builder like kube's `ClientBuilder::try_from(config)`, over HTTP/2.
pub fn client_builder(config: Config) -> Result<ClientBuilder<Http2Service>, kube::Error> {
    let server_name = config
        .tls_server_name
        .clone()
        .map(|name| {
            rustls_pki_types::ServerName::try_from(name).map_err(|error| {
                kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(error))
            })
        })
        .transpose()?;
    let connector = connect::Connector::new(
        config.rustls_client_config()?,
        server_name,
        config.connect_timeout,
    );
    let pool = pool::Pool::new(connector);
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
