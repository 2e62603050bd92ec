//! `flagd-proxy status`: a client of a running proxy's management port. It reads `/status` and
//! `/metrics` over plain HTTP/1.1 and prints the proxy's state: every watched resource (state,
//! version, how long ago that version changed at the source, subscribers, why it is not served
//! as it is), the watches, the connections, the limits that refused something, and the serving
//! certificate's expiry. As a table for people, or as JSON (`-o json`) for scripts.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How long one request to the management port may take, connecting included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why no status could be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("cannot connect to the management port at {address}: {source}")]
    Connect {
        address: String,
        source: std::io::Error,
    },
    #[error("GET {path} from {address}: {source}")]
    Http {
        address: String,
        path: &'static str,
        source: hyper::Error,
    },
    #[error("GET {path} from {address}: no answer within {}s", REQUEST_TIMEOUT.as_secs())]
    Timeout { address: String, path: &'static str },
    #[error(
        "GET {path} from {address}: HTTP status {status} (is this a flagd-proxy management port?)"
    )]
    Status {
        address: String,
        path: &'static str,
        status: hyper::StatusCode,
    },
    #[error("GET /status from {address}: not the JSON a flagd-proxy serves: {source}")]
    Json {
        address: String,
        source: serde_json::Error,
    },
}

/// What `/status` says (the fields this command reads; others are kept in `source_status`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusPage {
    ready: bool,
    source: String,
    #[serde(default)]
    source_status: Value,
    #[serde(default)]
    resources: Vec<StatusResource>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusResource {
    selector: String,
    availability: String,
    reason: Option<String>,
    version: Option<u64>,
    bytes: Option<u64>,
    subscribers: u64,
    #[serde(default)]
    version_age_seconds: Option<f64>,
}

/// A running proxy's state, as printed (`-o json` prints this).
#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The management port read.
    pub address: String,
    pub ready: bool,
    pub source: String,
    /// The source's own report (`/status`' `sourceStatus`: files that do not parse, the API
    /// server, the upstream proxy).
    pub source_status: Value,
    pub resources: Vec<ResourceReport>,
    pub watches: Watches,
    /// Open connections by port (`sync`, `management`).
    pub connections: BTreeMap<String, u64>,
    /// Requests refused since start, by the limit that refused them (only limits that did).
    pub limits_hit: BTreeMap<String, u64>,
    /// What is charged to the memory budget now.
    pub memory: Memory,
    /// Versions refused as invalid since start, by resource (`namespace/name`).
    pub invalid_versions: BTreeMap<String, u64>,
    /// The serving certificate's notAfter, in seconds since the Unix epoch (none without TLS).
    pub certificate_expires_at: Option<u64>,
}

/// The memory budget (`--memory-budget`) and what is charged to it, in bytes.
#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// The budget; 0: no limit.
    pub budget: u64,
    /// Charged now, by kind (`versions`, `connections`, `streams`).
    pub charged: BTreeMap<String, u64>,
}

impl Memory {
    /// "12.0 MiB of 384.0 MiB budget (versions 4.0 MiB, ...)".
    fn summary(&self) -> String {
        let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / 1_048_576.0);
        let used: u64 = self.charged.values().sum();
        let budget = match self.budget {
            0 => "no budget".to_owned(),
            budget => format!("of {} budget", mib(budget)),
        };
        let parts: Vec<String> = self
            .charged
            .iter()
            .map(|(kind, bytes)| format!("{kind} {}", mib(*bytes)))
            .collect();
        format!("{} charged {budget} ({})", mib(used), parts.join(", "))
    }
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceReport {
    pub selector: String,
    /// `pending`, `present`, `absent`, `invalid`, `forbidden`, `unreachable` or `refused`.
    pub state: String,
    /// The version clients get (none before the first one).
    pub version: Option<u64>,
    /// How long ago the source changed to that version.
    pub version_age_seconds: Option<f64>,
    pub bytes: Option<u64>,
    pub subscribers: u64,
    /// Why the resource is not served as it is now (the newest version refused, the source
    /// unreachable, no permission).
    pub last_error: Option<String>,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Watches {
    /// Resources watched at the source.
    pub active: u64,
    /// Of those, resources that do not exist yet and never had a version.
    pub waiting: u64,
}

/// Reads the state of the proxy whose management port is at `address` (`host:port`).
pub async fn fetch(address: &str) -> Result<Report, StatusError> {
    let status = get(address, "/status").await?;
    let metrics = get(address, "/metrics").await?;
    let page: StatusPage = serde_json::from_slice(&status).map_err(|source| StatusError::Json {
        address: address.to_owned(),
        source,
    })?;
    Ok(Report::new(
        address,
        page,
        &Samples::parse(&String::from_utf8_lossy(&metrics)),
    ))
}

/// One HTTP/1.1 GET on a connection of its own: the body of a 200 answer.
async fn get(address: &str, path: &'static str) -> Result<Bytes, StatusError> {
    let timeout = || StatusError::Timeout {
        address: address.to_owned(),
        path,
    };
    tokio::time::timeout(REQUEST_TIMEOUT, get_unbounded(address, path))
        .await
        .map_err(|_| timeout())?
}

async fn get_unbounded(address: &str, path: &'static str) -> Result<Bytes, StatusError> {
    let http = |source| StatusError::Http {
        address: address.to_owned(),
        path,
        source,
    };
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|source| StatusError::Connect {
            address: address.to_owned(),
            source,
        })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(http)?;
    let connection = tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, address)
        .body(Empty::<Bytes>::new())
        .expect("a GET with a path and a host is a valid request");
    let response = sender.send_request(request).await.map_err(http)?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(http)?;
    connection.abort();
    if status != hyper::StatusCode::OK {
        return Err(StatusError::Status {
            address: address.to_owned(),
            path,
            status,
        });
    }
    Ok(body.to_bytes())
}

