//! Authorization: which client may read which FeatureFlag.
//!
//! A client's identity comes from, in order: a client certificate with a SPIFFE ID
//! (`spiffe://<domain>/ns/<namespace>/sa/<service account>`), a ServiceAccount token in the
//! `authorization` header (checked with the API's TokenReview), or — opt-in — the pod that owns
//! the connection's source address. Then, by mode:
//! - `namespace`: a client reads its own namespace, plus an allow-list;
//! - `rbac`: the API decides (SubjectAccessReview for `get` on that FeatureFlag), so RBAC stays
//!   the single source of truth.
//!
//! Decisions and token reviews are cached for a short time; open streams are checked again at
//! that interval, so a revoked permission ends them with `PERMISSION_DENIED`. Concurrent
//! identical questions to the API (a token, an identity and resource, a pod address) share one
//! request. Pod addresses are answered from a watch over running pods, so the API server's cost
//! is per identity, not per connection (see [`kubernetes`]).
mod memo;

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tonic::metadata::MetadataMap;

use self::memo::{Footprint, Memo};
use crate::budget::MemoryBudget;
use crate::net::info::ConnectionInfo;
use crate::selector::ResourceKey;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthzMode {
    /// Every client may read every resource (the Go flagd-proxy's behaviour).
    None,
    /// A client may read resources in its own namespace and the allowed ones.
    Namespace,
    /// The Kubernetes API decides, per client and resource (SubjectAccessReview).
    Rbac,
}

/// Default of [`AuthzSettings::mode`] (and of `--authz`).
pub const DEFAULT_MODE: AuthzMode = AuthzMode::None;
/// Default of [`AuthzSettings::cache_ttl`] (and of `--authz-cache-ttl`).
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(30);

/// Authorization settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthzSettings {
    pub mode: AuthzMode,
    /// Namespaces every identified client may read (namespace mode).
    pub allow_namespaces: Vec<String>,
    /// Audiences a bearer token must be valid for (empty: the API server's default).
    pub token_audiences: Vec<String>,
    /// Identify clients by the pod that owns their source address.
    pub pod_ip: bool,
    /// With `pod_ip`: only pods scheduled on this node identify clients (the node tier's own
    /// node), and only they are watched.
    pub pod_node: Option<String>,
    /// How long decisions are cached, and how often open streams are checked again.
    pub cache_ttl: Duration,
}

impl Default for AuthzSettings {
    fn default() -> Self {
        Self {
            mode: DEFAULT_MODE,
            allow_namespaces: Vec::new(),
            token_audiences: Vec::new(),
            pod_ip: false,
            pod_node: None,
            cache_ttl: DEFAULT_CACHE_TTL,
        }
    }
}

/// Who a client is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    /// The namespace of the client's ServiceAccount, when it has one.
    pub namespace: Option<String>,
    /// How the identity was established.
    pub via: &'static str,
}

impl Footprint for Identity {
    fn heap_bytes(&self) -> usize {
        self.user.heap_bytes() + self.groups.heap_bytes() + self.namespace.heap_bytes()
    }
}

impl Footprint for ResourceKey {
    fn heap_bytes(&self) -> usize {
        self.namespace.heap_bytes() + self.name.heap_bytes()
    }
}

impl Footprint for PodOwner {
    fn heap_bytes(&self) -> usize {
        self.uid.heap_bytes() + self.namespace.heap_bytes() + self.service_account.heap_bytes()
    }
}

