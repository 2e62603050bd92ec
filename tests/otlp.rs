//! OpenTelemetry export (`--otlp-endpoint`) against a real OpenTelemetry Collector (built from
//! its Go modules by `scripts/install-otelcol.sh`: the OTLP receiver and the file exporter).
//! A central proxy (manifest files) and a node tier chained to it both export; a client of the
//! node tier sees an update. The collector receives the metrics of `/metrics` under their names
//! (counters as monotonic sums, gauges, the propagation histogram with its buckets), a
//! `flagd_proxy.publish` span per version from each tier with the resource, version,
//! subscribers and bytes, and the node tier's `flagd_proxy.upstream.connect` span. Over TLS,
//! the collector's CA is given with `--otlp-ca-file`; without it every export fails, is counted,
//! and clients are served all the same. With the Kubernetes API as the source (a real
//! kube-apiserver, see `testkit/src/control_plane.rs`), the watch's attempts to reach the API
//! server are spans too, through a restart of the API server.
//!
//! Without the collector (or, for the Kubernetes test, the control plane) these tests print a
//! notice and pass, unless `CI` is set.
use flagd_proxy_testkit as support;
use kube::api::{Api, PostParams};
use serde_json::Value;
use support::client::{Client, channel, default_variant, next, open, v1};
use support::control_plane::{self, feature_flag_object, feature_flag_resource};
use support::or_return;
use support::otelcol::{self, Collector, ReceiverTls, attribute};
use support::{Proxy, TestCa, eventually, string_flag, write_manifest};

const SELECTOR: &str = "core.openfeature.dev/shop/checkout";

fn colors(default: &str) -> Value {
    string_flag("color", default, &["red", "blue"])
}

/// A stream of shop/checkout from `proxy`.
async fn subscribe(proxy: &Proxy) -> tonic::Streaming<v1::SyncFlagsResponse> {
    open(&mut Client::new(channel(proxy.port).await), SELECTOR)
        .await
        .expect("a stream")
}

/// The default variant of `color` in the stream's next message.
async fn next_color(stream: &mut tonic::Streaming<v1::SyncFlagsResponse>) -> String {
    default_variant(&next(stream).await.flag_configuration, "color")
}

