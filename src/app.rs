//! Wiring: the proxy's [`Settings`] (built once from the command line, see
//! [`crate::cli::StartArgs`]), and the steps that turn them into a running proxy: [`prepare`]
//! checks them and loads the source and TLS, [`Prepared::bind`] listens, [`Bound::run`] starts
//! the hub and the servers, serves, and shuts down in order.
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::authz::{Authorizer, AuthzConfigError, AuthzMode, AuthzSettings, Reviewer};
use crate::hub::{Hub, HubOptions, Source, SpanSink};
use crate::kubernetes::events::EventRecorder;
use crate::kubernetes::reviews::KubeReviewer;
use crate::kubernetes::{KubeError, KubeSettings, KubernetesSource};
use crate::management::{self, ManagementOptions, Readiness};
use crate::metrics::Metrics;
use crate::net::listener::{SocketError, SyncListener, UnixSocket};
use crate::net::tls::{ReloadingTls, TlsError, TlsFiles};
use crate::server::{self, ServerOptions};
use crate::source::manifests::{ManifestError, ManifestSource};
use crate::source::upstream::{UpstreamError, UpstreamSettings, UpstreamSource};
use crate::telemetry::{Exporter, OtlpError, OtlpSettings};
use crate::wire::{CompressionSettings, SyncService};

