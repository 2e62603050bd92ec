//! Interop with the published OpenFeature flagd providers (in-process resolver):
//! npm `@openfeature/flagd-provider`, PyPI `openfeature-provider-flagd` and crates.io
//! `open-feature-flagd`, each driven through the small client program under `interop/`.
//!
//! Each client prints `READY` once its provider has synced, then `VALUE <v>` whenever the
//! evaluated string flag changes. A test starts the proxy on a manifests directory, waits for
//! the flag's default variant, rewrites the manifest and waits for the new one.
//!
//! The clients are installed by `scripts/install-interop.sh`. A missing client fails the test
//! when `CI` is set and is skipped with a notice otherwise.

mod support;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::{Proxy, TestCa};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// Guards against a hang only; never a performance expectation.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "default";
const NAME: &str = "demo";
const SELECTOR: &str = "core.openfeature.dev/default/demo";
const FLAG_KEY: &str = "color";
const INSTALL_HINT: &str = "scripts/install-interop.sh";
/// How many stderr lines of a client are kept for failure messages.
const STDERR_TAIL: usize = 60;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cache_dir() -> PathBuf {
    match std::env::var_os("FLAGD_PROXY_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let home = std::env::var_os("HOME").expect("HOME or FLAGD_PROXY_CACHE must be set");
            PathBuf::from(home).join(".cache").join("flagd-proxy")
        }
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Js,
    Python,
    Rust,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Js => "js",
            Kind::Python => "python",
            Kind::Rust => "rust",
        }
    }

    /// The command that runs this client, or why it cannot run.
    fn command(self) -> Result<StdCommand, String> {
        let root = repo_root();
        match self {
            Kind::Js => {
                let dir = root.join("interop/js");
                let provider = dir.join("node_modules/@openfeature/flagd-provider/package.json");
                if !on_path("node") {
                    return Err("`node` is not on PATH".into());
                }
                if !provider.is_file() {
                    return Err(format!("{} is missing", provider.display()));
                }
                let mut cmd = StdCommand::new("node");
                cmd.arg(dir.join("client.mjs")).current_dir(dir);
                Ok(cmd)
            }
            Kind::Python => {
                let python = cache_dir().join("venv/bin/python");
                if !python.is_file() {
                    return Err(format!("{} is missing", python.display()));
                }
                let dir = root.join("interop/python");
                let mut cmd = StdCommand::new(python);
                cmd.arg("-u").arg(dir.join("client.py")).current_dir(dir);
                Ok(cmd)
            }
            Kind::Rust => {
                let bin = cache_dir().join("target-interop/release/flagd-proxy-interop-rust");
                if !bin.is_file() {
                    return Err(format!("{} is missing", bin.display()));
                }
                Ok(StdCommand::new(bin))
            }
        }
    }
}

/// The client's command, or `None` (after a notice) when it is not installed outside CI.
fn client_command_or_skip(kind: Kind) -> Option<StdCommand> {
    match kind.command() {
        Ok(cmd) => Some(cmd),
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!(
                "the {} interop client is not installed: {why}; run {INSTALL_HINT}",
                kind.name()
            )
        }
        Err(why) => {
            eprintln!(
                "NOTICE: skipping the {} interop test: {why}. Run {INSTALL_HINT} to install the clients.",
                kind.name()
            );
            None
        }
    }
}

/// A running client. Killed on drop; it also exits by itself when its stdin closes.
struct Client {
    name: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_reader: Option<JoinHandle<()>>,
}

