//! A real Prometheus for the alert and dashboard tests (`tests/prometheus/`): `promtool` and a
//! `prometheus` server on loopback with given scrape configurations and rule files, and a
//! client of its HTTP API.
//!
//! Both come from `FLAGD_PROXY_PROMETHEUS_BIN` (a folder holding both), the cache
//! (`scripts/install-prometheus.sh`), or `PATH`. Without them the caller skips with a notice,
//! or fails when `CI` is set.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::control_plane::cache_dir;
use super::{collect_lines, free_port, http_get_whole, wait_answering};

/// The `prometheus` and `promtool` binaries.
pub struct Tools {
    pub prometheus: PathBuf,
    pub promtool: PathBuf,
}

impl Tools {
    /// Finds both, or [`skip`](crate::skip::skip)s the calling test.
    pub fn find_or_skip() -> Option<Tools> {
        let dirs = match std::env::var_os("FLAGD_PROXY_PROMETHEUS_BIN").filter(|v| !v.is_empty()) {
            Some(dir) => vec![Some(PathBuf::from(dir))],
            None => vec![Some(cache_dir().join("bin")), None],
        };
        for dir in dirs {
            let path = |name: &str| match &dir {
                Some(dir) => dir.join(name),
                None => PathBuf::from(name),
            };
            let (prometheus, promtool) = (path("prometheus"), path("promtool"));
            if crate::answers_version(&prometheus) && crate::answers_version(&promtool) {
                return Some(Tools {
                    prometheus,
                    promtool,
                });
            }
        }
        crate::skip::skip(
            "prometheus and promtool not found ($FLAGD_PROXY_PROMETHEUS_BIN, the cache's bin/, \
             PATH); run scripts/install-prometheus.sh",
        );
        None
    }

    /// Runs `promtool ARGS` in `dir`: (success, stdout + stderr).
    pub fn promtool(&self, dir: &Path, args: &[&str]) -> (bool, String) {
        let output = Command::new(&self.promtool)
            .current_dir(dir)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.promtool.display()));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    }
}

/// A running Prometheus server on loopback with its own storage; killed on drop.
pub struct Prometheus {
    pub port: u16,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts a server with these `scrape_configs` (Prometheus' configuration, as JSON), a
    /// default scrape interval of one second, and `rule_files` evaluated every second; waits
    /// until it is ready.
    pub async fn start(tools: &Tools, scrape_configs: &[Value], rule_files: &[PathBuf]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = serde_json::json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": rule_files,
            "scrape_configs": scrape_configs,
        });
        // JSON is YAML.
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config.to_string()).expect("write prometheus.yml");
        let port = free_port();
        let mut child = Command::new(&tools.prometheus)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", tools.prometheus.display()));
        let log = collect_lines(child.stderr.take().expect("stderr"));
        wait_answering(&mut child, "prometheus", &log, port, "/-/ready").await;
        Prometheus {
            port,
            child: Some(child),
            log,
            _dir: dir,
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().expect("log").join("\n")
    }

    /// `GET /api/v1/PATH?QUERY`: the `data` of a successful answer, or what went wrong.
    pub async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
        let query: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", percent_encode(v)))
            .collect();
        let target = format!("/api/v1/{path}?{}", query.join("&"));
        let (status, body) = http_get_whole(self.port, &target)
            .await
            .map_err(|e| format!("GET {target}: {e}"))?;
        let answer: Value = serde_json::from_str(&body)
            .map_err(|e| format!("GET {target}: {status}, not JSON ({e}): {body}"))?;
        if answer["status"] != "success" {
            return Err(format!("GET {target}: {status} {answer}"));
        }
        Ok(answer["data"].clone())
    }

    /// An instant query: its result vector (an error for a query Prometheus refuses).
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.api("query", &[("query", expr)]).await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        crate::stop(&mut self.child);
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn percent_encoding_keeps_only_unreserved_characters() {
        assert_eq!(
            super::percent_encode("sum by (le) (x{a=~\".*\"})"),
            "sum%20by%20%28le%29%20%28x%7Ba%3D~%22.%2A%22%7D%29"
        );
    }
}
