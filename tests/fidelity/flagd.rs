//! flagd v0.16 as the judge: a flagd process that reads its sources (files, or gRPC sync
//! streams from the proxy) and answers evaluations over its HTTP evaluation API on a unix
//! socket. It runs in a network namespace of its own (`unshare --net`): it binds its other
//! listeners to every address, and only there is that loopback of its own.
//!
//! When every source's first payload has been handed to flagd's state (see [`Flagd::settle`]),
//! its answers are final: flagd applies payloads one at a time in the order they arrive, so once
//! a marker source's later payload shows, every payload before it has been applied.
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flagd_proxy_testkit as support;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

/// Hang guard for one event flagd is waited for; never a performance expectation.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(120);

/// The marker flag: one string flag, `v1` first and `v2` after the marker's update.
pub const MARKER_FLAG: &str = "fidelity_marker";

pub fn marker_document(value: &str) -> Value {
    json!({"flags": {MARKER_FLAG: {"state": "ENABLED", "variants": {"v1": "v1", "v2": "v2"},
                                    "defaultVariant": value}}})
}

/// A running flagd, killed on drop.
pub struct Flagd {
    _child: Child,
    socket: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Flagd {
    /// Starts flagd (`bin`) with `sources` (flagd's `--sources` entries), logging at debug level.
    pub fn start(bin: &Path, sources: &[Value]) -> Flagd {
        let dir = tempfile::tempdir().expect("flagd's directory");
        let socket = dir.path().join("flagd.sock");
        let mut cmd = Command::new("unshare");
        cmd.arg("--net").arg(bin).arg("start").arg("--debug");
        cmd.arg("--socket-path").arg(&socket);
        cmd.arg("--sync-socket-path")
            .arg(dir.path().join("sync.sock"));
        // Its own namespace: these ports are free there.
        for (flag, port) in [
            ("--management-port", "8014"),
            ("--ofrep-port", "8016"),
            ("--sync-port", "8015"),
        ] {
            cmd.args([flag, port]);
        }
        cmd.args(["--sources", &Value::Array(sources.to_vec()).to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("start flagd");
        let log = Arc::new(Mutex::new(Vec::new()));
        collect(child.stdout.take().expect("stdout"), log.clone());
        collect(child.stderr.take().expect("stderr"), log.clone());
        Flagd {
            _child: child,
            socket,
            log,
            _dir: dir,
        }
    }

    /// How many log lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.log
            .lock()
            .expect("log")
            .iter()
            .filter(|line| line.contains(needle))
            .count()
    }

    /// The last `n` log lines, for a failure message.
    pub fn tail(&self, n: usize) -> String {
        let log = self.log.lock().expect("log");
        log[log.len().saturating_sub(n)..].join("\n")
    }

    /// Waits until `ready` holds of this flagd (a hang guard of [`EVENT_TIMEOUT`]), or panics
    /// with `what` and its log.
    pub async fn wait(&self, what: &str, mut ready: impl FnMut(&Flagd) -> bool) {
        support::eventually_within(&format!("flagd: {what}"), EVENT_TIMEOUT, || {
            let done = ready(self);
            async move {
                if done {
                    Ok(())
                } else {
                    Err(format!("not yet; its log ends:\n{}", self.tail(40)))
                }
            }
        })
        .await;
    }

    /// Waits until the marker flag evaluates to `value`: every payload flagd had received
    /// before the marker's has then been applied.
    pub async fn settle(&self, value: &str) {
        support::eventually_within(
            &format!("flagd: the marker evaluates to {value}"),
            EVENT_TIMEOUT,
            || async {
                let answer = self.resolve_string(MARKER_FLAG, &json!({})).await;
                if answer.get("value").and_then(Value::as_str) == Some(value) {
                    Ok(())
                } else {
                    Err(format!(
                        "the answer is {answer}; its log ends:\n{}",
                        self.tail(40)
                    ))
                }
            },
        )
        .await;
    }

    /// flagd's answers for every flag it can evaluate in `context` (`ResolveAll`).
    pub async fn resolve_all(&self, context: &Value) -> serde_json::Map<String, Value> {
        let body = json!({"context": context}).to_string();
        let answer = self
            .post("/flagd.evaluation.v1.Service/ResolveAll", &body)
            .await;
        match answer.get("flags") {
            Some(Value::Object(flags)) => flags.clone(),
            _ => serde_json::Map::new(),
        }
    }

    /// flagd's answer (a value, or an error) for `key` asked as a string flag.
    pub async fn resolve_string(&self, key: &str, context: &Value) -> Value {
        let body = json!({"flagKey": key, "context": context}).to_string();
        self.post("/flagd.evaluation.v1.Service/ResolveString", &body)
            .await
    }

    async fn post(&self, path: &str, body: &str) -> Value {
        match support::unix_http::post_json(&self.socket, path, body).await {
            Ok(value) => value,
            Err(error) => json!({"transport_error": error}),
        }
    }
}

fn collect<R: AsyncRead + Unpin + Send + 'static>(reader: R, log: Arc<Mutex<Vec<String>>>) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            log.lock().expect("log").push(line);
        }
    });
}
