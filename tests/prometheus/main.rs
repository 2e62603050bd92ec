//! The alerts and the dashboard against a real Prometheus (built from its Go module by
//! `scripts/install-prometheus.sh`): `promtool check rules` and `promtool test rules` (every
//! alert fires and resolves), and a Prometheus that scrapes a real proxy under load (subscribers
//! on both protocols, a stream of updates, invalid versions, refused watches and connections,
//! a certificate that expires in 10 days, a manifest that does not parse) and a target that is
//! down: every dashboard query returns data and the alerts that should be active are, and no
//! other. That Prometheus scrapes as the Prometheus Operator would for the chart's
//! ServiceMonitor and evaluates the chart's PrometheusRule, both rendered by helm
//! (`operator.rs`): every alert about a FeatureFlag names its namespace, and every panel keeps
//! flags of the same name in different namespaces apart. FlagdProxyRequestsRefused stays quiet
//! for one refused request and fires for refusals without a pause (`refusals.rs`). Also: the chart and
//! `deploy/` carry the same rules and dashboard, and the runbook names every refusal reason.
//!
//! Without prometheus and promtool (or helm, for the tests that render the chart) these tests
//! print a notice and pass, unless `CI` is set.
//! `FLAGD_PROXY_UPDATE_DOCS=1` also redraws `docs/dashboard.svg` from the run's data.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flagd_proxy_testkit as support;
use serde_json::{Value, json};
use support::client::{self, Client, LegacyClient};
use support::or_return;
use support::prometheus::{Prometheus, Tools};
use tonic::transport::{Certificate, ClientTlsConfig};

mod operator;
mod picture;
mod refusals;

const ALERTS: &str = "charts/flagd-proxy/files/alerts.yaml";
const DASHBOARD: &str = "charts/flagd-proxy/files/dashboard.json";
const DEPLOY_RULES: &str = "deploy/components/monitoring/prometheusrule.yaml";
const DEPLOY_DASHBOARD: &str = "deploy/components/monitoring/dashboard.json";
const UNIT_TESTS: &str = "tests/monitoring/alerts.test.yaml";

