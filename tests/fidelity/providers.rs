//! The in-process providers as judges: each reads every document of the corpus from a file (its
//! offline file mode) and syncs it from the proxy (its in-process gRPC mode), through its
//! differential program (`interop/differential.md`), and each flag must evaluate the same both
//! ways. Where a provider disagrees with itself because it treats a document differently from
//! flagd (it loads one flagd refuses, which the proxy therefore holds back, or refuses one flagd
//! loads), that is the provider's own defect: it is counted and listed, not failed.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use support::control_plane::{cache_dir, java_class_path};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use super::support;

/// Hang guard for one client's whole run over the corpus; never a performance expectation.
const RUN_TIMEOUT: Duration = Duration::from_secs(1200);
/// The providers' startup deadline (`FLAGD_DEADLINE_MS`): a hang guard as well.
const STARTUP_DEADLINE_MS: &str = "5000";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Client {
    Js,
    Python,
    Go,
    Java,
    Rust,
}

pub const CLIENTS: [Client; 5] = [
    Client::Js,
    Client::Python,
    Client::Go,
    Client::Java,
    Client::Rust,
];

impl Client {
    pub fn name(self) -> &'static str {
        match self {
            Client::Js => "JS provider",
            Client::Python => "Python provider",
            Client::Go => "Go provider",
            Client::Java => "Java provider",
            Client::Rust => "Rust provider",
        }
    }

    /// The command that runs the client's differential program, or what is missing.
    pub fn command(self) -> Result<Command, String> {
        let root = support::repo_root();
        let cache = cache_dir();
        let file = |path: PathBuf, installer: &str| {
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!("{} is missing: run {installer}", path.display()))
            }
        };
        let command = match self {
            Client::Js => {
                file(
                    root.join("interop/js/node_modules/@openfeature/flagd-provider/package.json"),
                    "scripts/install-interop.sh js",
                )?;
                let mut cmd = Command::new("node");
                cmd.arg(root.join("interop/js/diff.mjs"));
                cmd
            }
            Client::Python => {
                let python = file(
                    cache.join("venv/bin/python"),
                    "scripts/install-interop.sh python",
                )?;
                let mut cmd = Command::new(python);
                cmd.arg("-u").arg(root.join("interop/python/diff.py"));
                cmd.current_dir(root.join("interop/python"));
                cmd
            }
            Client::Go => Command::new(file(
                cache.join("bin/interop-go/flagd-proxy-interop-go-diff"),
                "scripts/install-compat.sh go",
            )?),
            Client::Java => {
                file(
                    cache.join("java/classes/interop/Diff.class"),
                    "scripts/install-compat.sh java",
                )?;
                let mut cmd = Command::new("java");
                cmd.arg("-cp").arg(java_class_path()).arg("interop.Diff");
                cmd
            }
            Client::Rust => Command::new(file(
                cache.join("target-interop/debug/flagd-proxy-interop-rust-diff"),
                "scripts/install-interop.sh rust",
            )?),
        };
        Ok(command)
    }
}

/// One document as a job names it.
pub struct JobDocument {
    pub id: String,
    pub path: PathBuf,
    pub selector: String,
    pub flags: Vec<String>,
    pub served: bool,
}

/// Runs `client`'s differential program over `documents` in `mode` (`file` or `sync`): its
/// line for each document, by id.
pub async fn run(
    client: Client,
    mode: &str,
    port: u16,
    contexts: &[Value],
    documents: &[JobDocument],
    dir: &Path,
) -> Result<BTreeMap<String, Value>, String> {
    let job = json!({
        "mode": mode,
        "host": "127.0.0.1",
        "port": port,
        "contexts": contexts,
        "documents": documents.iter().map(|d| json!({
            "id": d.id, "path": d.path, "selector": d.selector, "flags": d.flags,
            "served": d.served,
        })).collect::<Vec<_>>(),
    });
    let job_path = dir.join(format!("job-{client:?}-{mode}.json"));
    std::fs::write(&job_path, job.to_string()).map_err(|e| e.to_string())?;
    let mut cmd = client.command()?;
    // A provider's first event must not depend on how fast the machine is: the Python
    // provider, for one, reports ERROR when its first data takes longer than its startup
    // deadline (500 ms by default), and READY after.
    cmd.env("INTEROP_DIFF_JOB", &job_path)
        .env("FLAGD_DEADLINE_MS", STARTUP_DEADLINE_MS)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| format!("starting it: {e}"))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut stderr = child.stderr.take().ok_or("no stderr")?;
    let run = async {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (read_out, read_err) =
            tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        read_out.and(read_err).map_err(|e| e.to_string())?;
        let status = child.wait().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((status, out, err))
    };
    let (status, out, err) = tokio::time::timeout(RUN_TIMEOUT, run)
        .await
        .map_err(|_| format!("no end within {RUN_TIMEOUT:?}"))??;
    let err = String::from_utf8_lossy(&err);
    if !status.success() {
        // A crash names its cause in its first lines and where it was in its last ones.
        let lines: Vec<&str> = err.lines().collect();
        let first = lines
            .iter()
            .position(|l| l.contains("panic") || l.contains("fatal"));
        let cause = first.map_or(&[][..], |at| &lines[at..lines.len().min(at + 5)]);
        let tail = &lines[lines.len().saturating_sub(15)..];
        return Err(format!(
            "{mode} mode exited with {status}; its log:\n{}\n...\n{}",
            cause.join("\n"),
            tail.join("\n")
        ));
    }
    let mut lines = BTreeMap::new();
    for line in String::from_utf8_lossy(&out).lines() {
        let value: Value =
            serde_json::from_str(line).map_err(|e| format!("not a JSON line ({e}): {line}"))?;
        let id = value["id"].as_str().unwrap_or_default().to_owned();
        lines.insert(id, value);
    }
    let missing: Vec<&str> = documents
        .iter()
        .filter(|d| !lines.contains_key(&d.id))
        .map(|d| d.id.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{mode} mode gave no line for {} documents (first: {:?})",
            missing.len(),
            &missing[..missing.len().min(5)]
        ));
    }
    Ok(lines)
}

/// Numbers compared as numbers (`1` and `1.0` are the same answer).
fn normalized(value: &Value) -> Value {
    match value {
        Value::Number(n) => n.as_f64().map_or(Value::Null, |f| json!(f)),
        Value::Array(items) => Value::Array(items.iter().map(normalized).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), normalized(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn ready(line: &Value) -> bool {
    line["ready"] == json!(true)
}

/// How one document went for one client.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Both modes gave the same answers (or both had no provider ready).
    Same,
    /// The client treats the document differently from flagd: it loads a document flagd
    /// refuses (`loads`), or refuses one flagd loads; its two modes differ because of that.
    ClientDiffers { loads: bool },
    /// The modes differ for another reason: the proxy changed what the client sees.
    Differs,
}

/// Compares the client's file-mode and sync-mode lines for one document that flagd loads
/// (`flagd_loads`: the proxy serves it) or refuses.
pub fn compare(file: &Value, sync: &Value, flagd_loads: bool) -> Outcome {
    let client_loads = ready(file);
    if client_loads != flagd_loads {
        return Outcome::ClientDiffers {
            loads: client_loads,
        };
    }
    match (ready(file), ready(sync)) {
        (false, false) => Outcome::Same,
        (true, true) if normalized(&file["answers"]) == normalized(&sync["answers"]) => {
            Outcome::Same
        }
        _ => Outcome::Differs,
    }
}
