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

/// A central proxy behind one address is replaced: the old one drains (its listener closed, its
/// connections left as they are) and a new one listens on the same port. Meanwhile the node is
/// served on the connection it has, a resource it asks for anew included; when the drain ends,
/// its streams move to the successor, and its clients see nothing of it but the versions.
#[tokio::test]
async fn a_node_is_served_through_its_centrals_drain_and_moves_to_the_successor() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_manifest(dir.path(), "default", "demo", colors("red"));
    write_manifest(dir.path(), "default", "other", colors("white"));
    let manifests = dir.path().to_str().expect("utf-8").to_owned();
    let mut old = Proxy::start(&["--manifests", &manifests, "--drain-delay", "1h"]).await;
    let port = old.port;
    let node = Proxy::start(&["--upstream", &format!("127.0.0.1:{port}")]).await;
    let mut demo = open_demo(node.port).await;
    assert_eq!(next_color(&mut demo).await.expect("first"), "red");

    old.signal("TERM");
    old.wait_for_log("draining: no new connections").await;
    support::wait_until_refused(port).await;
    let new = Proxy::start_on(
        port,
        support::free_port(),
        &["--manifests", &manifests],
        &[],
    )
    .await;
    let mut other = open(
        &mut Client::new(channel(node.port).await),
        "core.openfeature.dev/default/other",
    )
    .await
    .expect("stream");
    assert_eq!(next_color(&mut other).await.expect("first"), "white");
    write_manifest(dir.path(), "default", "demo", colors("blue"));
    assert_eq!(
        next_color(&mut demo).await.expect("served while draining"),
        "blue"
    );

    old.signal("TERM");
    assert!(old.wait_exit().await.success());
    new.wait_for_metric("sync_active_streams", 2.0).await;
    write_manifest(dir.path(), "default", "demo", colors("green"));
    write_manifest(dir.path(), "default", "other", colors("red"));
    for (stream, want) in [(&mut demo, "green"), (&mut other, "red")] {
        // The successor's first version of a resource may come first.
        while next_color(stream).await.expect("from the successor") != want {}
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

/// A node proxy whose `--upstream` is wrong says how, where its operator looks (log and
/// `/status`): nothing listening there is a connection refused, not something "the upstream
/// answered"; another proxy's management port is named as the likely mistake.
#[tokio::test]
async fn a_wrong_upstream_is_explained() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_manifest(dir.path(), "default", "demo", colors("red"));
    let central = Proxy::start(&["--manifests", dir.path().to_str().expect("utf-8")]).await;
    let management = format!("127.0.0.1:{}", central.management_port);
    // Port 1 of loopback: nothing listens there.
    for (upstream, why) in [
        ("127.0.0.1:1", "cannot reach the upstream: "),
        (management.as_str(), "not its management port"),
    ] {
        let node = Proxy::start(&["--upstream", upstream]).await;
        let _stream = open_demo(node.port).await;
        node.wait_for_log("source unreachable").await;
        let status = node.status_page().await;
        let reason = status
            .resource(SELECTOR)
            .and_then(|r| r.reason.clone())
            .unwrap_or_default();
        assert!(reason.contains(why), "{upstream}: {reason:?}");
        if upstream.ends_with(":1") {
            assert!(reason.contains("Connection refused"), "{reason:?}");
        }
    }
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
    node.status_page()
        .await
        .resource(SELECTOR)
        .is_some_and(|r| r.stale)
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

/// A channel to `port` whose connection comes from `address` (a 127.0.0.x address stands for a
/// pod's).
async fn channel_from(port: u16, address: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("uri")
        .local_address(Some(address.parse().expect("ip")))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect from {address}: {e}"))
}

/// The central's manifests: `resources` resources named `r0`, `r1`, …, and `wanted`.
fn many_resources(resources: usize) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..resources {
        write_manifest(dir.path(), "default", &format!("r{i}"), colors("red"));
    }
    write_manifest(dir.path(), "default", "wanted", colors("blue"));
    let manifests = dir.path().to_str().expect("utf-8").to_owned();
    (dir, manifests)
}

fn selector_of(name: &str) -> String {
    format!("core.openfeature.dev/default/{name}")
}

/// A central proxy on `manifests` with `central_args`, and a node proxy chained to it with
/// `node_args`.
async fn tiers(manifests: &str, central_args: &[&str], node_args: &[&str]) -> (Proxy, Proxy) {
    let central_args: Vec<&str> = ["--manifests", manifests]
        .into_iter()
        .chain(central_args.iter().copied())
        .collect();
    let central = Proxy::start(&central_args).await;
    let upstream = format!("127.0.0.1:{}", central.port);
    let node_args: Vec<&str> = ["--upstream", &upstream]
        .into_iter()
        .chain(node_args.iter().copied())
        .collect();
    let node = Proxy::start(&node_args).await;
    (central, node)
}

