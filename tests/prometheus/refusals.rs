//! FlagdProxyRequestsRefused against a real Prometheus, with its window, threshold and `for`
//! set through the chart's values: one refused request never makes it active, a client refused
//! on every request it sends, without a pause, makes it fire.
use std::time::Duration;

use tonic::transport::Channel;

use crate::support::client::{self, Client};
use crate::support::or_return;
use crate::support::prometheus::{Prometheus, Tools};
use crate::{
    RELEASE, RELEASE_NAMESPACE, active_alerts, alert_name, operator, operator_prometheus, support,
    wait_for_series,
};

/// The window and threshold the refusal test gives FlagdProxyRequestsRefused through the
/// chart's values. One refusal makes the rate over the window at most 2.1 / 20 s = 0.105 a
/// second, whenever it is evaluated and however the scrapes fall: Prometheus does not
/// extrapolate an increase back before a sample at 0, and forward by at most 1.1 sample
/// intervals, which multiplies it by 2.1 at the most (two samples in the window). Well below
/// 0.5.
const REFUSED_WINDOW_SECONDS: f64 = 20.0;
const REFUSED_SETS: [&str; 4] = [
    "prometheusRule.requestsRefused.window=20s",
    "prometheusRule.requestsRefused.perSecond=0.5",
    "prometheusRule.requestsRefused.for=2s",
    // A reason with a threshold of its own: the expression's other form.
    "prometheusRule.requestsRefused.perReason.max_watches=0.25",
];

/// FlagdProxyRequestsRefused with a 20 s window and a threshold of 0.5 refusals a second, set
/// through the chart's values: one refused request never makes it active, a client refused
/// on every request it sends, without a pause, makes it fire.
#[tokio::test]
#[ignore = "needs prometheus, promtool and helm: scripts/test installs them"]
async fn one_refused_request_does_not_alert_and_refusals_without_a_pause_do() {
    let tools = or_return!(Tools::find_or_skip());
    let chart = or_return!(operator::Chart::render(
        RELEASE,
        RELEASE_NAMESPACE,
        &REFUSED_SETS
    ));
    let rule = chart.alert("FlagdProxyRequestsRefused");
    let expr = rule["expr"].as_str().expect("expr").to_owned();
    assert!(expr.contains("[20s]) > 0.5"), "{rule}");
    assert_eq!(rule["for"], "2s", "{rule}");
    let manifests = tempfile::tempdir().expect("a manifests folder");
    support::write_color(manifests.path(), "default", "demo", "red", &["red", "blue"]);
    let proxy =
        support::Proxy::start(&["--manifests", &manifests.path().display().to_string()]).await;
    let targets = vec![format!("127.0.0.1:{}", proxy.management_port)];
    let (prometheus, _rules) = operator_prometheus(&tools, &chart, &targets).await;
    let counter = "flagd_proxy_rejected_requests_total{reason=\"invalid_selector\"}";
    wait_for_series(&prometheus, &format!("{counter} == 0")).await;

    // One refused request, and a whole window of scrapes after Prometheus has seen it.
    let channel = client::channel(proxy.port).await;
    refuse_one(&channel).await;
    let seen = first_sample_at(&prometheus, counter, 1.0).await;
    let after_window = seen + REFUSED_WINDOW_SECONDS + 2.0;
    wait_for_series(
        &prometheus,
        &format!("timestamp({counter}) > {after_window}"),
    )
    .await;
    // Over that time the refusal was in the window, and the alert's expression never held.
    let range = |expr: String| {
        let prometheus = &prometheus;
        async move {
            let (start, end) = ((seen - 1.0).to_string(), after_window.to_string());
            let params = [
                ("query", expr.as_str()),
                ("start", start.as_str()),
                ("end", end.as_str()),
                ("step", "0.5"),
            ];
            let data = prometheus.api("query_range", &params).await.expect(&expr);
            data["result"].as_array().cloned().unwrap_or_default()
        }
    };
    assert!(
        !range(format!("rate({counter}[20s]) > 0")).await.is_empty(),
        "the refusal is in the window"
    );
    let held = range(expr.clone()).await;
    assert!(held.is_empty(), "one refusal: {expr} held: {held:?}");
    let alerted = prometheus
        .query("ALERTS{alertname=\"FlagdProxyRequestsRefused\"}[1h]")
        .await
        .expect("ALERTS");
    assert!(
        alerted.is_empty(),
        "one refusal made it active: {alerted:?}"
    );

    // A client refused on every request, without a pause: the alert fires, for that reason
    // and in the proxy's namespace.
    let refusing = tokio::spawn(async move {
        loop {
            refuse_one(&channel).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let firing = support::eventually_within(
        "FlagdProxyRequestsRefused fires",
        Duration::from_secs(180),
        || async {
            let alerts = active_alerts(&prometheus).await?;
            alerts
                .into_iter()
                .find(|a| alert_name(a) == "FlagdProxyRequestsRefused" && a["state"] == "firing")
                .ok_or_else(|| "not firing yet".to_owned())
        },
    )
    .await;
    refusing.abort();
    let labels = &firing["labels"];
    assert_eq!(labels["reason"], "invalid_selector", "{firing}");
    assert_eq!(labels["namespace"], RELEASE_NAMESPACE, "{firing}");
    assert_eq!(labels["severity"], "warning", "{firing}");
}

/// A `FetchAllFlags` the proxy refuses: its selector is not one.
async fn refuse_one(channel: &Channel) {
    let status = client::fetch(&mut Client::new(channel.clone()), "not-a-selector")
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
}

/// Waits until Prometheus has scraped `series` at `value`: the time of the first such sample,
/// in seconds.
async fn first_sample_at(prometheus: &Prometheus, series: &str, value: f64) -> f64 {
    let samples = format!("{series}[10m]");
    support::eventually(&format!("Prometheus has {series} at {value}"), || {
        let samples = &samples;
        async move {
            let result = prometheus.query(samples).await?;
            result
                .iter()
                .flat_map(|s| s["values"].as_array().cloned().unwrap_or_default())
                .find(|sample| sample[1].as_str().and_then(|v| v.parse().ok()) == Some(value))
                .and_then(|sample| sample[0].as_f64())
                .ok_or_else(|| "not yet".to_owned())
        }
    })
    .await
}