fn root() -> PathBuf {
    support::repo_root()
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every alerting rule of the rule file: name -> rule.
fn alerts() -> BTreeMap<String, Value> {
    let rules = yaml(ALERTS);
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .map(|rule| (rule["alert"].as_str().expect("an alert").to_owned(), rule))
        .collect()
}

/// Every query of the dashboard: (panel title, expression as written).
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join(DASHBOARD)).expect("dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().expect("a title").to_owned();
            panel["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .map(move |t| (title.clone(), t["expr"].as_str().expect("expr").to_owned()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A dashboard expression as Grafana sends it: every job, a one-minute rate window.
fn concrete(expr: &str) -> String {
    expr.replace("$job", ".*").replace("$__rate_interval", "1m")
}

#[test]
fn chart_and_deploy_carry_the_same_rules_and_dashboard() {
    let deploy = yaml(DEPLOY_RULES);
    assert_eq!(deploy["kind"], "PrometheusRule");
    assert_eq!(
        deploy["spec"],
        json!({"groups": yaml(ALERTS)["groups"]}),
        "{DEPLOY_RULES} has the rules of {ALERTS}"
    );
    let read = |p: &str| std::fs::read(root().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    assert!(
        read(DASHBOARD) == read(DEPLOY_DASHBOARD),
        "{DEPLOY_DASHBOARD} is a copy of {DASHBOARD}"
    );
    // deploy/'s ServiceMonitor selects the metrics Service, by a port it has.
    let monitor = yaml("deploy/components/monitoring/servicemonitor.yaml");
    let service = yaml("deploy/service-metrics.yaml");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    assert!(
        selector
            .iter()
            .all(|(k, v)| service["metadata"]["labels"][k] == *v),
        "the ServiceMonitor's {selector:?} selects {}",
        service["metadata"]
    );
    let port = &monitor["spec"]["endpoints"][0]["port"];
    assert!(
        service["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .any(|p| p["name"] == *port),
        "the metrics Service has the port {port}"
    );
    let kustomization = yaml("deploy/components/monitoring/kustomization.yaml");
    let generator = &kustomization["configMapGenerator"][0];
    assert_eq!(generator["options"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(generator["files"][0], "flagd-proxy.json=dashboard.json");
}

/// docs/alerts.md has a runbook for every alert, and every alert points to it.
#[test]
fn every_alert_has_a_runbook() {
    let docs = std::fs::read_to_string(root().join("docs/alerts.md")).expect("docs/alerts.md");
    for (name, rule) in alerts() {
        assert!(
            docs.contains(&format!("\n### {name}\n\n**Means:**")),
            "no runbook for {name} in docs/alerts.md"
        );
        let anchor = format!("docs/alerts.md#{}", name.to_lowercase());
        assert!(
            rule["annotations"]["runbook"]
                .as_str()
                .is_some_and(|r| r.starts_with(&anchor)),
            "{name} names its runbook {anchor}"
        );
    }
}

/// The runbook of FlagdProxyRequestsRefused names every reason the proxy counts refusals by,
/// and the chart's `perReason` takes exactly those.
#[test]
fn the_refusals_runbook_names_every_reason() {
    let docs = std::fs::read_to_string(root().join("docs/alerts.md")).expect("docs/alerts.md");
    let start = docs
        .find("\n### FlagdProxyRequestsRefused\n")
        .expect("the runbook");
    let runbook = &docs[start + 1..];
    let runbook = &runbook[..runbook.find("\n### ").unwrap_or(runbook.len())];
    for reason in flagd_proxy::metrics::REJECT_REASONS {
        assert!(
            runbook.contains(&format!("| `{reason}` |")),
            "the runbook of FlagdProxyRequestsRefused has no row for the reason {reason}"
        );
    }
    let schema = std::fs::read_to_string(root().join("charts/flagd-proxy/values.schema.json"))
        .expect("values.schema.json");
    let schema: Value = serde_json::from_str(&schema).expect("the schema is JSON");
    let reasons = &schema["properties"]["prometheusRule"]["properties"]["requestsRefused"]["properties"]
        ["perReason"]["propertyNames"]["enum"];
    assert_eq!(
        *reasons,
        json!(flagd_proxy::metrics::REJECT_REASONS),
        "values.schema.json: prometheusRule.requestsRefused.perReason takes every reason"
    );
}

/// Every alert has a unit test in which it fires and, later, has resolved.
#[test]
fn every_alert_is_unit_tested_firing_and_resolving() {
    let tests = yaml(UNIT_TESTS);
    let mut seen: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for group in tests["tests"].as_array().expect("tests") {
        // Per alert: the first eval time it fires, and whether it is quiet after that.
        let mut fired_at: BTreeMap<String, u64> = BTreeMap::new();
        let mut cases: Vec<(u64, String, bool)> = group["alert_rule_test"]
            .as_array()
            .expect("alert_rule_test")
            .iter()
            .map(|case| {
                let at = duration_seconds(case["eval_time"].as_str().expect("eval_time"));
                let name = case["alertname"].as_str().expect("alertname").to_owned();
                let fires = !case["exp_alerts"]
                    .as_array()
                    .expect("exp_alerts")
                    .is_empty();
                (at, name, fires)
            })
            .collect();
        cases.sort();
        for (at, name, fires) in cases {
            let entry = seen.entry(name.clone()).or_default();
            if fires {
                entry.0 = true;
                fired_at.entry(name).or_insert(at);
            } else if fired_at.get(&name).is_some_and(|f| *f < at) {
                entry.1 = true;
            }
        }
    }
    for name in alerts().keys() {
        assert_eq!(
            seen.get(name),
            Some(&(true, true)),
            "{UNIT_TESTS}: {name} fires and then resolves"
        );
    }
}

/// `5m`, `10d`: seconds.
fn duration_seconds(text: &str) -> u64 {
    let (number, unit) = text.split_at(text.len() - 1);
    let n: u64 = number.parse().expect("a number");
    n * match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        other => panic!("unit {other}"),
    }
}

#[test]
#[ignore = "needs promtool: scripts/test installs it"]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let tools = or_return!(Tools::find_or_skip());
    let (ok, out) = tools.promtool(&root(), &["check", "rules", ALERTS]);
    assert!(ok, "promtool check rules {ALERTS}:\n{out}");
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", alerts().len())),
        "{out}"
    );
    let (ok, out) = tools.promtool(&root(), &["test", "rules", UNIT_TESTS]);
    assert!(ok, "promtool test rules {UNIT_TESTS}:\n{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// A real Prometheus scraping a loaded proxy

/// The calendar day `days` days after 1970-01-01 (proleptic Gregorian).
fn civil_day(days: i64) -> support::Day {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        i32::try_from(year).expect("a year"),
        u8::try_from(month).expect("a month"),
        u8::try_from(day).expect("a day"),
    )
}

fn tls_config(ca: &Path) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).expect("read ca")))
        .domain_name("localhost")
}

