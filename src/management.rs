//! Management: liveness, readiness, Prometheus metrics, a status page, and gRPC health, on one
//! port (HTTP/1.1 and HTTP/2 both).
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::hub::Source;
use crate::hub::{Availability, Hub};
use crate::introspection::{ResourceStatus, StatusPage};
use crate::metrics::{Metrics, STATE_INVALID, WatchedResource};
use crate::net::connection::{Connection, Stream};
use crate::net::deadlines::request_starts_within;
use crate::net::limits::{AddressLimit, TotalLimit};
use crate::net::listener::next_accepted;
use crate::net::room::Room;

/// Whether the proxy is serving: true once listening, false from the moment shutdown begins.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct AppState {
    hub: Hub,
    metrics: Arc<Metrics>,
    source: Arc<dyn Source>,
    readiness: Readiness,
}

/// The management routes; `grpc` adds gRPC services (health) to the same port.
pub fn router(
    hub: Hub,
    metrics: Arc<Metrics>,
    source: Arc<dyn Source>,
    readiness: Readiness,
    grpc: tonic::service::Routes,
) -> Router {
    let http = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_page))
        .route("/status", get(status))
        .with_state(AppState {
            hub,
            metrics,
            source,
            readiness,
        });
    grpc.into_axum_router().merge(http).fallback(no_route)
}

/// What the management routes say of a path they do not serve, to a person, a probe or a
/// scraper.
pub const NO_ROUTE: &str =
    "not found: the management port serves /healthz, /readyz, /metrics and /status\n";

/// A request for nothing served here. A gRPC call (of a service other than health) gets
/// UNIMPLEMENTED, as gRPC says; any other request 404 (the Go flagd-proxy's answer too): a
/// probe or scrape of a mistyped path fails rather than passing with an empty 200.
async fn no_route(request: axum::extract::Request) -> axum::response::Response {
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"));
    if grpc {
        return tonic::Status::unimplemented("no such service on the management port").into_http();
    }
    (StatusCode::NOT_FOUND, NO_ROUTE).into_response()
}

/// Default of [`ManagementOptions::max_connections`] (and of `--max-management-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default of [`ManagementOptions::max_connections_per_address`].
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 32;

/// Budgets of the management port, so that nothing on it can exhaust file descriptors or memory
/// and starve the sync port or the probes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagementOptions {
    /// The most open connections in total (0: no limit).
    pub max_connections: usize,
    /// The most open connections from one client IP address (0: no limit).
    pub max_connections_per_address: usize,
    /// How long a new connection may take to send its first request bytes, and an HTTP/1 request
    /// (or an idle keep-alive connection) its headers.
    pub header_timeout: Duration,
    /// HTTP/2 pings find dead peers, and writes stalled for interval + timeout close the
    /// connection.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
}

/// The timeouts are the sync port's defaults: the command line sets both ports' together.
impl Default for ManagementOptions {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            header_timeout: crate::net::DEFAULT_HANDSHAKE_TIMEOUT,
            keepalive_interval: crate::net::DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: crate::net::DEFAULT_KEEPALIVE_TIMEOUT,
        }
    }
}

/// The most concurrent HTTP/2 streams on one management connection.
const MAX_STREAMS: u32 = 100;

