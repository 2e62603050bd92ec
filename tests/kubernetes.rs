//! The Kubernetes source against a real kube-apiserver and etcd (see `testkit/src/control_plane.rs`),
//! with the proxy binary running as the restricted identity `system:serviceaccount:flagd:proxy`.
//!
//! Each test starts its own control plane and uses its own namespaces. The tests that need one
//! take turns (a lock), so a small machine never runs several API servers at once. Without the
//! control-plane binaries these tests print a notice and pass, unless `CI` is set.
use flagd_proxy_testkit as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::discovery::Scope;
use serde::Deserialize;
use serde_json::{Value, json};
use support::client::{
    Client, assert_status, client, default_variant, next_message, open, v1, with_selector,
};
use support::control_plane::{self, ControlPlane, feature_flag_resource};
use support::relay::Relay;
use support::{EVENT_TIMEOUT, Proxy, eventually, string_flag};
use tonic::{Code, Status, Streaming};

/// One control plane at a time.
static CONTROL_PLANE_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The forbidden-error counter of the Kubernetes source.
const FORBIDDEN_METRIC: &str =
    "flagd_proxy_source_errors_total{source=\"kubernetes\",kind=\"forbidden\"}";

// ---------------------------------------------------------------------------------------------
// Helpers

/// A FeatureFlag `<ns>/<name>` with one string flag `color` defaulting to `variant`.
fn feature_flag(ns: &str, name: &str, variant: &str) -> DynamicObject {
    control_plane::feature_flag_object(ns, name, string_flag("color", variant, &[variant, "other"]))
}

fn flags_api(cp: &ControlPlane, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(cp.admin_client(), ns, &feature_flag_resource())
}

async fn create_flag(cp: &ControlPlane, ns: &str, name: &str, variant: &str) {
    let api = flags_api(cp, ns);
    let object = feature_flag(ns, name, variant);
    let params = PostParams::default();
    eventually(&format!("creating FeatureFlag {ns}/{name}"), || {
        api.create(&params, &object)
    })
    .await;
}

async fn set_variant(cp: &ControlPlane, ns: &str, name: &str, variant: &str) {
    let api = flags_api(cp, ns);
    let patch = json!({"spec": {"flagSpec": {"flags": {"color": {
        "variants": {variant: variant},
        "defaultVariant": variant
    }}}}});
    let params = PatchParams::default();
    let patch = Patch::Merge(&patch);
    eventually(&format!("updating FeatureFlag {ns}/{name}"), || {
        api.patch(name, &params, &patch)
    })
    .await;
}

async fn delete_flag(cp: &ControlPlane, ns: &str, name: &str) {
    let api = flags_api(cp, ns);
    let params = DeleteParams::default();
    eventually(&format!("deleting FeatureFlag {ns}/{name}"), || {
        api.delete(name, &params)
    })
    .await;
}

fn selector(ns: &str, name: &str) -> String {
    format!("core.openfeature.dev/{ns}/{name}")
}

/// The first message of a new stream, or the status that refused or ended it.
async fn first_message(
    client: &mut Client,
    selector: &str,
) -> Result<v1::SyncFlagsResponse, Status> {
    let mut stream = open(client, selector).await?;
    next_message(&mut stream).await
}

async fn next_variant(stream: &mut Streaming<v1::SyncFlagsResponse>) -> String {
    let message = next_message(stream)
        .await
        .expect("the stream stays healthy");
    default_variant(&message.flag_configuration, "color")
}

/// Reads a stream until it carries `want`; intermediate versions may come first.
async fn wait_for_variant(stream: &mut Streaming<v1::SyncFlagsResponse>, want: &str) {
    loop {
        if next_variant(stream).await == want {
            return;
        }
    }
}

/// Waits until one log line contains every needle.
async fn wait_for_log_line(proxy: &Proxy, needles: &[&str]) -> String {
    wait_for_log_line_within(proxy, needles, EVENT_TIMEOUT).await
}

