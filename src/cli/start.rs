//! The flags of `start`, in one group per component (each under its own heading in `--help`
//! and `docs/cli.md`), and their conversion into that component's settings ([`Settings`]).
//!
//! Defaults are not written here: every default is a constant beside the settings type of its
//! component, which that type's `Default` uses too (a test checks that parsing an empty command
//! line gives each component's `Default`).
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use super::LogFormat;
use crate::authz::{self, AuthzSettings};
use crate::budget;
use crate::hub::{self, HubOptions};
use crate::kubernetes::KubeSettings;
use crate::management::{self, ManagementOptions};
use crate::net::tls::TlsFiles;
use crate::server::{self, ServerOptions};
use crate::settings::{self, ServeSettings, Settings, SourceSettings};
use crate::source::upstream::UpstreamSettings;
use crate::telemetry::{self, OtlpSettings};
use crate::wire::compression::{self, CompressionMode, CompressionSettings};

/// A default duration as the command line spells it (`30s`).
fn duration_text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[derive(Debug, Args)]
pub struct StartArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub authz: AuthzArgs,
    #[command(flatten)]
    pub hub: HubArgs,
    #[command(flatten)]
    pub sync: SyncArgs,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub management: ManagementArgs,
    #[command(flatten)]
    pub otlp: OtlpArgs,
}

impl From<StartArgs> for Settings {
    fn from(args: StartArgs) -> Self {
        let server = ServerOptions::from(args.server);
        let serve = ServeSettings::from(args.serve);
        let otlp = args.otlp.into_settings(serve.pod_name.clone());
        Settings {
            serve,
            source: args.source.into(),
            tls: args.tls.into_settings(),
            authz: args.authz.into(),
            hub: args.hub.into(),
            management: args.management.into_settings(&server),
            server,
            compression: args.sync.compression_settings(),
            context_values: args.sync.context_values,
            otlp,
        }
    }
}

/// Where the proxy listens ([`ServeSettings`]).
#[derive(Debug, Args)]
#[command(next_help_heading = "Listening")]
pub struct ServeArgs {
    /// Port of the gRPC sync service (flagd.sync.v1, the legacy sync.v1, and gRPC health).
    #[arg(short = 'p', long, env = "FLAGD_PROXY_PORT", default_value_t = settings::DEFAULT_PORT)]
    pub port: u16,

    /// Port of the management service: /healthz, /readyz, /metrics, /status and gRPC health.
    /// `--metrics-port`, the Go proxy's deprecated name for this flag, is accepted too.
    #[arg(
        short = 'm',
        long,
        alias = "metrics-port",
        env = "FLAGD_PROXY_MANAGEMENT_PORT",
        default_value_t = settings::DEFAULT_MANAGEMENT_PORT
    )]
    pub management_port: u16,

    /// Address both ports listen on. Use 127.0.0.1 to accept local clients only.
    #[arg(long, env = "FLAGD_PROXY_BIND_ADDRESS", default_value_t = settings::DEFAULT_BIND_ADDRESS)]
    pub bind_address: IpAddr,

    /// Also serve both sync protocols and gRPC health on a unix domain socket at this path
    /// (flagd's --sync-socket-path). A stale socket file left by a crash is replaced; the file is
    /// removed on shutdown.
    #[arg(long, value_name = "PATH", env = "FLAGD_PROXY_SYNC_SOCKET_PATH")]
    pub sync_socket_path: Option<PathBuf>,

    /// Permission bits of the unix socket file, in octal (who may connect).
    #[arg(long, value_name = "MODE", env = "FLAGD_PROXY_SYNC_SOCKET_MODE", default_value = format!("{:04o}", settings::DEFAULT_SYNC_SOCKET_MODE), value_parser = crate::net::listener::parse_mode, requires = "sync_socket_path")]
    pub sync_socket_mode: u32,

    /// Serve the sync protocols on the unix socket only, not on --port (the management port
    /// still listens).
    #[arg(
        long,
        env = "FLAGD_PROXY_SYNC_SOCKET_ONLY",
        requires = "sync_socket_path"
    )]
    pub sync_socket_only: bool,

    /// How long shutdown waits for streams to close after ending them with UNAVAILABLE.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_SHUTDOWN_TIMEOUT", default_value = duration_text(settings::DEFAULT_SHUTDOWN_TIMEOUT), value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// The name of this proxy's pod (the downward API's metadata.name): the reporting instance
    /// of the Kubernetes Events it records and its OpenTelemetry service.instance.id (the host
    /// name without it).
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    pub pod_name: Option<String>,
}

