//! The proxy between start and shutdown: the hub, the servers, readiness and the drain.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::{Bound, Prepared, RunError};
use crate::hub::{Hub, STALE_GRACE};
use crate::management::{self, Readiness};
use crate::metrics::Metrics;
use crate::net::listener::SyncListener;
use crate::server;
use crate::state::StateDir;
use crate::wire::SyncService;

impl Bound {
    pub fn sync_addr(&self) -> std::io::Result<SocketAddr> {
        match &self.sync {
            Some(sync) => sync.local_addr(),
            None => Err(std::io::Error::other(
                "the sync port is off (--sync-socket-only)",
            )),
        }
    }

    pub fn management_addr(&self) -> std::io::Result<SocketAddr> {
        self.management.local_addr()
    }

    /// Serves until `shutdown` is cancelled; then readiness goes false, no new connection is
    /// accepted, and the connections open keep being served for the drain delay (until no
    /// stream is open, or `hurry` is cancelled); then every stream ends with `UNAVAILABLE`,
    /// every connection is sent GOAWAY, and the servers close for at most the shutdown timeout.
    pub async fn run(
        self,
        shutdown: CancellationToken,
        hurry: CancellationToken,
    ) -> Result<(), RunError> {
        let shutdown_timeout = self.prepared.serve.shutdown_timeout;
        let drain_delay = self.prepared.serve.drain_delay;
        let mut running = self.start();
        running.set_serving(true).await;
        running.log_serving();
        let early = tokio::select! {
            () = shutdown.cancelled() => None,
            result = &mut running.sync_task => Some(result),
        };
        running.set_serving(false).await;
        running.phases.accepting_end.cancel();
        if early.is_none() {
            running.drain(drain_delay, &hurry).await;
        }
        running.stop(early, shutdown_timeout).await
    }

    /// Starts the hub, the management server and the sync server (not yet reported healthy).
    fn start(self) -> Running {
        let listening = self.listening();
        let Bound {
            prepared,
            sync,
            socket,
            management,
        } = self;
        let Prepared {
            hub: hub_options,
            server: server_options,
            management: management_options,
            context_values,
            compression,
            metrics,
            budget,
            source,
            tls,
            authz,
            events,
            otlp,
            state,
            ..
        } = prepared;
        let (exporter, spans) = otlp.unzip();
        // Every task the proxy starts, but the hub's watches (the hub tracks those).
        let tasks = TaskTracker::new();
        let hub = Hub::traced(
            source.clone(),
            hub_options,
            metrics.clone(),
            budget.clone(),
            spans,
        );
        if let Some(events) = events {
            hub.record_events(Arc::new(events.tracked_by(tasks.clone())));
        }
        if let Some(state) = &state {
            hub.keep_versions(Arc::new(state.clone()), STALE_GRACE);
        }
        let readiness = Readiness::default();
        let otlp_done = CancellationToken::new();
        let otlp_task = exporter.map(|exporter| {
            let (hub, readiness, metrics) = (hub.clone(), readiness.clone(), metrics.clone());
            let collect = move || {
                metrics.collect_observed(|metrics| management::observe(metrics, &hub, &readiness))
            };
            tasks.spawn(exporter.run(collect, otlp_done.clone()))
        });
        let (health, health_service) = tonic_health::server::health_reporter();
        let management_done = CancellationToken::new();
        let management_task = tasks.spawn(management::run(
            management,
            management::router(
                hub.clone(),
                metrics.clone(),
                source,
                readiness.clone(),
                tonic::service::Routes::new(health_service.clone()),
            ),
            management_options,
            metrics.clone(),
            management_done.clone(),
        ));
        let phases = server::Phases::default();
        let service = SyncService::new(hub.clone(), metrics.clone(), phases.streams_end.clone())
            .with_authorizer(authz)
            .with_context_values(&context_values)
            .with_compression(compression)
            .with_max_resources_per_address(server_options.max_resources_per_address);
        if let Some(tls) = &tls {
            tls.spawn_reloader(&tasks, phases.accepting_end.clone());
        }
        let listeners = sync.map(SyncListener::Tcp).into_iter();
        let port = server::SyncPort {
            listeners: listeners.chain(socket.map(SyncListener::Unix)).collect(),
            tls,
            options: server_options,
        };
        let sync_task = tasks.spawn(server::run(
            port,
            service,
            health_service,
            budget,
            metrics.clone(),
            phases.clone(),
            tasks.clone(),
        ));
        Running {
            hub,
            tasks,
            readiness,
            health,
            metrics,
            phases,
            sync_task,
            management_task,
            management_done,
            otlp_task,
            otlp_done,
            state,
            listening,
        }
    }