/// The sync port's connection limit in the run; all of it is used.
const MAX_CONNECTIONS: usize = 10;

/// Alerts the run makes active (pending or firing). The others must not be, except
/// FlagdProxyPropagationSlow, which depends on how fast the machine is: its expression must
/// evaluate, and its input must have data. One refused watch and one refused connection do not
/// make FlagdProxyRequestsRefused active.
const ACTIVE: [&str; 5] = [
    "FlagdProxyDown",
    "FlagdProxyVersionRejected",
    "FlagdProxyConnectionsNearLimit",
    "FlagdProxyCertificateExpiresSoon",
    "FlagdProxyWatchesFailing",
];

/// The chart's release, and its namespace: the proxy's, which no FeatureFlag of the run is in.
pub(crate) const RELEASE: &str = "flagd-proxy";
pub(crate) const RELEASE_NAMESPACE: &str = "flagd-system";

/// The FeatureFlags the run serves (`--max-watches` is their number): two of the same name in
/// different namespaces.
const FLAGS: [(&str, &str); 4] = [
    ("default", "demo"),
    ("shop", "checkout"),
    ("team", "checkout"),
    ("team", "beta"),
];

/// The two that get an invalid version.
const INVALID: [(&str, &str); 2] = [("shop", "checkout"), ("team", "checkout")];

/// A Prometheus that scrapes the pods at `targets` as the Prometheus Operator would for the
/// rendered chart's ServiceMonitor, and evaluates its PrometheusRule. The folder holds the rule
/// file; keep it while Prometheus runs.
pub(crate) async fn operator_prometheus(
    tools: &Tools,
    chart: &operator::Chart,
    targets: &[String],
) -> (Prometheus, tempfile::TempDir) {
    let rules = tempfile::tempdir().expect("a rules folder");
    let prometheus = Prometheus::start(
        tools,
        &chart.scrape_configs(targets),
        &[chart.rule_file(rules.path())],
    )
    .await;
    (prometheus, rules)
}

/// The (namespace, name) of every series of `result` that has a `name` label.
fn flags_in(result: &[Value]) -> BTreeSet<(String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    result
        .iter()
        .map(|series| &series["metric"])
        .filter(|labels| labels.get("name").is_some())
        .map(|labels| (text(&labels["namespace"]), text(&labels["name"])))
        .collect()
}

/// Every series about a FeatureFlag is about one of the run's, by its own namespace (not the
/// proxy's, which a scrape without honor_labels would put in its place).
fn assert_flags_of_the_run(what: &str, flags: &BTreeSet<(String, String)>, seen: &Value) {
    for (namespace, name) in flags {
        assert!(
            FLAGS.contains(&(namespace.as_str(), name.as_str())),
            "{what}: FeatureFlag {name} in namespace {namespace:?}, which is not its namespace \
             ({RELEASE_NAMESPACE} is the proxy's): {seen}"
        );
    }
}