impl From<ServeArgs> for ServeSettings {
    fn from(args: ServeArgs) -> Self {
        ServeSettings {
            port: args.port,
            management_port: args.management_port,
            bind_address: args.bind_address,
            sync_socket_path: args.sync_socket_path,
            sync_socket_mode: args.sync_socket_mode,
            sync_socket_only: args.sync_socket_only,
            shutdown_timeout: args.shutdown_timeout,
            pod_name: args.pod_name.filter(|name| !name.is_empty()),
        }
    }
}

/// How the proxy logs.
#[derive(Clone, Copy, Debug, Args)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Log format.
    #[arg(short = 'z', long, env = "FLAGD_PROXY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Console)]
    pub log_format: LogFormat,

    /// Log at debug level (RUST_LOG, if set, takes precedence).
    #[arg(short = 'x', long, env = "FLAGD_PROXY_DEBUG")]
    pub debug: bool,
}

/// Where resources come from ([`SourceSettings`]): manifest files, another proxy, or the
/// Kubernetes API.
#[derive(Debug, Args)]
#[command(next_help_heading = "Source")]
pub struct SourceArgs {
    /// Serve FeatureFlag objects from YAML/JSON files under this directory instead of the
    /// Kubernetes API. Repeatable (or comma-separated in the variable). Files are watched.
    #[arg(
        long = "manifests",
        value_name = "DIR",
        env = "FLAGD_PROXY_MANIFESTS",
        value_delimiter = ','
    )]
    pub manifests: Vec<PathBuf>,

    /// Take resources from another flagd-proxy at this address (host:port) over the sync
    /// protocol instead of the Kubernetes API: a node-local tier in front of central proxies.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "FLAGD_PROXY_UPSTREAM",
        conflicts_with = "manifests"
    )]
    pub upstream: Option<String>,

    /// Connect to the upstream with TLS (system roots, or --upstream-ca-path).
    #[arg(long, env = "FLAGD_PROXY_UPSTREAM_TLS", requires = "upstream")]
    pub upstream_tls: bool,

    /// CA bundle (PEM) that signs the upstream's certificate; implies --upstream-tls.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_UPSTREAM_CA_PATH",
        requires = "upstream"
    )]
    pub upstream_ca_path: Option<PathBuf>,

    /// Kubernetes API server URL. Without it: KUBECONFIG if set, else the in-cluster configuration.
    /// With --upstream, the API is used only to authorize clients (--authz).
    #[arg(long, value_name = "URL", env = "FLAGD_PROXY_KUBE_API_SERVER")]
    pub kube_api_server: Option<String>,

    /// CA bundle (PEM) that signs the API server's certificate; with --kube-api-server.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_KUBE_CA_PATH",
        requires = "kube_api_server"
    )]
    pub kube_ca_path: Option<PathBuf>,

    /// File holding the bearer token for the API server, read again when it changes; with --kube-api-server.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_KUBE_TOKEN_PATH",
        requires = "kube_api_server"
    )]
    pub kube_token_path: Option<PathBuf>,

    /// Record Kubernetes Events on FeatureFlag resources that are served: a Warning when a new
    /// version is rejected or served with warnings (a flag flagd may not evaluate), a Normal
    /// one when it is valid again. Needs create and patch on
    /// events (events.k8s.io); the reporting instance is --pod-name. `--events=false` turns it
    /// off.
    #[arg(
        long,
        value_name = "BOOL",
        env = "FLAGD_PROXY_EVENTS",
        num_args = 0..=1,
        require_equals = true,
        default_value_t = settings::DEFAULT_EVENTS,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub events: bool,
}

