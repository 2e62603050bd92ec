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
mod kubernetes;
mod memo;

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tonic::metadata::MetadataMap;

use self::memo::Memo;
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

/// The questions authorization asks the cluster: the port behind which the Kubernetes API sits
/// ([`kubernetes::KubeReviewer`]), so the policy here can be tested without one.
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
    tokens: Memo<String, Result<Identity, String>>,
    decisions: Memo<(String, ResourceKey), Result<(), String>>,
    /// Only shared while in flight: the pod index (or a list) is the source of truth.
    pods: Memo<IpAddr, Vec<PodOwner>>,
}

impl Authorizer {
    /// `client` is the Kubernetes API client, when the proxy has one. With `--authz-pod-ip`
    /// this starts a watch over running pods (on the current Tokio runtime).
    pub fn new(
        settings: AuthzSettings,
        client: Option<kube::Client>,
    ) -> Result<Self, AuthzConfigError> {
        let reviewer = client.map(|client| {
            Arc::new(kubernetes::KubeReviewer::new(
                client,
                settings.token_audiences.clone(),
                settings.pod_ip,
            )) as Arc<dyn Reviewer>
        });
        Self::with_reviewer(settings, reviewer)
    }

    /// An authorizer that asks `reviewer` (none: the proxy has no Kubernetes API).
    pub fn with_reviewer(
        settings: AuthzSettings,
        reviewer: Option<Arc<dyn Reviewer>>,
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
            tokens: Memo::new(settings.cache_ttl),
            decisions: Memo::new(settings.cache_ttl),
            pods: Memo::new(Duration::ZERO),
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
            .get(token.to_owned(), || reviewer.review_token(token.to_owned()))
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
            [] => Err(AuthzError::Unauthenticated(format!(
                "no running pod has the address {ip}"
            ))),
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
        assert!(Authorizer::new(settings.clone(), None).is_err());
        let pod_ip = AuthzSettings {
            mode: AuthzMode::Namespace,
            pod_ip: true,
            ..settings
        };
        assert!(Authorizer::new(pod_ip, None).is_err());
    }

    /// A [`Reviewer`] that counts its calls and holds every answer until `gate` opens.
    struct FakeReviewer {
        calls: std::sync::Mutex<Vec<&'static str>>,
        gate: Arc<tokio::sync::Semaphore>,
        pods: std::sync::Mutex<Vec<PodOwner>>,
        down: std::sync::atomic::AtomicBool,
    }

    impl FakeReviewer {
        fn new() -> Self {
            Self {
                calls: std::sync::Mutex::default(),
                gate: Arc::new(tokio::sync::Semaphore::new(0)),
                pods: std::sync::Mutex::default(),
                down: std::sync::atomic::AtomicBool::new(false),
            }
        }

        fn calls(&self, kind: &str) -> usize {
            let calls = self.calls.lock().expect("lock");
            calls.iter().filter(|c| **c == kind).count()
        }

