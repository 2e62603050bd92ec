//! Authorization: client identity (certificate, ServiceAccount token, pod address) and the
//! `namespace` and `rbac` modes, against a real kube-apiserver where the API is involved.
use flagd_proxy_testkit as support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::json;
use support::client::{
    Client, assert_status, channel as plain_channel, default_variant, next_message, tls_channel,
    v1, with_selector,
};
use support::control_plane::{
    ControlPlane, feature_flag_object, feature_flag_resource, start_or_skip,
};
use support::identities::{
    grant_flag_reading, grant_review_permissions, running_pod, running_pod_on,
    service_account_token,
};
use support::or_return;
use support::{EVENT_TIMEOUT, Proxy, TestCa, string_flag, write_color};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

fn request(selector: &str, token: Option<&str>) -> tonic::Request<v1::SyncFlagsRequest> {
    let mut request = with_selector(v1::SyncFlagsRequest::default(), selector);
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
    }
    request
}

/// A connection to `proxy` from `ip` ([`connect_from`]), once a client without a token is served
/// `selector` on it (the proxy knows the pod at `ip`), and the first flag configuration it was
/// served.
async fn served_from(proxy: &Proxy, ip: &str, selector: &str) -> (Channel, String) {
    let channel = connect_from(proxy, ip).await;
    let what = format!("{selector} served to the pod at {ip}");
    let served = support::eventually(&what, || first(channel.clone(), selector, None)).await;
    (channel, served)
}

/// Opens a stream and returns its first message's flag configuration, or the refusal.
async fn first(
    channel: Channel,
    selector: &str,
    token: Option<&str>,
) -> Result<String, tonic::Status> {
    let mut stream = Client::new(channel)
        .sync_flags(request(selector, token))
        .await?
        .into_inner();
    Ok(next_message(&mut stream).await?.flag_configuration)
}

/// A TLS connection to the proxy on `port`, whose certificate `ca` signed, presenting `cert`.
async fn connect_with(ca: &TestCa, port: u16, cert: (String, String)) -> Channel {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(
            std::fs::read(&ca.ca_cert).expect("ca"),
        ))
        .domain_name("localhost")
        .identity(Identity::from_pem(cert.0, cert.1));
    tls_channel(port, tls).await.expect("connect")
}

#[tokio::test]
async fn spiffe_client_certificates_in_namespace_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_color(dir.path(), "team-a", "flags", "red", &["red"]);
    write_color(dir.path(), "team-b", "flags", "blue", &["blue"]);
    write_color(dir.path(), "shared", "flags", "green", &["green"]);
    let ca = TestCa::new();
    let mut args = vec!["--manifests".to_owned(), dir.path().display().to_string()];
    args.extend(ca.proxy_args());
    args.extend(["--client-ca-path".into(), ca.ca_cert.display().to_string()]);
    args.extend([
        "--authz".into(),
        "namespace".into(),
        "--authz-allow-namespaces".into(),
        "shared".into(),
    ]);
    let proxy = Proxy::start(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;

    let connect = |cert: (String, String)| connect_with(&ca, proxy.port, cert);
    let web =
        connect(ca.issue_client_with_uri("web", Some("spiffe://cluster.local/ns/team-a/sa/web")))
            .await;
    first(web.clone(), TEAM_A, None)
        .await
        .expect("own namespace");
    first(web.clone(), "core.openfeature.dev/shared/flags", None)
        .await
        .expect("allow-listed namespace");
    let denied = first(web, TEAM_B, None).await.expect_err("other namespace");
    assert_status(
        &denied,
        Code::PermissionDenied,
        "system:serviceaccount:team-a:web",
    );

    // A verified certificate without a SPIFFE ID names no ServiceAccount.
    let anonymous = connect(ca.issue_client("no-spiffe")).await;
    let status = first(anonymous, "core.openfeature.dev/shared/flags", None)
        .await
        .expect_err("no identity");
    assert_status(&status, Code::Unauthenticated, "SPIFFE");
}