/// Waits until one log line contains every needle, for at most `timeout` (a hang guard).
async fn wait_for_log_line_within(proxy: &Proxy, needles: &[&str], timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(line) = proxy
            .log_text()
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
        {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no log line with all of {needles:?}:\n{}",
            proxy.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_proxy_with_flags(cp: &ControlPlane, extra: &[&str]) -> Proxy {
    let args = cp.proxy_args(extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Proxy::start(&args).await
}

// ---------------------------------------------------------------------------------------------
// Configuration (no control plane needed)

fn run_proxy_expecting_exit(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flagd-proxy"));
    command
        .args(["start", "--bind-address", "127.0.0.1", "--port", "0"])
        .args(["--management-port", "0"])
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT");
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command.output().expect("running flagd-proxy");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs the proxy with `args` and `env`; asserts that it exits with 64 naming every one of
/// `needles` on stderr.
fn assert_usage_error(args: &[&str], env: &[(&str, &str)], needles: &[&str]) {
    let (code, stderr) = run_proxy_expecting_exit(args, env);
    assert_eq!(code, Some(64), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} missing from: {stderr}");
    }
}

#[test]
fn configuration_errors_exit_before_listening() {
    let dir = tempfile::tempdir().expect("tempdir");

    // Nothing configured: the message tells every way to configure the proxy.
    assert_usage_error(
        &[],
        &[],
        &["KUBECONFIG", "--kube-api-server", "--manifests DIR"],
    );

    // A broken KUBECONFIG is an error naming the file, never a fallback.
    let broken = dir.path().join("broken-kubeconfig");
    std::fs::write(&broken, "clusters: [").expect("write");
    let broken = broken.display().to_string();
    assert_usage_error(
        &[],
        &[
            ("KUBECONFIG", &broken),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ],
        &[&broken],
    );
    let missing = dir.path().join("missing-kubeconfig").display().to_string();
    assert_usage_error(&[], &[("KUBECONFIG", &missing)], &[&missing]);

    // Unreadable token and CA files name the flag and the file.
    let token = dir.path().join("no-token").display().to_string();
    assert_usage_error(
        &[
            "--kube-api-server",
            "https://127.0.0.1:1",
            "--kube-token-path",
            &token,
        ],
        &[],
        &["--kube-token-path", &token],
    );
    let ca = dir.path().join("no-ca.pem").display().to_string();
    assert_usage_error(
        &[
            "--kube-api-server",
            "https://127.0.0.1:1",
            "--kube-ca-path",
            &ca,
        ],
        &[],
        &["--kube-ca-path", &ca],
    );
}

#[tokio::test]
async fn an_unreachable_api_server_does_not_block_start_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "not-a-real-token\n").expect("write");
    let url = format!("https://127.0.0.1:{}", support::free_port());
    let proxy = Proxy::start(&[
        "--kube-api-server",
        &url,
        "--kube-token-path",
        token.to_str().expect("utf-8"),
    ])
    .await;
    let mut client = client(&proxy).await;
    let status = client
        .fetch_all_flags(with_selector(
            v1::FetchAllFlagsRequest::default(),
            &selector("any", "flags"),
        ))
        .await
        .expect_err("nothing to fetch");
    assert_status(
        &status,
        Code::Unavailable,
        "cannot reach the Kubernetes API server",
    );
    assert!(
        proxy
            .metric("flagd_proxy_source_errors_total{source=\"kubernetes\",kind=\"unreachable\"}")
            .await
            > 0.0
    );
}

// ---------------------------------------------------------------------------------------------
// Against the control plane

/// Many subscribers share one watch, which closes once they have gone; creations, updates,
/// deletions and re-creations reach open streams. Connects through KUBECONFIG.
#[tokio::test]
async fn one_watch_per_resource_and_changes_propagate() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    cp.grant_proxy_cluster_wide().await;
    for ns in ["shared", "late"] {
        cp.create_namespace(ns).await;
    }
    create_flag(&cp, "shared", "flags", "red").await;
    let kubeconfig = cp.proxy_kubeconfig().display().to_string();
    let proxy =
        Proxy::start_with_env(&["--idle-timeout", "1s"], &[("KUBECONFIG", &kubeconfig)]).await;
    assert_eq!(cp.open_watches("featureflags").await, 0);

    // 20 subscribers, over two connections.
    let shared = selector("shared", "flags");
    let mut clients = [client(&proxy).await, client(&proxy).await];
    let mut streams = Vec::new();
    for i in 0..20 {
        let stream = open(&mut clients[i % 2], &shared)
            .await
            .expect("stream opened");
        streams.push(stream);
    }
    for stream in &mut streams {
        assert_eq!(next_variant(stream).await, "red");
    }
    cp.wait_for_open_watches("featureflags", 1).await;
    assert_eq!(proxy.metric("flagd_proxy_upstream_watches").await, 1.0);

    // An update reaches every stream.
    set_variant(&cp, "shared", "flags", "blue").await;
    for stream in &mut streams {
        wait_for_variant(stream, "blue").await;
    }

    // A deletion keeps the streams open with the last flags...
    delete_flag(&cp, "shared", "flags").await;
    wait_for_log_line(&proxy, &["resource not found", &shared]).await;
    for stream in &mut streams {
        let quiet = tokio::time::timeout(Duration::from_millis(200), stream.message()).await;
        assert!(quiet.is_err(), "nothing is sent for a deletion: {quiet:?}");
    }
    let fetched = clients[0]
        .fetch_all_flags(with_selector(v1::FetchAllFlagsRequest::default(), &shared))
        .await
        .expect("the last flags are still served")
        .into_inner();
    assert_eq!(
        default_variant(&fetched.flag_configuration, "color"),
        "blue"
    );
    // ... and a re-creation delivers the new content.
    create_flag(&cp, "shared", "flags", "green").await;
    for stream in &mut streams {
        wait_for_variant(stream, "green").await;
    }
    assert_eq!(cp.open_watches("featureflags").await, 1, "still one watch");

    // The watch closes after the last subscriber has gone (plus the idle time).
    drop(streams);
    cp.wait_for_open_watches("featureflags", 0).await;
    proxy
        .wait_for_metric("flagd_proxy_upstream_watches", 0.0)
        .await;

    // A resource created after its first subscriber arrived.
    let late = selector("late", "flags");
    let mut stream = open(&mut clients[0], &late).await.expect("stream opened");
    cp.wait_for_open_watches("featureflags", 1).await;
    wait_for_log_line(&proxy, &["resource not found", &late]).await;
    create_flag(&cp, "late", "flags", "purple").await;
    assert_eq!(next_variant(&mut stream).await, "purple");

    // FetchAllFlags on a resource that does not exist.
    let status = clients[1]
        .fetch_all_flags(with_selector(
            v1::FetchAllFlagsRequest::default(),
            &selector("late", "missing"),
        ))
        .await
        .expect_err("missing resource");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

/// The restricted identity may read namespace A only: B is refused with a message that names
/// the missing permission, A keeps working, and B works once it is granted.
#[tokio::test]
async fn rbac_refusal_is_explained_and_recovers_when_granted() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    for ns in ["rbac-a", "rbac-b"] {
        cp.create_namespace(ns).await;
        create_flag(&cp, ns, "flags", "red").await;
    }
    cp.grant_proxy_namespace("rbac-a").await;
    let proxy = start_proxy_with_flags(&cp, &["--idle-timeout", "1s"]).await;
    let mut client = client(&proxy).await;

    let a = selector("rbac-a", "flags");
    let mut stream_a = open(&mut client, &a).await.expect("stream for A");
    assert_eq!(next_variant(&mut stream_a).await, "red");

    let b = selector("rbac-b", "flags");
    let status = first_message(&mut client, &b)
        .await
        .expect_err("B is refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    for needle in [
        "RBAC forbids list on featureflags.core.openfeature.dev in namespace \"rbac-b\"",
        "for this proxy's identity: grant get, list, watch",
        "system:serviceaccount:flagd:proxy",
    ] {
        assert!(
            status.message().contains(needle),
            "{needle:?} missing: {status:?}"
        );
    }
    let fetch = client
        .fetch_all_flags(with_selector(v1::FetchAllFlagsRequest::default(), &b))
        .await
        .expect_err("fetching B is refused too");
    assert_eq!(fetch.code(), Code::PermissionDenied, "{fetch:?}");
    let line = wait_for_log_line(&proxy, &["access denied", &b]).await;
    assert!(line.contains("RBAC forbids list"), "{line}");
    assert!(proxy.metric(FORBIDDEN_METRIC).await > 0.0);

    // A is unaffected.
    set_variant(&cp, "rbac-a", "flags", "blue").await;
    wait_for_variant(&mut stream_a, "blue").await;

    // Granting B: a new stream for B works (the watch retries by itself with backoff).
    cp.grant_proxy_namespace("rbac-b").await;
    let deadline = Instant::now() + EVENT_TIMEOUT * 2;
    loop {
        match first_message(&mut client, &b).await {
            Ok(message) => {
                assert_eq!(default_variant(&message.flag_configuration, "color"), "red");
                break;
            }
            Err(status) if status.code() == Code::PermissionDenied => {
                assert!(
                    Instant::now() < deadline,
                    "B still refused after the grant: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(status) => panic!("unexpected status for B: {status:?}"),
        }
    }
    set_variant(&cp, "rbac-a", "flags", "green").await;
    wait_for_variant(&mut stream_a, "green").await;
}

/// The API server is killed and started again (same etcd) under live subscribers; an update made
/// after the restart reaches every one of them.
#[tokio::test]
async fn subscribers_catch_up_after_an_api_server_restart() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(mut cp) = control_plane::start_or_skip().await else {
        return;
    };
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace("restart").await;
    create_flag(&cp, "restart", "flags", "red").await;
    let proxy = start_proxy_with_flags(&cp, &[]).await;
    let target = selector("restart", "flags");
    let mut client = client(&proxy).await;
    let mut streams = Vec::new();
    for _ in 0..5 {
        let mut stream = open(&mut client, &target).await.expect("stream opened");
        assert_eq!(next_variant(&mut stream).await, "red");
        streams.push(stream);
    }
    cp.wait_for_open_watches("featureflags", 1).await;

    cp.stop_apiserver().await;
    wait_for_log_line(&proxy, &["source unreachable", &target]).await;
    cp.start_apiserver().await;

    set_variant(&cp, "restart", "flags", "blue").await;
    for stream in &mut streams {
        wait_for_variant(stream, "blue").await;
    }
    // A second update, to show the re-established watch keeps delivering.
    set_variant(&cp, "restart", "flags", "green").await;
    for stream in &mut streams {
        wait_for_variant(stream, "green").await;
    }
    cp.wait_for_open_watches("featureflags", 1).await;
}

/// 200 resources, each with its own subscriber: every stream gets its own resource and the
/// API server sees exactly one watch per resource.
#[tokio::test]
async fn many_resources_each_get_their_own_watch() {
    const RESOURCES: usize = 200;
    const CONNECTIONS: usize = 4;
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace("many").await;
    futures::stream::iter(0..RESOURCES)
        .map(|i| {
            let cp = &cp;
            async move { create_flag(cp, "many", &format!("flags-{i}"), &format!("v{i}")).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let proxy = start_proxy_with_flags(&cp, &[]).await;
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(client(&proxy).await);
    }
    let opened = futures::future::join_all((0..RESOURCES).map(|i| {
        let mut client = clients[i % CONNECTIONS].clone();
        async move {
            let mut stream = open(&mut client, &selector("many", &format!("flags-{i}")))
                .await
                .expect("stream opened");
            let variant = next_variant(&mut stream).await;
            (i, variant, stream)
        }
    }))
    .await;
    for (i, variant, _) in &opened {
        assert_eq!(variant, &format!("v{i}"), "stream {i} got another resource");
    }
    cp.wait_for_open_watches("featureflags", RESOURCES as u64)
        .await;
    assert_eq!(
        proxy.metric("flagd_proxy_upstream_watches").await,
        RESOURCES as f64
    );

    // Updates still go to the right streams.
    let mut streams: Vec<_> = opened.into_iter().map(|(_, _, s)| s).collect();
    for i in [0, RESOURCES / 2, RESOURCES - 1] {
        set_variant(&cp, "many", &format!("flags-{i}"), &format!("w{i}")).await;
        wait_for_variant(&mut streams[i], &format!("w{i}")).await;
    }
}

// ---------------------------------------------------------------------------------------------
// deploy/

#[derive(Deserialize)]
struct Kustomization {
    namespace: Option<String>,
    resources: Vec<String>,
    #[serde(default)]
    images: Vec<ImageOverride>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageOverride {
    name: String,
    new_name: Option<String>,
    new_tag: Option<String>,
}

/// The objects `kubectl apply -k deploy/` would create: the listed files with the kustomization's
/// namespace and image settings applied (the parts of kustomize these files use).
fn rendered_deploy_objects(dir: &Path) -> (String, Vec<Value>) {
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).expect("kustomization.yaml");
    let kustomization: Kustomization = serde_norway::from_str(&text).expect("kustomization parses");
    let namespace = kustomization
        .namespace
        .clone()
        .expect("the base kustomization sets a namespace");
    let mut objects = Vec::new();
    for file in &kustomization.resources {
        let path: PathBuf = dir.join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        for document in serde_norway::Deserializer::from_str(&text) {
            let value = Value::deserialize(document)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
            if !value.is_null() {
                objects.push(value);
            }
        }
    }
    let service_accounts: Vec<String> = objects
        .iter()
        .filter(|o| o["kind"] == "ServiceAccount")
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    for object in &mut objects {
        if let Some(subjects) = object.get_mut("subjects").and_then(Value::as_array_mut) {
            for subject in subjects {
                let names_ours = subject["kind"] == "ServiceAccount"
                    && subject["name"]
                        .as_str()
                        .is_some_and(|n| service_accounts.iter().any(|s| s == n));
                if names_ours {
                    subject["namespace"] = json!(namespace);
                }
            }
        }
        if let Some(containers) = object
            .pointer_mut("/spec/template/spec/containers")
            .and_then(Value::as_array_mut)
        {
            for container in containers {
                let image = container["image"].as_str().unwrap_or_default().to_owned();
                let (name, tag) = image.rsplit_once(':').unwrap_or((&image, ""));
                if let Some(o) = kustomization.images.iter().find(|o| o.name == name) {
                    let name = o.new_name.as_deref().unwrap_or(name);
                    let tag = o.new_tag.as_deref().unwrap_or(tag);
                    container["image"] = json!(format!("{name}:{tag}"));
                }
            }
        }
    }
    (namespace, objects)
}

/// Creates one object as the administrator with strict field validation (unknown or duplicate
/// fields are errors, not warnings).
async fn create_strictly(cp: &ControlPlane, namespace: &str, object: &mut Value) -> String {
    let api_version = object["apiVersion"]
        .as_str()
        .expect("apiVersion")
        .to_owned();
    let kind = object["kind"].as_str().expect("kind").to_owned();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    let client = cp.admin_client();
    let (resource, capabilities) =
        kube::discovery::pinned_kind(&client, &GroupVersionKind::gvk(group, version, &kind))
            .await
            .unwrap_or_else(|e| panic!("the API server does not know {api_version} {kind}: {e}"));
    let ns = match capabilities.scope {
        Scope::Namespaced => {
            object["metadata"]["namespace"] = json!(namespace);
            Some(namespace)
        }
        Scope::Cluster => None,
    };
    let base = if resource.group.is_empty() {
        format!("/api/{}", resource.version)
    } else {
        format!("/apis/{}/{}", resource.group, resource.version)
    };
    let url = match ns {
        Some(ns) => format!("{base}/namespaces/{ns}/{}", resource.plural),
        None => format!("{base}/{}", resource.plural),
    };
    let request = http::Request::post(format!("{url}?fieldValidation=Strict"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(object).expect("json"))
        .expect("request");
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("?")
        .to_owned();
    client
        .request::<Value>(request)
        .await
        .unwrap_or_else(|e| panic!("the API server refused {kind} {name}: {e}"));
    format!("{kind}/{name}")
}

/// The deploy/ manifests are accepted by a real API server and give the proxy's service account
/// read access to the OpenFeature resources, create and patch on Events, and nothing else.
#[tokio::test]
async fn deploy_manifests_are_accepted_and_grant_read_only_access() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    // The control plane pre-creates a ClusterRole of the same name for its own tests; the one
    // from deploy/ replaces it.
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(cp.admin_client())
        .delete(control_plane::PROXY_CLUSTER_ROLE, &DeleteParams::default())
        .await
        .expect("deleting the control plane's own ClusterRole");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let (namespace, mut objects) = rendered_deploy_objects(&dir);
    assert_eq!(namespace, "flagd-proxy");
    // Namespaces first, as kubectl orders them.
    objects.sort_by_key(|o| o["kind"] != "Namespace");
    let mut created = Vec::new();
    for object in &mut objects {
        created.push(create_strictly(&cp, &namespace, object).await);
    }
    for want in [
        "Namespace/flagd-proxy",
        "ServiceAccount/flagd-proxy",
        "ClusterRole/flagd-proxy",
        "ClusterRoleBinding/flagd-proxy",
        "Deployment/flagd-proxy",
        "Service/flagd-proxy-svc",
    ] {
        assert!(
            created.iter().any(|c| c == want),
            "{want} not in {created:?}"
        );
    }
    let service: Value = cp
        .admin_client()
        .request(
            http::Request::get(format!(
                "/api/v1/namespaces/{namespace}/services/flagd-proxy-svc"
            ))
            .body(Vec::new())
            .expect("request"),
        )
        .await
        .expect("the Service exists");
    assert_eq!(service["spec"]["ports"][0]["port"], 8015);

    // Wait until RBAC has seen the binding, then ask about everything else.
    let may = |verb, group, resource, ns| {
        cp.service_account_may(&namespace, "flagd-proxy", verb, group, resource, ns)
    };
    let group = control_plane::GROUP;
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while !may("watch", group, "featureflags", "some-app").await {
        assert!(
            Instant::now() < deadline,
            "the ClusterRoleBinding never took effect"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut answers = BTreeMap::new();
    for resource in ["featureflags", "featureflagsources"] {
        for verb in ["get", "list", "watch"] {
            for ns in ["some-app", &namespace, ""] {
                answers.insert(
                    format!("{verb} {resource} in {ns:?}"),
                    (may(verb, group, resource, ns).await, true),
                );
            }
        }
        for verb in ["create", "update", "patch", "delete"] {
            answers.insert(
                format!("{verb} {resource} in \"some-app\""),
                (may(verb, group, resource, "some-app").await, false),
            );
        }
    }
    // Events on FeatureFlags: create and patch, in any namespace, nothing more.
    for verb in ["create", "patch"] {
        answers.insert(
            format!("{verb} events.k8s.io/events in \"some-app\""),
            (may(verb, "events.k8s.io", "events", "some-app").await, true),
        );
    }
    for (verb, group, resource, ns) in [
        ("get", "events.k8s.io", "events", "some-app"),
        ("list", "events.k8s.io", "events", ""),
        ("update", "events.k8s.io", "events", "some-app"),
        ("delete", "events.k8s.io", "events", "some-app"),
        ("create", "", "events", "some-app"),
        ("get", "", "secrets", namespace.as_str()),
        ("list", "", "secrets", ""),
        ("list", "", "pods", ""),
        ("watch", "", "pods", ""),
        ("get", "", "configmaps", "some-app"),
        ("list", "apps", "deployments", namespace.as_str()),
    ] {
        answers.insert(
            format!("{verb} {group}/{resource} in {ns:?}"),
            (may(verb, group, resource, ns).await, false),
        );
    }
    let wrong: Vec<_> = answers
        .iter()
        .filter(|(_, (allowed, want))| allowed != want)
        .map(|(what, (allowed, _))| format!("{what}: allowed={allowed}"))
        .collect();
    assert!(wrong.is_empty(), "unexpected RBAC answers: {wrong:#?}");
}

#[tokio::test]
async fn invented_selectors_keep_api_server_watches_bounded() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace("flood").await;
    create_flag(&cp, "flood", "real", "red").await;
    let proxy = start_proxy_with_flags(
        &cp,
        &[
            "--idle-timeout",
            "1s",
            "--max-watches",
            "50",
            "--max-waiting-resources",
            "10",
        ],
    )
    .await;
    let mut good_client = client(&proxy).await;
    let mut good = open(&mut good_client, &selector("flood", "real"))
        .await
        .expect("stream");
    assert_eq!(next_variant(&mut good).await, "red");

    // 300 invented names over three connections, all open at once.
    let mut flood_clients = [
        client(&proxy).await,
        client(&proxy).await,
        client(&proxy).await,
    ];
    let mut flood = Vec::new();
    let mut refused = 0;
    let mut most_watches = 0;
    for i in 0..300 {
        match open(
            &mut flood_clients[i % 3],
            &selector("flood", &format!("invented-{i}")),
        )
        .await
        {
            Ok(stream) => flood.push(stream),
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                refused += 1;
            }
        }
        if i % 25 == 0 {
            most_watches = most_watches.max(cp.open_watches("featureflags").await);
        }
    }
    // Streams that were accepted either wait (within the limit) or end with RESOURCE_EXHAUSTED.
    let mut waiting = Vec::new();
    for mut stream in flood {
        match tokio::time::timeout(Duration::from_millis(200), stream.message()).await {
            Err(_) => waiting.push(stream),
            Ok(Err(status)) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                refused += 1;
            }
            Ok(Ok(message)) => panic!("an invented resource delivered {message:?}"),
        }
    }
    most_watches = most_watches.max(cp.open_watches("featureflags").await);
    assert!(
        most_watches <= 50,
        "the API server saw {most_watches} watches; --max-watches is 50"
    );
    assert!(
        waiting.len() <= 10,
        "{} streams still wait; --max-waiting-resources is 10",
        waiting.len()
    );
    assert!(refused >= 290 - waiting.len(), "refused {refused}");

    // The real subscriber is unaffected.
    set_variant(&cp, "flood", "real", "blue").await;
    wait_for_variant(&mut good, "blue").await;

    // Once the flood is gone, only the real resource is watched.
    drop(waiting);
    drop(flood_clients);
    cp.wait_for_open_watches("featureflags", 1).await;
}

// ---------------------------------------------------------------------------------------------
// Events on FeatureFlags

/// The pod name the proxy reports Events as.
const POD_NAME: &str = "flagd-proxy-7d9f-abcde";

/// Grants the proxy identity the events rules of `deploy/clusterrole.yaml` (and only those),
/// cluster-wide, and waits until RBAC honours them.
async fn grant_events_as_deployed(cp: &ControlPlane) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/clusterrole.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/clusterrole.yaml");
    let role: Value = serde_norway::from_str(&text).expect("the ClusterRole parses");
    let rules: Vec<Value> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|rule| rule["apiGroups"].to_string().contains("events.k8s.io"))
        .cloned()
        .collect();
    assert_eq!(rules.len(), 1, "one events rule in {}", path.display());
    let admin = cp.admin_client();
    let role: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "flagd-proxy-events"},
        "rules": rules,
    }))
    .expect("events ClusterRole");
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("creating the events ClusterRole");
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "flagd-proxy-events"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flagd-proxy-events"},
        "subjects": [{"kind": "ServiceAccount", "name": "proxy", "namespace": "flagd"}],
    }))
    .expect("events ClusterRoleBinding");
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &binding)
        .await
        .expect("creating the events ClusterRoleBinding");
    let deadline = Instant::now() + EVENT_TIMEOUT;
    for verb in ["create", "patch"] {
        while !cp
            .service_account_may(
                "flagd",
                "proxy",
                verb,
                "events.k8s.io",
                "events",
                "anywhere",
            )
            .await
        {
            assert!(
                Instant::now() < deadline,
                "the events grant never took effect"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Makes flag `bad` of `<ns>/<name>` invalid: its default variant `missing` is not a variant.
async fn break_flag(cp: &ControlPlane, ns: &str, name: &str, missing: &str) {
    let api = flags_api(cp, ns);
    let patch = json!({"spec": {"flagSpec": {"flags": {"bad": {
        "state": "ENABLED",
        "variants": {"on": true, "off": false},
        "defaultVariant": missing
    }}}}});
    let params = PatchParams::default();
    let patch = Patch::Merge(&patch);
    eventually(&format!("breaking FeatureFlag {ns}/{name}"), || {
        api.patch(name, &params, &patch)
    })
    .await;
}

/// Makes `<ns>/<name>` valid again with `color` defaulting to `variant`.
async fn fix_flag(cp: &ControlPlane, ns: &str, name: &str, variant: &str) {
    let api = flags_api(cp, ns);
    let patch = json!({"spec": {"flagSpec": {"flags": {
        "bad": null,
        "color": {"variants": {variant: variant}, "defaultVariant": variant}
    }}}});
    let params = PatchParams::default();
    let patch = Patch::Merge(&patch);
    eventually(&format!("fixing FeatureFlag {ns}/{name}"), || {
        api.patch(name, &params, &patch)
    })
    .await;
}

/// The Events (events.k8s.io/v1) about FeatureFlag `<ns>/<name>`, read back through the API.
async fn events_about(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(cp.admin_client(), ns);
    let params = kube::api::ListParams::default();
    let list = eventually("listing Events", || api.list(&params)).await;
    list.items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("FeatureFlag") && r.name.as_deref() == Some(name)
            })
        })
        .collect()
}

