//! Topologies: a node-local proxy chained to a central one, and connection ageing.
use flagd_proxy_testkit as support;

use support::client::{Client, channel, default_variant, next_message, open, v1};
use support::{Proxy, string_flag, write_manifest};

const SELECTOR: &str = "core.openfeature.dev/default/demo";

async fn open_demo(port: u16) -> tonic::Streaming<v1::SyncFlagsResponse> {
    open(&mut Client::new(channel(port).await), SELECTOR)
        .await
        .expect("stream")
}

/// The variant of `color` in the stream's next message, or the status that ended the stream.
async fn next_color(
    stream: &mut tonic::Streaming<v1::SyncFlagsResponse>,
) -> Result<String, tonic::Status> {
    let message = next_message(stream).await?;
    Ok(default_variant(&message.flag_configuration, "color"))
}

fn colors(default: &str) -> serde_json::Value {
    string_flag("color", default, &["red", "blue", "green", "white"])
}

#[tokio::test]
async fn node_proxy_shares_one_upstream_stream_and_survives_central_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_manifest(dir.path(), "default", "demo", colors("red"));
    let manifests = dir.path().to_str().expect("utf-8").to_owned();
    let mut central = Proxy::start(&["--manifests", &manifests]).await;
    let upstream = format!("127.0.0.1:{}", central.port);
    let node = Proxy::start(&["--upstream", &upstream]).await;

    let mut streams = Vec::new();
    for _ in 0..5 {
        let mut stream = open_demo(node.port).await;
        assert_eq!(next_color(&mut stream).await.expect("first"), "red");
        streams.push(stream);
    }
    // However many clients the node serves, it holds one stream to the central proxy.
    assert_eq!(central.metric("sync_active_streams").await, 1.0);
    assert_eq!(node.metric("sync_active_streams").await, 5.0);
    assert_eq!(node.metric("flagd_proxy_upstream_watches").await, 1.0);

    write_manifest(dir.path(), "default", "demo", colors("blue"));
    for stream in &mut streams {
        assert_eq!(
            next_color(stream).await.expect("update through both tiers"),
            "blue"
        );
    }

    // The central proxy goes away: node clients stay connected with their flags...
    let (port, management_port) = (central.port, central.management_port);
    assert!(central.terminate().await.success());
    node.wait_for_log("source unreachable").await;
    write_manifest(dir.path(), "default", "demo", colors("green"));
    // ...and get the newest version once it is back.
    let _central = Proxy::start_on(port, management_port, &["--manifests", &manifests], &[]).await;
    for stream in &mut streams {
        assert_eq!(
            next_color(stream)
                .await
                .expect("caught up after the restart"),
            "green"
        );
    }
}

#[tokio::test]
async fn aged_connections_close_and_reconnecting_clients_stay_current() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_manifest(dir.path(), "default", "demo", colors("red"));
    let manifests = dir.path().to_str().expect("utf-8").to_owned();
    let proxy = Proxy::start(&[
        "--manifests",
        &manifests,
        "--max-connection-age",
        "1s",
        "--max-connection-age-grace",
        "1s",
    ])
    .await;
    let mut stream = open_demo(proxy.port).await;
    assert_eq!(next_color(&mut stream).await.expect("first"), "red");
    // The connection is closed once it is old enough; the stream ends with an error, never OK.
    let ended = loop {
        match next_color(&mut stream).await {
            Ok(_) => continue,
            Err(status) => break status,
        }
    };
    assert_ne!(ended.code(), tonic::Code::Ok);
    // A change made while the client reconnects is what it finds.
    write_manifest(dir.path(), "default", "demo", colors("white"));
    let mut again = open_demo(proxy.port).await;
    let mut last = next_color(&mut again).await.expect("first after reconnect");
    while last != "white" {
        last = next_color(&mut again).await.expect("newest version");
    }
}

/// The central proxy refuses a resource whose first version is invalid: the node tier passes
/// the refusal on (FAILED_PRECONDITION with the reason) instead of waiting silently, and serves
/// the resource once it is fixed at the source.
#[tokio::test]
async fn a_refused_first_version_is_passed_on_by_the_node_tier() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = serde_json::json!({"color": {"state": "ENABLED", "variants": {"red": "red"}, "defaultVariant": "blue"}});
    write_manifest(dir.path(), "default", "demo", broken);
    let manifests = dir.path().to_str().expect("utf-8").to_owned();
    let central = Proxy::start(&["--manifests", &manifests]).await;
    let upstream = format!("127.0.0.1:{}", central.port);
    let node = Proxy::start(&["--upstream", &upstream]).await;

    let mut stream = open_demo(node.port).await;
    let status = next_color(&mut stream)
        .await
        .expect_err("the stream ends with the refusal");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("is invalid")
            && status.message().contains("is not one of the variants"),
        "{status:?}"
    );

    write_manifest(dir.path(), "default", "demo", colors("blue"));
    let served = support::eventually("served once fixed", || async {
        let mut again = open_demo(node.port).await;
        next_color(&mut again).await
    })
    .await;
    assert_eq!(served, "blue");
}

