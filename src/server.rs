//! The gRPC sync server: accepts connections (plain, TLS or on the unix socket), serves both
//! sync protocols and gRPC health, and drains: it stops accepting, then the service ends every
//! stream with `UNAVAILABLE` as every connection is sent GOAWAY.
//!
//! Limits that protect the proxy from hostile or broken clients: connections per client
//! address and in total, a connection's memory and its first bytes' deadline (`admission`, on
//! the transport's `crate::net`), the request header and message sizes, a request message's
//! deadline and the memory of a stream (`layers`, the gRPC-aware tower layers in front of the
//! services), the HTTP/2 streams per connection and the HTTP/2 layer's own reset limits
//! (here). The transport knows nothing of gRPC; what tonic needs of a connection is
//! `connected`.
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::accept::accept_all;
use self::layers::{Layer, RequestDeadline, RequestLimits};
use crate::budget::MemoryBudget;
use crate::metrics::Metrics;
use crate::net::h2::MAX_FRAME_SIZE;
use crate::net::limits::AddressLimit;
use crate::net::listener::SyncListener;
use crate::net::tls::ReloadingTls;
use crate::wire::{FlagdSyncV1, LegacySyncV1, SyncRoutes, SyncService};

mod accept;
mod admission;
mod connected;
mod layers;

pub use crate::net::{
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_KEEPALIVE_TIMEOUT,
};

/// Streams a connection may make the server reset (flow-control and protocol errors the client
/// causes, the "MadeYouReset" pattern) before it is sent GOAWAY. tonic leaves hyper's limit off.
const MAX_LOCAL_ERROR_RESETS: usize = 256;
/// Streams a client may open and reset at once before it is sent GOAWAY (rapid reset).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;
/// HTTP/2 receive windows: how much request data a client may send ahead of what the server has
/// read, per stream and per connection. Requests are small; responses are bounded by the
/// client's windows, not these.
const STREAM_WINDOW: u32 = 64 * 1024;
const CONNECTION_WINDOW: u32 = 128 * 1024;

/// Defaults of [`ServerOptions`] (and of the command line's flags for them).
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1_000;
pub const DEFAULT_MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
/// Real clients' requests are a few hundred bytes: a selector (at most about 340 bytes for a
/// FeatureFlag's: the group, a 63-byte namespace, a 253-byte name) and a provider id. 4 KiB
/// leaves ten times that, and bounds what an unfinished request can make a stream hold.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 * 1024;
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;
pub const DEFAULT_CONNECTION_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_PENDING_REQUESTS_PER_ADDRESS: usize = 1_000;
/// The default of [`ServerOptions::max_resources_per_address`] on a node tier (`--upstream`),
/// whose clients are pods that each name a few resources. Elsewhere there is none by default: a
/// central proxy's clients include node proxies, each naming every resource its node uses.
pub const NODE_TIER_MAX_RESOURCES_PER_ADDRESS: usize = 100;
/// The grace period of [`ServerOptions::max_connection_age`] when only the age is given.
pub const DEFAULT_MAX_CONNECTION_AGE_GRACE: Duration = Duration::from_secs(10);

/// Transport settings of the sync port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerOptions {
    /// Interval of server pings that find dead peers.
    pub keepalive_interval: Duration,
    /// How long a ping may stay unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// The most concurrent streams on one connection.
    pub max_concurrent_streams: u32,
    /// The largest request header block accepted, in bytes (HTTP/2 accounting). Larger
    /// requests get `RESOURCE_EXHAUSTED`; the HTTP/2 layer itself refuses header blocks over
    /// twice this size.
    pub max_header_list_size: u32,
    /// The largest request message the services decode, in bytes.
    pub max_request_bytes: usize,
    /// The most open connections from one client IP address; 0 means no limit.
    pub max_connections_per_address: usize,
    /// Close connections after this age, then after a grace period for their streams, so
    /// streams spread over replicas again.
    pub max_connection_age: Option<(Duration, Duration)>,
    /// The most open connections in total; 0 means no limit.
    pub max_connections: usize,
    /// How long a new connection may take to complete its TLS handshake and send the HTTP/2
    /// preface.
    pub handshake_timeout: Duration,
    /// How long a connection may have no stream open before it is closed; `None`: no limit.
    pub connection_idle_timeout: Option<Duration>,
    /// How long a stream's request message may take to arrive.
    pub request_timeout: Duration,
    /// The most requests from one client IP address whose message has not arrived yet; 0
    /// means no limit.
    pub max_pending_requests_per_address: usize,
    /// The most distinct resources the streams and calls of one client IP address (of one
    /// connection, without an address) may name at once; 0 means no limit.
    pub max_resources_per_address: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_header_list_size: DEFAULT_MAX_HEADER_LIST_SIZE,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            max_connection_age: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            connection_idle_timeout: Some(DEFAULT_CONNECTION_IDLE_TIMEOUT),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_pending_requests_per_address: DEFAULT_MAX_PENDING_REQUESTS_PER_ADDRESS,
            max_resources_per_address: 0,
        }
    }
}