impl Identity {
    fn service_account(namespace: &str, name: &str, via: &'static str) -> Self {
        Identity {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_owned(),
            ],
            namespace: Some(namespace.to_owned()),
            via,
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (from {})", self.user, self.via)
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum AuthzError {
    #[error("no client identity: {0}")]
    Unauthenticated(String),
    #[error("{identity} may not read {key}: {reason}")]
    Denied {
        identity: String,
        key: ResourceKey,
        reason: String,
    },
    #[error("the authorization check could not be made: {0}")]
    Unavailable(String),
}

#[derive(Debug, thiserror::Error)]
pub enum AuthzConfigError {
    #[error(
        "--authz {0:?} with {1} needs the Kubernetes API: with --manifests it cannot be used; with --upstream give the node tier an API configuration (in-cluster, KUBECONFIG or --kube-api-server)"
    )]
    NeedsKubernetes(AuthzMode, &'static str),
}

/// The questions authorization asks the cluster: the port behind which the Kubernetes API sits
/// (`crate::kubernetes::reviews::KubeReviewer`), so the policy here can be tested without one.
///
/// Each returns a `'static` future (an implementation clones what it needs), so one answer can
/// be shared by every caller asking the same question. `Err` means the question could not be
/// asked (the API is unreachable, or refused the proxy); such errors are never cached.
pub trait Reviewer: Send + Sync {
    /// TokenReview: whose token this is (`Ok(Err(reason))`: the API server rejected it).
    fn review_token(
        &self,
        token: String,
    ) -> BoxFuture<'static, Result<Result<Identity, String>, AuthzError>>;

    /// SubjectAccessReview for `get` on the FeatureFlag `key` (`Ok(Err(reason))`: not allowed).
    fn review_access(
        &self,
        identity: Identity,
        key: ResourceKey,
    ) -> BoxFuture<'static, Result<Result<(), String>, AuthzError>>;

    /// The running, non-host-network pods that have the address `ip`.
    fn pods_at(&self, ip: IpAddr) -> BoxFuture<'static, Result<Vec<PodOwner>, AuthzError>>;
}

/// A running pod that has an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodOwner {
    pub uid: String,
    pub namespace: String,
    pub service_account: String,
}

/// Makes authorization decisions. Shared by all requests.
pub struct Authorizer {
    settings: AuthzSettings,
    reviewer: Option<Arc<dyn Reviewer>>,
    /// Token reviews by the token's SHA-256 digest: a kept answer costs the same whatever the
    /// token's size.
    tokens: Memo<[u8; 32], Result<Identity, String>>,
    decisions: Memo<(String, ResourceKey), Result<(), String>>,
    /// Only shared while in flight: the pod index (or a list) is the source of truth.
    pods: Memo<IpAddr, Vec<PodOwner>>,
}

impl Authorizer {
    /// An authorizer that asks `reviewer` (none: the proxy has no Kubernetes API), its kept
    /// answers charged to `budget`.
    pub fn new(
        settings: AuthzSettings,
        reviewer: Option<Arc<dyn Reviewer>>,
        budget: Arc<MemoryBudget>,
    ) -> Result<Self, AuthzConfigError> {
        if reviewer.is_none() {
            if settings.mode == AuthzMode::Rbac {
                return Err(AuthzConfigError::NeedsKubernetes(
                    settings.mode,
                    "SubjectAccessReview",
                ));
            }
            if settings.pod_ip {
                return Err(AuthzConfigError::NeedsKubernetes(
                    settings.mode,
                    "--authz-pod-ip",
                ));
            }
        }
        Ok(Self {
            tokens: Memo::new(settings.cache_ttl, Result::is_ok, budget.clone()),
            decisions: Memo::new(settings.cache_ttl, Result::is_ok, budget.clone()),
            pods: Memo::new(Duration::ZERO, |_| true, budget),
            settings,
            reviewer,
        })
    }
    pub fn enabled(&self) -> bool {
        self.settings.mode != AuthzMode::None
    }

    /// How often open streams are checked again.
    pub fn recheck_interval(&self) -> Duration {
        self.settings.cache_ttl
    }