#[tokio::test]
async fn api_based_modes_need_the_kubernetes_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_flagd-proxy"))
        .args([
            "start",
            "--bind-address",
            "127.0.0.1",
            "--manifests",
            dir.path().to_str().expect("utf-8"),
        ])
        .args(["--authz", "rbac"])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--authz"),
        "{output:?}"
    );
}

async fn create_flag(cp: &ControlPlane, ns: &str, name: &str, variant: &str) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(cp.admin_client(), ns, &feature_flag_resource());
    let object = feature_flag_object(ns, name, string_flag("color", variant, &[variant]));
    api.create(&PostParams::default(), &object)
        .await
        .expect("create FeatureFlag");
}

/// The review permissions, namespaces team-a and team-b with a FeatureFlag "flags" each, and a
/// token of the ServiceAccount team-a/web.
async fn two_teams(cp: &ControlPlane) -> String {
    grant_review_permissions(cp).await;
    for ns in ["team-a", "team-b"] {
        cp.create_namespace(ns).await;
        create_flag(cp, ns, "flags", ns).await;
    }
    service_account_token(cp, "team-a", "web").await
}

/// A channel whose connection comes from `address` (a 127.0.0.x address stands for a pod's).
async fn connect_from(proxy: &Proxy, address: &str) -> Channel {
    Endpoint::from_shared(proxy.endpoint())
        .expect("uri")
        .local_address(Some(address.parse().expect("ip")))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect from {address}: {e}"))
}

/// Requests the API server has counted (its own `apiserver_request_total`) of these kinds.
async fn requests(cp: &ControlPlane, kinds: &[(&str, &str)]) -> u64 {
    let mut total = 0;
    for (verb, resource) in kinds {
        total += cp.requests(verb, resource).await;
    }
    total
}

/// The selectors of the FeatureFlags `flags` of the namespaces team-a and team-b.
const TEAM_A: &str = "core.openfeature.dev/team-a/flags";
const TEAM_B: &str = "core.openfeature.dev/team-b/flags";

/// Asserts that `answer` is a refusal with `code` whose message contains `needle`.
fn assert_refused(answer: Result<String, tonic::Status>, code: Code, needle: &str) {
    let status = answer.expect_err("refused");
    assert_status(&status, code, needle);
}

/// The proxy against the control plane with `extra` flags.
async fn start_on(cp: &ControlPlane, extra: &[&str]) -> Proxy {
    let args = cp.proxy_args(extra);
    Proxy::start(&args.iter().map(String::as_str).collect::<Vec<_>>()).await
}

const POD_LOOKUPS: &[(&str, &str)] = &[("LIST", "pods"), ("WATCH", "pods"), ("GET", "pods")];