    /// Where the proxy is about to serve.
    fn listening(&self) -> Listening {
        Listening {
            sync: self.sync.as_ref().and_then(|sync| sync.local_addr().ok()),
            socket: self.socket.as_ref().map(|socket| socket.path().to_owned()),
            management: self.management.local_addr().ok(),
            tls: self.prepared.tls.is_some(),
            source: self.prepared.source.name(),
            available: available(&self.prepared.source.status()),
        }
    }
}

/// The selectors a source's status lists (`selectors`) and its count of resources, if it lists
/// them (the manifests source does: it knows every resource at start).
fn available(status: &crate::introspection::SourceStatus) -> Option<(Vec<String>, u64)> {
    match status {
        crate::introspection::SourceStatus::Manifests(manifests) => {
            Some((manifests.selectors.clone(), manifests.resources))
        }
        _ => None,
    }
}

/// The services whose gRPC health the proxy reports: the server as a whole and both sync
/// protocols.
const HEALTH_SERVICES: [&str; 3] = [
    "",
    "flagd.sync.v1.FlagSyncService",
    "sync.v1.FlagSyncService",
];

/// The proxy between start and shutdown.
struct Running {
    hub: Hub,
    /// The tasks started for the proxy (the hub tracks its watches itself); shutdown waits
    /// for them.
    tasks: TaskTracker,
    readiness: Readiness,
    health: HealthReporter,
    metrics: Arc<Metrics>,
    /// The sync server's end, phase by phase.
    phases: server::Phases,
    sync_task: JoinHandle<Result<(), server::ServerError>>,
    management_task: JoinHandle<std::io::Result<()>>,
    management_done: CancellationToken,
    /// The OTLP exporter, which exports once more when `otlp_done` is cancelled.
    otlp_task: Option<JoinHandle<()>>,
    otlp_done: CancellationToken,
    /// The state directory: what is still pending is written when the proxy stops.
    state: Option<StateDir>,
    listening: Listening,
}

/// Where the proxy serves, for the log.
struct Listening {
    sync: Option<SocketAddr>,
    socket: Option<PathBuf>,
    management: Option<SocketAddr>,
    tls: bool,
    source: &'static str,
    /// Resources the source knows of at start (`selectors` in its status), and how many.
    available: Option<(Vec<String>, u64)>,
}

impl Running {
    /// Readiness and the gRPC health of every service, together.
    async fn set_serving(&self, serving: bool) {
        if !serving {
            self.readiness.set(false);
        }
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in HEALTH_SERVICES {
            self.health.set_service_status(service, status).await;
        }
        if serving {
            self.readiness.set(true);
        }
    }

    fn log_serving(&self) {
        let listening = &self.listening;
        let shown = |address: Option<String>| address.unwrap_or_else(|| "off".to_owned());
        tracing::info!(
            sync = %shown(listening.sync.map(|a| a.to_string())),
            sync_socket = %shown(listening.socket.as_ref().map(|p| p.display().to_string())),
            management = %shown(listening.management.map(|a| a.to_string())),
            tls = listening.tls,
            source = listening.source,
            "flagd-proxy is serving"
        );
        if let Some((selectors, count)) = &listening.available {
            let Some(first) = selectors.first() else {
                tracing::info!(
                    source = listening.source,
                    "no FeatureFlag to serve yet; clients that ask for one get it once it appears"
                );
                return;
            };
            let uri = match (listening.sync, &listening.socket) {
                (Some(address), _) => address.to_string(),
                (None, Some(path)) => format!("unix://{}", path.display()),
                (None, None) => String::new(),
            };
            tracing::info!(
                count,
                selectors = %selectors.join(", "),
                "FeatureFlags served (selectors); try one with flagd: flagd start --sources \
                 '[{{\"uri\":\"{uri}\",\"provider\":\"grpc\",\"selector\":\"{first}\"}}]'"
            );
        }
    }

