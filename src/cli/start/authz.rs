//! The flags of who may read which resource (`Authorization`): the mode, allowed namespaces,
//! token audiences, identification by pod address and the decision cache; they become
//! [`AuthzSettings`].
use std::time::Duration;

use clap::Args;

use super::duration_text;
use crate::authz::{self, AuthzSettings};

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