/// The samples of a Prometheus text exposition: (name, labels, value).
struct Samples(Vec<(String, BTreeMap<String, String>, f64)>);

impl Samples {
    /// Reads `name{label="value",...} number` lines; comments and lines it cannot read are
    /// skipped (this proxy's label values hold no quotes or commas).
    fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let value: f64 = value.trim().parse().ok()?;
                let (name, labels) = match series.split_once('{') {
                    Some((name, labels)) => (name, labels.strip_suffix('}')?),
                    None => (series, ""),
                };
                let labels = labels
                    .split(',')
                    .filter(|pair| !pair.is_empty())
                    .filter_map(|pair| {
                        let (key, value) = pair.split_once('=')?;
                        Some((key.to_owned(), value.trim_matches('"').to_owned()))
                    })
                    .collect();
                Some((name.to_owned(), labels, value))
            })
            .collect();
        Self(samples)
    }

    /// The value of an unlabelled sample.
    fn value(&self, name: &str) -> Option<f64> {
        self.0
            .iter()
            .find(|(n, labels, _)| n == name && labels.is_empty())
            .map(|(_, _, value)| *value)
    }

    /// Samples of `name` (only those above 0 unless `zeros`), keyed by the values of `labels`
    /// (joined with `/`).
    fn by(&self, name: &str, labels: &[&str], zeros: bool) -> BTreeMap<String, u64> {
        self.0
            .iter()
            .filter(|(n, _, value)| n == name && (zeros || *value > 0.0))
            .map(|(_, set, value)| {
                let key: Vec<&str> = labels
                    .iter()
                    .map(|label| set.get(*label).map_or("", String::as_str))
                    .collect();
                (key.join("/"), *value as u64)
            })
            .collect()
    }
}

impl Report {
    fn new(address: &str, page: StatusPage, samples: &Samples) -> Self {
        let count = |name: &str| samples.value(name).map_or(0, |v| v as u64);
        let resources = page
            .resources
            .into_iter()
            .map(|r| ResourceReport {
                selector: r.selector,
                state: r.availability,
                version: r.version,
                version_age_seconds: r.version_age_seconds,
                bytes: r.bytes,
                subscribers: r.subscribers,
                last_error: r.reason,
            })
            .collect();
        Report {
            address: address.to_owned(),
            ready: page.ready,
            source: page.source,
            source_status: page.source_status,
            resources,
            watches: Watches {
                active: count("flagd_proxy_upstream_watches"),
                waiting: count("flagd_proxy_waiting_resources"),
            },
            connections: samples.by("flagd_proxy_open_connections", &["port"], true),
            limits_hit: samples.by("flagd_proxy_rejected_requests_total", &["reason"], false),
            memory: Memory {
                budget: count("flagd_proxy_memory_budget_bytes"),
                charged: samples.by("flagd_proxy_memory_charged_bytes", &["kind"], true),
            },
            invalid_versions: samples.by(
                "flagd_proxy_invalid_documents_total",
                &["namespace", "name"],
                false,
            ),
            certificate_expires_at: samples
                .value("flagd_proxy_tls_certificate_expiry_timestamp_seconds")
                .filter(|at| *at > 0.0)
                .map(|at| at as u64),
        }
    }