impl From<SourceArgs> for SourceSettings {
    /// Manifest files when given, else the upstream when given, else the Kubernetes API.
    fn from(args: SourceArgs) -> Self {
        let kube = KubeSettings {
            api_server: args.kube_api_server,
            ca_path: args.kube_ca_path,
            token_path: args.kube_token_path,
        };
        if !args.manifests.is_empty() {
            SourceSettings::Manifests(args.manifests)
        } else if let Some(address) = args.upstream {
            SourceSettings::Upstream {
                settings: UpstreamSettings {
                    address,
                    tls: args.upstream_tls,
                    ca_path: args.upstream_ca_path,
                },
                kube,
            }
        } else {
            SourceSettings::Kubernetes {
                settings: kube,
                events: args.events,
            }
        }
    }
}

/// TLS on the sync port ([`TlsFiles`]).
#[derive(Debug, Args)]
#[command(next_help_heading = "TLS")]
pub struct TlsArgs {
    /// TLS certificate chain (PEM) for the sync port. Reloaded when the file changes.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_SERVER_CERT_PATH",
        requires = "server_key_path"
    )]
    pub server_cert_path: Option<PathBuf>,

    /// TLS private key (PEM) for the sync port. Reloaded when the file changes.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_SERVER_KEY_PATH",
        requires = "server_cert_path"
    )]
    pub server_key_path: Option<PathBuf>,

    /// CA bundle (PEM) for client certificates: when set, clients must present a certificate it signs.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_CLIENT_CA_PATH",
        requires = "server_cert_path"
    )]
    pub client_ca_path: Option<PathBuf>,
}

impl TlsArgs {
    /// The TLS files, when a certificate and key are given (the parser requires both or none).
    pub fn into_settings(self) -> Option<TlsFiles> {
        match (self.server_cert_path, self.server_key_path) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: self.client_ca_path,
            }),
            _ => None,
        }
    }
}

/// Who may read which resource ([`AuthzSettings`]).
#[derive(Debug, Args)]
#[command(next_help_heading = "Authorization")]
pub struct AuthzArgs {
    /// Who may read which resource: `none` (anyone who can connect; the Go proxy's behaviour),
    /// `namespace` (a client reads its own namespace and --authz-allow-namespaces), or `rbac`
    /// (the Kubernetes API decides with a SubjectAccessReview for `get` on the FeatureFlag).
    #[arg(long, value_enum, env = "FLAGD_PROXY_AUTHZ", default_value_t = authz::DEFAULT_MODE)]
    pub authz: authz::AuthzMode,

    /// Namespaces every identified client may read in `--authz namespace` mode.
    #[arg(
        long,
        value_name = "NS",
        env = "FLAGD_PROXY_AUTHZ_ALLOW_NAMESPACES",
        value_delimiter = ','
    )]
    pub authz_allow_namespaces: Vec<String>,

    /// Audiences a client's bearer token must be valid for (TokenReview); default: the API server's.
    #[arg(
        long,
        value_name = "AUDIENCE",
        env = "FLAGD_PROXY_AUTHZ_TOKEN_AUDIENCES",
        value_delimiter = ','
    )]
    pub authz_token_audiences: Vec<String>,

    /// Identify clients without a certificate or token by the pod that owns their source address
    /// (works with today's unmodified flagd sidecars; needs list and watch on pods).
    #[arg(long, env = "FLAGD_PROXY_AUTHZ_POD_IP")]
    pub authz_pod_ip: bool,

    /// With --authz-pod-ip: only pods scheduled on this node identify clients, and only they are
    /// watched (the node tier sets it to its own node, from the downward API's spec.nodeName).
    #[arg(
        long,
        value_name = "NODE",
        env = "FLAGD_PROXY_AUTHZ_POD_NODE",
        requires = "authz_pod_ip"
    )]
    pub authz_pod_node: Option<String>,

    /// How long authorization decisions are cached; open streams are checked again this often.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_AUTHZ_CACHE_TTL", default_value = duration_text(authz::DEFAULT_CACHE_TTL), value_parser = humantime::parse_duration)]
    pub authz_cache_ttl: Duration,
}