    /// Keeps serving the open streams for at most `delay` (the listeners are closed): until no
    /// stream is open, or `hurry` is cancelled. Clients meanwhile get every update, and a Service
    /// stops routing to this replica (its readiness fails), so that when their streams end they
    /// reconnect to another one.
    async fn drain(&self, delay: Duration, hurry: &CancellationToken) {
        let open = || self.metrics.sync_active_streams.get();
        if delay.is_zero() || open() == 0 {
            return;
        }
        tracing::info!(
            ?delay,
            streams = open(),
            "draining: no new connections; open streams are served until the drain delay ends \
             (a second stop signal ends it now)"
        );
        let end = Instant::now() + delay;
        while open() > 0 && Instant::now() < end {
            let next = end.min(Instant::now() + DRAIN_CHECK);
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = hurry.cancelled() => return,
            }
        }
    }

    /// Ends the streams, waits for the sync server (unless it has already ended, with `early`)
    /// for at most `timeout`, stops the management server, the exporter and the watches, and
    /// waits for every task the proxy started to end, until `timeout` has passed (and at least
    /// [`CLOSE_GRACE`]).
    async fn stop(
        mut self,
        early: Option<Result<Result<(), server::ServerError>, tokio::task::JoinError>>,
        timeout: Duration,
    ) -> Result<(), RunError> {
        let deadline = Instant::now() + timeout;
        self.phases.streams_end.cancel();
        let result = match early {
            Some(result) => server_result(result),
            None => {
                tracing::info!(?timeout, "shutting down: ending streams with UNAVAILABLE");
                match tokio::time::timeout_at(deadline, &mut self.sync_task).await {
                    Ok(result) => server_result(result),
                    Err(_) => {
                        tracing::warn!("shutdown timeout reached; closing remaining connections");
                        self.phases.drain_end.cancel();
                        // The connections end as they are next polled, which is at once.
                        match tokio::time::timeout(CLOSE_GRACE, &mut self.sync_task).await {
                            Ok(result) => server_result(result),
                            Err(_) => {
                                self.sync_task.abort();
                                Ok(())
                            }
                        }
                    }
                }
            }
        };
        self.management_done.cancel();
        let management = self.management_task.await;
        // The last export, with the spans and metrics of the drain.
        self.otlp_done.cancel();
        if let Some(otlp) = self.otlp_task {
            let _ = otlp.await;
        }
        // The sync server has ended (its streams with it), and the last export has reported the
        // watches: they stop.
        self.hub.stop_watches();
        self.tasks.close();
        let trackers = [self.hub.tasks(), &self.tasks];
        let _ = wait_for_tasks(&trackers, deadline.max(Instant::now() + CLOSE_GRACE)).await;
        // After the watches: the versions they delivered last are written too.
        if let Some(state) = &self.state {
            state.flush().await;
        }
        if let Ok(Err(error)) = management {
            return Err(RunError::Management(error));
        }
        tracing::info!("stopped");
        result
    }
}

/// How long the closed connections are given to end after the shutdown timeout.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How often the drain looks whether a stream is still open.
const DRAIN_CHECK: Duration = Duration::from_millis(100);

/// Waits until every task of `trackers` (closed) has ended, or `deadline`; then logs how many
/// are still running, and returns that count (0 when all ended in time).
pub(super) async fn wait_for_tasks(trackers: &[&TaskTracker], deadline: Instant) -> usize {
    let all = futures::future::join_all(trackers.iter().map(|tracker| tracker.wait()));
    if tokio::time::timeout_at(deadline, all).await.is_ok() {
        return 0;
    }
    let still_running: usize = trackers.iter().map(|tracker| tracker.len()).sum();
    if still_running > 0 {
        tracing::warn!(
            still_running,
            "shutdown timeout reached; {still_running} tasks did not finish and are abandoned"
        );
    }
    still_running
}

/// What a server task's end means for the proxy: its error, or its panic resumed here; a
/// cancelled task is no error.
fn server_result(
    result: Result<Result<(), server::ServerError>, tokio::task::JoinError>,
) -> Result<(), RunError> {
    match result {
        Ok(inner) => inner.map_err(RunError::from),
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(_) => Ok(()),
    }
}
