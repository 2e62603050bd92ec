//! The flags of connections to both ports: the sync port's keepalive, limits and timeouts
//! (`Sync port connections`, [`ServerOptions`]) and the management port's connection limits
//! (`Management port`, [`ManagementOptions`]), which share the sync port's keepalive and
//! handshake settings.
use std::time::Duration;

use clap::{ArgAction, Args};

use super::duration_text;
use crate::management::{self, ManagementOptions};
use crate::server::{self, ServerOptions};

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

    /// The most distinct resources the streams and calls from one client IP address (from one
    /// connection, for those without an address such as the unix socket's) may name at once;
    /// a stream or call for one more gets RESOURCE_EXHAUSTED (more streams for resources it
    /// names already are not limited). 0 means no limit. Default: 100 with --upstream (a pod
    /// names a few resources), no limit otherwise (a central proxy's clients include node
    /// proxies, each naming every resource its node uses).
    #[arg(long, value_name = "N", env = "FLAGD_PROXY_MAX_RESOURCES_PER_ADDRESS")]
    pub max_resources_per_address: Option<usize>,

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
        args.into_options(false)
    }
}

impl ServerArgs {
    /// The sync port's settings; `node_tier` (`--upstream`) gives the limits their defaults
    /// for a node tier.
    pub fn into_options(self, node_tier: bool) -> ServerOptions {
        let default_resources_per_address = if node_tier {
            server::NODE_TIER_MAX_RESOURCES_PER_ADDRESS
        } else {
            ServerOptions::default().max_resources_per_address
        };
        ServerOptions {
            keepalive_interval: self.keepalive_interval,
            keepalive_timeout: self.keepalive_timeout,
            max_concurrent_streams: self.max_streams_per_connection,
            max_header_list_size: self.max_header_bytes,
            max_request_bytes: self.max_request_bytes,
            max_connections_per_address: self.max_connections_per_address,
            max_connection_age: self
                .max_connection_age
                .map(|age| (age, self.max_connection_age_grace)),
            max_connections: self.max_connections,
            handshake_timeout: self.handshake_timeout,
            connection_idle_timeout: (!self.connection_idle_timeout.is_zero())
                .then_some(self.connection_idle_timeout),
            request_timeout: self.request_timeout,
            max_pending_requests_per_address: self.max_pending_requests_per_address,
            max_resources_per_address: self
                .max_resources_per_address
                .unwrap_or(default_resources_per_address),
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
