//! The command line. Every flag has an environment variable; `docs/cli.md` is generated from
//! these definitions (`flagd-proxy generate-cli-docs`) and checked by a test.
//!
//! `--config FILE` supplies values for the flags of `start` from a YAML or JSON file, as the Go
//! flagd-proxy's `--config` does: a flag given on the command line or through its environment
//! variable takes precedence over the file, and the file over the default. The file's values
//! go through the same parser as the command line ([`parse_from`]).
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{
    ArgAction, ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum,
};

mod config_file;

pub use config_file::ConfigFileError;

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
    /// Read values for the flags of `start` from this YAML or JSON file (JSON when the name ends
    /// in .json): a mapping from long flag names to values, such as `port: 8015`,
    /// `log-format: json` or `manifests: [a, b]`. A flag given on the command line or through its
    /// environment variable takes precedence over the file. Only this file is read; no default
    /// location is searched.
    #[arg(long, global = true, value_name = "FILE", env = "FLAGD_PROXY_CONFIG")]
    pub config: Option<PathBuf>,

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
    /// `--metrics-port`, the Go proxy's deprecated name for this flag, is accepted too.
    #[arg(
        short = 'm',
        long,
        alias = "metrics-port",
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

    /// The most open connections to the sync port in total; further ones are closed at once
    /// (counted in flagd_proxy_rejected_requests_total{reason="max_connections"}). 0 means no
    /// limit.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_CONNECTIONS",
        default_value_t = 16_384
    )]
    pub max_connections: usize,

    /// How long a new connection to the sync port may take to complete its TLS handshake and
    /// send the HTTP/2 connection preface before it is closed.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub handshake_timeout: Duration,

    /// How long the request message of a sync call may take to arrive; then the call ends with
    /// DEADLINE_EXCEEDED.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// The most sync requests from one client IP address whose request message has not arrived
    /// yet (each holds memory until it does, or until --request-timeout); further ones get
    /// RESOURCE_EXHAUSTED at once. 0 means no limit.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_PENDING_REQUESTS_PER_ADDRESS",
        default_value_t = 1_000
    )]
    pub max_pending_requests_per_address: usize,

    /// The most open connections to the management port in total; further ones are closed at
    /// once. 0 means no limit.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_MANAGEMENT_CONNECTIONS",
        default_value_t = 256
    )]
    pub max_management_connections: usize,

    /// The most open connections to the management port from one client IP address; further
    /// ones are closed at once. 0 means no limit.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_MANAGEMENT_CONNECTIONS_PER_ADDRESS",
        default_value_t = 32
    )]
    pub max_management_connections_per_address: usize,

    /// Close client connections after this age so long-lived streams spread over replicas again
    /// (for example after a rolling restart); clients reconnect and resume on the newest version.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_MAX_CONNECTION_AGE", value_parser = humantime::parse_duration)]
    pub max_connection_age: Option<Duration>,

    /// How long streams on a connection past --max-connection-age may continue before it is closed.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_MAX_CONNECTION_AGE_GRACE", default_value = "10s", value_parser = humantime::parse_duration, requires = "max_connection_age")]
    pub max_connection_age_grace: Duration,

    /// An entry for every message's sync_context and for GetMetadata, as flagd's
    /// --context-value: providers merge it into their evaluation context, so targeting rules can
    /// use it (for example region=eu). Repeatable or comma-separated; in the config file a list
    /// of key=value or a mapping. The keys proxy, proxyVersion and selector are the proxy's own.
    #[arg(long = "context-value", value_name = "KEY=VALUE", env = "FLAGD_PROXY_CONTEXT_VALUES", value_delimiter = ',', value_parser = crate::context::parse_entry)]
    pub context_values: Vec<(String, String)>,

    /// Also serve both sync protocols and gRPC health on a unix domain socket at this path
    /// (flagd's --sync-socket-path). A stale socket file left by a crash is replaced; the file is
    /// removed on shutdown.
    #[arg(long, value_name = "PATH", env = "FLAGD_PROXY_SYNC_SOCKET_PATH")]
    pub sync_socket_path: Option<PathBuf>,

    /// Permission bits of the unix socket file, in octal (who may connect).
    #[arg(long, value_name = "MODE", env = "FLAGD_PROXY_SYNC_SOCKET_MODE", default_value = "0660", value_parser = crate::listener::parse_mode, requires = "sync_socket_path")]
    pub sync_socket_mode: u32,

    /// Serve the sync protocols on the unix socket only, not on --port (the management port
    /// still listens).
    #[arg(
        long,
        env = "FLAGD_PROXY_SYNC_SOCKET_ONLY",
        requires = "sync_socket_path"
    )]
    pub sync_socket_only: bool,

    /// Record Kubernetes Events on FeatureFlag resources that are served: a Warning when a new
    /// version is rejected, a Normal one when it is valid again. Needs create and patch on
    /// events (events.k8s.io); the reporting instance is the POD_NAME environment variable (the
    /// pod name, from the downward API). `--events=false` turns it off.
    #[arg(
        long,
        value_name = "BOOL",
        env = "FLAGD_PROXY_EVENTS",
        num_args = 0..=1,
        require_equals = true,
        default_value = "true",
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub events: bool,
}