impl Client {
    fn spawn(kind: Kind, cmd: StdCommand, port: u16, tls_ca: Option<&Path>) -> Client {
        let mut cmd = Command::from(cmd);
        cmd.env("FLAGD_HOST", "127.0.0.1")
            .env("FLAGD_PORT", port.to_string())
            .env("FLAGD_SOURCE_SELECTOR", SELECTOR)
            .env("INTEROP_FLAG_KEY", FLAG_KEY)
            // The clients configure their provider explicitly; keep stray variables from
            // steering a provider elsewhere through its own environment lookup.
            .env_remove("FLAGD_RESOLVER")
            .env_remove("FLAGD_SYNC_PORT")
            .env_remove("FLAGD_TARGET_URI")
            .env_remove("FLAGD_SOCKET_PATH")
            .env_remove("FLAGD_OFFLINE_FLAG_SOURCE_PATH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        match tls_ca {
            Some(ca) => cmd
                .env("FLAGD_TLS", "true")
                .env("FLAGD_SERVER_CERT_PATH", ca),
            None => cmd
                .env("FLAGD_TLS", "false")
                .env_remove("FLAGD_SERVER_CERT_PATH"),
        };
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting the {} client: {e}", kind.name()));

        let lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();

        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let sink = Arc::clone(&stderr);
        let mut pipe = BufReader::new(child.stderr.take().expect("piped stderr"));
        let stderr_reader = tokio::spawn(async move {
            let mut raw = Vec::new();
            while matches!(pipe.read_until(b'\n', &mut raw).await, Ok(n) if n > 0) {
                let line = String::from_utf8_lossy(&raw).trim_end().to_string();
                raw.clear();
                let mut tail = sink.lock().unwrap();
                tail.push_back(line);
                if tail.len() > STDERR_TAIL {
                    tail.pop_front();
                }
            }
        });

        Client {
            name: kind.name(),
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
        }
    }