#[tokio::test]
#[ignore = "needs prometheus, promtool and helm: scripts/test installs them"]
async fn a_real_prometheus_has_data_for_every_panel_and_the_expected_alerts() {
    let tools = or_return!(Tools::find_or_skip());
    let chart = or_return!(operator::Chart::render(RELEASE, RELEASE_NAMESPACE, &[]));
    let manifests = tempfile::tempdir().expect("a manifests folder");
    let dir = manifests.path();
    for (namespace, name) in FLAGS {
        support::write_color(dir, namespace, name, "red", &["red", "blue"]);
    }
    // A serving certificate that expires in 10 days.
    let today = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs()
            / 86_400,
    )
    .expect("days");
    let mut ca = support::TestCa::new();
    ca.issue_server_valid(
        "localhost",
        Some((civil_day(today - 1), civil_day(today + 10))),
    );
    let mut args: Vec<String> = vec![
        "--manifests".into(),
        dir.display().to_string(),
        "--max-watches".into(),
        FLAGS.len().to_string(),
        "--max-connections".into(),
        MAX_CONNECTIONS.to_string(),
    ];
    args.extend(ca.proxy_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let proxy = support::Proxy::start(&args).await;

    let down = support::free_port();
    let targets = vec![
        format!("127.0.0.1:{}", proxy.management_port),
        format!("127.0.0.1:{down}"),
    ];
    let (prometheus, _rules) = operator_prometheus(&tools, &chart, &targets).await;
    let started = SystemTime::now();

    // Subscribers: every connection the limit allows, streams of both protocols on them.
    let mut channels = Vec::new();
    let mut streams_v1 = Vec::new();
    let mut streams_legacy = Vec::new();
    for i in 0..MAX_CONNECTIONS {
        let channel = client::tls_channel(proxy.port, tls_config(&ca.ca_cert))
            .await
            .expect("a TLS connection");
        let (namespace, name) = FLAGS[i % FLAGS.len()];
        let selector = format!("core.openfeature.dev/{namespace}/{name}");
        let mut v1 = Client::new(channel.clone());
        let mut stream = client::open(&mut v1, &selector).await.expect("a stream");
        client::next(&mut stream).await;
        streams_v1.push(stream);
        let mut legacy_stream =
            client::open_legacy(&mut LegacyClient::new(channel.clone()), &selector)
                .await
                .expect("a sync.v1 stream");
        client::next(&mut legacy_stream).await;
        streams_legacy.push(legacy_stream);
        channels.push(channel);
    }
    proxy
        .wait_for_metric(
            "flagd_proxy_open_connections{port=\"sync\"}",
            MAX_CONNECTIONS as f64,
        )
        .await;
    // Drain the streams, so that every update reaches every subscriber.
    let drains: Vec<_> =
        streams_v1
            .into_iter()
            .map(|mut s| tokio::spawn(async move { while let Ok(Some(_)) = s.message().await {} }))
            .chain(streams_legacy.into_iter().map(|mut s| {
                tokio::spawn(async move { while let Ok(Some(_)) = s.message().await {} })
            }))
            .collect();
    // A stream of updates of default/demo until the checks are done.
    let updating = Arc::new(AtomicBool::new(true));
    let updater = {
        let updating = updating.clone();
        let dir = dir.to_path_buf();
        tokio::spawn(async move {
            let mut n = 0u64;
            while updating.load(Ordering::SeqCst) {
                n += 1;
                let color = if n.is_multiple_of(2) { "red" } else { "blue" };
                support::write_color(&dir, "default", "demo", color, &["red", "blue"]);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };

    // What follows is counted: Prometheus must have seen the counters before, so that it sees
    // them increase.
    wait_for_series(
        &prometheus,
        "flagd_proxy_rejected_requests_total{reason=\"max_watches\"} == 0",
    )
    .await;
    // One connection more is refused.
    let mut refused = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port))
        .await
        .expect("connect");
    support::wait_closed(
        &mut refused,
        "a connection over --max-connections is closed",
    )
    .await;
    // One resource more is over --max-watches.
    let mut v1 = Client::new(channels[0].clone());
    let status = match client::open(&mut v1, "core.openfeature.dev/default/other").await {
        Ok(mut stream) => client::next_message(&mut stream)
            .await
            .expect_err("refused"),
        Err(status) => status,
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    // An invalid version of both checkouts (a default variant that is not a variant).
    for (namespace, name) in INVALID {
        support::write_manifest(
            dir,
            namespace,
            name,
            json!({"color": {"state": "ENABLED", "variants": {"red": "red"}, "defaultVariant": "blue"}}),
        );
    }
    // A manifest that does not parse; once Prometheus has its error count, another error.
    support::write_atomically(&dir.join("broken.yaml"), "kind: [unclosed\n");
    wait_for_series(
        &prometheus,
        "flagd_proxy_source_errors_total{kind=\"parse\"}",
    )
    .await;
    support::write_atomically(&dir.join("broken.yaml"), "kind: {unclosed\n");

    // The alerts that should be active are, and no others.
    let alerts = alerts();
    let expected: BTreeSet<String> = ACTIVE.iter().map(|a| (*a).to_owned()).collect();
    let invalid: BTreeSet<(String, String)> = INVALID
        .iter()
        .map(|(namespace, name)| ((*namespace).to_owned(), (*name).to_owned()))
        .collect();
    let active_alerts = support::eventually("the expected alerts are active", || {
        let prometheus = &prometheus;
        let (expected, invalid) = (expected.clone(), invalid.clone());
        async move {
            let alerts = active_alerts(prometheus).await?;
            let names: BTreeSet<String> = alerts.iter().map(alert_name).collect();
            let rejected = series_of(&alerts, "FlagdProxyVersionRejected");
            if expected.is_subset(&names) && rejected.len() >= invalid.len() {
                Ok(alerts)
            } else {
                Err(format!("active so far: {names:?}"))
            }
        }
    })
    .await;
    let active: BTreeSet<String> = active_alerts.iter().map(alert_name).collect();
    let unexpected: Vec<&String> = active
        .iter()
        .filter(|a| !expected.contains(*a) && *a != "FlagdProxyPropagationSlow")
        .collect();
    assert!(
        unexpected.is_empty(),
        "alerts active that should not be: {unexpected:?}"
    );
    // An alert about a FeatureFlag names its namespace; one about a proxy, the proxy's.
    for alert in &active_alerts {
        let labels = &alert["labels"];
        let what = format!("alert {}", alert_name(alert));
        match labels.get("name") {
            Some(_) => {
                assert_flags_of_the_run(&what, &flags_in(&[json!({"metric": labels})]), labels);
            }
            None => assert_eq!(
                labels["namespace"], RELEASE_NAMESPACE,
                "{what} is about a proxy, in the namespace {RELEASE_NAMESPACE}: {labels}"
            ),
        }
    }
    let rejected = series_of(&active_alerts, "FlagdProxyVersionRejected");
    assert_eq!(
        flags_in(&rejected),
        invalid,
        "one FlagdProxyVersionRejected per invalid FeatureFlag: {rejected:?}"
    );

    // Every panel's query returns data; a panel of FeatureFlags shows each by its own
    // namespace, both checkouts apart.
    let queries = dashboard_queries();
    for (title, expr) in &queries {
        let expr = concrete(expr);
        eprintln!("panel {title:?}: {expr}");
        wait_for_series(&prometheus, &expr).await;
        let what = format!("panel {title:?}: {expr}");
        let invalid = &invalid;
        support::eventually(&format!("{what} keeps the checkouts apart"), || {
            let (prometheus, expr, what) = (&prometheus, &expr, &what);
            async move {
                let result = prometheus.query(expr).await?;
                let flags = flags_in(&result);
                assert_flags_of_the_run(what, &flags, &json!(result));
                if flags.is_empty() || invalid.is_subset(&flags) {
                    Ok(())
                } else {
                    Err(format!("FeatureFlags so far: {flags:?}"))
                }
            }
        })
        .await;
    }
    // Every rule is loaded and evaluates without an error.
    let rules = prometheus
        .api("rules", &[("type", "alert")])
        .await
        .expect("rules");
    let loaded: BTreeMap<String, Value> = rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .map(|r| (r["name"].as_str().expect("name").to_owned(), r))
        .collect();
    assert_eq!(
        loaded.keys().collect::<Vec<_>>(),
        alerts.keys().collect::<Vec<_>>(),
        "Prometheus loaded every alert"
    );
    for (name, rule) in &loaded {
        assert_eq!(rule["health"], "ok", "{name}: {rule}");
    }
    // The alerts that are not active: their inputs exist, so they are quiet for the right
    // reason and not for a misspelt metric.
    for input in [
        "flagd_proxy_ready",
        "flagd_proxy_watched_resources",
        "flagd_proxy_tls_certificate_expiry_timestamp_seconds",
        "histogram_quantile(0.99, rate(flagd_proxy_propagation_seconds_bucket[10m]))",
    ] {
        let result = prometheus.query(input).await.expect(input);
        assert!(!result.is_empty(), "{input} has no data");
    }

    if std::env::var_os("FLAGD_PROXY_UPDATE_DOCS").is_some() {
        // Two more minutes of load, so that the picture has some history to show.
        tokio::time::sleep(Duration::from_secs(120)).await;
        picture::draw(&prometheus, started, &root().join("docs/dashboard.svg")).await;
    }
    updating.store(false, Ordering::SeqCst);
    updater.await.expect("the updater");
    for drain in drains {
        drain.abort();
    }
}

/// The alerts pending or firing.
pub(crate) async fn active_alerts(prometheus: &Prometheus) -> Result<Vec<Value>, String> {
    let data = prometheus.api("alerts", &[]).await?;
    Ok(data["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == "pending" || a["state"] == "firing")
        .cloned()
        .collect())
}

/// The labels of the alerts named `name`, as series (`{"metric": labels}`).
fn series_of(alerts: &[Value], name: &str) -> Vec<Value> {
    alerts
        .iter()
        .filter(|a| alert_name(a) == name)
        .map(|a| json!({"metric": a["labels"]}))
        .collect()
}

pub(crate) fn alert_name(alert: &Value) -> String {
    alert["labels"]["alertname"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Waits until `expr` has data in Prometheus.
pub(crate) async fn wait_for_series(prometheus: &Prometheus, expr: &str) {
    support::eventually(&format!("Prometheus has {expr}"), || async move {
        match prometheus.query(expr).await? {
            result if result.is_empty() => Err("no data yet".to_owned()),
            _ => Ok(()),
        }
    })
    .await;
}