    /// The report as JSON, for scripts.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes") + "\n"
    }

    /// The report as text for a terminal; `now` dates the certificate's expiry.
    pub fn to_table(&self, now: SystemTime) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "flagd-proxy at {}: {}, source {}{}",
            self.address,
            if self.ready { "ready" } else { "NOT READY" },
            self.source,
            source_summary(&self.source_status),
        );
        out.push('\n');
        if self.resources.is_empty() {
            out.push_str("No resource is watched (no client has asked for one).\n");
        } else {
            let rows: Vec<[String; 6]> = self
                .resources
                .iter()
                .map(|r| {
                    [
                        r.selector.clone(),
                        r.state.clone(),
                        r.version.map_or("-".into(), |v| v.to_string()),
                        r.version_age_seconds
                            .map_or("-".into(), |s| age(Duration::from_secs_f64(s.max(0.0)))),
                        r.subscribers.to_string(),
                        r.last_error.clone().unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            table(
                &mut out,
                [
                    "RESOURCE",
                    "STATE",
                    "VERSION",
                    "AGE",
                    "SUBSCRIBERS",
                    "LAST ERROR",
                ],
                &rows,
            );
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "Watches:      {} active, {} waiting for their resource to exist",
            self.watches.active, self.watches.waiting
        );
        let _ = writeln!(out, "Connections:  {}", listing(&self.connections));
        let _ = writeln!(out, "Limits hit:   {}", listing(&self.limits_hit));
        let _ = writeln!(out, "Memory:       {}", self.memory.summary());
        let _ = writeln!(out, "Refused versions: {}", listing(&self.invalid_versions));
        if let Some(at) = self.certificate_expires_at {
            let at_time = UNIX_EPOCH + Duration::from_secs(at);
            let when = match at_time.duration_since(now) {
                Ok(left) => format!("expires in {}", age(left)),
                Err(past) => format!("EXPIRED {} ago", age(past.duration())),
            };
            let _ = writeln!(out, "Certificate:  {when}");
        }
        for problem in source_problems(&self.source_status) {
            let _ = writeln!(out, "Source problem: {problem}");
        }
        out
    }
}

/// What the source's report adds to the first line.
fn source_summary(status: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(n) = status.get("resources").and_then(Value::as_u64) {
        parts.push(format!("{n} resources in the files"));
    }
    for key in ["apiServer", "upstream"] {
        if let Some(text) = status.get(key).and_then(Value::as_str) {
            parts.push(text.to_owned());
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// The source's problems (files that do not parse), one line each.
fn source_problems(status: &Value) -> Vec<String> {
    status
        .get("problems")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| match (p.get("path"), p.get("error")) {
            (Some(path), Some(error)) => format!(
                "{}: {}",
                path.as_str().unwrap_or_default(),
                error.as_str().unwrap_or_default()
            ),
            _ => p.to_string(),
        })
        .collect()
}

/// `key value, key value`, or `none`.
fn listing(entries: &BTreeMap<String, u64>) -> String {
    if entries.is_empty() {
        return "none".into();
    }
    entries
        .iter()
        .map(|(key, value)| format!("{key} {value}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A duration in its two largest units: `42s`, `3m12s`, `5h4m`, `13d2h`.
fn age(duration: Duration) -> String {
    let s = duration.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// Columns padded to their widest cell; the last column is not padded.
fn table<const N: usize>(out: &mut String, header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "# HELP flagd_proxy_upstream_watches Resources\n\
        # TYPE flagd_proxy_upstream_watches gauge\n\
        flagd_proxy_upstream_watches 2\n\
        flagd_proxy_waiting_resources 1\n\
        flagd_proxy_rejected_requests_total{reason=\"max_watches\"} 3\n\
        flagd_proxy_rejected_requests_total{reason=\"max_connections\"} 0\n\
        flagd_proxy_invalid_documents_total{namespace=\"shop\",name=\"checkout\"} 2\n\
        flagd_proxy_open_connections{port=\"sync\"} 5\n\
        flagd_proxy_open_connections{port=\"management\"} 1\n\
        flagd_proxy_tls_certificate_expiry_timestamp_seconds 864000\n\
        flagd_proxy_memory_budget_bytes 8388608\n\
        flagd_proxy_memory_charged_bytes{kind=\"versions\"} 1048576\n\
        flagd_proxy_memory_charged_bytes{kind=\"streams\"} 1048576\n\
        # EOF\n";

    fn report() -> Report {
        let page: StatusPage = serde_json::from_value(serde_json::json!({
            "ready": true,
            "source": "manifests",
            "sourceStatus": {"resources": 2, "selectors": [], "problems": [
                {"path": "/flags/bad.yaml", "error": "not YAML"}
            ]},
            "resources": [
                {"selector": "core.openfeature.dev/default/demo", "availability": "present",
                 "reason": null, "version": 3, "bytes": 120, "subscribers": 4,
                 "versionAgeSeconds": 75.5},
                {"selector": "core.openfeature.dev/shop/checkout", "availability": "invalid",
                 "reason": "flag \"size\": state must be \"ENABLED\" or \"DISABLED\"",
                 "version": 1, "bytes": 80, "subscribers": 0}
            ]
        }))
        .expect("a status page");
        Report::new("127.0.0.1:8016", page, &Samples::parse(METRICS))
    }

    #[test]
    fn the_memory_budget_and_its_charges_are_summed_up() {
        let memory = report().memory;
        assert_eq!(memory.budget, 8 << 20);
        assert_eq!(
            memory.summary(),
            "2.0 MiB charged of 8.0 MiB budget (streams 1.0 MiB, versions 1.0 MiB)"
        );
    }

    #[test]
    fn metrics_fill_watches_connections_and_limits() {
        let report = report();
        assert_eq!(
            report.watches,
            Watches {
                active: 2,
                waiting: 1
            }
        );
        assert_eq!(
            report.limits_hit,
            BTreeMap::from([("max_watches".to_owned(), 3)]),
            "limits that refused nothing are left out"
        );
        assert_eq!(
            report.invalid_versions,
            BTreeMap::from([("shop/checkout".to_owned(), 2)])
        );
        assert_eq!(report.connections["sync"], 5);
        assert_eq!(report.certificate_expires_at, Some(864_000));
    }

    #[test]
    fn the_table_shows_each_resource_and_what_went_wrong() {
        let now = UNIX_EPOCH + Duration::from_secs(864_000 - 3 * 86_400);
        let table = report().to_table(now);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "flagd-proxy at 127.0.0.1:8016: ready, source manifests (2 resources in the files)"
        );
        assert!(lines[2].starts_with("RESOURCE "), "{table}");
        assert!(lines[2].ends_with("SUBSCRIBERS  LAST ERROR"), "{table}");
        let demo = lines[3].split_whitespace().collect::<Vec<_>>();
        assert_eq!(
            demo,
            [
                "core.openfeature.dev/default/demo",
                "present",
                "3",
                "1m15s",
                "4",
                "-"
            ]
        );
        let checkout = lines[4].split_whitespace().collect::<Vec<_>>();
        assert_eq!(
            checkout[..6],
            [
                "core.openfeature.dev/shop/checkout",
                "invalid",
                "1",
                "-",
                "0",
                "flag"
            ]
        );
        assert!(lines[4].ends_with("state must be \"ENABLED\" or \"DISABLED\""));
        assert!(
            table.contains("Watches:      2 active, 1 waiting"),
            "{table}"
        );
        assert!(table.contains("Limits hit:   max_watches 3\n"), "{table}");
        assert!(table.contains("Certificate:  expires in 3d0h\n"), "{table}");
        assert!(
            table.contains("Source problem: /flags/bad.yaml: not YAML\n"),
            "{table}"
        );
        let expired = report().to_table(UNIX_EPOCH + Duration::from_secs(864_000 + 90));
        assert!(
            expired.contains("Certificate:  EXPIRED 1m30s ago"),
            "{expired}"
        );
    }

    #[test]
    fn json_keeps_every_field_for_scripts() {
        let json: Value = serde_json::from_str(&report().to_json()).expect("JSON");
        assert_eq!(json["resources"][0]["versionAgeSeconds"], 75.5);
        assert_eq!(
            json["resources"][1]["lastError"],
            "flag \"size\": state must be \"ENABLED\" or \"DISABLED\""
        );
        assert_eq!(json["limitsHit"]["max_watches"], 3);
        assert_eq!(json["watches"]["active"], 2);
        assert_eq!(json["sourceStatus"]["resources"], 2);
    }

    #[test]
    fn ages_read_in_their_two_largest_units() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (60, "1m0s"),
            (3599, "59m59s"),
            (3600, "1h0m"),
            (86_399, "23h59m"),
            (86_400 * 14 + 7200, "14d2h"),
        ];
        for (secs, text) in cases {
            assert_eq!(age(Duration::from_secs(secs)), text);
        }
    }
}