/// The node tier asks its central proxy for gzip, and compresses again (once per version) for
/// its own clients that accept it; both tiers serve the exact document.
#[tokio::test]
async fn the_node_tier_takes_gzip_from_its_central_proxy() {
    use support::flag_sets::realistic_flags;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut flags = realistic_flags(1, 200 * 1024);
    flags.extend(colors("red").as_object().cloned().unwrap_or_default());
    let flags = serde_json::Value::Object(flags);
    write_manifest(dir.path(), "default", "demo", flags.clone());
    let manifests = dir.path().to_str().expect("utf-8").to_owned();
    let central = Proxy::start(&["--manifests", &manifests]).await;
    let upstream = format!("127.0.0.1:{}", central.port);
    let node = Proxy::start(&["--upstream", &upstream]).await;

    let client = Client::new(channel(node.port).await)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    let mut stream = open(&mut client.clone(), SELECTOR).await.expect("stream");
    let message = next_message(&mut stream).await.expect("the first version");
    let document: serde_json::Value =
        serde_json::from_str(&message.flag_configuration).expect("JSON");
    assert_eq!(document["flags"], flags);

    let gzip = "flagd_proxy_sent_bytes_total{encoding=\"gzip\"}";
    let identity = "flagd_proxy_sent_bytes_total{encoding=\"identity\"}";
    for tier in [&central, &node] {
        assert!(tier.metric(gzip).await > 0.0, "gzip sent");
        assert_eq!(tier.metric(identity).await, 0.0, "nothing uncompressed");
        assert_eq!(
            tier.metric("flagd_proxy_messages_compressed_total{encoding=\"flagd.sync.v1+gzip\"}")
                .await,
            1.0
        );
    }
}

/// Whether the node's `/status` marks the demo resource stale.
async fn demo_is_stale(node: &Proxy) -> bool {
    let (_, body) = support::http_get(node.management_port, "/status")
        .await
        .expect("status");
    let status: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    status["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .any(|r| r["selector"] == SELECTOR && r["stale"] == true)
}

/// A node proxy restarted with its state directory while the central proxy is down serves the
/// last version it delivered, marked stale, and the fresh one once the central proxy is back; a
/// corrupt file in the directory is ignored with a warning.
#[tokio::test]
async fn a_restarted_node_serves_its_kept_versions_until_the_central_proxy_is_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    write_manifest(dir.path(), "default", "demo", colors("red"));
    let manifests = dir.path().to_str().expect("utf-8").to_owned();
    let state_dir = state.path().to_str().expect("utf-8").to_owned();
    let mut central = Proxy::start(&["--manifests", &manifests]).await;
    let upstream = format!("127.0.0.1:{}", central.port);
    let node_args = ["--upstream", &upstream, "--state-dir", &state_dir];
    let mut node = Proxy::start(&node_args).await;

    let mut stream = open_demo(node.port).await;
    assert_eq!(next_color(&mut stream).await.expect("first"), "red");
    write_manifest(dir.path(), "default", "demo", colors("blue"));
    assert_eq!(next_color(&mut stream).await.expect("update"), "blue");
    support::eventually("the newest version is kept", || async {
        let kept = support::kept_flag_configurations(state.path());
        match kept
            .iter()
            .map(|d| default_variant(d, "color"))
            .collect::<Vec<_>>()
            .as_slice()
        {
            [color] if color == "blue" => Ok(()),
            other => Err(format!("kept {other:?}")),
        }
    })
    .await;
    drop(stream);

    // Both tiers go away; the resource changes meanwhile; a file in the directory is damaged.
    let (port, management_port) = (central.port, central.management_port);
    assert!(central.terminate().await.success());
    assert!(node.terminate().await.success());
    write_manifest(dir.path(), "default", "demo", colors("green"));
    let corrupt = state.path().join("0123456789abcdef0123456789abcdef.json");
    std::fs::write(&corrupt, "{\"format\":1,\"namespace\":\"default\"").expect("write");

    let node = Proxy::start(&node_args).await;
    node.wait_for_log("state file ignored").await;
    assert!(
        node.log_text()
            .lines()
            .any(|l| l.contains("state file ignored") && l.contains(&corrupt.display().to_string())),
        "{}",
        node.log_text()
    );
    // A new client gets the kept version while the central proxy is still down...
    let mut stream = open_demo(node.port).await;
    assert_eq!(
        next_color(&mut stream).await.expect("the kept version"),
        "blue"
    );
    assert!(demo_is_stale(&node).await);
    assert_eq!(node.metric("flagd_proxy_stale_resources").await, 1.0);
    node.wait_for_metric("flagd_proxy_watched_resources{state=\"unreachable\"}", 1.0)
        .await;
    // ...and the fresh one once it is back, which is no longer stale.
    let _central = Proxy::start_on(port, management_port, &["--manifests", &manifests], &[]).await;
    assert_eq!(
        next_color(&mut stream).await.expect("the fresh version"),
        "green"
    );
    node.wait_for_metric("flagd_proxy_stale_resources", 0.0)
        .await;
    assert!(!demo_is_stale(&node).await);
}