        fn answer<T: Send + 'static>(
            &self,
            kind: &'static str,
            answer: T,
        ) -> BoxFuture<'static, Result<T, AuthzError>> {
            self.calls.lock().expect("lock").push(kind);
            let gate = self.gate.clone();
            let down = self.down.load(std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                let _permit = gate.acquire().await.expect("open");
                if down {
                    Err(AuthzError::Unavailable(format!("{kind}: the API is down")))
                } else {
                    Ok(answer)
                }
            })
        }
    }

    impl Reviewer for FakeReviewer {
        fn review_token(
            &self,
            token: String,
        ) -> BoxFuture<'static, Result<Result<Identity, String>, AuthzError>> {
            let answer = match token.split_once('/') {
                Some((ns, name)) => Ok(Identity::service_account(ns, name, "bearer token")),
                None => Err("rejected".to_owned()),
            };
            self.answer("token", answer)
        }

        fn review_access(
            &self,
            identity: Identity,
            key: ResourceKey,
        ) -> BoxFuture<'static, Result<Result<(), String>, AuthzError>> {
            let allowed = identity.namespace.as_deref() == Some(key.namespace.as_str());
            self.answer("access", if allowed { Ok(()) } else { Err("no".into()) })
        }

        fn pods_at(&self, _: IpAddr) -> BoxFuture<'static, Result<Vec<PodOwner>, AuthzError>> {
            let pods = self.pods.lock().expect("lock").clone();
            self.answer("pods", pods)
        }
    }

    fn faked(mode: AuthzMode, pod_ip: bool) -> (Arc<FakeReviewer>, Authorizer) {
        let fake = Arc::new(FakeReviewer::new());
        let settings = AuthzSettings {
            mode,
            pod_ip,
            cache_ttl: Duration::from_secs(3600),
            ..AuthzSettings::default()
        };
        let authz = Authorizer::with_reviewer(settings, Some(fake.clone() as Arc<dyn Reviewer>))
            .expect("valid settings");
        (fake, authz)
    }

    fn bearer(token: &str) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        metadata.insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
        metadata
    }

    fn from_address(ip: &str) -> ConnectionInfo {
        ConnectionInfo {
            remote_addr: Some(std::net::SocketAddr::new(ip.parse().expect("ip"), 40000)),
            peer_certificates: None,
            activity: None,
        }
    }

    fn owner(uid: &str, namespace: &str, account: &str) -> PodOwner {
        PodOwner {
            uid: uid.into(),
            namespace: namespace.into(),
            service_account: account.into(),
        }
    }

    /// Runs `calls` concurrently: all are waiting on the fake before it answers any of them.
    async fn together<F: std::future::Future>(
        fake: &FakeReviewer,
        calls: impl IntoIterator<Item = F>,
    ) -> Vec<F::Output> {
        let all = futures::future::join_all(calls);
        tokio::pin!(all);
        assert!(futures::poll!(&mut all).is_pending(), "held by the fake");
        fake.gate
            .add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
        all.await
    }

    fn assert_all_are(answers: &[Result<Identity, AuthzError>], user: &str) {
        for answer in answers {
            assert_eq!(answer.as_ref().map(|i| i.user.as_str()), Ok(user));
        }
    }

    #[tokio::test]
    async fn concurrent_identical_token_reviews_make_one_call() {
        let (fake, authz) = faked(AuthzMode::Namespace, false);
        let metadata = bearer("team-a/web");
        let answers = together(&fake, (0..50).map(|_| authz.identify(&metadata, None))).await;
        assert_all_are(&answers, "system:serviceaccount:team-a:web");
        assert_eq!(fake.calls("token"), 1);
        authz.identify(&metadata, None).await.expect("cached");
        authz
            .identify(&bearer("bogus"), None)
            .await
            .expect_err("rejected");
        authz
            .identify(&bearer("bogus"), None)
            .await
            .expect_err("rejected");
        assert_eq!(
            fake.calls("token"),
            2,
            "answers, rejections too, are cached"
        );
    }

    #[tokio::test]
    async fn an_unreachable_api_is_not_cached() {
        let (fake, authz) = faked(AuthzMode::Namespace, false);
        fake.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let metadata = bearer("team-a/web");
        let answers = together(&fake, (0..10).map(|_| authz.identify(&metadata, None))).await;
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Err(AuthzError::Unavailable(_))))
        );
        assert_eq!(fake.calls("token"), 1, "one call for the concurrent ones");
        fake.down.store(false, std::sync::atomic::Ordering::SeqCst);
        authz.identify(&metadata, None).await.expect("asked again");
        assert_eq!(fake.calls("token"), 2);
    }

    #[tokio::test]
    async fn concurrent_identical_access_reviews_make_one_call() {
        let (fake, authz) = faked(AuthzMode::Rbac, false);
        let me = Identity::service_account("team-a", "web", "test");
        let own = ResourceKey::new("team-a", "f");
        let other = ResourceKey::new("team-b", "f");
        let answers = together(
            &fake,
            (0..30).map(|i| authz.check(&me, if i % 2 == 0 { &own } else { &other })),
        )
        .await;
        assert_eq!(answers.iter().filter(|a| a.is_ok()).count(), 15);
        assert!(
            answers
                .iter()
                .filter_map(|a| a.as_ref().err())
                .all(|e| matches!(e, AuthzError::Denied { .. }))
        );
        assert_eq!(fake.calls("access"), 2, "one per (identity, resource)");
        authz.check(&me, &own).await.expect("cached");
        authz.check(&me, &other).await.expect_err("cached denial");
        assert_eq!(fake.calls("access"), 2);
    }

    #[tokio::test]
    async fn concurrent_connections_from_one_pod_make_one_lookup() {
        let (fake, authz) = faked(AuthzMode::Namespace, true);
        *fake.pods.lock().expect("lock") = vec![owner("a", "team-a", "web")];
        let from = from_address("10.0.0.7");
        let metadata = MetadataMap::new();
        let answers = together(
            &fake,
            (0..100).map(|_| authz.identify(&metadata, Some(&from))),
        )
        .await;
        assert_all_are(&answers, "system:serviceaccount:team-a:web");
        assert_eq!(fake.calls("pods"), 1);
    }

    #[tokio::test]
    async fn a_pod_address_is_never_cached_and_two_owners_identify_neither() {
        let (fake, authz) = faked(AuthzMode::Namespace, true);
        fake.gate.add_permits(1000);
        let from = from_address("10.0.0.7");
        let metadata = MetadataMap::new();
        *fake.pods.lock().expect("lock") = vec![owner("a", "team-a", "web")];
        let first = authz.identify(&metadata, Some(&from)).await.expect("a");
        assert_eq!(first.namespace.as_deref(), Some("team-a"));
        // The address is reused while the first pod is still known: nobody gets it.
        fake.pods
            .lock()
            .expect("lock")
            .push(owner("b", "team-b", "db"));
        let both = authz
            .identify(&metadata, Some(&from))
            .await
            .expect_err("claimed twice");
        assert!(both.to_string().contains("several running pods"), "{both}");
        // The first pod is gone: the address is the new pod's, at once.
        fake.pods.lock().expect("lock").remove(0);
        let second = authz.identify(&metadata, Some(&from)).await.expect("b");
        assert_eq!(second.user, "system:serviceaccount:team-b:db");
        assert_eq!(fake.calls("pods"), 3);
    }
}
