//! Faults a real cluster has: the path to the API server cut or dropping packets, etcd
//! compaction, the CRD deleted and created again.

use super::*;
use flagd_proxy_testkit::or_return;

/// A FeatureFlag `ns/flags` (red), a relay in front of the API server and a proxy that reaches
/// the API server only through it, with one stream that has the first version.
async fn subscribed_through_a_relay(
    cp: &ControlPlane,
    ns: &str,
) -> (Relay, Proxy, Streaming<v1::SyncFlagsResponse>) {
    granted_red_flag(cp, ns, "flags").await;
    let relay = Relay::start(std::net::SocketAddr::from(([127, 0, 0, 1], cp.port()))).await;
    let mut args = cp.proxy_args(&[]);
    assert_eq!(args[0], "--kube-api-server");
    args[1] = format!("https://127.0.0.1:{}", relay.address().port());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let proxy = Proxy::start(&args).await;
    let (_client, stream) = red_stream(&proxy, &selector(ns, "flags")).await;
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
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn a_cut_connection_resumes_the_watch_without_a_list() {
    let (_turn, cp) = or_return!(control_plane_or_skip().await);
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
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn a_watch_resumed_after_compaction_lists_again() {
    let (_turn, mut cp) = or_return!(control_plane_or_skip().await);
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
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn a_path_that_drops_packets_is_noticed_and_the_watch_comes_back() {
    let (_turn, cp) = or_return!(control_plane_or_skip().await);
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
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn the_crd_deleted_and_created_again_serves_the_resource_again() {
    let (_turn, cp) = or_return!(control_plane_or_skip().await);
    let proxy = proxy_with_red_flag(&cp, "crd", "flags", &[]).await;
    let target = selector("crd", "flags");
    let (mut client, mut stream) = red_stream(&proxy, &target).await;
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

/// The central tier's warm start: a proxy restarted with its state directory while the API
/// server is down serves a new client the version it delivered last, marked stale, and the
/// fresh one once the API server is back (the node tier's is in `tests/chaining.rs`).
#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn a_proxy_restarted_while_the_api_server_is_down_serves_its_kept_version() {
    let (_turn, mut cp) = or_return!(control_plane_or_skip().await);
    let state = tempfile::tempdir().expect("tempdir");
    let state_dir = state.path().to_str().expect("utf-8").to_owned();
    let extra = ["--state-dir", state_dir.as_str()];
    let mut proxy = proxy_with_red_flag(&cp, "warm", "flags", &extra).await;
    let target = selector("warm", "flags");
    let (_client, stream) = red_stream(&proxy, &target).await;
    eventually("the version to be kept", || async {
        let kept = support::kept_flag_configurations(state.path());
        match kept.as_slice() {
            [document] if default_variant(document, "color") == "red" => Ok(()),
            other => Err(format!("kept {other:?}")),
        }
    })
    .await;
    drop(stream);
    assert!(proxy.terminate().await.success());

    cp.stop_apiserver().await;
    let proxy = start_proxy_with_flags(&cp, &extra).await;
    let (_client, mut stream) = red_stream(&proxy, &target).await;
    assert!(is_stale(&proxy, &target).await, "marked stale");
    assert_eq!(proxy.metric("flagd_proxy_stale_resources").await, 1.0);

    cp.start_apiserver().await;
    set_variant(&cp, "warm", "flags", "blue").await;
    wait_for_variant(&mut stream, "blue").await;
    proxy
        .wait_for_metric("flagd_proxy_stale_resources", 0.0)
        .await;
    assert!(!is_stale(&proxy, &target).await, "fresh");
}

/// Whether the proxy's `/status` marks `target` stale.
async fn is_stale(proxy: &Proxy, target: &str) -> bool {
    proxy
        .status_page()
        .await
        .resource(target)
        .is_some_and(|r| r.stale)
}
