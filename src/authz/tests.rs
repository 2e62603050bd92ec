//! Unit tests of the authorization policy, with a counting fake [`Reviewer`].
use super::*;

fn authorizer(mode: AuthzMode, allow: &[&str]) -> Authorizer {
    Authorizer::new(
        AuthzSettings {
            mode,
            allow_namespaces: allow.iter().map(|s| (*s).to_owned()).collect(),
            token_audiences: Vec::new(),
            pod_ip: false,
            pod_node: None,
            cache_ttl: Duration::from_secs(5),
        },
        None,
        unlimited(),
    )
    .expect("valid settings")
}

fn unlimited() -> Arc<MemoryBudget> {
    MemoryBudget::unlimited(Arc::new(crate::metrics::Metrics::new()))
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
        pod_node: None,
        cache_ttl: Duration::from_secs(5),
    };
    assert!(Authorizer::new(settings.clone(), None, unlimited()).is_err());
    let pod_ip = AuthzSettings {
        mode: AuthzMode::Namespace,
        pod_ip: true,
        ..settings
    };
    assert!(Authorizer::new(pod_ip, None, unlimited()).is_err());
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
    let authz = Authorizer::new(
        settings,
        Some(fake.clone() as Arc<dyn Reviewer>),
        unlimited(),
    )
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