/// One pod (127.0.0.2) opens streams for `r0` … `r{resources - 1}` on the node proxy, 500 a
/// connection (the node lets one carry 1,000), and waits until the node watches each of them
/// and the central carries at least `central_streams` streams.
async fn one_pod_opens_many(
    (central, node): &(Proxy, Proxy),
    resources: usize,
    central_streams: usize,
) -> Vec<tonic::Streaming<v1::SyncFlagsResponse>> {
    let mut streams = Vec::new();
    let mut pod = Client::new(channel_from(node.port, "127.0.0.2").await);
    for i in 0..resources {
        if i > 0 && i % 500 == 0 {
            pod = Client::new(channel_from(node.port, "127.0.0.2").await);
        }
        let stream = open(&mut pod, &selector_of(&format!("r{i}")))
            .await
            .expect("stream");
        streams.push(stream);
    }
    node.wait_for_metric("flagd_proxy_upstream_watches", resources as f64)
        .await;
    support::eventually("the central carries the streams", || async {
        let carried = central.metric("sync_active_streams").await;
        if carried >= central_streams as f64 {
            Ok(())
        } else {
            Err(format!("the central carries {carried} streams"))
        }
    })
    .await;
    streams
}

/// One pod opens streams for three times as many resources as the central lets one connection
/// carry (its `--max-streams-per-connection`, lowered so that few streams are enough): the node
/// tier spreads its streams to the central over connections of at most
/// `--upstream-streams-per-connection`, so another pod that asks for a new resource gets it.
/// With every stream on one connection, that pod's stream waited behind the central's cap.
#[tokio::test]
async fn one_pods_many_resources_leave_room_on_the_node_tiers_upstream() {
    const CENTRAL_CAP: usize = 20;
    const PER_CONNECTION: usize = 10;
    const RESOURCES: usize = 3 * CENTRAL_CAP;
    let (_dir, manifests) = many_resources(RESOURCES);
    let (cap, per_connection) = (CENTRAL_CAP.to_string(), PER_CONNECTION.to_string());
    let tiers = tiers(
        &manifests,
        &["--max-streams-per-connection", &cap],
        &[
            "--upstream-streams-per-connection",
            &per_connection,
            // The pod's many resources are what this test is about, not the bound on them.
            "--max-resources-per-address",
            "0",
            "--idle-timeout",
            "1s",
        ],
    )
    .await;
    // Every resource's watch has started and the central carries at least its cap of
    // streams: with one connection, the node's further streams would now wait there.
    let mut streams = one_pod_opens_many(&tiers, RESOURCES, CENTRAL_CAP).await;
    let (central, node) = &tiers;

    let mut other = Client::new(channel_from(node.port, "127.0.0.3").await);
    let mut wanted = open(&mut other, &selector_of("wanted"))
        .await
        .expect("stream");
    assert_eq!(
        next_color(&mut wanted)
            .await
            .expect("the other pod's new resource"),
        "blue"
    );
    for stream in &mut streams {
        assert_eq!(next_color(stream).await.expect("first"), "red");
    }
    // 61 streams at 10 a connection.
    assert_eq!(
        node.metric("flagd_proxy_upstream_connections").await,
        RESOURCES.div_ceil(PER_CONNECTION) as f64 + 1.0
    );
    assert_eq!(
        central.metric("sync_active_streams").await,
        RESOURCES as f64 + 1.0
    );

    // Once the pods have gone (and the node's idle time has passed), every connection to the
    // central closes with its last stream.
    drop((streams, wanted, other));
    node.wait_for_metric("flagd_proxy_upstream_watches", 0.0)
        .await;
    node.wait_for_metric("flagd_proxy_upstream_connections", 0.0)
        .await;
}