#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn the_api_server_pays_per_identity_not_per_connection() {
    let cp = or_return!(start_or_skip().await);
    let token = two_teams(&cp).await;
    // Decisions are kept long enough that only concurrency could cause a second review.
    let proxy = start_on(
        &cp,
        &[
            "--authz",
            "namespace",
            "--authz-pod-ip",
            "--authz-cache-ttl",
            "1h",
            "--max-connections-per-address",
            "0",
        ],
    )
    .await;

    // Concurrent first requests with one token: one TokenReview.
    let reviews = cp.requests("POST", "tokenreviews").await;
    let channel = plain_channel(proxy.port).await;
    let answers =
        futures::future::join_all((0..50).map(|_| first(channel.clone(), TEAM_A, Some(&token))))
            .await;
    for answer in answers {
        assert!(answer.expect("own namespace").contains("team-a"));
    }
    let made = support::eventually("the API server counts the TokenReview", || async {
        let made = cp.requests("POST", "tokenreviews").await - reviews;
        if made > 0 { Ok(made) } else { Err("none yet") }
    })
    .await;
    assert_eq!(
        made, 1,
        "TokenReviews for 50 concurrent requests with one token"
    );

    // 200 connections from one pod's address: no pod lookup each.
    running_pod(&cp, "team-a", "web-0", "web", "127.0.0.9").await;
    let (_probe, _) = served_from(&proxy, "127.0.0.9", TEAM_A).await;
    let lookups = requests(&cp, POD_LOOKUPS).await;
    // In ten waves of twenty: concurrent lookups of one address share a request anyway, so
    // the waves show that connections after the first ones make none.
    for _ in 0..10 {
        let answers = futures::future::join_all((0..20).map(|_| {
            let proxy = &proxy;
            async move {
                let channel = connect_from(proxy, "127.0.0.9").await;
                first(channel, TEAM_A, None).await
            }
        }))
        .await;
        for answer in answers {
            assert!(answer.expect("the pod's own namespace").contains("team-a"));
        }
    }
    let made = requests(&cp, POD_LOOKUPS).await - lookups;
    assert!(
        made <= 2,
        "{made} pod requests for 200 connections from one pod"
    );

    // The pod goes and its address is given to a pod of another ServiceAccount in another
    // namespace: the new pod is the new pod, never the old one.
    Api::<Pod>::namespaced(cp.admin_client(), "team-a")
        .delete("web-0", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
    running_pod(&cp, "team-b", "db-0", "db", "127.0.0.9").await;
    let (reused, _) = served_from(&proxy, "127.0.0.9", TEAM_B).await;
    assert_refused(
        first(reused.clone(), TEAM_A, None).await,
        Code::PermissionDenied,
        "system:serviceaccount:team-b:db",
    );

    // Two running pods claim the address (one of them is gone, the API does not know yet):
    // neither identity is handed out.
    running_pod(&cp, "team-a", "web-1", "web", "127.0.0.9").await;
    let refused = support::eventually("the second claim on 127.0.0.9 is seen", || async {
        match first(reused.clone(), TEAM_B, None).await {
            Err(status) if status.code() == Code::Unauthenticated => Ok(status),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_status(
        &refused,
        Code::Unauthenticated,
        "several running pods have the address 127.0.0.9",
    );
    for ns in ["team-a", "team-b"] {
        let status = first(
            reused.clone(),
            &format!("core.openfeature.dev/{ns}/flags"),
            None,
        )
        .await
        .expect_err("no identity");
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    }
}

#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn tokens_pods_and_rbac_against_the_api_server() {
    let cp = or_return!(start_or_skip().await);
    let token = two_teams(&cp).await;

    // Namespace mode with ServiceAccount tokens.
    let proxy = start_on(&cp, &["--authz", "namespace", "--authz-pod-ip"]).await;
    let channel = plain_channel(proxy.port).await;
    let own = first(channel.clone(), TEAM_A, Some(&token))
        .await
        .expect("own namespace");
    assert!(own.contains("team-a"));
    let denied = first(channel.clone(), TEAM_B, Some(&token))
        .await
        .expect_err("denied");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let bogus = first(channel.clone(), TEAM_A, Some("not-a-token"))
        .await
        .expect_err("bad");
    assert_eq!(bogus.code(), Code::Unauthenticated, "{bogus:?}");
    assert_refused(
        first(channel.clone(), TEAM_A, None).await,
        Code::Unauthenticated,
        "no running pod has the address 127.0.0.1",
    );

    // Pod address identity: a running pod in team-a owns 127.0.0.7; a client from there is it.
    running_pod(&cp, "team-a", "web-0", "web", "127.0.0.7").await;
    // The proxy learns of the pod from its pod watch.
    let (from_pod, _) = served_from(&proxy, "127.0.0.7", TEAM_A).await;
    let denied = first(from_pod, TEAM_B, None)
        .await
        .expect_err("other namespace");
    assert_status(&denied, Code::PermissionDenied, "pod address");
    drop(proxy);

    // RBAC mode: the API decides, and a revoked binding ends a live stream.
    let proxy = start_on(&cp, &["--authz", "rbac", "--authz-cache-ttl", "500ms"]).await;
    let channel = plain_channel(proxy.port).await;
    assert_refused(
        first(channel.clone(), TEAM_A, Some(&token)).await,
        Code::PermissionDenied,
        "RBAC does not allow get",
    );

    grant_flag_reading(
        &cp,
        "team-b",
        "web-reads-flags",
        json!({"kind": "ServiceAccount", "namespace": "team-a", "name": "web"}),
    )
    .await;
    let bindings: Api<RoleBinding> = Api::namespaced(cp.admin_client(), "team-b");
    // RBAC takes effect asynchronously in the API server; ask until it does (cache TTL is short).
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    let mut stream = loop {
        match Client::new(channel.clone())
            .sync_flags(request(TEAM_B, Some(&token)))
            .await
        {
            Ok(response) => break response.into_inner(),
            Err(status) => {
                assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the RoleBinding never took effect"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let message = tokio::time::timeout(EVENT_TIMEOUT, stream.message())
        .await
        .expect("no hang");
    assert!(
        message
            .expect("ok")
            .expect("first message")
            .flag_configuration
            .contains("team-b")
    );

    bindings
        .delete("web-reads-flags", &DeleteParams::default())
        .await
        .expect("delete binding");
    let end = tokio::time::timeout(EVENT_TIMEOUT, stream.message())
        .await
        .expect("the stream ends");
    let status = end.expect_err("revoked access ends the stream with an error");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
}

/// The node tier (`--upstream`) authorizes its own clients through the API: with
/// `--authz-pod-node` only pods scheduled on its node identify a client, and it watches only
/// those, while the central serves it whatever its clients may read.
#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn the_node_tier_identifies_only_the_pods_of_its_own_node() {
    let cp = or_return!(start_or_skip().await);
    two_teams(&cp).await;
    let central = Proxy::start(
        &cp.proxy_args(&[])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .await;
    let upstream = format!("127.0.0.1:{}", central.port);
    let node = start_on(
        &cp,
        &[
            "--upstream",
            &upstream,
            "--authz",
            "namespace",
            "--authz-pod-ip",
            "--authz-pod-node",
            "node-a",
        ],
    )
    .await;

    running_pod_on(&cp, Some("node-a"), "team-a", "web-a", "web", "127.0.0.31").await;
    running_pod_on(&cp, Some("node-b"), "team-b", "web-b", "web", "127.0.0.32").await;
    let (here, own) = served_from(&node, "127.0.0.31", TEAM_A).await;
    assert!(own.contains("team-a"), "{own}");
    let denied = first(here, TEAM_B, None)
        .await
        .expect_err("another namespace");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");

    // A running pod on another node is no identity here, even for its own namespace ...
    let elsewhere = connect_from(&node, "127.0.0.32").await;
    assert_refused(
        first(elsewhere, TEAM_B, None).await,
        Code::Unauthenticated,
        "no running pod on node node-a has the address 127.0.0.32",
    );
    // ... while a pod of that namespace on this node is served.
    running_pod_on(&cp, Some("node-a"), "team-b", "web-b2", "web", "127.0.0.33").await;
    let (_neighbour, theirs) = served_from(&node, "127.0.0.33", TEAM_B).await;
    assert!(theirs.contains("team-b"), "{theirs}");
}

/// Versions a node proxy serves from its state directory while the central proxy is down are
/// authorized as fresh ones are: a client reads its own namespace's kept version and is refused
/// another namespace's.
#[tokio::test]
async fn kept_versions_are_authorized_like_fresh_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    write_color(dir.path(), "team-a", "flags", "red", &["red"]);
    write_color(dir.path(), "team-b", "flags", "blue", &["blue"]);
    let mut central = Proxy::start(&["--manifests", &dir.path().display().to_string()]).await;
    let ca = TestCa::new();
    let mut args = vec![
        "--upstream".to_owned(),
        format!("127.0.0.1:{}", central.port),
        "--state-dir".into(),
        state.path().display().to_string(),
        "--client-ca-path".into(),
        ca.ca_cert.display().to_string(),
        "--authz".into(),
        "namespace".into(),
    ];
    args.extend(ca.proxy_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let team = |namespace: &str| {
        ca.issue_client_with_uri(
            "web",
            Some(&format!("spiffe://cluster.local/ns/{namespace}/sa/web")),
        )
    };
    let color = |document: String| default_variant(&document, "color");

    let mut node = Proxy::start(&args).await;
    for (namespace, selector, expected) in [("team-a", TEAM_A, "red"), ("team-b", TEAM_B, "blue")] {
        let channel = connect_with(&ca, node.port, team(namespace)).await;
        let served = first(channel, selector, None).await.expect("own namespace");
        assert_eq!(color(served), expected);
    }
    support::eventually("both versions are kept", || async {
        match support::kept_flag_configurations(state.path()).len() {
            2 => Ok(()),
            n => Err(format!("{n} kept")),
        }
    })
    .await;
    assert!(central.terminate().await.success());
    assert!(node.terminate().await.success());

    // The central proxy stays down: what the node serves now is what it kept.
    let node = Proxy::start(&args).await;
    let web = connect_with(&ca, node.port, team("team-a")).await;
    let kept = first(web.clone(), TEAM_A, None)
        .await
        .expect("own namespace, kept");
    assert_eq!(color(kept), "red");
    assert_eq!(node.metric("flagd_proxy_stale_resources").await, 1.0);
    let denied = first(web, TEAM_B, None)
        .await
        .expect_err("another namespace, kept");
    assert_status(
        &denied,
        Code::PermissionDenied,
        "system:serviceaccount:team-a:web",
    );
    let other = connect_with(&ca, node.port, team("team-b")).await;
    let kept = first(other, TEAM_B, None)
        .await
        .expect("its own namespace, kept");
    assert_eq!(color(kept), "blue");
}

/// A flood of invented 15 KiB bearer tokens, each reviewed and refused: the token memo keeps
/// each refusal by the token's digest, charged to the memory budget (`kind="authorization"`) at
/// far less than the token, and the identity of an honest client, kept before the flood,
/// outlasts it (its next request makes no TokenReview).
#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn a_flood_of_invented_tokens_is_kept_small_and_keeps_honest_identities() {
    const TOKENS: usize = 1_000;
    const AUTHORIZATION: &str = "flagd_proxy_memory_charged_bytes{kind=\"authorization\"}";
    let cp = or_return!(start_or_skip().await);
    let token = two_teams(&cp).await;
    let args = ["--authz", "namespace", "--authz-cache-ttl", "1h"];
    let proxy = start_on(&cp, &args).await;
    let channel = plain_channel(proxy.port).await;
    let honest = first(channel.clone(), TEAM_A, Some(&token)).await;
    assert!(honest.expect("own namespace").contains("team-a"));
    let rss_before = proxy.rss_bytes();

    for wave in 0..TOKENS / 50 {
        let invented = futures::future::join_all((0..50).map(|i| {
            let token = invented_token(wave * 50 + i);
            let channel = channel.clone();
            async move { first(channel, TEAM_A, Some(&token)).await }
        }))
        .await;
        for answer in invented {
            assert_eq!(answer.expect_err("refused").code(), Code::Unauthenticated);
        }
    }
    let charged = proxy.metric(AUTHORIZATION).await;
    let per_token = charged / TOKENS as f64;
    eprintln!(
        "{TOKENS} invented tokens of 15 KiB: {per_token:.0} bytes charged per token; RSS {:+.1} KiB per token",
        (proxy.rss_bytes() as f64 - rss_before as f64) / TOKENS as f64 / 1024.0
    );
    assert!(
        (100.0..1024.0).contains(&per_token),
        "{per_token} bytes charged per refused token"
    );
    let reviews = cp.requests("POST", "tokenreviews").await;
    let again = first(channel, TEAM_A, Some(&token)).await;
    assert!(again.expect("own namespace").contains("team-a"));
    assert_eq!(
        cp.requests("POST", "tokenreviews").await,
        reviews,
        "the honest identity was kept"
    );
}

/// A token no one issued, 15,000 characters of the JWT alphabet, distinct for each `seed`.
fn invented_token(seed: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut state = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..15_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(ALPHABET[(state % 64) as usize])
        })
        .collect()
}
