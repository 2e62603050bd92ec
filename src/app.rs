//! Wiring: turns the `start` arguments into a running proxy (source, hub, servers) and shuts it
//! down in order.
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::authz::{Authorizer, AuthzConfigError, AuthzSettings};
use crate::cli::StartArgs;
use crate::hub::Source;
use crate::hub::{Hub, HubOptions};
use crate::listener::{SocketError, SyncListener, UnixSocket};
use crate::management::{self, Readiness};
use crate::metrics::Metrics;
use crate::server::{self, ServerOptions};
use crate::source::events::EventRecorder;
use crate::source::kubernetes::{KubeError, KubeSettings, KubernetesSource};
use crate::source::manifests::{ManifestError, ManifestSource};
use crate::source::upstream::{UpstreamError, UpstreamSettings, UpstreamSource};
use crate::tls::{ReloadingTls, TlsError, TlsFiles};
use crate::wire::SyncService;

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

/// Everything checked and loaded, nothing listening yet.
pub struct Prepared {
    args: StartArgs,
    metrics: Arc<Metrics>,
    source: Arc<dyn Source>,
    tls: Option<Arc<ReloadingTls>>,
    authz: Arc<Authorizer>,
    events: Option<EventRecorder>,
}

/// Checks the arguments and loads what they point at.
pub async fn prepare(args: StartArgs) -> Result<Prepared, ConfigError> {
    if args.port == args.management_port && args.port != 0 {
        return Err(ConfigError::SamePort(args.port));
    }
    if args.sync_socket_path.is_some() && args.client_ca_path.is_some() {
        return Err(ConfigError::SocketWithoutClientCertificates);
    }
    let metrics = Arc::new(Metrics::new());
    let tls = match (&args.server_cert_path, &args.server_key_path) {
        (Some(cert), Some(key)) => Some(
            ReloadingTls::load(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.client_ca_path.clone(),
            })
            .map_err(ConfigError::Tls)?,
        ),
        _ => None,
    };
    if let Some(tls) = &tls {
        tls.report_expiry(metrics.tls_certificate_expiry.clone());
    }
    let mut kube_client = None;
    let source: Arc<dyn Source> = if !args.manifests.is_empty() {
        Arc::new(
            ManifestSource::start(args.manifests.clone(), metrics.clone())
                .map_err(ConfigError::Manifests)?,
        )
    } else if let Some(address) = &args.upstream {
        let settings = UpstreamSettings {
            address: address.clone(),
            tls: args.upstream_tls,
            ca_path: args.upstream_ca_path.clone(),
        };
        Arc::new(UpstreamSource::new(settings, metrics.clone()).map_err(ConfigError::Upstream)?)
    } else {
        let settings = KubeSettings {
            api_server: args.kube_api_server.clone(),
            ca_path: args.kube_ca_path.clone(),
            token_path: args.kube_token_path.clone(),
        };
        let kubernetes = KubernetesSource::connect(settings, metrics.clone())
            .await
            .map_err(ConfigError::Kubernetes)?;
        kube_client = Some(kubernetes.client());
        Arc::new(kubernetes)
    };
    let events = match &kube_client {
        Some(client) if args.events => Some(EventRecorder::new(
            client.clone(),
            std::env::var("POD_NAME")
                .ok()
                .filter(|name| !name.is_empty()),
        )),
        _ => None,
    };
    let authz = Authorizer::new(
        AuthzSettings {
            mode: args.authz,
            allow_namespaces: args.authz_allow_namespaces.clone(),
            token_audiences: args.authz_token_audiences.clone(),
            pod_ip: args.authz_pod_ip,
            cache_ttl: args.authz_cache_ttl,
        },
        kube_client,
    )
    .map_err(ConfigError::Authz)?;
    Ok(Prepared {
        args,
        metrics,
        source,
        tls,
        authz: Arc::new(authz),
        events,
    })
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
        let sync_addr = SocketAddr::new(self.args.bind_address, self.args.port);
        let sync = if self.args.sync_socket_only {
            None
        } else {
            Some(bind_tcp(sync_addr, "--port", SYNC_BACKLOG)?)
        };
        let socket = match &self.args.sync_socket_path {
            Some(path) => {
                Some(UnixSocket::bind(path, self.args.sync_socket_mode).map_err(RunError::Socket)?)
            }
            None => None,
        };
        let management_addr = SocketAddr::new(self.args.bind_address, self.args.management_port);
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
        let Bound {
            prepared,
            sync,
            socket,
            management,
        } = self;
        let Prepared {
            args,
            metrics,
            source,
            tls,
            authz,
            events,
        } = prepared;
        let hub = Hub::new(
            source.clone(),
            HubOptions {
                idle_timeout: args.idle_timeout,
                max_watches: args.max_watches,
                max_document_bytes: args.max_document_bytes,
                max_waiting_resources: args.max_waiting_resources,
            },
            metrics,
        );
        if let Some(events) = events {
            hub.record_events(Arc::new(events));
        }
        let readiness = Readiness::default();
        let (health, health_service) = tonic_health::server::health_reporter();
        let streams_end = CancellationToken::new();
        let service = SyncService::new(hub.clone(), streams_end.clone())
            .with_authorizer(authz)
            .with_context_values(&args.context_values);
        if let Some(tls) = &tls {
            tls.spawn_reloader(streams_end.clone());
        }
        let sync_addr = sync.as_ref().and_then(|sync| sync.local_addr().ok());
        let sync_socket = socket.as_ref().map(|socket| socket.path().to_owned());
        let listeners: Vec<SyncListener> = sync
            .map(SyncListener::Tcp)
            .into_iter()
            .chain(socket.map(SyncListener::Unix))
            .collect();
        let management_addr = management.local_addr().ok();
        let management_done = CancellationToken::new();
        let management_metrics = hub.metrics().clone();
        let router = management::router(
            hub,
            source.clone(),
            readiness.clone(),
            tonic::service::Routes::new(health_service.clone()),
        );
        let management_options = management::ManagementOptions {
            max_connections: args.max_management_connections,
            max_connections_per_address: args.max_management_connections_per_address,
            header_timeout: args.handshake_timeout,
            keepalive_interval: args.keepalive_interval,
            keepalive_timeout: args.keepalive_timeout,
        };
        let management_task = tokio::spawn(management::run(
            management,
            router,
            management_options,
            management_metrics,
            management_done.clone(),
        ));
        let options = ServerOptions {
            keepalive_interval: args.keepalive_interval,
            keepalive_timeout: args.keepalive_timeout,
            max_concurrent_streams: args.max_streams_per_connection,
            max_header_list_size: args.max_header_bytes,
            max_request_bytes: args.max_request_bytes,
            max_connections_per_address: args.max_connections_per_address,
            max_connection_age: args
                .max_connection_age
                .map(|age| (age, args.max_connection_age_grace)),
            max_connections: args.max_connections,
            handshake_timeout: args.handshake_timeout,
            request_timeout: args.request_timeout,
            max_pending_requests_per_address: args.max_pending_requests_per_address,
        };
        let mut sync_task = tokio::spawn(server::run(
            listeners,
            tls.clone(),
            service,
            health_service,
            options,
            streams_end.clone(),
        ));

        health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        health
            .set_service_status(
                "flagd.sync.v1.FlagSyncService",
                tonic_health::ServingStatus::Serving,
            )
            .await;
        health
            .set_service_status(
                "sync.v1.FlagSyncService",
                tonic_health::ServingStatus::Serving,
            )
            .await;
        readiness.set(true);
        tracing::info!(
            sync = ?sync_addr,
            ?sync_socket,
            management = ?management_addr,
            tls = tls.is_some(),
            source = source.name(),
            "flagd-proxy is serving"
        );

        let early = tokio::select! {
            () = shutdown.cancelled() => None,
            result = &mut sync_task => Some(result),
        };
        readiness.set(false);
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        health
            .set_service_status(
                "flagd.sync.v1.FlagSyncService",
                tonic_health::ServingStatus::NotServing,
            )
            .await;
        health
            .set_service_status(
                "sync.v1.FlagSyncService",
                tonic_health::ServingStatus::NotServing,
            )
            .await;
        streams_end.cancel();
        let result = match early {
            Some(result) => flatten(result),
            None => {
                tracing::info!(timeout = ?args.shutdown_timeout, "shutting down: ending streams with UNAVAILABLE");
                match tokio::time::timeout(args.shutdown_timeout, &mut sync_task).await {
                    Ok(result) => flatten(result),
                    Err(_) => {
                        tracing::warn!("shutdown timeout reached; closing remaining connections");
                        sync_task.abort();
                        Ok(())
                    }
                }
            }
        };
        management_done.cancel();
        if let Ok(Err(error)) = management_task.await {
            return Err(RunError::Management(error));
        }
        tracing::info!("stopped");
        result
    }
}

fn flatten(
    result: Result<Result<(), server::ServerError>, tokio::task::JoinError>,
) -> Result<(), RunError> {
    match result {
        Ok(inner) => inner.map_err(RunError::from),
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(_) => Ok(()),
    }
}
