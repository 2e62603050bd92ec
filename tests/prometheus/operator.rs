//! The chart as the Prometheus Operator would use it: rendered by `helm template`, its
//! ServiceMonitor turned into the scrape configuration the operator generates for it, and its
//! PrometheusRule into a rule file.
//!
//! The operator's rules for a ServiceMonitor (its API documentation): one scrape job per
//! endpoint, named `serviceMonitor/<namespace>/<name>/<index>`, over the endpoints of the
//! Services the monitor selects (`selector`, `namespaceSelector`) on the endpoint's named port.
//! Every target gets the labels `namespace` (the Service's), `service`, `pod`, `container` (the
//! pod's container with that port), `endpoint` (the port's name) and `job` (the Service's name,
//! or the value of its label named by `jobLabel`), and one label per `podTargetLabels` and
//! `targetLabels` entry (the pod's or the Service's label, its name made a valid label name);
//! the endpoint's `relabelings` come after those, its `metricRelabelings` are the metric
//! relabelings, and `honor_labels` is its `honorLabels`. The operator sets the target labels
//! with relabelings from Kubernetes service discovery; here they are set, to the same values,
//! on static targets: the pods of the workload the selected Service selects, one per address.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::support;

/// The chart rendered with its ServiceMonitor and PrometheusRule, scraped every second.
pub struct Chart {
    objects: Vec<Value>,
}

/// What the test sets, before the caller's `--set`s: the monitoring objects, scraped every
/// second (the rules are evaluated every second by the test's Prometheus).
const MONITORING: [&str; 4] = [
    "serviceMonitor.enabled=true",
    "serviceMonitor.interval=1s",
    "serviceMonitor.scrapeTimeout=1s",
    "prometheusRule.enabled=true",
];

/// The endpoint fields this emulation follows; any other in the rendered chart fails the test
/// rather than being ignored.
const ENDPOINT_FIELDS: [&str; 9] = [
    "port",
    "path",
    "scheme",
    "interval",
    "scrapeTimeout",
    "honorLabels",
    "honorTimestamps",
    "relabelings",
    "metricRelabelings",
];

impl Chart {
    /// `helm template RELEASE charts/flagd-proxy --namespace NAMESPACE` with the monitoring
    /// objects and `sets`; `None` (the test skips) without helm.
    pub fn render(release: &str, namespace: &str, sets: &[&str]) -> Option<Chart> {
        let helm = support::helm::ChartRenderer::find_or_skip()?;
        let sets: Vec<&str> = MONITORING.iter().chain(sets).copied().collect();
        Some(Chart {
            objects: helm.render(release, namespace, &sets),
        })
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        match self.all(kind)[..] {
            [object] => object,
            ref found => panic!("the chart renders {} {kind}, not one", found.len()),
        }
    }