/// Waits until `count` Events of `type_` about `<ns>/<name>` exist; returns the newest.
async fn wait_for_events(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    type_: &str,
    count: usize,
) -> k8s_openapi::api::events::v1::Event {
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let mut events: Vec<_> = events_about(cp, ns, name)
            .await
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some(type_))
            .collect();
        if events.len() >= count {
            events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
            return events.pop().expect("one");
        }
        assert!(
            Instant::now() < deadline,
            "no {count} {type_} Events about {ns}/{name}: {:#?}",
            events_about(cp, ns, name).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Someone who applies an invalid FeatureFlag that is being served gets a Warning Event on it
/// naming the bad flag and the version clients keep; fixing it gives a Normal Event. A burst of
/// 100 invalid edits makes a bounded number of Event objects.
#[tokio::test]
async fn rejected_versions_are_told_with_events_on_the_resource() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    cp.grant_proxy_cluster_wide().await;
    grant_events_as_deployed(&cp).await;
    cp.create_namespace("events").await;
    create_flag(&cp, "events", "demo", "red").await;
    let args = cp.proxy_args(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let proxy = Proxy::start_with_env(&args, &[("POD_NAME", POD_NAME)]).await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, &selector("events", "demo"))
        .await
        .expect("stream");
    assert_eq!(next_variant(&mut stream).await, "red");
    // A second replica with Events turned off serves the same resource.
    let quiet_args = cp.proxy_args(&["--events=false"]);
    let quiet_args: Vec<&str> = quiet_args.iter().map(String::as_str).collect();
    let quiet = Proxy::start_with_env(&quiet_args, &[("POD_NAME", "quiet-pod")]).await;
    let mut quiet_client = Client::connect(quiet.endpoint())
        .await
        .expect("connecting to the quiet replica");
    let mut quiet_stream = open(&mut quiet_client, &selector("events", "demo"))
        .await
        .expect("stream");
    assert_eq!(next_variant(&mut quiet_stream).await, "red");
    let uid = flags_api(&cp, "events")
        .get("demo")
        .await
        .expect("the FeatureFlag")
        .metadata
        .uid;

    break_flag(&cp, "events", "demo", "nope").await;
    let warning = wait_for_events(&cp, "events", "demo", "Warning", 1).await;
    let note = warning.note.clone().unwrap_or_default();
    for needle in [
        "flag \"bad\"",
        "defaultVariant \"nope\" is not one of the variants",
        "generation 2",
        "clients keep generation 1",
    ] {
        assert!(note.contains(needle), "{needle:?} missing from {note:?}");
    }
    assert_eq!(warning.reason.as_deref(), Some("FlagConfigurationRejected"));
    assert_eq!(warning.reporting_controller.as_deref(), Some("flagd-proxy"));
    assert_eq!(warning.reporting_instance.as_deref(), Some(POD_NAME));
    let regarding = warning.regarding.clone().expect("regarding");
    assert_eq!(
        regarding.uid, uid,
        "the Event is on the object kubectl describes"
    );
    assert_eq!(regarding.namespace.as_deref(), Some("events"));

    fix_flag(&cp, "events", "demo", "blue").await;
    wait_for_variant(&mut stream, "blue").await;
    let normal = wait_for_events(&cp, "events", "demo", "Normal", 1).await;
    let note = normal.note.clone().unwrap_or_default();
    assert!(note.contains("is valid; clients receive it"), "{note}");
    assert_eq!(normal.reason.as_deref(), Some("FlagConfigurationValid"));
    // The quiet replica saw the rejected version before the fix and wrote nothing; the Normal
    // Event above comes at least 5 s after the Warning, so a write of its own would be there.
    wait_for_variant(&mut quiet_stream, "blue").await;
    let quiet_events: Vec<_> = events_about(&cp, "events", "demo")
        .await
        .into_iter()
        .filter(|e| e.reporting_instance.as_deref() == Some("quiet-pod"))
        .collect();
    assert!(
        quiet_events.is_empty(),
        "--events=false wrote {quiet_events:#?}"
    );

    // 100 rapid invalid edits, each with a different problem, then a fix.
    let before = events_about(&cp, "events", "demo").await.len();
    let started = Instant::now();
    for i in 0..100 {
        break_flag(&cp, "events", "demo", &format!("nope-{i}")).await;
    }
    // The newest problem is told, whatever was skipped on the way.
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while !events_about(&cp, "events", "demo").await.iter().any(|e| {
        e.note
            .as_deref()
            .is_some_and(|n| n.contains("defaultVariant \"nope-99\""))
    }) {
        assert!(
            Instant::now() < deadline,
            "no Warning names the last problem: {:#?}",
            events_about(&cp, "events", "demo").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fix_flag(&cp, "events", "demo", "green").await;
    wait_for_variant(&mut stream, "green").await;
    wait_for_events(&cp, "events", "demo", "Normal", 2).await;
    let elapsed = started.elapsed();
    let made = events_about(&cp, "events", "demo").await.len() - before;
    // At most one Event write per resource per interval (5 s), plus the first: the bound in
    // docs/kubernetes.md. It does not depend on how many edits were made.
    let bound = 2 + (elapsed.as_secs() / 5) as usize;
    eprintln!(
        "{made} Event objects for 100 invalid edits and a fix in {elapsed:?} (bound {bound})"
    );
    assert!(
        (2..=bound).contains(&made),
        "{made} Event objects for 100 edits in {elapsed:?} (bound {bound})"
    );
    assert!(made < 100);
}

/// Without permission to write Events, flags still flow and one log line says what is missing.
#[tokio::test]
async fn missing_events_permission_is_logged_and_flags_still_flow() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace("no-events").await;
    create_flag(&cp, "no-events", "demo", "red").await;
    let proxy = start_proxy_with_flags(&cp, &[]).await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, &selector("no-events", "demo"))
        .await
        .expect("stream");
    assert_eq!(next_variant(&mut stream).await, "red");

    break_flag(&cp, "no-events", "demo", "nope").await;
    let line = wait_for_log_line(&proxy, &["cannot record Events"]).await;
    for needle in [
        "create and patch on events (events.k8s.io) in namespace no-events",
        "--events=false",
    ] {
        assert!(line.contains(needle), "{needle:?} missing: {line}");
    }
    fix_flag(&cp, "no-events", "demo", "blue").await;
    wait_for_variant(&mut stream, "blue").await;
    // The Normal Event is refused too: logged at debug level, the clear line stays one.
    wait_for_log_line(&proxy, &["cannot record an event"]).await;
    let lines = proxy.log_text();
    assert_eq!(
        lines.matches("cannot record Events").count(),
        1,
        "one line about the permission:\n{lines}"
    );
    set_variant(&cp, "no-events", "demo", "green").await;
    wait_for_variant(&mut stream, "green").await;
    assert!(
        events_about(&cp, "no-events", "demo").await.is_empty(),
        "no Event was written"
    );
    // A new stream works too: the watch is not stuck.
    let message = first_message(&mut client, &selector("no-events", "demo"))
        .await
        .expect("a new stream");
    assert_eq!(
        default_variant(&message.flag_configuration, "color"),
        "green"
    );
}

