//! The flags of where the proxy listens (`Listening`: ports, address, unix socket, drain and
//! shutdown, pod name) and how it logs (`Logging`); the listening ones become [`ServeSettings`].
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::duration_text;
use crate::cli::LogFormat;
use crate::settings::{self, ServeSettings};

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

    /// After SIGTERM, SIGINT or SIGQUIT: how long open streams keep being served, with updates,
    /// before they end with UNAVAILABLE and their connections get GOAWAY. No new connection is
    /// accepted meanwhile and readiness fails, so clients reconnect to another replica. Ends at
    /// once when no stream is open or a second stop signal arrives.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_DRAIN_DELAY", default_value = duration_text(settings::DEFAULT_DRAIN_DELAY), value_parser = humantime::parse_duration)]
    pub drain_delay: Duration,

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
            drain_delay: args.drain_delay,
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