impl From<AuthzArgs> for AuthzSettings {
    fn from(args: AuthzArgs) -> Self {
        AuthzSettings {
            mode: args.authz,
            allow_namespaces: args.authz_allow_namespaces,
            token_audiences: args.authz_token_audiences,
            pod_ip: args.authz_pod_ip,
            pod_node: args.authz_pod_node.filter(|node| !node.is_empty()),
            cache_ttl: args.authz_cache_ttl,
        }
    }
}

/// Watches and what they may hold ([`HubOptions`]).
#[derive(Debug, Args)]
#[command(next_help_heading = "Watches")]
pub struct HubArgs {
    /// How long a resource stays watched after its last client has gone.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_IDLE_TIMEOUT", default_value = duration_text(hub::DEFAULT_IDLE_TIMEOUT), value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// The most resources watched at once; requests for further resources get RESOURCE_EXHAUSTED.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_WATCHES",
        default_value_t = hub::DEFAULT_MAX_WATCHES
    )]
    pub max_watches: usize,

    /// The largest flag configuration sent, in bytes, its flag-set metadata counted again (it is
    /// repeated in every message's sync_context). Larger resources are not pushed (clients
    /// refuse messages over 4 MiB); subscribers keep the last good version.
    #[arg(long, value_name = "BYTES", env = "FLAGD_PROXY_MAX_DOCUMENT_BYTES", default_value_t = hub::DEFAULT_MAX_DOCUMENT_BYTES)]
    pub max_document_bytes: usize,

    /// The most resources waited on that do not exist yet (the source reports them absent and
    /// they never had a version). Streams for a further such resource end with
    /// RESOURCE_EXHAUSTED and its watch stops at once; resources that exist are not affected.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_WAITING_RESOURCES",
        default_value_t = hub::DEFAULT_MAX_WAITING_RESOURCES
    )]
    pub max_waiting_resources: usize,

    /// The memory budget for what clients can make the proxy hold: versions (once each, while
    /// any stream holds them), connections and streams (at their measured size). Above it, new
    /// connections are closed and new streams get RESOURCE_EXHAUSTED; established streams keep
    /// being served. Bytes, or with a unit (512Mi, 2Gi). Default: three quarters of the
    /// container's memory limit (cgroup), else half the machine's memory. 0 means no limit.
    #[arg(long, value_name = "BYTES", env = "FLAGD_PROXY_MEMORY_BUDGET", value_parser = budget::parse_bytes)]
    pub memory_budget: Option<usize>,
}

impl From<HubArgs> for HubOptions {
    fn from(args: HubArgs) -> Self {
        HubOptions {
            idle_timeout: args.idle_timeout,
            max_watches: args.max_watches,
            max_document_bytes: args.max_document_bytes,
            max_waiting_resources: args.max_waiting_resources,
            memory_budget: args.memory_budget.unwrap_or_else(budget::default_limit),
        }
    }
}

/// What the sync services add to every message.
#[derive(Debug, Args)]
#[command(next_help_heading = "Sync protocol")]
pub struct SyncArgs {
    /// An entry for every message's sync_context and for GetMetadata, as flagd's
    /// --context-value: providers merge it into their evaluation context, so targeting rules can
    /// use it (for example region=eu). Repeatable or comma-separated; in the config file a list
    /// of key=value or a mapping. The keys proxy, proxyVersion and selector are the proxy's own.
    #[arg(long = "context-value", value_name = "KEY=VALUE", env = "FLAGD_PROXY_CONTEXT_VALUES", value_delimiter = ',', value_parser = crate::context::parse_entry)]
    pub context_values: Vec<(String, String)>,