/// One pod may name at most `--max-resources-per-address` resources on the node tier: one more
/// is refused with RESOURCE_EXHAUSTED naming the limit, counted, and leaves the pod's other
/// streams and other pods alone.
#[tokio::test]
async fn one_pod_names_at_most_its_share_of_resources_on_the_node_tier() {
    const LIMIT: usize = 5;
    let (_dir, manifests) = many_resources(LIMIT + 1);
    let limit = LIMIT.to_string();
    let (_central, node) = tiers(&manifests, &[], &["--max-resources-per-address", &limit]).await;

    let mut pod = Client::new(channel_from(node.port, "127.0.0.2").await);
    let mut streams = Vec::new();
    for i in 0..LIMIT {
        let mut stream = open(&mut pod, &selector_of(&format!("r{i}")))
            .await
            .expect("stream");
        assert_eq!(next_color(&mut stream).await.expect("first"), "red");
        streams.push(stream);
    }
    // From another connection of the same address too.
    let mut same_pod = Client::new(channel_from(node.port, "127.0.0.2").await);
    let refused = open(&mut same_pod, &selector_of(&format!("r{LIMIT}")))
        .await
        .expect_err("one resource too many");
    support::client::assert_status(
        &refused,
        tonic::Code::ResourceExhausted,
        "--max-resources-per-address",
    );
    assert_eq!(
        node.metric("flagd_proxy_rejected_requests_total{reason=\"max_resources_per_address\"}")
            .await,
        1.0
    );
    // More streams for a resource it names already are not limited.
    let mut again = open(&mut same_pod, &selector_of("r0"))
        .await
        .expect("a resource the pod names already");
    assert_eq!(next_color(&mut again).await.expect("first"), "red");
    // Another pod is not affected.
    let mut other = Client::new(channel_from(node.port, "127.0.0.3").await);
    let mut wanted = open(&mut other, &selector_of("wanted"))
        .await
        .expect("stream");
    assert_eq!(next_color(&mut wanted).await.expect("first"), "blue");
    // The pod's place comes back when it stops naming a resource.
    drop(again);
    streams.truncate(LIMIT - 1);
    let mut last = support::eventually("a place again", || {
        let mut same_pod = same_pod.clone();
        async move { open(&mut same_pod, &selector_of(&format!("r{LIMIT}"))).await }
    })
    .await;
    assert_eq!(next_color(&mut last).await.expect("first"), "red");
}

/// Not a check: one pod's streams for 1,000 and then 5,000 resources on a node tier, every
/// limit at its default but the pod's bound (turned off), and what another pod then gets for a
/// new resource. `FLAGD_PROXY_MEASURE_NODE_ARGS` replaces the node's flags (by default
/// `--max-resources-per-address 0`): `--upstream-streams-per-connection 1000000` puts every
/// stream on one connection. Run with `cargo test --release --test chaining
/// measure_one_pods_thousands_of_resources -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a measurement, not a check"]
async fn measure_one_pods_thousands_of_resources_on_the_node_tier() {
    use std::time::{Duration, Instant};
    const WAIT: Duration = Duration::from_secs(20);
    let node_args = std::env::var("FLAGD_PROXY_MEASURE_NODE_ARGS")
        .unwrap_or_else(|_| "--max-resources-per-address 0".into());
    let node_args: Vec<&str> = node_args.split_whitespace().collect();
    for resources in [1_000, 5_000] {
        let (_dir, manifests) = many_resources(resources);
        write_manifest(
            std::path::Path::new(&manifests),
            "default",
            "fetched",
            colors("green"),
        );
        let tiers = tiers(&manifests, &[], &node_args).await;
        let rss_before = tiers.1.rss_bytes();
        // At least as many as the central lets one connection carry.
        let _streams = one_pod_opens_many(&tiers, resources, resources.min(1_000)).await;
        let (central, node) = &tiers;
        let per_resource = |bytes: f64| bytes / resources as f64 / 1024.0;
        let mut charged = Vec::new();
        for kind in ["versions", "connections", "streams", "watches"] {
            let sample = format!("flagd_proxy_memory_charged_bytes{{kind=\"{kind}\"}}");
            charged.push(format!(
                "{kind} {:.1}",
                per_resource(node.metric(&sample).await)
            ));
        }
        eprintln!(
            "{resources} resources: node RSS {:.1} KiB per resource with its stream; charged per resource (KiB): {}",
            per_resource(node.rss_bytes().saturating_sub(rss_before) as f64),
            charged.join(", ")
        );

        let mut other = Client::new(channel_from(node.port, "127.0.0.3").await);
        let started = Instant::now();
        let mut wanted = open(&mut other, &selector_of("wanted"))
            .await
            .expect("stream");
        let streamed = match tokio::time::timeout(WAIT, wanted.message()).await {
            Ok(Ok(Some(_))) => format!("first message after {:?}", started.elapsed()),
            Ok(other) => format!("{other:?} after {:?}", started.elapsed()),
            Err(_) => format!("nothing within {WAIT:?}"),
        };
        let started = Instant::now();
        let fetched = match tokio::time::timeout(
            WAIT,
            support::client::fetch(&mut other, &selector_of("fetched")),
        )
        .await
        {
            Ok(Ok(_)) => format!("answered after {:?}", started.elapsed()),
            Ok(Err(status)) => format!("{:?} after {:?}", status.code(), started.elapsed()),
            Err(_) => format!("nothing within {WAIT:?}"),
        };
        eprintln!(
            "{resources} resources, node flags {node_args:?}: \
             another pod's new resource: SyncFlags {streamed}; FetchAllFlags {fetched}; \
             node: {} upstream connections, RSS {} MiB; central: {} streams, RSS {} MiB",
            node.metric("flagd_proxy_upstream_connections").await,
            node.rss_bytes() / (1 << 20),
            central.metric("sync_active_streams").await,
            central.rss_bytes() / (1 << 20),
        );
    }
}