/// Why the command line (with its config file) gives no [`Cli`].
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Refused by the command-line parser, or a request for help or the version (see
    /// [`clap::Error::use_stderr`]).
    #[error(transparent)]
    Clap(#[from] clap::Error),
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),
}

/// Parses the command line, applying the file given with `--config` (or `FLAGD_PROXY_CONFIG`)
/// to the flags of `start` that are set neither on the command line nor through their
/// environment variables.
///
/// Each value in the file becomes `--<flag>=<value>` after the given arguments (one per element
/// of a list for repeatable flags), so the command-line parser validates it as usual.
pub fn parse_from<I, T>(args: I) -> Result<Cli, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let command = Cli::command();
    let (matches, incomplete) = match command.clone().try_get_matches_from(&args) {
        Ok(matches) => (matches, None),
        // A flag on the command line may require another that the file gives (--server-cert-path
        // needs --server-key-path): find the file from what was given, then decide.
        Err(error) if error.kind() == ErrorKind::MissingRequiredArgument => {
            match command
                .clone()
                .ignore_errors(true)
                .try_get_matches_from(&args)
            {
                Ok(matches) if config_for_start(&matches).is_some() => (matches, Some(error)),
                _ => return Err(error.into()),
            }
        }
        Err(error) => return Err(error.into()),
    };
    let Some((start, path)) = config_for_start(&matches) else {
        return Ok(Cli::from_arg_matches(&matches)?);
    };
    let start_command = command
        .find_subcommand("start")
        .expect("the start subcommand exists");
    let settings = config_file::read(&path, start_command, start)?;
    if settings.is_empty() {
        return match incomplete {
            Some(error) => Err(error.into()),
            None => Ok(Cli::from_arg_matches(&matches)?),
        };
    }

    // Before a `--` terminator, if any, so that the values are still read as flags.
    let at = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut full = args[..at].to_vec();
    full.extend(settings.iter().flat_map(|s| s.arguments.iter().cloned()));
    full.extend_from_slice(&args[at..]);
    match command.try_get_matches_from(full) {
        Ok(matches) => Ok(Cli::from_arg_matches(&matches)?),
        // Still missing what the command line lacked: not the file's doing.
        Err(error)
            if incomplete.is_some() && error.kind() == ErrorKind::MissingRequiredArgument =>
        {
            Err(error.into())
        }
        Err(source) => Err(config_file::rejected(path, source, &settings).into()),
    }
}

/// The matches of `start` and the config file, when `start` runs with one.
fn config_for_start(matches: &ArgMatches) -> Option<(&ArgMatches, PathBuf)> {
    let start = matches.subcommand_matches("start")?;
    let path = start
        .get_one::<PathBuf>("config")
        .or_else(|| matches.get_one::<PathBuf>("config"))?;
    Some((start, path.clone()))
}

/// The command-line reference as Markdown.
pub fn markdown() -> String {
    let root = Cli::command();
    let mut out = String::from(
        "# Command-line reference\n\n<!-- Generated by `flagd-proxy generate-cli-docs`; a test keeps it in sync. -->\n\n",
    );
    out.push_str(&format!(
        "`{}` {}\n\n",
        root.get_name(),
        root.get_about().map(|a| a.to_string()).unwrap_or_default()
    ));
    out.push_str("## Global flags\n\nAccepted before or after the subcommand.\n\n");
    markdown_table(&mut out, &root);
    for sub in root.get_subcommands().filter(|s| !s.is_hide_set()) {
        out.push_str(&format!(
            "## `flagd-proxy {}`\n\n{}\n\n",
            sub.get_name(),
            sub.get_about().map(|a| a.to_string()).unwrap_or_default()
        ));
        markdown_table(&mut out, sub);
    }
    out
}