// ---------------------------------------------------------------------------------------------
// Faults a real cluster has: the path to the API server cut or dropping packets, etcd compaction,
// the CRD deleted and created again.

/// A FeatureFlag `ns/flags` (red), a relay in front of the API server and a proxy that reaches
/// the API server only through it, with one stream that has the first version.
async fn subscribed_through_a_relay(
    cp: &ControlPlane,
    ns: &str,
) -> (Relay, Proxy, Streaming<v1::SyncFlagsResponse>) {
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace(ns).await;
    create_flag(cp, ns, "flags", "red").await;
    let relay = Relay::start(std::net::SocketAddr::from(([127, 0, 0, 1], cp.port()))).await;
    let mut args = cp.proxy_args(&[]);
    assert_eq!(args[0], "--kube-api-server");
    args[1] = format!("https://127.0.0.1:{}", relay.address().port());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let proxy = Proxy::start(&args).await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, &selector(ns, "flags"))
        .await
        .expect("stream opened");
    assert_eq!(next_variant(&mut stream).await, "red");
    cp.wait_for_open_watches("featureflags", 1).await;
    (relay, proxy, stream)
}

/// The reads (lists, gets) of FeatureFlags the API server answered since it started; it counts the
/// proxy's list of one resource (a `metadata.name` field selector) as a GET.
async fn reads(cp: &ControlPlane) -> u64 {
    cp.requests("LIST", "featureflags").await + cp.requests("GET", "featureflags").await
}