    /// gzip for sync messages: `auto` sends the messages of at least --compression-min-bytes
    /// gzipped to every client that lists gzip in grpc-accept-encoding (each version is
    /// compressed once, for all of them); other clients, and smaller messages, go uncompressed.
    /// `off` never compresses.
    #[arg(long, value_name = "MODE", env = "FLAGD_PROXY_COMPRESSION", value_enum, default_value_t = Compression::Auto)]
    pub compression: Compression,

    /// Sync messages smaller than this many bytes are sent uncompressed.
    #[arg(long, value_name = "BYTES", env = "FLAGD_PROXY_COMPRESSION_MIN_BYTES", default_value_t = compression::DEFAULT_MIN_BYTES)]
    pub compression_min_bytes: usize,

    /// gzip level, 1 (fastest) to 9 (smallest).
    #[arg(long, value_name = "LEVEL", env = "FLAGD_PROXY_COMPRESSION_LEVEL", default_value_t = compression::DEFAULT_LEVEL, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub compression_level: u32,
}

/// `--compression`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Compression {
    Auto,
    Off,
}

impl SyncArgs {
    pub fn compression_settings(&self) -> CompressionSettings {
        CompressionSettings {
            mode: match self.compression {
                Compression::Auto => CompressionMode::Auto,
                Compression::Off => CompressionMode::Off,
            },
            min_bytes: self.compression_min_bytes,
            level: self.compression_level,
        }
    }
}

/// Connections to the sync port ([`ServerOptions`]); the keepalive and handshake settings apply
/// to the management port too.
#[derive(Debug, Args)]
#[command(next_help_heading = "Sync port connections")]
pub struct ServerArgs {
    /// Interval of HTTP/2 pings the server sends to find dead clients.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_KEEPALIVE_INTERVAL", default_value = duration_text(server::DEFAULT_KEEPALIVE_INTERVAL), value_parser = humantime::parse_duration)]
    pub keepalive_interval: Duration,

    /// How long a server ping may go unanswered before the connection is closed.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_KEEPALIVE_TIMEOUT", default_value = duration_text(server::DEFAULT_KEEPALIVE_TIMEOUT), value_parser = humantime::parse_duration)]
    pub keepalive_timeout: Duration,

    /// Accepted for compatibility with the Go flagd-proxy, where it is the shortest interval
    /// between client keepalive pings that the sync server permits (more frequent pings are
    /// answered with GOAWAY ENHANCE_YOUR_CALM). It has no effect here: this proxy never refuses
    /// client pings, at any rate, with or without an active stream, so every client the Go proxy
    /// accepts is accepted.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_KEEP_ALIVE_MIN_TIME", default_value = "30s", value_parser = humantime::parse_duration)]
    pub keep_alive_min_time: Duration,

    /// Accepted for compatibility with the Go flagd-proxy, where `false` refuses client keepalive
    /// pings on connections without an active stream. It has no effect here: this proxy never
    /// refuses client pings, at any rate, with or without an active stream. The bare flag means
    /// `true`; `=false` is accepted, as with a Go boolean flag.
    #[arg(
        long,
        value_name = "BOOL",
        env = "FLAGD_PROXY_KEEP_ALIVE_PERMIT_WITHOUT_STREAM",
        num_args = 0..=1,
        require_equals = true,
        default_value = "true",
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub keep_alive_permit_without_stream: bool,