    /// Establishes the client's identity.
    pub async fn identify(
        &self,
        metadata: &MetadataMap,
        connection: Option<&ConnectionInfo>,
    ) -> Result<Identity, AuthzError> {
        if let Some(certs) = connection.and_then(|c| c.peer_certificates.as_ref())
            && let Some(leaf) = certs.first()
            && let Some((namespace, name)) = spiffe_service_account(leaf.as_ref())
        {
            return Ok(Identity::service_account(
                &namespace,
                &name,
                "client certificate",
            ));
        }
        if let Some(value) = metadata.get("authorization") {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| {
                    v.strip_prefix("Bearer ")
                        .or_else(|| v.strip_prefix("bearer "))
                })
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| {
                    AuthzError::Unauthenticated(
                        "the authorization header is not \"Bearer <token>\"".into(),
                    )
                })?;
            return self.review_token(token).await;
        }
        if self.settings.pod_ip
            && let Some(ip) = connection.and_then(|c| c.remote_addr).map(|a| a.ip())
        {
            return self.pod_identity(ip).await;
        }
        let mut ways = vec![
            "a client certificate with a SPIFFE ID (needs --client-ca-path)",
            "a ServiceAccount token in the authorization header",
        ];
        if !self.settings.pod_ip {
            ways.push("or --authz-pod-ip on the proxy to identify pods by address");
        }
        Err(AuthzError::Unauthenticated(format!(
            "present {}",
            ways.join(", ")
        )))
    }

    /// Decides whether `identity` may read `key`.
    pub async fn check(&self, identity: &Identity, key: &ResourceKey) -> Result<(), AuthzError> {
        let denied = |reason: String| AuthzError::Denied {
            identity: identity.to_string(),
            key: key.clone(),
            reason,
        };
        match self.settings.mode {
            AuthzMode::None => Ok(()),
            AuthzMode::Namespace => {
                let own = identity.namespace.as_deref() == Some(key.namespace.as_str());
                if own || self.settings.allow_namespaces.contains(&key.namespace) {
                    Ok(())
                } else {
                    Err(denied(format!(
                        "in namespace mode a client reads only its own namespace ({}) and the allowed namespaces [{}]",
                        identity.namespace.as_deref().unwrap_or("none"),
                        self.settings.allow_namespaces.join(", ")
                    )))
                }
            }
            AuthzMode::Rbac => {
                let reviewer = self.reviewer.as_ref().ok_or_else(|| {
                    AuthzError::Unavailable("RBAC mode needs the Kubernetes API".into())
                })?;
                self.decisions
                    .get((identity.user.clone(), key.clone()), || {
                        reviewer.review_access(identity.clone(), key.clone())
                    })
                    .await?
                    .map_err(denied)
            }
        }
    }

    async fn review_token(&self, token: &str) -> Result<Identity, AuthzError> {
        let Some(reviewer) = &self.reviewer else {
            return Err(AuthzError::Unauthenticated(
                "bearer tokens need the Kubernetes API (TokenReview); this proxy has no API access"
                    .into(),
            ));
        };
        self.tokens
            .get(token_digest(token), || {
                reviewer.review_token(token.to_owned())
            })
            .await?
            .map_err(AuthzError::Unauthenticated)
    }

    /// The identity of the one running pod that has the address `ip`. Two pods claiming the
    /// same address (one is gone, the API does not know yet) identify neither.
    async fn pod_identity(&self, ip: IpAddr) -> Result<Identity, AuthzError> {
        let Some(reviewer) = &self.reviewer else {
            return Err(AuthzError::Unavailable(
                "pod identity needs the Kubernetes API".into(),
            ));
        };
        let owners = self.pods.get(ip, || reviewer.pods_at(ip)).await?;
        match owners.as_slice() {
            [pod] => Ok(Identity::service_account(
                &pod.namespace,
                &pod.service_account,
                "pod address",
            )),
            [] => Err(AuthzError::Unauthenticated(match &self.settings.pod_node {
                Some(node) => format!("no running pod on node {node} has the address {ip}"),
                None => format!("no running pod has the address {ip}"),
            })),
            _ => Err(AuthzError::Unauthenticated(format!(
                "several running pods have the address {ip}"
            ))),
        }
    }
}

/// The ServiceAccount named by a certificate's SPIFFE ID URI SAN, if it has one of the form
/// `spiffe://<trust domain>/ns/<namespace>/sa/<name>`.
fn spiffe_service_account(der: &[u8]) -> Option<(String, String)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|name| match name {
        x509_parser::extensions::GeneralName::URI(uri) => parse_spiffe(uri),
        _ => None,
    })
}

fn parse_spiffe(uri: &str) -> Option<(String, String)> {
    let path = uri.strip_prefix("spiffe://")?.split_once('/')?.1;
    let mut parts = path.split('/');
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some("ns"), Some(ns), Some("sa"), Some(sa), None) if !ns.is_empty() && !sa.is_empty() => {
            Some((ns.to_owned(), sa.to_owned()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;

/// The SHA-256 digest of a bearer token: what the token memo is keyed by.
fn token_digest(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    key
}
