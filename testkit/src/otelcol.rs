//! A real OpenTelemetry Collector for the OTLP export test (`tests/otlp.rs`): the OTLP/gRPC
//! receiver on a loopback port (optionally with TLS) and the file exporter, which writes what
//! it receives as OTLP JSON, one export request per line.
//!
//! The binary comes from `FLAGD_PROXY_OTELCOL_BIN`, the cache (`scripts/install-otelcol.sh`),
//! or `otelcol` on `PATH`. Without it the caller skips (recorded and listed by `scripts/test`),
//! or fails when `CI` is set.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::control_plane::cache_dir;
use super::{EVENT_TIMEOUT, collect_lines, free_port};

/// Finds the collector; `None` after a recorded skip ([`crate::skip`]; a panic under `CI`) when
/// it is missing.
pub fn find_or_skip() -> Option<PathBuf> {
    let candidates = match std::env::var_os("FLAGD_PROXY_OTELCOL_BIN").filter(|v| !v.is_empty()) {
        Some(path) => vec![PathBuf::from(path)],
        None => vec![cache_dir().join("bin/otelcol"), PathBuf::from("otelcol")],
    };
    crate::skip::require(
        candidates
            .into_iter()
            .find(|path| crate::answers_version(path))
            .ok_or(
                "otelcol not found ($FLAGD_PROXY_OTELCOL_BIN, the cache's bin/, PATH); run \
                 scripts/install-otelcol.sh",
            ),
    )
}

/// TLS for the receiver: its certificate chain and key (PEM files).
pub struct ReceiverTls<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
}

/// A running collector; killed on drop.
pub struct Collector {
    /// The OTLP/gRPC receiver's port on 127.0.0.1.
    pub port: u16,
    output: PathBuf,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Collector {
    /// Starts the collector and waits until its receiver accepts connections.
    pub async fn start(bin: &Path, tls: Option<ReceiverTls<'_>>) -> Collector {
        let dir = tempfile::tempdir().expect("tempdir");
        let output = dir.path().join("received.jsonl");
        let port = free_port();
        let mut grpc = json!({"endpoint": format!("127.0.0.1:{port}")});
        if let Some(tls) = tls {
            grpc["tls"] = json!({"cert_file": tls.cert, "key_file": tls.key});
        }
        let pipeline = json!({"receivers": ["otlp"], "exporters": ["file"]});
        let config = json!({
            "receivers": {"otlp": {"protocols": {"grpc": grpc}}},
            // Written at once, not every second.
            "exporters": {"file": {"path": output, "flush_interval": "10ms"}},
            "service": {
                // No telemetry of its own: no port but the receiver's.
                "telemetry": {"metrics": {"level": "none"}},
                "pipelines": {"metrics": pipeline, "traces": pipeline},
            },
        });
        // JSON is YAML.
        let config_path = dir.path().join("config.yaml");
        std::fs::write(&config_path, config.to_string()).expect("write the collector config");
        let mut child = Command::new(bin)
            .arg(format!("--config=file:{}", config_path.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let log = collect_lines(child.stderr.take().expect("stderr"));
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!(
                    "the collector exited with {status} before it listened:\n{}",
                    log.lock().expect("log").join("\n")
                );
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the collector does not listen on {port}:\n{}",
                log.lock().expect("log").join("\n")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Collector {
            port,
            output,
            child: Some(child),
            log,
            _dir: dir,
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().expect("log").join("\n")
    }

    /// Every export request written so far (a line still being written is left for later).
    pub fn received(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.output).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Waits until `found` finds something in what was received, and returns it; panics after
    /// [`EVENT_TIMEOUT`] with `what` and what did arrive.
    pub async fn wait_for<T>(&self, what: &str, found: impl Fn(&[Value]) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            let received = self.received();
            if let Some(value) = found(&received) {
                return value;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the collector never received {what}; it received {} requests:\n{}\nits log:\n{}",
                received.len(),
                received
                    .iter()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join("\n"),
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        crate::stop(&mut self.child);
    }
}

/// Every metric of the export requests in `received`, with the resource attributes each came
/// with: (resource attributes, metric).
pub fn metrics(received: &[Value]) -> Vec<(Value, Value)> {
    items(received, "resourceMetrics", "scopeMetrics", "metrics")
}

/// Every span of the export requests in `received`: (resource attributes, span).
pub fn spans(received: &[Value]) -> Vec<(Value, Value)> {
    items(received, "resourceSpans", "scopeSpans", "spans")
}

fn items(received: &[Value], resources: &str, scopes: &str, list: &str) -> Vec<(Value, Value)> {
    let mut out = Vec::new();
    for request in received {
        for resource in request[resources].as_array().into_iter().flatten() {
            let attributes = resource["resource"]["attributes"].clone();
            for scope in resource[scopes].as_array().into_iter().flatten() {
                for item in scope[list].as_array().into_iter().flatten() {
                    out.push((attributes.clone(), item.clone()));
                }
            }
        }
    }
    out
}

/// The value of attribute `key` in an OTLP JSON attribute list, as text (OTLP JSON writes
/// 64-bit integers as strings; booleans and doubles are printed).
pub fn attribute(attributes: &Value, key: &str) -> Option<String> {
    let entry = attributes
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)?
        .get("value")?
        .as_object()?
        .values()
        .next()?
        .clone();
    Some(match entry {
        Value::String(text) => text,
        other => other.to_string(),
    })
}