/// What the sync server serves on: its listeners (TCP ports and the unix socket), TLS for the
/// TCP ones, and the transport settings.
pub struct SyncPort {
    pub listeners: Vec<SyncListener>,
    pub tls: Option<Arc<ReloadingTls>>,
    pub options: ServerOptions,
}

/// The sync server's end, in the order the app cancels them.
#[derive(Clone, Debug, Default)]
pub struct Phases {
    /// The drain begins: the listeners close; the connections open go on as they were.
    pub accepting_end: CancellationToken,
    /// Every stream ends with `UNAVAILABLE` (the service holds this token too) and every
    /// connection is sent GOAWAY.
    pub streams_end: CancellationToken,
    /// The connections still open are closed (the shutdown timeout has passed).
    pub drain_end: CancellationToken,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("the gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves the sync protocols on `port` until `phases.streams_end` is cancelled and every stream
/// has ended, charging connections and streams to `budget` and counting in `metrics`. When
/// `accepting_end` is cancelled (the drain begins) the listeners close; the connections open go
/// on as they were, new streams on them included, and see nothing of it (a client that watches
/// its channel's state, as the Java provider does, would report a GOAWAY as an outage). When
/// `streams_end` is cancelled every connection is sent GOAWAY, as the service ends the streams.
/// Connections whose streams have not ended by the time `drain_end` is cancelled are closed
/// then. The tasks that accept and admit connections run on `tasks`, and end with
/// `accepting_end`.
pub async fn run(
    port: SyncPort,
    service: SyncService,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    budget: Arc<MemoryBudget>,
    metrics: Arc<Metrics>,
    phases: Phases,
    tasks: TaskTracker,
) -> Result<(), ServerError> {
    let SyncPort {
        listeners,
        tls,
        options,
    } = port;
    let accepted = accept_all(listeners, tls, &options, &budget, &metrics, &phases, &tasks);
    // The server sends GOAWAY to every connection as soon as its incoming connections end:
    // they end only with `streams_end`, however long before the listeners closed.
    let shutdown = phases.streams_end;
    let incoming = accepted.chain(
        futures::stream::once(shutdown.clone().cancelled_owned()).filter_map(|()| async { None }),
    );
    let max_request = options.max_request_bytes;
    http2_server(&options)
        .layer(Layer(RequestDeadline {
            limit: options.request_timeout,
            pending: AddressLimit::new(options.max_pending_requests_per_address, metrics.clone())
                .with_reason("max_pending_requests_per_address"),
        }))
        .layer(Layer(RequestLimits {
            max_header_bytes: options.max_header_list_size as usize,
            max_request_bytes: max_request,
            budget,
            metrics,
        }))
        .add_service(SyncRoutes::<FlagdSyncV1>::new(service.clone(), max_request))
        .add_service(SyncRoutes::<LegacySyncV1>::new(service, max_request))
        .add_service(health.max_decoding_message_size(max_request))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// The HTTP/2 server with the sync port's transport settings.
fn http2_server(options: &ServerOptions) -> tonic::transport::Server {
    let builder = tonic::transport::Server::builder()
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESETS))
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .http2_keepalive_interval(Some(options.keepalive_interval))
        .http2_keepalive_timeout(Some(options.keepalive_timeout))
        .max_concurrent_streams(options.max_concurrent_streams)
        .http2_max_header_list_size(http2_max_header_list_size(options))
        // Stated rather than left to the default: the unix socket's filter writes header
        // blocks in frames no larger.
        .max_frame_size(MAX_FRAME_SIZE)
        .tcp_nodelay(true);
    match options.max_connection_age {
        Some((age, grace)) => builder
            .max_connection_age(age)
            .max_connection_age_grace(grace),
        None => builder,
    }
}

/// The header list size the HTTP/2 layer accepts (SETTINGS_MAX_HEADER_LIST_SIZE): between
/// the limit and twice it, `RequestLimits` answers with a gRPC status and counts.
pub(super) fn http2_max_header_list_size(options: &ServerOptions) -> u32 {
    options.max_header_list_size.saturating_mul(2)
}