    /// The most concurrent streams one client connection may open.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_STREAMS_PER_CONNECTION",
        default_value_t = server::DEFAULT_MAX_CONCURRENT_STREAMS
    )]
    pub max_streams_per_connection: u32,

    /// The most open connections to the sync port from one client IP address; further ones are
    /// closed at once. 0 means no limit.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_CONNECTIONS_PER_ADDRESS",
        default_value_t = server::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    )]
    pub max_connections_per_address: usize,

    /// The largest request header block accepted on the sync port, in bytes, counted as HTTP/2
    /// does (name + value + 32 per field). Larger requests get RESOURCE_EXHAUSTED; header blocks
    /// over twice this size are refused by the HTTP/2 layer (HTTP 431).
    #[arg(
        long,
        value_name = "BYTES",
        env = "FLAGD_PROXY_MAX_HEADER_BYTES",
        default_value_t = server::DEFAULT_MAX_HEADER_LIST_SIZE
    )]
    pub max_header_bytes: u32,

    /// The largest request message accepted by the sync services, in bytes. Larger requests are
    /// refused (OUT_OF_RANGE) before they are read.
    #[arg(
        long,
        value_name = "BYTES",
        env = "FLAGD_PROXY_MAX_REQUEST_BYTES",
        default_value_t = server::DEFAULT_MAX_REQUEST_BYTES
    )]
    pub max_request_bytes: usize,

    /// The most open connections to the sync port in total; further ones are closed at once
    /// (counted in flagd_proxy_rejected_requests_total{reason="max_connections"}). 0 means no
    /// limit.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_CONNECTIONS",
        default_value_t = server::DEFAULT_MAX_CONNECTIONS
    )]
    pub max_connections: usize,

    /// How long a new connection to the sync port may take to complete its TLS handshake and
    /// send the HTTP/2 connection preface before it is closed.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_HANDSHAKE_TIMEOUT", default_value = duration_text(server::DEFAULT_HANDSHAKE_TIMEOUT), value_parser = humantime::parse_duration)]
    pub handshake_timeout: Duration,

    /// How long a sync connection may stay open with no stream on it before it is closed
    /// (clients connect again when they next call). At --max-connections, the connection idle
    /// the longest is closed to make room for a new one. 0 means no idle limit.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_CONNECTION_IDLE_TIMEOUT", default_value = duration_text(server::DEFAULT_CONNECTION_IDLE_TIMEOUT), value_parser = humantime::parse_duration)]
    pub connection_idle_timeout: Duration,

    /// How long the request message of a sync call may take to arrive; then the call ends with
    /// DEADLINE_EXCEEDED.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_REQUEST_TIMEOUT", default_value = duration_text(server::DEFAULT_REQUEST_TIMEOUT), value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// The most sync requests from one client IP address whose request message has not arrived
    /// yet (each holds memory until it does, or until --request-timeout); further ones get
    /// RESOURCE_EXHAUSTED at once. 0 means no limit.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_PENDING_REQUESTS_PER_ADDRESS",
        default_value_t = server::DEFAULT_MAX_PENDING_REQUESTS_PER_ADDRESS
    )]
    pub max_pending_requests_per_address: usize,

    /// Close client connections after this age so long-lived streams spread over replicas again
    /// (for example after a rolling restart); clients reconnect and resume on the newest version.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_MAX_CONNECTION_AGE", value_parser = humantime::parse_duration)]
    pub max_connection_age: Option<Duration>,

    /// How long streams on a connection past --max-connection-age may continue before it is closed.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_MAX_CONNECTION_AGE_GRACE", default_value = duration_text(server::DEFAULT_MAX_CONNECTION_AGE_GRACE), value_parser = humantime::parse_duration, requires = "max_connection_age")]
    pub max_connection_age_grace: Duration,
}

impl From<ServerArgs> for ServerOptions {
    fn from(args: ServerArgs) -> Self {
        ServerOptions {
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
            connection_idle_timeout: (!args.connection_idle_timeout.is_zero())
                .then_some(args.connection_idle_timeout),
            request_timeout: args.request_timeout,
            max_pending_requests_per_address: args.max_pending_requests_per_address,
        }
    }
}