/// The table of a command's own flags (not those it inherits).
fn markdown_table(out: &mut String, command: &clap::Command) {
    out.push_str("| Flag | Environment variable | Default | Description |\n|---|---|---|---|\n");
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" || long == "version" {
            continue;
        }
        let mut flag = match arg.get_short() {
            Some(short) => format!("`-{short}`, `--{long}`"),
            None => format!("`--{long}`"),
        };
        if let Some(aliases) = arg.get_all_aliases() {
            let aliases: Vec<String> = aliases.iter().map(|a| format!("`--{a}`")).collect();
            flag.push_str(&format!(" (alias {})", aliases.join(", ")));
        }
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

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    /// A config file with the given extension and text, removed when dropped.
    fn config_file(extension: &str, text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::Builder::new()
            .suffix(&format!(".{extension}"))
            .tempfile()
            .expect("create a temporary file");
        std::io::Write::write_all(&mut file, text.as_bytes()).expect("write the config file");
        file
    }

    fn parse(args: &[&OsStr]) -> Result<Cli, CliError> {
        parse_from(std::iter::once(OsStr::new("flagd-proxy")).chain(args.iter().copied()))
    }

    fn start_args(cli: Cli) -> StartArgs {
        let Command::Start(args) = cli.command else {
            panic!("expected start")
        };
        *args
    }

    /// `start --config <file> <extra...>` with a file holding `text`.
    fn start_with_config(extension: &str, text: &str, extra: &[&str]) -> Result<StartArgs, String> {
        let file = config_file(extension, text);
        let mut args = vec![
            OsStr::new("start"),
            OsStr::new("--config"),
            file.path().as_os_str(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        parse(&args).map(start_args).map_err(|error| {
            let message = error.to_string();
            assert!(
                message.contains(&file.path().display().to_string()),
                "the message names the file: {message}"
            );
            message
        })
    }

    #[test]
    fn go_proxy_compatibility_flags_parse() {
        let args = |line: &[&str]| {
            start_args(
                Cli::try_parse_from(std::iter::once("flagd-proxy").chain(line.iter().copied()))
                    .expect("parses"),
            )
        };
        assert_eq!(
            args(&["start", "--metrics-port", "9100"]).management_port,
            9100
        );
        assert_eq!(
            args(&["start", "--metrics-port=9100"]).management_port,
            9100
        );
        let given = args(&[
            "start",
            "--keep-alive-min-time",
            "10s",
            "--keep-alive-permit-without-stream=false",
        ]);
        assert_eq!(
            (
                given.keep_alive_min_time,
                given.keep_alive_permit_without_stream
            ),
            (Duration::from_secs(10), false)
        );
        let bare = args(&["start", "--keep-alive-permit-without-stream", "-p", "9000"]);
        assert!(bare.keep_alive_permit_without_stream);
        assert_eq!(bare.port, 9000);
        let defaults = args(&["start"]);
        assert_eq!(
            (
                defaults.keep_alive_min_time,
                defaults.keep_alive_permit_without_stream
            ),
            (Duration::from_secs(30), true)
        );
        // As with a Go boolean flag, a value needs `=`.
        assert!(
            Cli::try_parse_from([
                "flagd-proxy",
                "start",
                "--keep-alive-permit-without-stream",
                "false"
            ])
            .is_err()
        );
    }

    #[test]
    fn config_flag_is_accepted_before_and_after_start() {
        let file = config_file("yaml", "port: 9000\n");
        let path = file.path().as_os_str();
        for line in [
            vec![OsStr::new("--config"), path, OsStr::new("start")],
            vec![OsStr::new("start"), OsStr::new("--config"), path],
            vec![
                OsStr::new("start"),
                OsStr::new("--config"),
                path,
                OsStr::new("--"),
            ],
        ] {
            let cli = parse(&line).expect("parses");
            assert_eq!(cli.config.as_deref(), Some(file.path()), "{line:?}");
            assert_eq!(start_args(cli).port, 9000, "{line:?}");
        }
    }

    #[test]
    fn config_file_values_apply() {
        let args = start_with_config(
            "yaml",
            "# flagd-proxy\n\
             port: 9000\n\
             management-port: 9001\n\
             log-format: json\n\
             debug: true\n\
             manifests: [a, b]\n\
             keepalive-interval: 10s\n\
             max-watches: 5\n\
             keep-alive-min-time: 1m\n\
             keep-alive-permit-without-stream: false\n",
            &[],
        )
        .expect("parses");
        assert_eq!(
            (args.port, args.management_port, args.log_format, args.debug),
            (9000, 9001, LogFormat::Json, true)
        );
        assert_eq!(args.manifests, [PathBuf::from("a"), PathBuf::from("b")]);
        assert_eq!(args.keepalive_interval, Duration::from_secs(10));
        assert_eq!(args.max_watches, 5);
        assert_eq!(args.keep_alive_min_time, Duration::from_secs(60));
        assert!(!args.keep_alive_permit_without_stream);
    }

    #[test]
    fn json_config_file_values_apply() {
        let args = start_with_config(
            "json",
            r#"{"port": 9000, "metrics-port": 9100, "manifests": ["a", "b"], "upstream-tls": false}"#,
            &[],
        )
        .expect("parses");
        assert_eq!((args.port, args.management_port), (9000, 9100));
        assert_eq!(args.manifests, [PathBuf::from("a"), PathBuf::from("b")]);
        assert!(!args.upstream_tls);
    }

    #[test]
    fn config_file_details() {
        // Keys are case-insensitive; a single value for a repeatable flag; an empty file.
        let args = start_with_config("yml", "Port: 9000\nmanifests: a\n", &[]).expect("parses");
        assert_eq!(args.port, 9000);
        assert_eq!(args.manifests, [PathBuf::from("a")]);
        let args = start_with_config("yaml", "# nothing yet\n", &[]).expect("parses");
        assert_eq!((args.port, args.management_port), (8015, 8016));
        // A file without an extension is YAML.
        let args = start_with_config("", "port: 9000\n", &[]).expect("parses");
        assert_eq!(args.port, 9000);
    }

    #[test]
    fn command_line_beats_config_file() {
        let text = "port: 9000\nmanagement-port: 9001\nmanifests: [a, b]\nlog-format: json\n";
        let args =
            start_with_config("yaml", text, &["-p", "7000", "--manifests", "c"]).expect("parses");
        assert_eq!((args.port, args.management_port), (7000, 9001));
        assert_eq!(args.manifests, [PathBuf::from("c")]);
        assert_eq!(args.log_format, LogFormat::Json);
        // The Go name counts as the command line too.
        let args = start_with_config("yaml", text, &["--metrics-port", "7001"]).expect("parses");
        assert_eq!((args.port, args.management_port), (9000, 7001));
    }

    /// Runs in a child process of the test binary, so that no test changes the environment of
    /// the process the other tests run in.
    #[test]
    fn environment_beats_config_file() {
        const CHILD: &str = "FLAGD_PROXY_TEST_ENVIRONMENT_CHILD";
        if std::env::var_os(CHILD).is_some() {
            // The config file comes through FLAGD_PROXY_CONFIG, the port through FLAGD_PROXY_PORT.
            let args = start_args(parse(&[OsStr::new("start")]).expect("parses"));
            assert_eq!((args.port, args.management_port), (7000, 9001));
            let args = start_args(
                parse(&[OsStr::new("start"), OsStr::new("-p"), OsStr::new("6000")])
                    .expect("parses"),
            );
            assert_eq!((args.port, args.management_port), (6000, 9001));
            return;
        }
        let file = config_file("yaml", "port: 9000\nmanagement-port: 9001\n");
        let name = module_path!()
            .split_once("::")
            .map_or(module_path!(), |(_, path)| path);
        let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                &format!("{name}::environment_beats_config_file"),
                "--exact",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("FLAGD_PROXY_CONFIG", file.path())
            .env("FLAGD_PROXY_PORT", "7000")
            .output()
            .expect("run the test binary");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "child test failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    #[test]
    fn config_file_completes_what_the_command_line_requires() {
        let args = start_with_config(
            "yaml",
            "server-key-path: key.pem\n",
            &["--server-cert-path", "cert.pem"],
        )
        .expect("parses");
        assert_eq!(args.server_key_path, Some(PathBuf::from("key.pem")));
        // Without it, the parser's own error, not one about the file.
        let error = parse_from(["flagd-proxy", "start", "--server-cert-path", "cert.pem"])
            .expect_err("refused");
        assert!(
            matches!(error, CliError::Clap(ref e) if e.kind() == ErrorKind::MissingRequiredArgument)
        );
        let file = config_file("yaml", "port: 9000\n");
        let error = parse(&[
            OsStr::new("start"),
            OsStr::new("--config"),
            file.path().as_os_str(),
            OsStr::new("--server-cert-path"),
            OsStr::new("cert.pem"),
        ])
        .expect_err("refused");
        assert!(
            matches!(error, CliError::Clap(ref e) if e.kind() == ErrorKind::MissingRequiredArgument)
        );
    }

    #[test]
    fn config_file_is_only_read_for_start() {
        let missing = OsStr::new("/nonexistent/flagd-proxy.yaml");
        let cli = parse(&[
            OsStr::new("--config"),
            missing,
            OsStr::new("generate-cli-docs"),
        ])
        .expect("parses");
        assert!(matches!(cli.command, Command::GenerateCliDocs));
        // Help comes before the file.
        let error = parse(&[
            OsStr::new("start"),
            OsStr::new("--help"),
            OsStr::new("--config"),
            missing,
        ])
        .expect_err("help");
        assert!(matches!(error, CliError::Clap(ref e) if !e.use_stderr()));
    }

    #[test]
    fn config_file_errors_name_the_file_and_key() {
        let error = |extension: &str, text: &str, extra: &[&str]| {
            start_with_config(extension, text, extra).expect_err("refused")
        };
        let cases: &[(&str, &str, &[&str], &[&str])] = &[
            (
                "yaml",
                "- port\n- 9000\n",
                &[],
                &["expected a mapping", "found a list"],
            ),
            (
                "yaml",
                "9000\n",
                &[],
                &["expected a mapping", "found a number"],
            ),
            (
                "yaml",
                "prot: 9000\n",
                &[],
                &[
                    "key `prot` is not a flag of `flagd-proxy start`",
                    "did you mean `port`?",
                ],
            ),
            (
                "yaml",
                "management_port: 9000\n",
                &[],
                &["key `management_port`", "did you mean `management-port`?"],
            ),
            (
                "yaml",
                "nothing-like-it: 1\n",
                &[],
                &["key `nothing-like-it` is not a flag"],
            ),
            (
                "yaml",
                "config: other.yaml\n",
                &[],
                &["key `config` cannot be set"],
            ),
            ("yaml", "help: true\n", &[], &["key `help` cannot be set"]),
            (
                "yaml",
                "version: 1\n",
                &[],
                &["key `version` cannot be set"],
            ),
            (
                "yaml",
                "port:\n  value: 9000\n",
                &[],
                &["key `port`", "found a nested mapping"],
            ),
            (
                "yaml",
                "manifests: [a, {b: c}]\n",
                &[],
                &["key `manifests`", "found a nested mapping"],
            ),
            (
                "yaml",
                "port: [9000, 9001]\n",
                &[],
                &["key `port`", "--port takes a single value, not a list"],
            ),
            ("yaml", "port:\n", &[], &["key `port`", "no value"]),
            (
                "yaml",
                "debug: 1\n",
                &[],
                &["key `debug`", "expected true or false"],
            ),
            (
                "yaml",
                "management-port: 1\nmetrics-port: 2\n",
                &[],
                &["keys `management-port` and `metrics-port` both set --management-port"],
            ),
            (
                "yaml",
                "port: 9000\n  bad: indentation\n",
                &[],
                &["not valid YAML"],
            ),
            ("json", "{\"port\": 9000,}", &[], &["not valid JSON"]),
            (
                "toml",
                "port = 9000\n",
                &[],
                &["unsupported format `.toml`"],
            ),
            (
                "yaml",
                "port: abc\n",
                &[],
                &["key `port`: invalid value 'abc' for '--port <PORT>'"],
            ),
            (
                "yaml",
                "port: 70000\n",
                &[],
                &["key `port`: invalid value '70000' for '--port <PORT>'"],
            ),
            (
                "yaml",
                "log-format: xml\n",
                &[],
                &["key `log-format`: invalid value 'xml'"],
            ),
            (
                "yaml",
                "keep-alive-min-time: 10\n",
                &[],
                &["key `keep-alive-min-time`: invalid value '10'"],
            ),
            (
                "yaml",
                "upstream: proxy:8015\n",
                &["--manifests", "d"],
                &["key `upstream`:", "cannot be used with"],
            ),
        ];
        for (extension, text, extra, expected) in cases {
            let message = error(extension, text, extra);
            for part in *expected {
                assert!(
                    message.contains(part),
                    "{text:?}: {message:?} lacks {part:?}"
                );
            }
            assert!(!message.contains('\n'), "one line: {message:?}");
        }
        let missing = parse(&[
            OsStr::new("start"),
            OsStr::new("--config"),
            OsStr::new("/nonexistent/flagd-proxy.yaml"),
        ])
        .expect_err("refused")
        .to_string();
        assert!(
            missing.starts_with("config file /nonexistent/flagd-proxy.yaml: cannot read it"),
            "{missing}"
        );
    }

    #[test]
    fn definitions_are_consistent() {
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
