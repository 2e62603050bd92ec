//! The flags of where resources come from (`Source`): manifest files, another proxy, or the
//! Kubernetes API, and whether Kubernetes Events are recorded; they become [`SourceSettings`].
use std::path::PathBuf;

use clap::builder::TypedValueParser as _;
use clap::{ArgAction, Args};

use crate::kubernetes::KubeSettings;
use crate::settings::{self, SourceSettings};
use crate::source::upstream::{self, UpstreamSettings};

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

    /// The most streams (one per resource in use) on one connection to the upstream; another
    /// connection is opened when every one has this many, and one is closed when its last stream
    /// ends. Keep it below the upstream's --max-streams-per-connection: a stream over that
    /// waits until another on its connection ends.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_UPSTREAM_STREAMS_PER_CONNECTION",
        default_value_t = upstream::DEFAULT_STREAMS_PER_CONNECTION,
        value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize),
        requires = "upstream"
    )]
    pub upstream_streams_per_connection: usize,

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
                    streams_per_connection: args.upstream_streams_per_connection,
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