    /// The alerting rule `name` of the rendered PrometheusRule.
    pub fn alert(&self, name: &str) -> Value {
        self.one("PrometheusRule")["spec"]["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .flat_map(|g| g["rules"].as_array().expect("rules").iter())
            .find(|rule| rule["alert"] == name)
            .unwrap_or_else(|| panic!("no alert {name} in the PrometheusRule"))
            .clone()
    }

    /// Writes the rendered PrometheusRule's rule groups as a rule file in `dir`.
    pub fn rule_file(&self, dir: &Path) -> PathBuf {
        let rule = self.one("PrometheusRule");
        let path = dir.join("flagd-proxy.rules.yml");
        // JSON is YAML.
        std::fs::write(&path, json!({"groups": rule["spec"]["groups"]}).to_string())
            .expect("write the rule file");
        path
    }

    /// The scrape configuration of the rendered ServiceMonitor, with the pods of the workload
    /// it ends up scraping at `addresses` (`host:port` of their management port).
    pub fn scrape_configs(&self, addresses: &[String]) -> Vec<Value> {
        let monitor = self.one("ServiceMonitor");
        let spec = &monitor["spec"];
        let monitor_namespace = monitor["metadata"]["namespace"]
            .as_str()
            .expect("namespace");
        let services: Vec<&Value> = self
            .all("Service")
            .into_iter()
            .filter(|s| selects_service(spec, monitor_namespace, s))
            .collect();
        let [service] = services[..] else {
            panic!(
                "the ServiceMonitor selects {} Services, not one",
                services.len()
            );
        };
        let pods = self.pods(service, addresses);
        spec["endpoints"]
            .as_array()
            .expect("endpoints")
            .iter()
            .enumerate()
            .map(|(index, endpoint)| {
                let job_name = format!(
                    "serviceMonitor/{monitor_namespace}/{}/{index}",
                    monitor["metadata"]["name"].as_str().expect("name")
                );
                scrape_config(&job_name, spec, endpoint, service, &pods)
            })
            .collect()
    }

    /// The pods behind `service`: those of the one workload whose pod template it selects,
    /// named after it, one per address.
    fn pods(&self, service: &Value, addresses: &[String]) -> Vec<Pod> {
        let selector = service["spec"]["selector"].as_object().expect("selector");
        let workloads: Vec<&Value> = ["Deployment", "DaemonSet"]
            .into_iter()
            .flat_map(|kind| self.all(kind))
            .filter(|w| matches(selector, &w["spec"]["template"]["metadata"]["labels"]))
            .collect();
        let [workload] = workloads[..] else {
            panic!("the metrics Service selects {} workloads", workloads.len());
        };
        let name = workload["metadata"]["name"].as_str().expect("name");
        let template = &workload["spec"]["template"];
        addresses
            .iter()
            .enumerate()
            .map(|(i, address)| Pod {
                name: format!("{name}-5d8c7b9f6-{i:05}"),
                address: address.clone(),
                labels: template["metadata"]["labels"].clone(),
                containers: template["spec"]["containers"].clone(),
            })
            .collect()
    }
}

/// A pod of the scraped workload, as service discovery would see it.
struct Pod {
    name: String,
    address: String,
    labels: Value,
    containers: Value,
}

impl Pod {
    /// The container with the port that `target_port` (a name or a number) names.
    fn container_with(&self, target_port: &Value) -> &str {
        self.containers
            .as_array()
            .expect("containers")
            .iter()
            .find(|c| {
                c["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == *target_port || p["containerPort"] == *target_port)
            })
            .and_then(|c| c["name"].as_str())
            .unwrap_or_else(|| panic!("no container of {} has the port {target_port}", self.name))
    }
}

/// Whether a label selector's `matchLabels` all hold in `labels`.
fn matches(selector: &Map<String, Value>, labels: &Value) -> bool {
    selector.iter().all(|(k, v)| labels[k] == *v)
}

/// Whether the monitor (`spec`, in `monitor_namespace`) selects `service`.
fn selects_service(spec: &Value, monitor_namespace: &str, service: &Value) -> bool {
    let selector = &spec["selector"];
    assert!(
        selector.get("matchExpressions").is_none(),
        "the emulation knows matchLabels only: {selector}"
    );
    let namespace = &service["metadata"]["namespace"];
    let in_namespace = match &spec["namespaceSelector"] {
        Value::Null => *namespace == monitor_namespace,
        s if s["any"] == true => true,
        s => s["matchNames"]
            .as_array()
            .is_some_and(|names| names.contains(namespace)),
    };
    in_namespace
        && matches(
            selector["matchLabels"].as_object().expect("matchLabels"),
            &service["metadata"]["labels"],
        )
}

/// One endpoint's scrape job over `pods` behind `service`.
fn scrape_config(
    job_name: &str,
    spec: &Value,
    endpoint: &Value,
    service: &Value,
    pods: &[Pod],
) -> Value {
    for field in endpoint.as_object().expect("an endpoint").keys() {
        assert!(
            ENDPOINT_FIELDS.contains(&field.as_str()),
            "the emulation does not follow the endpoint field {field}"
        );
    }
    let port_name = endpoint["port"].as_str().expect("a named port");
    let port = support::helm::service_port(service, port_name);
    let service_name = service["metadata"]["name"].as_str().expect("name");
    let job = spec["jobLabel"]
        .as_str()
        .and_then(|label| service["metadata"]["labels"][label].as_str())
        .unwrap_or(service_name);
    let static_configs: Vec<Value> = pods
        .iter()
        .map(|pod| {
            let mut labels = BTreeMap::from([
                (
                    "namespace".to_owned(),
                    service["metadata"]["namespace"].clone(),
                ),
                ("service".to_owned(), json!(service_name)),
                ("pod".to_owned(), json!(pod.name)),
                (
                    "container".to_owned(),
                    json!(pod.container_with(&port["targetPort"])),
                ),
                ("endpoint".to_owned(), json!(port_name)),
                ("job".to_owned(), json!(job)),
            ]);
            for (field, from) in [
                ("podTargetLabels", &pod.labels),
                ("targetLabels", &service["metadata"]["labels"]),
            ] {
                for label in spec[field].as_array().into_iter().flatten() {
                    let label = label.as_str().expect("a label name");
                    if let Some(value) = from.get(label) {
                        labels.insert(label_name(label), value.clone());
                    }
                }
            }
            json!({"targets": [pod.address], "labels": labels})
        })
        .collect();
    let mut config = json!({
        "job_name": job_name,
        "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
        "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
        "scheme": endpoint["scheme"].as_str().unwrap_or("http"),
        "static_configs": static_configs,
        "relabel_configs": relabel_configs(&endpoint["relabelings"]),
        "metric_relabel_configs": relabel_configs(&endpoint["metricRelabelings"]),
    });
    for (field, key) in [
        ("interval", "scrape_interval"),
        ("scrapeTimeout", "scrape_timeout"),
        ("honorTimestamps", "honor_timestamps"),
    ] {
        if let Some(value) = endpoint.get(field) {
            config[key] = value.clone();
        }
    }
    config
}

/// A Kubernetes label name as a Prometheus one: every character other than a letter, a digit
/// or `_` becomes `_`.
fn label_name(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The operator's `RelabelConfig`s (camelCase fields, actions in any case) as Prometheus'.
fn relabel_configs(configs: &Value) -> Vec<Value> {
    configs
        .as_array()
        .into_iter()
        .flatten()
        .map(|config| {
            let fields = config.as_object().expect("a relabeling");
            let converted: Map<String, Value> = fields
                .iter()
                .map(|(field, value)| {
                    let value = match (field.as_str(), value) {
                        ("action", Value::String(action)) => json!(action.to_lowercase()),
                        _ => value.clone(),
                    };
                    (snake_case(field), value)
                })
                .collect();
            Value::Object(converted)
        })
        .collect()
}

/// `sourceLabels` -> `source_labels`.
fn snake_case(field: &str) -> String {
    field
        .chars()
        .flat_map(|c| {
            let lower = c.to_ascii_lowercase();
            (c.is_ascii_uppercase().then_some('_').into_iter()).chain([lower])
        })
        .collect()
}

#[test]
fn operator_names_become_prometheus_names() {
    assert_eq!(snake_case("sourceLabels"), "source_labels");
    assert_eq!(snake_case("regex"), "regex");
    assert_eq!(
        label_name("app.kubernetes.io/component"),
        "app_kubernetes_io_component"
    );
    let converted = relabel_configs(&json!([
        {"sourceLabels": ["__meta_x"], "targetLabel": "x", "action": "Replace"}
    ]));
    assert_eq!(
        converted,
        vec![json!({"source_labels": ["__meta_x"], "target_label": "x", "action": "replace"})]
    );
}