/// The OTLP flags for a proxy exporting every second as `instance`.
fn otlp_args(endpoint: &str, instance: &str) -> Vec<String> {
    [
        "--otlp-endpoint",
        endpoint,
        "--otlp-interval",
        "1s",
        "--otlp-resource-attribute",
        &format!("service.instance.id={instance}"),
    ]
    .map(str::to_owned)
    .to_vec()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The items (spans or metrics, with their resource's attributes) called `name` that
/// `instance` exported, oldest first.
fn named(items: Vec<(Value, Value)>, instance: &str, name: &str) -> Vec<Value> {
    items
        .into_iter()
        .filter(|(resource, item)| {
            attribute(resource, "service.instance.id").as_deref() == Some(instance)
                && item["name"] == name
        })
        .map(|(_, item)| item)
        .collect()
}

/// The spans called `name` that `instance` exported.
fn spans_of(received: &[Value], instance: &str, name: &str) -> Vec<Value> {
    named(otelcol::spans(received), instance, name)
}

/// The publish span of `version` that `instance` exported.
fn publish_span(received: &[Value], instance: &str, version: u64) -> Option<Value> {
    spans_of(received, instance, "flagd_proxy.publish")
        .into_iter()
        .find(|span| {
            attribute(&span["attributes"], "flagd_proxy.version") == Some(version.to_string())
        })
}

/// The newest export of metric `name` by `instance`.
fn metric_of(received: &[Value], instance: &str, name: &str) -> Option<Value> {
    named(otelcol::metrics(received), instance, name).pop()
}

/// `span` is the first attempt of the watch of shop/checkout to reach its backend, and it worked.
fn assert_first_attempt(span: &Value) {
    let attributes = &span["attributes"];
    assert_eq!(
        attribute(attributes, "flagd_proxy.attempt").as_deref(),
        Some("1"),
        "{span}"
    );
    assert_eq!(
        attribute(attributes, "flagd_proxy.resource").as_deref(),
        Some("shop/checkout"),
        "{span}"
    );
    assert!(span["status"].get("code").is_none(), "{span}");
}

/// The first data point of a Sum or Gauge, as a number (OTLP JSON writes `asInt` as a string).
fn number(metric: &Value, kind: &str) -> Option<f64> {
    let point = &metric[kind]["dataPoints"][0];
    match (&point["asInt"], &point["asDouble"]) {
        (Value::String(int), _) => int.parse().ok(),
        (_, Value::Number(double)) => double.as_f64(),
        // A zero integer is left out.
        _ => point.is_object().then_some(0.0),
    }
}

#[tokio::test]
#[ignore = "needs an OpenTelemetry Collector: scripts/test installs it"]
async fn metrics_and_spans_of_both_tiers_reach_a_real_collector() {
    let bin = or_return!(otelcol::find_or_skip());
    let collector = Collector::start(&bin, None).await;
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    let dir = tempfile::tempdir().expect("tempdir");
    write_manifest(dir.path(), "shop", "checkout", colors("red"));
    let manifests = dir.path().to_str().expect("utf-8");

    let mut central_args = vec!["--manifests", manifests];
    let central_otlp = otlp_args(&endpoint, "central");
    central_args.extend(strs(&central_otlp));
    let central = Proxy::start(&central_args).await;
    let upstream = format!("127.0.0.1:{}", central.port);
    let mut node_args = vec!["--upstream", upstream.as_str()];
    let node_otlp = otlp_args(&endpoint, "node");
    node_args.extend(strs(&node_otlp));
    let node = Proxy::start(&node_args).await;

    let mut stream = subscribe(&node).await;
    let first = next(&mut stream).await;
    assert_eq!(default_variant(&first.flag_configuration, "color"), "red");
    write_manifest(dir.path(), "shop", "checkout", colors("blue"));
    let second = next(&mut stream).await;
    assert_eq!(default_variant(&second.flag_configuration, "color"), "blue");

    // One publish span per version and tier: the node's second version reached its one client.
    let span = collector
        .wait_for("the node tier's publish span of version 2", |received| {
            publish_span(received, "node", 2)
        })
        .await;
    let attributes = &span["attributes"];
    let text = |key| attribute(attributes, key);
    assert_eq!(
        text("flagd_proxy.resource").as_deref(),
        Some("shop/checkout")
    );
    assert_eq!(text("flagd_proxy.subscribers").as_deref(), Some("1"));
    assert_eq!(
        text("flagd_proxy.bytes"),
        Some(second.flag_configuration.len().to_string())
    );
    assert_eq!(text("flagd_proxy.superseded").as_deref(), Some("false"));
    let start: u64 = span["startTimeUnixNano"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("a start time");
    let end: u64 = span["endTimeUnixNano"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("an end time");
    assert!(start > 0 && start <= end, "{span}");
    assert_eq!(span["traceId"].as_str().map(str::len), Some(32), "{span}");
    // The central proxy's versions went to its one subscriber, the node tier.
    for version in [1, 2] {
        let span = collector
            .wait_for(
                &format!("the central proxy's publish span of version {version}"),
                |r| publish_span(r, "central", version),
            )
            .await;
        assert_eq!(
            attribute(&span["attributes"], "flagd_proxy.subscribers").as_deref(),
            Some("1"),
            "{span}"
        );
    }
    // The node tier's stream to the central proxy, opened once.
    let connects = collector
        .wait_for("the node tier's upstream connect span", |received| {
            let spans = spans_of(received, "node", "flagd_proxy.upstream.connect");
            (!spans.is_empty()).then_some(spans)
        })
        .await;
    assert_eq!(connects.len(), 1, "{connects:?}");
    assert_first_attempt(&connects[0]);
    assert_eq!(
        attribute(&connects[0]["attributes"], "flagd_proxy.upstream"),
        Some(upstream.clone())
    );

    // The metrics of /metrics, by their registered names, once an export has seen both versions
    // delivered.
    let propagation = collector
        .wait_for(
            "the node tier's propagation histogram with two versions",
            |r| {
                let metric = metric_of(r, "node", "flagd_proxy_propagation_seconds")?;
                (metric["histogram"]["dataPoints"][0]["count"] == "2").then_some(metric)
            },
        )
        .await;
    let point = &propagation["histogram"]["dataPoints"][0];
    let bounds = point["explicitBounds"].as_array().expect("bounds");
    assert_eq!(bounds.len(), 16, "{point}");
    assert_eq!(bounds[0].as_f64(), Some(0.0005), "{point}");
    let counts = point["bucketCounts"].as_array().expect("bucket counts");
    assert_eq!(counts.len(), 17, "one more bucket than bounds: {point}");
    let counted: u64 = counts
        .iter()
        .filter_map(|c| c.as_str()?.parse::<u64>().ok())
        .sum();
    assert_eq!(counted, 2, "{point}");
    assert_eq!(propagation["histogram"]["aggregationTemporality"], 2);

    let received = collector.received();
    let published = metric_of(&received, "node", "flagd_proxy_versions_published")
        .expect("flagd_proxy_versions_published");
    assert_eq!(published["sum"]["isMonotonic"], true, "{published}");
    assert_eq!(number(&published, "sum"), Some(2.0), "{published}");
    let streams = metric_of(&received, "node", "sync_active_streams").expect("sync_active_streams");
    assert_eq!(number(&streams, "gauge"), Some(1.0), "{streams}");
    let failures = metric_of(&received, "node", "flagd_proxy_otlp_export_failures")
        .expect("flagd_proxy_otlp_export_failures");
    assert_eq!(
        number(&failures, "sum"),
        Some(0.0),
        "{failures}\n{}",
        node.log_text()
    );
    let resource = otelcol::metrics(&received)
        .into_iter()
        .map(|(resource, _)| resource)
        .find(|resource| attribute(resource, "service.instance.id").as_deref() == Some("node"))
        .expect("the node's resource");
    assert_eq!(
        attribute(&resource, "service.name").as_deref(),
        Some("flagd-proxy")
    );
    // /metrics is served as before.
    assert_eq!(node.metric("sync_active_streams").await, 1.0);
}

#[tokio::test]
#[ignore = "needs an OpenTelemetry Collector: scripts/test installs it"]
async fn exports_over_tls_with_the_collectors_ca_and_fail_without_it_while_serving() {
    let bin = or_return!(otelcol::find_or_skip());
    let ca = TestCa::new();
    let collector = Collector::start(
        &bin,
        Some(ReceiverTls {
            cert: &ca.server_cert,
            key: &ca.server_key,
        }),
    )
    .await;
    let endpoint = format!("https://localhost:{}", collector.port);
    let dir = tempfile::tempdir().expect("tempdir");
    write_manifest(dir.path(), "shop", "checkout", colors("red"));
    let manifests = dir.path().to_str().expect("utf-8");
    let ca_file = ca.ca_cert.to_str().expect("utf-8");

    let mut trusting = vec!["--manifests", manifests, "--otlp-ca-file", ca_file];
    let trusting_otlp = otlp_args(&endpoint, "trusting");
    trusting.extend(strs(&trusting_otlp));
    let _trusting = Proxy::start(&trusting).await;
    collector
        .wait_for("metrics over TLS", |received| {
            metric_of(received, "trusting", "flagd_proxy_ready")
        })
        .await;

    // The system roots do not know the test CA: every export fails, and is counted.
    let mut distrusting = vec!["--manifests", manifests];
    let distrusting_otlp = otlp_args(&endpoint, "distrusting");
    distrusting.extend(strs(&distrusting_otlp));
    let proxy = Proxy::start(&distrusting).await;
    support::eventually("a failed export is counted", || async {
        let failures = proxy
            .metric("flagd_proxy_otlp_export_failures_total{signal=\"metrics\"}")
            .await;
        if failures >= 1.0 {
            Ok(())
        } else {
            Err(format!("none yet:\n{}", proxy.log_text()))
        }
    })
    .await;
    proxy.wait_for_log("OTLP export failed").await;
    // Serving goes on: a client gets its flags and the next version.
    let mut stream = subscribe(&proxy).await;
    assert_eq!(next_color(&mut stream).await, "red");
    write_manifest(dir.path(), "shop", "checkout", colors("blue"));
    assert_eq!(next_color(&mut stream).await, "blue");
    assert!(
        otelcol::metrics(&collector.received())
            .iter()
            .all(
                |(resource, _)| attribute(resource, "service.instance.id").as_deref()
                    != Some("distrusting")
            ),
        "nothing arrived from the proxy that does not trust the collector"
    );
}

/// The Kubernetes source's attempts to reach the API server: the first list, then, while the
/// API server is stopped, failed attempts, and once it is started again, one that worked.
#[tokio::test]
#[ignore = "needs an OpenTelemetry Collector, etcd and kube-apiserver: scripts/test installs them"]
async fn kubernetes_watch_attempts_are_spans_through_an_api_server_restart() {
    let bin = or_return!(otelcol::find_or_skip());
    let mut cp = or_return!(control_plane::start_or_skip().await);
    let collector = Collector::start(&bin, None).await;
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace("shop").await;
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(cp.admin_client(), "shop", &feature_flag_resource());
    let object = feature_flag_object("shop", "checkout", colors("red"));
    let params = PostParams::default();
    eventually("creating the FeatureFlag", || api.create(&params, &object)).await;
    let otlp = otlp_args(&endpoint, "kube");
    let args = cp.proxy_args(&strs(&otlp));
    let proxy = Proxy::start(&strs(&args)).await;
    let mut stream = subscribe(&proxy).await;
    assert_eq!(next_color(&mut stream).await, "red");
    let connects =
        |received: &[Value]| spans_of(received, "kube", "flagd_proxy.kubernetes.connect");
    let first = collector
        .wait_for("the watch's first attempt", |r| {
            connects(r).into_iter().next()
        })
        .await;
    assert_first_attempt(&first);
    let attributes = &first["attributes"];
    assert_eq!(
        attribute(attributes, "flagd_proxy.request").as_deref(),
        Some("list")
    );
    assert_eq!(
        attribute(attributes, "flagd_proxy.api_server")
            .as_deref()
            .map(|url| url.trim_end_matches('/')),
        Some(cp.server_url().as_str())
    );
    cp.wait_for_open_watches("featureflags", 1).await;

    // While the API server is away, every attempt fails; once it is back, one works.
    cp.stop_apiserver().await;
    let failed = |span: &Value| span["status"].get("code").is_some();
    let failures = collector
        .wait_for("a failed attempt", |received| {
            let spans = connects(received);
            spans.iter().any(failed).then_some(spans)
        })
        .await;
    cp.start_apiserver().await;
    let attempts = collector
        .wait_for("an attempt that worked after the failed ones", |received| {
            let spans = connects(received);
            (spans.len() > failures.len() && !failed(spans.last()?)).then_some(spans)
        })
        .await;
    let numbers: Vec<String> = attempts
        .iter()
        .filter_map(|span| attribute(&span["attributes"], "flagd_proxy.attempt"))
        .collect();
    let expected: Vec<String> = (1..=attempts.len()).map(|n| n.to_string()).collect();
    assert_eq!(
        numbers, expected,
        "attempts counted one by one: {attempts:?}"
    );
}
