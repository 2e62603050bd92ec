//! The proxy's settings: everything it is configured with, one value per component, built once
//! from the command line (see [`crate::cli::StartArgs`]) and run by [`crate::app`].
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use crate::authz::AuthzSettings;
use crate::hub::HubOptions;
use crate::kubernetes::KubeSettings;
use crate::management::ManagementOptions;
use crate::net::tls::TlsFiles;
use crate::server::ServerOptions;
use crate::source::upstream::UpstreamSettings;
use crate::state::StateSettings;
use crate::telemetry::OtlpSettings;
use crate::wire::CompressionSettings;

/// Everything the proxy is configured with, one settings value per component.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub serve: ServeSettings,
    pub source: SourceSettings,
    /// TLS on the sync port; plaintext without it.
    pub tls: Option<TlsFiles>,
    pub authz: AuthzSettings,
    pub hub: HubOptions,
    pub memory: MemorySettings,
    /// Where the last version of each resource is kept across restarts (`--state-dir`); off
    /// without it.
    pub state: Option<StateSettings>,
    pub server: ServerOptions,
    pub management: ManagementOptions,
    /// Entries of every message's sync context (`--context-value`).
    pub context_values: Vec<(String, String)>,
    /// gzip for clients that accept it (`--compression`).
    pub compression: CompressionSettings,
    /// OpenTelemetry export (`--otlp-endpoint`); off without it.
    pub otlp: Option<OtlpSettings>,
}

/// What clients may make the proxy hold (`--memory-budget`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySettings {
    /// The process's memory budget in bytes (0: no limit); see [`crate::budget::MemoryBudget`].
    pub budget: usize,
}

impl Default for MemorySettings {
    fn default() -> Self {
        Self {
            budget: crate::budget::default_limit(),
        }
    }
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
/// Default of [`ServeSettings::drain_delay`]: long enough for a Service to stop routing to a
/// terminating pod (and for a replacement to become ready), short of the providers' grace period
/// before they report an error (10 s) and of a pod's termination grace period (30 s) with the
/// shutdown timeout added.
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(5);
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
    /// How long, after a stop signal, the open streams keep being served (no new connection is
    /// accepted) before they are ended with `UNAVAILABLE`; cut short when no stream is open or a
    /// second stop signal arrives.
    pub drain_delay: Duration,
    /// The proxy's pod, for the Events it records and its OpenTelemetry resource.
    pub pod_name: Option<String>,
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
            drain_delay: DEFAULT_DRAIN_DELAY,
            pod_name: None,
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