/// A configuration that cannot work; reported before anything listens (exit status 64).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--manifests: {0}")]
    Manifests(#[source] ManifestError),
    #[error("--server-cert-path/--server-key-path/--client-ca-path: {0}")]
    Tls(#[source] TlsError),
    #[error("--port and --management-port are both {0}; they must differ")]
    SamePort(u16),
    #[error("{0}")]
    Kubernetes(#[source] KubeError),
    #[error("{0}")]
    Upstream(#[source] UpstreamError),
    #[error("{0}")]
    Authz(#[source] AuthzConfigError),
    #[error("{0}")]
    ContextValues(String),
    #[error("{0}")]
    Otlp(#[source] OtlpError),
    #[error(
        "--sync-socket-path cannot be combined with --client-ca-path: the unix socket carries no TLS, so its clients present no certificate"
    )]
    SocketWithoutClientCertificates,
}

/// A failure while running.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot listen on {addr} ({flag}): {source}")]
    Bind {
        addr: SocketAddr,
        flag: &'static str,
        source: std::io::Error,
    },
    #[error("cannot listen on the unix socket (--sync-socket-path): {0}")]
    Socket(#[source] SocketError),
    #[error(transparent)]
    Server(#[from] server::ServerError),
    #[error("the management server failed: {0}")]
    Management(std::io::Error),
}

/// Everything the proxy is configured with, one settings value per component.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub serve: ServeSettings,
    pub source: SourceSettings,
    /// TLS on the sync port; plaintext without it.
    pub tls: Option<TlsFiles>,
    pub authz: AuthzSettings,
    pub hub: HubOptions,
    pub server: ServerOptions,
    pub management: ManagementOptions,
    /// Entries of every message's sync context (`--context-value`).
    pub context_values: Vec<(String, String)>,
    /// gzip for clients that accept it (`--compression`).
    pub compression: CompressionSettings,
    /// OpenTelemetry export (`--otlp-endpoint`); off without it.
    pub otlp: Option<OtlpSettings>,
}

/// Default of [`ServeSettings::port`] (and of `--port`).
pub const DEFAULT_PORT: u16 = 8015;
/// Default of [`ServeSettings::management_port`].
pub const DEFAULT_MANAGEMENT_PORT: u16 = 8016;
/// Default of [`ServeSettings::bind_address`]: every IPv4 interface.
pub const DEFAULT_BIND_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
/// Default of [`ServeSettings::sync_socket_mode`].
pub const DEFAULT_SYNC_SOCKET_MODE: u32 = 0o660;
/// Default of [`ServeSettings::shutdown_timeout`].
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Whether Kubernetes Events are recorded unless told otherwise (`--events`).
pub const DEFAULT_EVENTS: bool = true;

/// Where the proxy listens, and how long it drains at shutdown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeSettings {
    pub bind_address: IpAddr,
    /// The sync port (0: any free port).
    pub port: u16,
    /// The management port (0: any free port).
    pub management_port: u16,
    /// Also serve the sync protocols on a unix socket at this path.
    pub sync_socket_path: Option<PathBuf>,
    /// Permission bits of the unix socket file.
    pub sync_socket_mode: u32,
    /// Serve the sync protocols on the unix socket only, not on `port`.
    pub sync_socket_only: bool,
    /// How long shutdown waits for streams to close.
    pub shutdown_timeout: Duration,
}

impl Default for ServeSettings {
    fn default() -> Self {
        Self {
            bind_address: DEFAULT_BIND_ADDRESS,
            port: DEFAULT_PORT,
            management_port: DEFAULT_MANAGEMENT_PORT,
            sync_socket_path: None,
            sync_socket_mode: DEFAULT_SYNC_SOCKET_MODE,
            sync_socket_only: false,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }
}

/// Where resources come from.
#[derive(Clone, Debug)]
pub enum SourceSettings {
    /// FeatureFlag objects in YAML/JSON files under these directories.
    Manifests(Vec<PathBuf>),
    /// Another flagd-proxy; the Kubernetes API (when configured) only authorizes clients.
    Upstream {
        settings: UpstreamSettings,
        kube: KubeSettings,
    },
    /// The Kubernetes API, recording Events on served resources when `events` is set.
    Kubernetes {
        settings: KubeSettings,
        events: bool,
    },
}

impl Default for SourceSettings {
    fn default() -> Self {
        Self::Kubernetes {
            settings: KubeSettings::default(),
            events: DEFAULT_EVENTS,
        }
    }
}

/// Everything checked and loaded, nothing listening yet.
pub struct Prepared {
    serve: ServeSettings,
    hub: HubOptions,
    server: ServerOptions,
    management: ManagementOptions,
    context_values: Vec<(String, String)>,
    compression: CompressionSettings,
    metrics: Arc<Metrics>,
    source: Arc<dyn Source>,
    tls: Option<Arc<ReloadingTls>>,
    authz: Arc<Authorizer>,
    events: Option<EventRecorder>,
    /// The OTLP exporter and where spans go, with `--otlp-endpoint`.
    otlp: Option<(Exporter, Arc<dyn SpanSink>)>,
}

/// Checks the settings and loads what they point at.
pub async fn prepare(settings: Settings) -> Result<Prepared, ConfigError> {
    check(&settings)?;
    let Settings {
        serve,
        source,
        tls,
        authz,
        hub,
        server,
        management,
        context_values,
        compression,
        otlp,
    } = settings;
    let metrics = Arc::new(Metrics::new());
    let otlp = match otlp {
        Some(settings) => {
            let (exporter, spans) =
                Exporter::new(&settings, metrics.clone()).map_err(ConfigError::Otlp)?;
            Some((exporter, spans as Arc<dyn SpanSink>))
        }
        None => None,
    };
    let tls = load_tls(tls, &metrics)?;
    let spans = otlp.as_ref().map(|(_, spans)| spans.clone());
    let started = start_source(source, &authz, &metrics, spans).await?;
    // The authorization port, answered by the Kubernetes API when the proxy has one.
    let reviewer = started
        .kube_client
        .map(|client| Arc::new(KubeReviewer::new(client, &authz)) as Arc<dyn Reviewer>);
    let authz = Authorizer::new(authz, reviewer).map_err(ConfigError::Authz)?;
    Ok(Prepared {
        serve,
        hub,
        server,
        management,
        context_values,
        compression,
        metrics,
        source: started.source,
        tls,
        authz: Arc::new(authz),
        events: started.events,
        otlp,
    })
}

/// Combinations of settings that cannot work.
fn check(settings: &Settings) -> Result<(), ConfigError> {
    let serve = &settings.serve;
    if serve.port == serve.management_port && serve.port != 0 {
        return Err(ConfigError::SamePort(serve.port));
    }
    let client_certificates = settings
        .tls
        .as_ref()
        .is_some_and(|tls| tls.client_ca.is_some());
    if serve.sync_socket_path.is_some() && client_certificates {
        return Err(ConfigError::SocketWithoutClientCertificates);
    }
    crate::context::check_entries(&settings.context_values).map_err(ConfigError::ContextValues)?;
    Ok(())
}

/// The TLS configuration of the sync port, loaded, with its expiry reported in the metrics.
fn load_tls(
    files: Option<TlsFiles>,
    metrics: &Metrics,
) -> Result<Option<Arc<ReloadingTls>>, ConfigError> {
    let Some(files) = files else {
        return Ok(None);
    };
    let tls = ReloadingTls::load(files).map_err(ConfigError::Tls)?;
    tls.report_expiry(metrics.tls_certificate_expiry.clone());
    Ok(Some(tls))
}

/// A started source, with the Kubernetes client and Event recorder when it is the API.
struct StartedSource {
    source: Arc<dyn Source>,
    kube_client: Option<kube::Client>,
    events: Option<EventRecorder>,
}

async fn start_source(
    settings: SourceSettings,
    authz: &AuthzSettings,
    metrics: &Arc<Metrics>,
    spans: Option<Arc<dyn SpanSink>>,
) -> Result<StartedSource, ConfigError> {
    let source: Arc<dyn Source> = match settings {
        SourceSettings::Manifests(directories) => Arc::new(
            ManifestSource::start(directories, metrics.clone()).map_err(ConfigError::Manifests)?,
        ),
        SourceSettings::Upstream { settings, kube } => {
            let source = UpstreamSource::new(settings, metrics.clone(), spans)
                .map_err(ConfigError::Upstream)?;
            return Ok(StartedSource {
                source: Arc::new(source),
                kube_client: authorization_client(authz, &kube).await?,
                events: None,
            });
        }
        SourceSettings::Kubernetes { settings, events } => {
            let kubernetes = KubernetesSource::connect(settings, metrics.clone())
                .await
                .map_err(ConfigError::Kubernetes)?
                .with_spans(spans);
            let client = kubernetes.client();
            // The reporting instance is the pod, named through the downward API.
            let pod = std::env::var("POD_NAME")
                .ok()
                .filter(|name| !name.is_empty());
            return Ok(StartedSource {
                events: events.then(|| EventRecorder::new(client.clone(), pod)),
                kube_client: Some(client),
                source: Arc::new(kubernetes),
            });
        }
    };
    Ok(StartedSource {
        source,
        kube_client: None,
        events: None,
    })
}

/// The node tier's Kubernetes client, used only to authorize its own clients: with an `--authz`
/// mode and an API configuration (in-cluster, `KUBECONFIG` or `--kube-api-server`). Without a
/// configuration, client certificates are the only identity ([`Authorizer::new`] refuses the
/// settings that need more).
async fn authorization_client(
    authz: &AuthzSettings,
    kube: &KubeSettings,
) -> Result<Option<kube::Client>, ConfigError> {
    if authz.mode == AuthzMode::None {
        return Ok(None);
    }
    match crate::kubernetes::client::configure(kube).await {
        Ok(configured) => {
            tracing::info!(
                api_server = %configured.server,
                configured_by = configured.configured_by,
                "clients are authorized through the Kubernetes API"
            );
            Ok(Some(configured.client))
        }
        Err(KubeError::NoConfiguration) => Ok(None),
        Err(error) => Err(ConfigError::Kubernetes(error)),
    }
}

/// The listeners, bound.
pub struct Bound {
    prepared: Prepared,
    sync: Option<TcpListener>,
    socket: Option<UnixSocket>,
    management: TcpListener,
}

impl Prepared {
    pub async fn bind(self) -> Result<Bound, RunError> {
        let serve = &self.serve;
        let sync_addr = SocketAddr::new(serve.bind_address, serve.port);
        let sync = if serve.sync_socket_only {
            None
        } else {
            Some(bind_tcp(sync_addr, "--port", SYNC_BACKLOG)?)
        };
        let socket = match &serve.sync_socket_path {
            Some(path) => {
                Some(UnixSocket::bind(path, serve.sync_socket_mode).map_err(RunError::Socket)?)
            }
            None => None,
        };
        let management_addr = SocketAddr::new(serve.bind_address, serve.management_port);
        let management = bind_tcp(management_addr, "--management-port", MANAGEMENT_BACKLOG)?;
        Ok(Bound {
            prepared: self,
            sync,
            socket,
            management,
        })
    }
}

fn bind_tcp(addr: SocketAddr, flag: &'static str, backlog: u32) -> Result<TcpListener, RunError> {
    listen(addr, backlog).map_err(|source| RunError::Bind { addr, flag, source })
}

/// Connections the kernel may queue on the sync port before they are accepted. When every
/// client reconnects at once (a restart, a network blip), tokio's default of 1,024 overflows and
/// the kernel drops further SYNs, which clients send again only after a second; Go's listeners
/// take the kernel's maximum, as this does (Linux caps it at `net.core.somaxconn`).
const SYNC_BACKLOG: u32 = 65_535;
/// The management port sees probes and scrapes only: tokio's default backlog.
const MANAGEMENT_BACKLOG: u32 = 1024;

/// A listener on `addr` like `TcpListener::bind`, with `backlog` pending connections.
fn listen(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

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

    /// Serves until `shutdown` is cancelled; then readiness goes false, every stream ends with
    /// `UNAVAILABLE`, and the servers drain for at most the shutdown timeout.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunError> {
        let shutdown_timeout = self.prepared.serve.shutdown_timeout;
        let mut running = self.start();
        running.set_serving(true).await;
        running.log_serving();
        let early = tokio::select! {
            () = shutdown.cancelled() => None,
            result = &mut running.sync_task => Some(result),
        };
        running.set_serving(false).await;
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
            source,
            tls,
            authz,
            events,
            otlp,
            ..
        } = prepared;
        let (exporter, spans) = otlp.unzip();
        let hub = Hub::traced(source.clone(), hub_options, metrics, spans);
        if let Some(events) = events {
            hub.record_events(Arc::new(events));
        }
        let readiness = Readiness::default();
        let otlp_done = CancellationToken::new();
        let otlp_task = exporter.map(|exporter| {
            let (hub, readiness) = (hub.clone(), readiness.clone());
            let collect = move || {
                hub.metrics()
                    .collect_observed(|metrics| management::observe(metrics, &hub, &readiness))
            };
            tokio::spawn(exporter.run(collect, otlp_done.clone()))
        });
        let (health, health_service) = tonic_health::server::health_reporter();
        let management_done = CancellationToken::new();
        let management_task = tokio::spawn(management::run(
            management,
            management::router(
                hub.clone(),
                source,
                readiness.clone(),
                tonic::service::Routes::new(health_service.clone()),
            ),
            management_options,
            hub.metrics().clone(),
            management_done.clone(),
        ));
        let streams_end = CancellationToken::new();
        let drain_end = CancellationToken::new();
        let service = SyncService::new(hub, streams_end.clone())
            .with_authorizer(authz)
            .with_context_values(&context_values)
            .with_compression(compression);
        if let Some(tls) = &tls {
            tls.spawn_reloader(streams_end.clone());
        }
        let listeners = sync.map(SyncListener::Tcp).into_iter();
        let sync_task = tokio::spawn(server::run(
            listeners.chain(socket.map(SyncListener::Unix)).collect(),
            tls,
            service,
            health_service,
            server_options,
            streams_end.clone(),
            drain_end.clone(),
        ));
        Running {
            readiness,
            health,
            streams_end,
            drain_end,
            sync_task,
            management_task,
            management_done,
            otlp_task,
            otlp_done,
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
fn available(status: &serde_json::Value) -> Option<(Vec<String>, u64)> {
    let selectors = status.get("selectors")?.as_array()?;
    let selectors: Vec<String> = selectors
        .iter()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect();
    let count = status
        .get("resources")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(selectors.len() as u64);
    Some((selectors, count))
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
    readiness: Readiness,
    health: HealthReporter,
    /// Ends every sync stream with `UNAVAILABLE`.
    streams_end: CancellationToken,
    /// Closes every sync connection still open (the shutdown timeout has passed).
    drain_end: CancellationToken,
    sync_task: JoinHandle<Result<(), server::ServerError>>,
    management_task: JoinHandle<std::io::Result<()>>,
    management_done: CancellationToken,
    /// The OTLP exporter, which exports once more when `otlp_done` is cancelled.
    otlp_task: Option<JoinHandle<()>>,
    otlp_done: CancellationToken,
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

    /// Ends the streams, waits for the sync server (unless it has already ended, with `early`)
    /// for at most `timeout`, then stops the management server.
    async fn stop(
        mut self,
        early: Option<Result<Result<(), server::ServerError>, tokio::task::JoinError>>,
        timeout: Duration,
    ) -> Result<(), RunError> {
        self.streams_end.cancel();
        let result = match early {
            Some(result) => flatten(result),
            None => {
                tracing::info!(?timeout, "shutting down: ending streams with UNAVAILABLE");
                match tokio::time::timeout(timeout, &mut self.sync_task).await {
                    Ok(result) => flatten(result),
                    Err(_) => {
                        tracing::warn!("shutdown timeout reached; closing remaining connections");
                        self.drain_end.cancel();
                        // The connections end as they are next polled, which is at once.
                        match tokio::time::timeout(CLOSE_GRACE, &mut self.sync_task).await {
                            Ok(result) => flatten(result),
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
        if let Ok(Err(error)) = management {
            return Err(RunError::Management(error));
        }
        tracing::info!("stopped");
        result
    }
}

/// How long the closed connections are given to end after the shutdown timeout.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

fn flatten(
    result: Result<Result<(), server::ServerError>, tokio::task::JoinError>,
) -> Result<(), RunError> {
    match result {
        Ok(inner) => inner.map_err(RunError::from),
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests;