/// Serves the management routes until `shutdown` is cancelled, then lets open requests finish.
pub async fn run(
    listener: TcpListener,
    router: Router,
    options: ManagementOptions,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let per_address = AddressLimit::new(options.max_connections_per_address, metrics.clone())
        .with_reason("max_management_connections_per_address");
    let total = TotalLimit::new(
        options.max_connections,
        "management",
        "max_management_connections",
        metrics,
    );
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_local_error_reset_streams(Some(MAX_STREAMS as usize))
        .keep_alive_interval(options.keepalive_interval)
        .keep_alive_timeout(options.keepalive_timeout);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let service = TowerToHyperService::new(router);
    let write_stall = options.keepalive_interval + options.keepalive_timeout;
    let room = Room::new();
    while let Some((tcp, peer)) = next_accepted(&shutdown, "management", || listener.accept()).await
    {
        let Some(address_place) = per_address.admit(peer.ip()) else {
            continue;
        };
        // At the limit, the connection quiet the longest makes room (the limit is still
        // counted as reached): a probe always gets in.
        let Some(total_place) = total.admit().or_else(|| room.make_room()) else {
            continue;
        };
        let ticket = room.enter(total_place);
        let builder = builder.clone();
        let service = service.clone();
        let watcher = graceful.watcher();
        let header_timeout = options.header_timeout;
        tokio::spawn(async move {
            let serve = async {
                if !request_starts_within(&tcp, true, header_timeout).await {
                    return;
                }
                let io = ticket.heard(Connection::new(
                    Stream::Plain(tcp),
                    write_stall,
                    address_place,
                ));
                let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
                if let Err(error) = watcher.watch(connection.into_owned()).await {
                    tracing::debug!(%peer, %error, "management connection ended");
                }
            };
            tokio::select! {
                () = serve => {}
                () = ticket.closed() => {
                    tracing::debug!(%peer, "management connection closed to make room for a new one");
                }
            }
        });
    }
    drop(listener);
    // Requests in flight get a moment to finish; idle connections close at once.
    let _ = tokio::time::timeout(options.header_timeout, graceful.shutdown()).await;
    Ok(())
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.readiness.get() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// The states of a watched resource, as `/status` and the metrics name them.
const STATES: [&str; 7] = [
    "pending",
    "present",
    "absent",
    STATE_INVALID,
    "forbidden",
    "unreachable",
    "refused",
];

/// A resource's state as `/status` and the metrics name it (one of [`STATES`]), and why it is
/// not served as it is.
fn state_of(availability: &Availability) -> (&'static str, Option<String>) {
    match availability {
        Availability::Pending => (STATES[0], None),
        Availability::Present => (STATES[1], None),
        Availability::Absent => (STATES[2], None),
        Availability::Invalid(r) => (STATES[3], Some(r.to_string())),
        Availability::Forbidden(r) => (STATES[4], Some(r.to_string())),
        Availability::Unreachable(r) => (STATES[5], Some(r.to_string())),
        Availability::TooManyWaiting { limit } => (
            STATES[6],
            Some(format!(
                "does not exist, and {limit} resources that do not exist are already waited on"
            )),
        ),
    }
}

async fn metrics_page(State(state): State<AppState>) -> impl IntoResponse {
    let text = state
        .metrics
        .encode_observed(|metrics| observe(metrics, &state.hub, &state.readiness));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
}

/// Sets the gauges that are set when the metrics are read: readiness and the watched resources
/// (for `/metrics`, and for the OTLP exporter).
pub fn observe(metrics: &Metrics, hub: &Hub, readiness: &Readiness) {
    metrics.ready.set(i64::from(readiness.get()));
    let resources = hub.resources();
    metrics.observe_resources(
        &STATES,
        resources
            .iter()
            .map(|(key, resource, subscribers)| WatchedResource {
                namespace: &key.namespace,
                name: &key.name,
                state: state_of(&resource.availability).0,
                stale: resource.stale,
                subscribers: *subscribers,
            }),
    );
}

/// Every watched resource with its state, and the source's own problems.
async fn status(State(state): State<AppState>) -> Json<StatusPage> {
    let resources = state
        .hub
        .resources()
        .into_iter()
        .map(|(key, resource, subscribers)| {
            let (availability, reason) = state_of(&resource.availability);
            let snapshot = resource.snapshot.as_ref();
            ResourceStatus {
                availability: availability.to_owned(),
                bytes: snapshot.map(|s| s.flag_configuration.len() as u64),
                reason,
                selector: key.to_string(),
                stale: resource.stale,
                subscribers: subscribers as u64,
                version: snapshot.map(|s| s.version),
                version_age_seconds: snapshot.map(|s| s.changed_at.elapsed().as_secs_f64()),
                warnings: snapshot.and_then(|s| s.warnings.as_deref().map(str::to_owned)),
            }
        })
        .collect();
    Json(StatusPage {
        ready: state.readiness.get(),
        resources,
        source: state.source.name().to_owned(),
        source_status: state.source.status(),
    })
}