/// The connection to the API server is cut (reset, new ones refused) while the resource
/// changes: once the path is back the watch resumes from the last version it saw, without a
/// list, and delivers the change.
#[tokio::test]
async fn a_cut_connection_resumes_the_watch_without_a_list() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    let (relay, proxy, mut stream) = subscribed_through_a_relay(&cp, "cut").await;
    let lists = reads(&cp).await;

    relay.cut();
    wait_for_log_line(&proxy, &["source unreachable", &selector("cut", "flags")]).await;
    set_variant(&cp, "cut", "flags", "blue").await;
    relay.pass();
    assert_eq!(next_variant(&mut stream).await, "blue");
    cp.wait_for_open_watches("featureflags", 1).await;
    assert_eq!(
        reads(&cp).await,
        lists,
        "the watch resumed from its last version: no list"
    );
}

/// The proxy is cut off while the resource changes twice, etcd compacts its history and the API
/// server restarts (its watch cache starts at the newest revision): the version the watch
/// resumes from is gone (410). The proxy lists again, and subscribers get the newest version
/// next, neither the one in between nor the one they have again.
#[tokio::test]
async fn a_watch_resumed_after_compaction_lists_again() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(mut cp) = control_plane::start_or_skip().await else {
        return;
    };
    let (relay, proxy, mut stream) = subscribed_through_a_relay(&cp, "compaction").await;
    let target = selector("compaction", "flags");

    relay.cut();
    wait_for_log_line(&proxy, &["source unreachable", &target]).await;
    set_variant(&cp, "compaction", "flags", "blue").await;
    set_variant(&cp, "compaction", "flags", "green").await;
    cp.compact_etcd().await;
    cp.stop_apiserver().await;
    cp.start_apiserver().await;
    let lists = reads(&cp).await;
    relay.pass();

    assert_eq!(next_variant(&mut stream).await, "green");
    assert!(
        reads(&cp).await > lists,
        "the version to resume from was gone: the proxy listed again"
    );
    // The watch after the list delivers.
    set_variant(&cp, "compaction", "flags", "red").await;
    assert_eq!(next_variant(&mut stream).await, "red");
}