/// Connections to the management port ([`ManagementOptions`]).
#[derive(Debug, Args)]
#[command(next_help_heading = "Management port")]
pub struct ManagementArgs {
    /// The most open connections to the management port in total; at the limit, a new one takes
    /// the place of the connection quiet the longest, which is closed (so health probes always
    /// get in). 0 means no limit.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_MANAGEMENT_CONNECTIONS",
        default_value_t = management::DEFAULT_MAX_CONNECTIONS
    )]
    pub max_management_connections: usize,

    /// The most open connections to the management port from one client IP address; further
    /// ones are closed at once. 0 means no limit.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_MANAGEMENT_CONNECTIONS_PER_ADDRESS",
        default_value_t = management::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    )]
    pub max_management_connections_per_address: usize,
}

impl ManagementArgs {
    /// The management port's settings; it shares the keepalive and handshake settings of the
    /// sync port.
    pub fn into_settings(self, server: &ServerOptions) -> ManagementOptions {
        ManagementOptions {
            max_connections: self.max_management_connections,
            max_connections_per_address: self.max_management_connections_per_address,
            header_timeout: server.handshake_timeout,
            keepalive_interval: server.keepalive_interval,
            keepalive_timeout: server.keepalive_timeout,
        }
    }
}

/// OpenTelemetry export ([`OtlpSettings`]); off without `--otlp-endpoint`.
#[derive(Debug, Args)]
#[command(next_help_heading = "OpenTelemetry")]
pub struct OtlpArgs {
    /// Export metrics (the ones /metrics shows) and traces (a span per published version and
    /// per attempt of a watch to reach the upstream or the Kubernetes API) over OTLP/gRPC to
    /// this collector: http://HOST:PORT, or https://HOST:PORT for TLS. Off when not set;
    /// /metrics is served either way.
    #[arg(long, value_name = "URL", env = "FLAGD_PROXY_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// A header sent with every export, such as an API key. Repeatable or comma-separated.
    #[arg(
        long = "otlp-header",
        value_name = "KEY=VALUE",
        env = "FLAGD_PROXY_OTLP_HEADERS",
        value_delimiter = ',',
        value_parser = telemetry::parse_pair,
        requires = "otlp_endpoint"
    )]
    pub otlp_headers: Vec<(String, String)>,

    /// CA bundle (PEM) that signs the collector's certificate, trusted besides the system
    /// roots; with an https:// endpoint.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_OTLP_CA_FILE",
        requires = "otlp_endpoint"
    )]
    pub otlp_ca_file: Option<PathBuf>,

    /// How often metrics and the spans recorded since are exported.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_OTLP_INTERVAL", default_value = duration_text(telemetry::DEFAULT_INTERVAL), value_parser = humantime::parse_duration)]
    pub otlp_interval: Duration,

    /// A resource attribute of everything exported, added to service.name (flagd-proxy),
    /// service.instance.id (--pod-name, else the host name) and service.version, or replacing
    /// one of them. Repeatable or comma-separated.
    #[arg(
        long = "otlp-resource-attribute",
        value_name = "KEY=VALUE",
        env = "FLAGD_PROXY_OTLP_RESOURCE_ATTRIBUTES",
        value_delimiter = ',',
        value_parser = telemetry::parse_pair,
        requires = "otlp_endpoint"
    )]
    pub otlp_resource_attributes: Vec<(String, String)>,
}

impl OtlpArgs {
    /// The export settings, when an endpoint is given; `instance` is the pod's name.
    pub fn into_settings(self, instance: Option<String>) -> Option<OtlpSettings> {
        Some(OtlpSettings {
            endpoint: self.otlp_endpoint?,
            headers: self.otlp_headers,
            ca_file: self.otlp_ca_file,
            interval: self.otlp_interval,
            resource_attributes: self.otlp_resource_attributes,
            instance,
        })
    }
}
