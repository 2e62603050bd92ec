//! The gRPC sync server: accepts connections (plain or TLS), serves both sync protocols and
//! gRPC health, and drains: it stops accepting and sends GOAWAY, then the service ends every
//! stream with `UNAVAILABLE`.
//!
//! Limits that protect the proxy from hostile or broken clients, built from the transport
//! (`crate::net`): connections per client address and in total (`net::limits`, counted at
//! accept, released when the connection is dropped), deadlines for a connection's first bytes,
//! a request's message and stalled writers (`net::deadlines`), the request header and message
//! sizes (`net::request_limits`), the HTTP/2 streams per connection, and the HTTP/2 layer's own
//! reset limits.
use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::budget::{self, Charge, Kind, MemoryBudget};
use crate::metrics::Metrics;
use crate::net::authority::{self, AuthorityFilter};
use crate::net::connection::{Connection, Stream};
use crate::net::deadlines::{PrefaceDeadline, RequestDeadline};
use crate::net::limits::{AddressLimit, AddressSlot, TotalLimit, TotalSlot};
use crate::net::listener::{SyncListener, UnixSocket, next_accepted};
use crate::net::request_limits::RequestLimits;
use crate::net::room::Room;
use crate::net::tls::ReloadingTls;
use crate::wire::{FlagdSyncV1, LegacySyncV1, SyncRoutes, SyncService};

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

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("the gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves the sync protocols on `listeners` until `shutdown` is cancelled and every stream has
/// ended, charging connections and streams to `budget` and counting in `metrics`. When
/// `stop_accepting` is cancelled (the drain begins) the listeners close; the connections open go
/// on as they were, new streams on them included, and see nothing of it (a client that watches
/// its channel's state, as the Java provider does, would report a GOAWAY as an outage). When
/// `shutdown` is cancelled every connection is sent GOAWAY, as the service ends the streams
/// (with `UNAVAILABLE`, on the same token). Connections whose streams have not ended by the
/// time `closed` is cancelled are closed then. The tasks that accept and admit connections run
/// on `tasks`, and end with `stop_accepting`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    listeners: Vec<SyncListener>,
    tls: Option<Arc<ReloadingTls>>,
    service: SyncService,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    options: ServerOptions,
    budget: Arc<MemoryBudget>,
    metrics: Arc<Metrics>,
    stop_accepting: CancellationToken,
    shutdown: CancellationToken,
    closed: CancellationToken,
    tasks: TaskTracker,
) -> Result<(), ServerError> {
    let accepted = accept_all(
        listeners,
        tls,
        &options,
        &budget,
        &metrics,
        &stop_accepting,
        closed,
        &tasks,
    );
    // The server sends GOAWAY to every connection as soon as its incoming connections end:
    // they end only with `shutdown`, however long before the listeners closed.
    let incoming = accepted.chain(
        futures::stream::once(shutdown.clone().cancelled_owned()).filter_map(|()| async { None }),
    );
    let max_request = options.max_request_bytes;
    http2_server(&options)
        .layer(RequestDeadline {
            limit: options.request_timeout,
            pending: AddressLimit::new(options.max_pending_requests_per_address, metrics.clone())
                .with_reason("max_pending_requests_per_address"),
        })
        .layer(RequestLimits {
            max_header_bytes: options.max_header_list_size as usize,
            max_request_bytes: max_request,
            budget,
            metrics,
        })
        .add_service(SyncRoutes::<FlagdSyncV1>::new(service.clone(), max_request))
        .add_service(SyncRoutes::<LegacySyncV1>::new(service, max_request))
        .add_service(health.max_decoding_message_size(max_request))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// Starts accepting on every listener; the accepted connections, admitted and with their TLS
/// handshakes done, come out of the returned stream.
#[allow(clippy::too_many_arguments)]
fn accept_all(
    listeners: Vec<SyncListener>,
    tls: Option<Arc<ReloadingTls>>,
    options: &ServerOptions,
    budget: &Arc<MemoryBudget>,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
    closed: CancellationToken,
    tasks: &TaskTracker,
) -> ReceiverStream<io::Result<Connection>> {
    let (tx, rx) = mpsc::channel(128);
    let admission = Arc::new(Admission {
        per_address: AddressLimit::new(options.max_connections_per_address, metrics.clone()),
        total: TotalLimit::new(
            options.max_connections,
            "sync",
            "max_connections",
            metrics.clone(),
        ),
        room: Room::new(),
        budget: budget.clone(),
        handshake_timeout: options.handshake_timeout,
        idle_timeout: options.connection_idle_timeout,
        write_stall: options.keepalive_interval + options.keepalive_timeout,
        http2_max_header_list_size: http2_max_header_list_size(options) as usize,
        closed,
    });
    tasks.spawn(
        admission
            .room
            .clone()
            .close_idle_when_refused(budget.clone(), shutdown.clone()),
    );
    for listener in listeners {
        let (tx, admission) = (tx.clone(), admission.clone());
        match listener {
            SyncListener::Tcp(listener) => {
                let tls = tls.clone();
                tasks.spawn(accept(
                    listener,
                    tls,
                    tx,
                    admission,
                    shutdown.clone(),
                    tasks.clone(),
                ));
            }
            SyncListener::Unix(socket) => {
                tasks.spawn(accept_unix(socket, tx, admission, shutdown.clone()));
            }
        }
    }
    ReceiverStream::new(rx)
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
        .max_frame_size(authority::MAX_FRAME_SIZE)
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
fn http2_max_header_list_size(options: &ServerOptions) -> u32 {
    options.max_header_list_size.saturating_mul(2)
}

/// Accepts TCP connections and completes TLS handshakes off the accept path (on `tasks`).
async fn accept(
    listener: TcpListener,
    tls: Option<Arc<ReloadingTls>>,
    tx: mpsc::Sender<io::Result<Connection>>,
    admission: Arc<Admission>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let per_address = &admission.per_address;
    while let Some((tcp, peer)) = next_accepted(&shutdown, "sync", || listener.accept()).await {
        let Some(slot) = per_address.admit(peer.ip()) else {
            tracing::debug!(%peer, "connection closed: too many connections from this address");
            drop(tcp);
            continue;
        };
        let bytes = match tls {
            None => budget::CONNECTION_BYTES,
            Some(_) => TLS_CONNECTION_BYTES,
        };
        let Some(total) = admission.place(bytes) else {
            tracing::debug!(%peer, "connection closed: --max-connections or --memory-budget reached");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let deadline = admission.handshake_timeout;
        match &tls {
            None => {
                let (tx, admission) = (tx.clone(), admission.clone());
                tasks.spawn(async move {
                    // The preface is checked as it is read, under the deadline: a peer that
                    // closes early frees its place at once, and nothing polls for it.
                    let connection = admission.connection(
                        Stream::Plain(tcp),
                        PrefaceDeadline::new(deadline),
                        slot,
                        total,
                    );
                    let _ = tx.send(Ok(connection)).await;
                });
            }
            Some(tls) => {
                let acceptor = tls.acceptor();
                let (tx, admission) = (tx.clone(), admission.clone());
                // One deadline for the handshake and the preface together.
                let deadline = tokio::time::Instant::now() + deadline;
                tasks.spawn(async move {
                    match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let connection = admission.connection(
                                Stream::Tls(Box::new(stream)),
                                PrefaceDeadline::until(deadline),
                                slot,
                                total,
                            );
                            let _ = tx.send(Ok(connection)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        }
    }
}

/// Accepts unix socket connections (plain: the socket file's mode is the gate, and there is no
/// client address to count per address, so only the total limit applies; the preface deadline is
/// read-based). Its bytes are read through [`AuthorityFilter`]: any `:authority` a client
/// sends names nothing here. The socket file is removed when this ends.
async fn accept_unix(
    socket: UnixSocket,
    tx: mpsc::Sender<io::Result<Connection>>,
    admission: Arc<Admission>,
    shutdown: CancellationToken,
) {
    let path = socket.path().display().to_string();
    while let Some((stream, _)) =
        next_accepted(&shutdown, &path, || socket.listener().accept()).await
    {
        let Some(total) = admission.place(UNIX_CONNECTION_BYTES) else {
            tracing::debug!(
                "unix socket connection closed: --max-connections or --memory-budget reached"
            );
            continue;
        };
        let stream = Box::new(AuthorityFilter::new(
            stream,
            admission.http2_max_header_list_size,
        ));
        let connection = admission.connection(
            Stream::Unix(stream),
            PrefaceDeadline::new(admission.handshake_timeout),
            AddressSlot::none(),
            total,
        );
        if tx.send(Ok(connection)).await.is_err() {
            return;
        }
    }
}

/// What a unix socket connection holds: an HTTP/2 connection's, and its [`AuthorityFilter`]'s.
const UNIX_CONNECTION_BYTES: usize = budget::CONNECTION_BYTES + authority::FILTER_BYTES;
/// What a TLS connection holds: a plaintext one's, and the TLS session's buffers and state
/// (8.0 KiB more per subscriber measured: 33.9 against 25.9 KiB, `measure_subscribers` in
/// `tests/tls.rs`).
const TLS_CONNECTION_BYTES: usize = budget::CONNECTION_BYTES + 8 * 1024;

/// What a new connection must pass before it is served.
struct Admission {
    per_address: AddressLimit,
    total: TotalLimit,
    /// The open connections, so that at the total limit an idle one makes room.
    room: Arc<Room>,
    /// Each connection is charged to it while it is open.
    budget: Arc<MemoryBudget>,
    handshake_timeout: Duration,
    idle_timeout: Option<Duration>,
    /// How long writes may make no progress before the connection is closed.
    write_stall: Duration,
    /// What the HTTP/2 layer accepts of a header list (the unix socket's filter keeps to it).
    http2_max_header_list_size: usize,
    /// Cancelled at the end of the drain: every connection still open is closed.
    closed: CancellationToken,
}

impl Admission {
    /// A place among all connections for one that holds `bytes`: a free one, or else the one of
    /// the connection idle the longest (no stream open), which is closed. `None` when every
    /// connection has a stream, or when `bytes` do not fit in the memory budget.
    fn place(&self, bytes: usize) -> Option<(TotalSlot, Charge)> {
        let memory = self.budget.try_charge(bytes, Kind::Connections)?;
        let place = self.total.admit().or_else(|| self.room.make_room())?;
        Some((place, memory))
    }

    /// An admitted connection, entered in the room.
    fn connection(
        &self,
        stream: Stream,
        preface: PrefaceDeadline,
        slot: AddressSlot,
        (total, memory): (TotalSlot, Charge),
    ) -> Connection {
        Connection::new(stream, self.write_stall, slot)
            .with_preface(preface)
            .in_room(self.room.enter(total), self.idle_timeout)
            .closed_by(&self.closed)
            .charged(memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(budget: &Arc<MemoryBudget>, metrics: &Arc<Metrics>) -> Admission {
        Admission {
            per_address: AddressLimit::new(0, metrics.clone()),
            total: TotalLimit::new(0, "sync", "max_connections", metrics.clone()),
            room: Room::new(),
            budget: budget.clone(),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: None,
            write_stall: Duration::from_secs(30),
            http2_max_header_list_size: 16 * 1024,
            closed: CancellationToken::new(),
        }
    }

    /// A unix socket connection is charged its authority filter (HPACK table and read buffer)
    /// besides what any connection holds: where one more TCP connection fits in the budget, one
    /// more unix socket connection does not.
    #[test]
    fn unix_socket_connections_are_charged_their_filter() {
        let metrics = Arc::new(Metrics::new());
        let budget = MemoryBudget::new(
            UNIX_CONNECTION_BYTES + budget::CONNECTION_BYTES,
            metrics.clone(),
        );
        let admission = admission(&budget, &metrics);
        let unix = admission.place(UNIX_CONNECTION_BYTES).expect("room");
        assert_eq!(budget.used(), 18 * 1024 + 4 * 1024 + 8 * 1024);
        assert!(admission.place(UNIX_CONNECTION_BYTES).is_none());
        let tcp = admission.place(budget::CONNECTION_BYTES).expect("room");
        assert_eq!(budget.used(), budget.limit());
        drop((unix, tcp));
        assert_eq!(budget.used(), 0);
    }
}