/// The path to the API server drops every packet without closing anything (a network fault,
/// not a restart). The proxy's HTTP/2 keepalive finds the dead connection (a ping unanswered
/// within 30 s + 20 s), tells subscribers' status that the source is unreachable while they keep
/// their flags, and once the path works again the watch comes back with the change made
/// meanwhile.
#[tokio::test]
async fn a_path_that_drops_packets_is_noticed_and_the_watch_comes_back() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    let (relay, proxy, mut stream) = subscribed_through_a_relay(&cp, "blackhole").await;
    let target = selector("blackhole", "flags");

    relay.blackhole();
    let dropped = Instant::now();
    set_variant(&cp, "blackhole", "flags", "blue").await;
    // Only a hang guard: the keepalive gives up after at most 50 s, then the backoff.
    wait_for_log_line_within(
        &proxy,
        &["source unreachable", &target],
        Duration::from_secs(240),
    )
    .await;
    eprintln!(
        "the dead connection was noticed {:.1} s after the path began dropping packets",
        dropped.elapsed().as_secs_f64()
    );
    relay.pass();
    assert_eq!(next_variant(&mut stream).await, "blue");
}

/// The FeatureFlag CRD is deleted (and with it every FeatureFlag) and created again: subscribers
/// keep their flags meanwhile, and get the resource once it exists again.
#[tokio::test]
async fn the_crd_deleted_and_created_again_serves_the_resource_again() {
    let _turn = CONTROL_PLANE_TURN.lock().await;
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace("crd").await;
    create_flag(&cp, "crd", "flags", "red").await;
    let proxy = start_proxy_with_flags(&cp, &[]).await;
    let target = selector("crd", "flags");
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, &target).await.expect("stream opened");
    assert_eq!(next_variant(&mut stream).await, "red");
    cp.wait_for_open_watches("featureflags", 1).await;

    cp.delete_feature_flag_crd().await;
    wait_for_log_line(&proxy, &["resource not found", &target]).await;
    wait_for_log_line(
        &proxy,
        &["source unreachable", &target, "is the FeatureFlag CRD"],
    )
    .await;
    // A new stream meanwhile gets the last flags.
    let mut late = open(&mut client, &target).await.expect("stream opened");
    assert_eq!(next_variant(&mut late).await, "red");

    cp.create_feature_flag_crd().await;
    create_flag(&cp, "crd", "flags", "blue").await;
    assert_eq!(next_variant(&mut stream).await, "blue");
    assert_eq!(next_variant(&mut late).await, "blue");
}
