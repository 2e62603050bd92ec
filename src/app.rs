//! Wiring: the steps that turn the proxy's [`Settings`] (see [`crate::settings`]) into a running
//! proxy: [`prepare`] checks them and loads the source and TLS, [`Prepared::bind`] listens,
//! [`Bound::run`] starts the hub and the servers, serves, and shuts down in order.
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::authz::{Authorizer, AuthzConfigError, AuthzMode, AuthzSettings, Reviewer};
use crate::budget::MemoryBudget;
use crate::hub::{HubOptions, Source, SpanSink};
use crate::kubernetes::events::EventRecorder;
use crate::kubernetes::reviews::KubeReviewer;
use crate::kubernetes::{KubeError, KubeSettings, KubernetesSource};
use crate::management::ManagementOptions;
use crate::metrics::Metrics;
use crate::net::listener::{
    MANAGEMENT_BACKLOG, SYNC_BACKLOG, SocketError, UnixSocket, check_socket_path, listen_tcp,
};
use crate::net::tls::{ReloadingTls, TlsError, TlsFiles};
use crate::server::{self, ServerOptions};
use crate::settings::{ServeSettings, Settings, SourceSettings};
use crate::source::manifests::{ManifestError, ManifestSource};
use crate::source::upstream::{UpstreamError, UpstreamSource};
use crate::state::{StateDir, StateError};
use crate::telemetry::{Exporter, OtlpError};
use crate::wire::CompressionSettings;

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
    #[error("--context-value: {0}")]
    ContextValues(String),
    #[error("{0}")]
    Otlp(#[source] OtlpError),
    #[error(
        "--sync-socket-path cannot be combined with --client-ca-path: the unix socket carries no TLS, so its clients present no certificate"
    )]
    SocketWithoutClientCertificates,
    #[error("--sync-socket-path {0}")]
    SocketPath(#[source] SocketError),
    #[error("{0}")]
    State(#[source] StateError),
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

/// Everything checked and loaded, nothing listening yet.
pub struct Prepared {
    serve: ServeSettings,
    hub: HubOptions,
    server: ServerOptions,
    management: ManagementOptions,
    context_values: Vec<(String, String)>,
    compression: CompressionSettings,
    /// The process's metrics and memory budget, handed to every part that counts or charges.
    metrics: Arc<Metrics>,
    budget: Arc<MemoryBudget>,
    source: Arc<dyn Source>,
    tls: Option<Arc<ReloadingTls>>,
    authz: Arc<Authorizer>,
    events: Option<EventRecorder>,
    /// The OTLP exporter and where spans go, with `--otlp-endpoint`.
    otlp: Option<(Exporter, Arc<dyn SpanSink>)>,
    /// Where versions are kept across restarts, with `--state-dir`.
    state: Option<StateDir>,
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
        memory,
        state,
        server,
        management,
        context_values,
        compression,
        otlp,
    } = settings;
    let state = state
        .map(StateDir::open)
        .transpose()
        .map_err(ConfigError::State)?;
    let metrics = Arc::new(Metrics::new());
    let budget = MemoryBudget::new(memory.budget, metrics.clone());
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
    // Events on the resources served, reported as this pod.
    let events = match (&started.kube_client, started.record_events) {
        (Some(client), true) => Some(EventRecorder::new(client.clone(), serve.pod_name.clone())),
        _ => None,
    };
    // The authorization port, answered by the Kubernetes API when the proxy has one.
    let reviewer = started
        .kube_client
        .map(|client| Arc::new(KubeReviewer::new(client, &authz)) as Arc<dyn Reviewer>);
    let authz = Authorizer::new(authz, reviewer, budget.clone()).map_err(ConfigError::Authz)?;
    Ok(Prepared {
        serve,
        hub,
        server,
        management,
        context_values,
        compression,
        metrics,
        budget,
        source: started.source,
        tls,
        authz: Arc::new(authz),
        events,
        otlp,
        state,
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
    if let Some(path) = &serve.sync_socket_path {
        check_socket_path(path).map_err(ConfigError::SocketPath)?;
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

/// A started source, with the Kubernetes client when the proxy has one, and whether Events are
/// to be recorded on the resources it serves (the Kubernetes source with `--events`).
struct StartedSource {
    source: Arc<dyn Source>,
    kube_client: Option<kube::Client>,
    record_events: bool,
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
                record_events: false,
            });
        }
        SourceSettings::Kubernetes { settings, events } => {
            let kubernetes = KubernetesSource::connect(settings, metrics.clone())
                .await
                .map_err(ConfigError::Kubernetes)?
                .with_spans(spans);
            return Ok(StartedSource {
                kube_client: Some(kubernetes.client()),
                source: Arc::new(kubernetes),
                record_events: events,
            });
        }
    };
    Ok(StartedSource {
        source,
        kube_client: None,
        record_events: false,
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
    listen_tcp(addr, backlog).map_err(|source| RunError::Bind { addr, flag, source })
}

mod running;

#[cfg(test)]
mod tests;
