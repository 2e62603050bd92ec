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
//! that interval, so a revoked permission ends them with `PERMISSION_DENIED`.
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use tonic::metadata::MetadataMap;

use crate::net::info::ConnectionInfo;
use crate::selector::{GROUP, ResourceKey};

/// Cached entries beyond this are dropped wholesale (the cache only saves API calls).
const MAX_CACHE_ENTRIES: usize = 10_000;

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
        "--authz {0:?} with {1} needs the Kubernetes API; it cannot be used with --manifests or --upstream"
    )]
    NeedsKubernetes(AuthzMode, &'static str),
}

/// A cache of answers with the time each was made.
type Cache<K, V> = Mutex<HashMap<K, (V, Instant)>>;

/// Makes authorization decisions. Shared by all requests.
pub struct Authorizer {
    settings: AuthzSettings,
    client: Option<kube::Client>,
    tokens: Cache<String, Result<Identity, AuthzError>>,
    decisions: Cache<(String, ResourceKey), Result<(), String>>,
}

impl Authorizer {
    /// `client` is the Kubernetes API client, when the proxy has one.
    pub fn new(
        settings: AuthzSettings,
        client: Option<kube::Client>,
    ) -> Result<Self, AuthzConfigError> {
        if client.is_none() {
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
            settings,
            client,
            tokens: Mutex::default(),
            decisions: Mutex::default(),
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
                let cache_key = (identity.user.clone(), key.clone());
                if let Some(cached) = cached(&self.decisions, &cache_key, self.settings.cache_ttl) {
                    return cached.map_err(denied);
                }
                let decision = self.access_review(identity, key).await?;
                store(&self.decisions, cache_key, decision.clone());
                decision.map_err(denied)
            }
        }
    }

    async fn review_token(&self, token: &str) -> Result<Identity, AuthzError> {
        if let Some(cached) = cached(&self.tokens, token, self.settings.cache_ttl) {
            return cached;
        }
        let Some(client) = &self.client else {
            return Err(AuthzError::Unauthenticated(
                "bearer tokens need the Kubernetes API (TokenReview); this proxy has no API access"
                    .into(),
            ));
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: (!self.settings.token_audiences.is_empty())
                    .then(|| self.settings.token_audiences.clone()),
            },
            ..TokenReview::default()
        };
        let answer = create_review(client, &review, "TokenReview").await?;
        let status = answer.status.unwrap_or_default();
        let result = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => {
                let name = user.username.unwrap_or_default();
                let namespace = name
                    .strip_prefix("system:serviceaccount:")
                    .and_then(|r| r.split(':').next())
                    .map(str::to_owned);
                Ok(Identity {
                    user: name,
                    groups: user.groups.unwrap_or_default(),
                    namespace,
                    via: "bearer token",
                })
            }
            _ => Err(AuthzError::Unauthenticated(format!(
                "the bearer token was rejected by the API server{}",
                status.error.map(|e| format!(": {e}")).unwrap_or_default()
            ))),
        };
        store(&self.tokens, token.to_owned(), result.clone());
        result
    }

    async fn pod_identity(&self, ip: IpAddr) -> Result<Identity, AuthzError> {
        let Some(client) = &self.client else {
            return Err(AuthzError::Unavailable(
                "pod identity needs the Kubernetes API".into(),
            ));
        };
        let pods = Api::<Pod>::all(client.clone())
            .list(&ListParams::default().fields(&format!("status.podIP={ip}")))
            .await
            .map_err(|e| AuthzError::Unavailable(format!("listing pods by address failed: {e}")))?;
        let owners: Vec<_> = pods
            .items
            .iter()
            .filter(|p| p.spec.as_ref().is_none_or(|s| s.host_network != Some(true)))
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect();
        match owners.as_slice() {
            [pod] => {
                let namespace = pod.metadata.namespace.clone().unwrap_or_default();
                let account = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.clone())
                    .unwrap_or_else(|| "default".into());
                Ok(Identity::service_account(
                    &namespace,
                    &account,
                    "pod address",
                ))
            }
            [] => Err(AuthzError::Unauthenticated(format!(
                "no running pod has the address {ip}"
            ))),
            _ => Err(AuthzError::Unauthenticated(format!(
                "several running pods have the address {ip}"
            ))),
        }
    }

    async fn access_review(
        &self,
        identity: &Identity,
        key: &ResourceKey,
    ) -> Result<Result<(), String>, AuthzError> {
        let Some(client) = &self.client else {
            return Err(AuthzError::Unavailable(
                "RBAC mode needs the Kubernetes API".into(),
            ));
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(identity.user.clone()),
                groups: Some(identity.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(GROUP.to_owned()),
                    resource: Some("featureflags".to_owned()),
                    verb: Some("get".to_owned()),
                    namespace: Some(key.namespace.clone()),
                    name: Some(key.name.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = create_review(client, &review, "SubjectAccessReview").await?;
        let status = answer.status.unwrap_or_default();
        if status.allowed {
            Ok(Ok(()))
        } else {
            let detail = status
                .reason
                .filter(|r| !r.is_empty())
                .map(|r| format!(" ({r})"))
                .unwrap_or_default();
            Ok(Err(format!(
                "RBAC does not allow get on featureflags.{GROUP} {:?} in namespace {:?}{detail}",
                key.name, key.namespace
            )))
        }
    }
}

fn cached<K, Q, V>(map: &Cache<K, V>, key: &Q, ttl: Duration) -> Option<V>
where
    K: std::hash::Hash + Eq + std::borrow::Borrow<Q>,
    Q: std::hash::Hash + Eq + ?Sized,
    V: Clone,
{
    let map = map.lock().unwrap_or_else(|p| p.into_inner());
    map.get(key)
        .filter(|(_, at)| ttl > at.elapsed())
        .map(|(v, _)| v.clone())
}

fn store<K: std::hash::Hash + Eq, V>(map: &Cache<K, V>, key: K, value: V) {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if map.len() >= MAX_CACHE_ENTRIES {
        map.clear();
    }
    map.insert(key, (value, Instant::now()));
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

/// Asks the API server for a review (`kind` names it in the error).
async fn create_review<K>(client: &kube::Client, review: &K, kind: &str) -> Result<K, AuthzError>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    Api::<K>::all(client.clone())
        .create(&PostParams::default(), review)
        .await
        .map_err(|e| AuthzError::Unavailable(format!("{kind} failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authorizer(mode: AuthzMode, allow: &[&str]) -> Authorizer {
        Authorizer::new(
            AuthzSettings {
                mode,
                allow_namespaces: allow.iter().map(|s| (*s).to_owned()).collect(),
                token_audiences: Vec::new(),
                pod_ip: false,
                cache_ttl: Duration::from_secs(5),
            },
            None,
        )
        .expect("valid settings")
    }

    #[test]
    fn spiffe_ids() {
        assert_eq!(
            parse_spiffe("spiffe://cluster.local/ns/team-a/sa/web"),
            Some(("team-a".into(), "web".into()))
        );
        for bad in [
            "spiffe://cluster.local/ns/team-a",
            "https://x/ns/a/sa/b",
            "spiffe://d/ns//sa/b",
            "spiffe://d/ns/a/sa/b/c",
        ] {
            assert_eq!(parse_spiffe(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn namespace_mode_allows_own_and_listed_namespaces() {
        let authz = authorizer(AuthzMode::Namespace, &["shared"]);
        let me = Identity::service_account("team-a", "web", "test");
        authz
            .check(&me, &ResourceKey::new("team-a", "f"))
            .await
            .expect("own namespace");
        authz
            .check(&me, &ResourceKey::new("shared", "f"))
            .await
            .expect("allow-listed");
        let err = authz
            .check(&me, &ResourceKey::new("team-b", "f"))
            .await
            .expect_err("other namespace");
        assert!(
            err.to_string().contains("system:serviceaccount:team-a:web")
                && err.to_string().contains("team-b"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn no_identity_is_unauthenticated_with_the_ways_to_get_one() {
        let authz = authorizer(AuthzMode::Namespace, &[]);
        let err = authz
            .identify(&MetadataMap::new(), None)
            .await
            .expect_err("anonymous");
        assert!(
            matches!(err, AuthzError::Unauthenticated(ref m) if m.contains("client certificate") && m.contains("token")),
            "{err}"
        );
        let mut metadata = MetadataMap::new();
        metadata.insert("authorization", "Basic abc".parse().expect("ascii"));
        assert!(matches!(
            authz.identify(&metadata, None).await,
            Err(AuthzError::Unauthenticated(_))
        ));
    }

    #[test]
    fn rbac_needs_the_api() {
        let settings = AuthzSettings {
            mode: AuthzMode::Rbac,
            allow_namespaces: Vec::new(),
            token_audiences: Vec::new(),
            pod_ip: false,
            cache_ttl: Duration::from_secs(5),
        };
        assert!(Authorizer::new(settings, None).is_err());
    }
}
