//! The command line. Every flag has an environment variable; `docs/cli.md` is generated from
//! these definitions (`flagd-proxy generate-cli-docs`) and checked by a test.
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "flagd-proxy",
    version,
    about = "Serves Kubernetes FeatureFlag resources to flagd sidecars and in-process providers over the flagd gRPC sync protocol",
    long_about = "Serves Kubernetes FeatureFlag resources to flagd sidecars and in-process providers over the flagd gRPC sync protocol.\n\n\
                  Clients ask for a resource with the selector core.openfeature.dev/<namespace>/<name>; the proxy watches it on demand \
                  (one watch per resource, shared by all clients) and streams every change."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the proxy.
    Start(Box<StartArgs>),
    /// Print the command-line reference as Markdown (the source of docs/cli.md).
    #[command(hide = true)]
    GenerateCliDocs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Console,
    Json,
}

#[derive(Debug, Args)]
pub struct StartArgs {
    /// Port of the gRPC sync service (flagd.sync.v1, the legacy sync.v1, and gRPC health).
    #[arg(short = 'p', long, env = "FLAGD_PROXY_PORT", default_value_t = 8015)]
    pub port: u16,

    /// Port of the management service: /healthz, /readyz, /metrics, /status and gRPC health.
    #[arg(
        short = 'm',
        long,
        env = "FLAGD_PROXY_MANAGEMENT_PORT",
        default_value_t = 8016
    )]
    pub management_port: u16,

    /// Address both ports listen on. Use 127.0.0.1 to accept local clients only.
    #[arg(long, env = "FLAGD_PROXY_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub bind_address: IpAddr,

    /// Log format.
    #[arg(short = 'z', long, env = "FLAGD_PROXY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Console)]
    pub log_format: LogFormat,

    /// Log at debug level (RUST_LOG, if set, takes precedence).
    #[arg(short = 'x', long, env = "FLAGD_PROXY_DEBUG")]
    pub debug: bool,

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
    #[arg(long, value_name = "HOST:PORT", env = "FLAGD_PROXY_UPSTREAM", conflicts_with_all = ["manifests", "kube_api_server"])]
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

    /// Who may read which resource: `none` (anyone who can connect; the Go proxy's behaviour),
    /// `namespace` (a client reads its own namespace and --authz-allow-namespaces), or `rbac`
    /// (the Kubernetes API decides with a SubjectAccessReview for `get` on the FeatureFlag).
    #[arg(long, value_enum, env = "FLAGD_PROXY_AUTHZ", default_value = "none")]
    pub authz: crate::authz::AuthzMode,

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
    /// (works with today's unmodified flagd sidecars; needs list on pods).
    #[arg(long, env = "FLAGD_PROXY_AUTHZ_POD_IP")]
    pub authz_pod_ip: bool,

    /// How long authorization decisions are cached; open streams are checked again this often.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_AUTHZ_CACHE_TTL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub authz_cache_ttl: Duration,

    /// How long a resource stays watched after its last client has gone.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_IDLE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// How long shutdown waits for streams to close after ending them with UNAVAILABLE.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// The most resources watched at once; requests for further resources get RESOURCE_EXHAUSTED.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_WATCHES",
        default_value_t = 10_000
    )]
    pub max_watches: usize,

    /// The largest flag configuration sent, in bytes. Larger resources are not pushed (clients
    /// refuse messages over 4 MiB); subscribers keep the last good version.
    #[arg(long, value_name = "BYTES", env = "FLAGD_PROXY_MAX_DOCUMENT_BYTES", default_value_t = 4 * 1024 * 1024 - 4096)]
    pub max_document_bytes: usize,

    /// The most resources waited on that do not exist yet (the source reports them absent and
    /// they never had a version). Streams for a further such resource end with
    /// RESOURCE_EXHAUSTED and its watch stops at once; resources that exist are not affected.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_WAITING_RESOURCES",
        default_value_t = 1_000
    )]
    pub max_waiting_resources: usize,

    /// Interval of HTTP/2 pings the server sends to find dead clients.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub keepalive_interval: Duration,

    /// How long a server ping may go unanswered before the connection is closed.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub keepalive_timeout: Duration,

    /// The most concurrent streams one client connection may open.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_STREAMS_PER_CONNECTION",
        default_value_t = 1_000
    )]
    pub max_streams_per_connection: u32,

    /// The most open connections to the sync port from one client IP address; further ones are
    /// closed at once. 0 means no limit.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_CONNECTIONS_PER_ADDRESS",
        default_value_t = 256
    )]
    pub max_connections_per_address: usize,

    /// The largest request header block accepted on the sync port, in bytes, counted as HTTP/2
    /// does (name + value + 32 per field). Larger requests get RESOURCE_EXHAUSTED; header blocks
    /// over twice this size are refused by the HTTP/2 layer (HTTP 431).
    #[arg(
        long,
        value_name = "BYTES",
        env = "FLAGD_PROXY_MAX_HEADER_BYTES",
        default_value_t = 16 * 1024
    )]
    pub max_header_bytes: u32,

    /// The largest request message accepted by the sync services, in bytes. Larger requests are
    /// refused (OUT_OF_RANGE) before they are read.
    #[arg(
        long,
        value_name = "BYTES",
        env = "FLAGD_PROXY_MAX_REQUEST_BYTES",
        default_value_t = 64 * 1024
    )]
    pub max_request_bytes: usize,

    /// Close client connections after this age so long-lived streams spread over replicas again
    /// (for example after a rolling restart); clients reconnect and resume on the newest version.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_MAX_CONNECTION_AGE", value_parser = humantime::parse_duration)]
    pub max_connection_age: Option<Duration>,

    /// How long streams on a connection past --max-connection-age may continue before it is closed.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_MAX_CONNECTION_AGE_GRACE", default_value = "10s", value_parser = humantime::parse_duration, requires = "max_connection_age")]
    pub max_connection_age_grace: Duration,
}