    /// Stops the client and returns the end of its stderr, for a failure message.
    async fn stop_and_collect_stderr(&mut self) -> String {
        self.stdin.take();
        let _ = self.child.kill().await;
        // The pipe closes with the process, which ends the reader.
        if let Some(reader) = self.stderr_reader.take() {
            let _ = timeout(Duration::from_secs(5), reader).await;
        }
        let tail = self.stderr.lock().unwrap();
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    async fn fail(&mut self, what: &str, proxy: &Proxy) -> ! {
        let stderr = self.stop_and_collect_stderr().await;
        panic!(
            "{} client: {what}\n--- client stderr (tail) ---\n{stderr}\n--- proxy log ---\n{}\n---",
            self.name,
            proxy.log_text()
        );
    }

    /// Asserts that the next stdout line is exactly `want`. Fails after [`LINE_TIMEOUT`]
    /// without output, or when the client exits.
    async fn expect_line(&mut self, want: &str, proxy: &Proxy) {
        match timeout(LINE_TIMEOUT, self.lines.next_line()).await {
            Ok(Ok(Some(got))) if got == want => {}
            Ok(Ok(Some(got))) => {
                self.fail(&format!("expected {want:?}, got {got:?}"), proxy)
                    .await
            }
            Ok(Ok(None)) | Ok(Err(_)) => {
                let status = timeout(Duration::from_secs(5), self.child.wait()).await;
                self.fail(
                    &format!("stdout closed ({status:?}) while waiting for {want:?}"),
                    proxy,
                )
                .await
            }
            Err(_) => {
                self.fail(
                    &format!("no output within {LINE_TIMEOUT:?} while waiting for {want:?}"),
                    proxy,
                )
                .await
            }
        }
    }

    /// Reads lines until one is exactly `want`; anything before it must be a `VALUE` line
    /// (a provider may fall back to the default while it reconnects).
    async fn expect_eventually(&mut self, want: &str, proxy: &Proxy) {
        loop {
            match timeout(LINE_TIMEOUT, self.lines.next_line()).await {
                Ok(Ok(Some(got))) if got == want => return,
                Ok(Ok(Some(got))) if got.starts_with("VALUE ") => {
                    eprintln!("{} client: {got:?} while waiting for {want:?}", self.name);
                }
                Ok(Ok(Some(got))) => {
                    self.fail(&format!("expected {want:?}, got {got:?}"), proxy)
                        .await
                }
                Ok(Ok(None)) | Ok(Err(_)) => {
                    let status = timeout(Duration::from_secs(5), self.child.wait()).await;
                    self.fail(
                        &format!("stdout closed ({status:?}) while waiting for {want:?}"),
                        proxy,
                    )
                    .await
                }
                Err(_) => {
                    self.fail(
                        &format!("no output within {LINE_TIMEOUT:?} while waiting for {want:?}"),
                        proxy,
                    )
                    .await
                }
            }
        }
    }
}

fn color_flags(default_variant: &str) -> Value {
    json!({
        FLAG_KEY: {
            "state": "ENABLED",
            "variants": { "red": "red", "blue": "blue", "green": "green" },
            "defaultVariant": default_variant,
        }
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Change {
    /// Rewrite the manifest while the proxy runs.
    Live,
    /// Stop the proxy (SIGTERM), rewrite the manifest, start it again on the same ports.
    AcrossRestart,
}

/// Connect, see the default variant, change it in the manifest, see the change.
async fn run_interop(kind: Kind, tls: bool, change: Change) {
    let Some(cmd) = client_command_or_skip(kind) else {
        return;
    };

    let manifests = tempfile::tempdir().expect("creating a manifests directory");
    support::write_manifest(manifests.path(), NAMESPACE, NAME, color_flags("red"));
    // Another object with the same flag key: the selector must pick `demo`, not this one.
    support::write_manifest(manifests.path(), NAMESPACE, "decoy", color_flags("green"));

    let ca = tls.then(TestCa::new);
    let mut args = vec![
        "--manifests".to_string(),
        manifests.path().display().to_string(),
    ];
    if let Some(ca) = &ca {
        args.extend(ca.proxy_args());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut proxy = Proxy::start(&args).await;

    let ca_file = ca.as_ref().map(|ca| ca.ca_cert.as_path());
    let mut client = Client::spawn(kind, cmd, proxy.port, ca_file);
    client.expect_line("READY", &proxy).await;
    client.expect_line("VALUE red", &proxy).await;

    match change {
        Change::Live => {
            support::write_manifest(manifests.path(), NAMESPACE, NAME, color_flags("blue"));
            client.expect_line("VALUE blue", &proxy).await;
        }
        Change::AcrossRestart => {
            let (port, management_port) = (proxy.port, proxy.management_port);
            proxy.terminate().await;
            support::write_manifest(manifests.path(), NAMESPACE, NAME, color_flags("blue"));
            proxy = Proxy::start_on(port, management_port, &args, &[]).await;
            client.expect_eventually("VALUE blue", &proxy).await;
        }
    }
}

#[tokio::test]
async fn js_in_process_plain() {
    run_interop(Kind::Js, false, Change::Live).await;
}

#[tokio::test]
async fn js_in_process_tls() {
    run_interop(Kind::Js, true, Change::Live).await;
}

#[tokio::test]
async fn js_reconnects_after_proxy_restart() {
    run_interop(Kind::Js, false, Change::AcrossRestart).await;
}

#[tokio::test]
async fn python_in_process_plain() {
    run_interop(Kind::Python, false, Change::Live).await;
}

#[tokio::test]
async fn python_in_process_tls() {
    run_interop(Kind::Python, true, Change::Live).await;
}

#[tokio::test]
async fn python_reconnects_after_proxy_restart() {
    run_interop(Kind::Python, false, Change::AcrossRestart).await;
}

#[tokio::test]
async fn rust_in_process_plain() {
    run_interop(Kind::Rust, false, Change::Live).await;
}

#[tokio::test]
async fn rust_in_process_tls() {
    run_interop(Kind::Rust, true, Change::Live).await;
}

#[tokio::test]
async fn rust_reconnects_after_proxy_restart() {
    run_interop(Kind::Rust, false, Change::AcrossRestart).await;
}