/// The command-line reference as Markdown.
pub fn markdown() -> String {
    use clap::CommandFactory;
    let root = Cli::command();
    let mut out = String::from(
        "# Command-line reference\n\n<!-- Generated by `flagd-proxy generate-cli-docs`; a test keeps it in sync. -->\n\n",
    );
    out.push_str(&format!(
        "`{}` {}\n\n",
        root.get_name(),
        root.get_about().map(|a| a.to_string()).unwrap_or_default()
    ));
    for sub in root.get_subcommands().filter(|s| !s.is_hide_set()) {
        out.push_str(&format!(
            "## `flagd-proxy {}`\n\n{}\n\n",
            sub.get_name(),
            sub.get_about().map(|a| a.to_string()).unwrap_or_default()
        ));
        out.push_str(
            "| Flag | Environment variable | Default | Description |\n|---|---|---|---|\n",
        );
        for arg in sub.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" || long == "version" {
                continue;
            }
            let flag = match arg.get_short() {
                Some(short) => format!("`-{short}`, `--{long}`"),
                None => format!("`--{long}`"),
            };
            let env = arg
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            let default = if defaults.is_empty() {
                String::new()
            } else {
                format!("`{}`", defaults.join(","))
            };
            let mut help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            let values: Vec<String> = arg
                .get_possible_values()
                .iter()
                .map(|v| format!("`{}`", v.get_name()))
                .collect();
            if !values.is_empty()
                && !arg.is_positional()
                && arg.get_num_args().is_none_or(|n| n.takes_values())
                && !values.iter().any(|v| v == "`true`")
            {
                help.push_str(&format!(" One of {}.", values.join(", ")));
            }
            out.push_str(&format!(
                "| {flag} | {env} | {default} | {} |\n",
                help.replace('\n', " ").replace('|', "\\|")
            ));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn go_proxy_command_lines_parse() {
        let cli = Cli::try_parse_from([
            "flagd-proxy",
            "start",
            "--management-port",
            "8016",
            "--debug",
        ])
        .expect("parses");
        let Command::Start(args) = cli.command else {
            panic!("start")
        };
        assert_eq!(
            (args.port, args.management_port, args.debug),
            (8015, 8016, true)
        );
        let cli = Cli::try_parse_from([
            "flagd-proxy",
            "start",
            "-p",
            "9000",
            "-m",
            "9001",
            "-z",
            "json",
            "-x",
        ])
        .expect("parses");
        let Command::Start(args) = cli.command else {
            panic!("start")
        };
        assert_eq!(
            (args.port, args.management_port, args.log_format),
            (9000, 9001, LogFormat::Json)
        );
    }

    #[test]
    fn docs_match_the_definitions() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md");
        let generated = markdown();
        if std::env::var_os("FLAGD_PROXY_UPDATE_DOCS").is_some() {
            std::fs::write(&path, &generated).expect("write docs/cli.md");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/cli.md is out of date: run `cargo run -- generate-cli-docs > docs/cli.md` (or FLAGD_PROXY_UPDATE_DOCS=1 cargo test)"
        );
    }
}
