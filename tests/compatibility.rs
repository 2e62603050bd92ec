//! The client compatibility matrix: every real flagd sync client we can install, against the
//! proxy, in every mode that matters, written into `docs/compatibility.md`.
//!
//! Rows: flagd itself as the sidecar (v0.16.x, `flagd.sync.v1`), an old flagd that speaks only
//! the legacy `sync.v1`, and the in-process providers for JS, Python, Rust, Java and Go.
//! Columns: plain, TLS, header selector, body selector, update, reconnect (see [`Column`]).
//! A second table covers what current flagd speaks besides (see [`Feature`]): flagd's
//! `source=` selector, the proxy's unix socket, and `--context-value` entries in evaluations.
//!
//! The JS, Python and Rust clients (under `interop/`) come from `scripts/install-interop.sh`;
//! flagd, the old flagd, Java and Go from `scripts/install-compat.sh`.
//! Every stdout client speaks one protocol: `READY` once its provider has synced, then
//! `VALUE <v>` whenever the evaluated flag changes. flagd is asked through its HTTP evaluation
//! API instead.
//!
//! The test fails on any `fail` cell, and when the committed `docs/compatibility.md` differs
//! from what the run produced (`FLAGD_PROXY_UPDATE_DOCS=1` rewrites it). A client that is not
//! installed fails the test when `CI` is set; otherwise it is skipped with a notice and the
//! document is neither checked nor rewritten.

use flagd_proxy_testkit as support;

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::{Proxy, TestCa};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Semaphore;
use tokio::time::{Instant, timeout};

/// Hang guard for one expected event; never a performance expectation.
const EVENT_TIMEOUT: Duration = Duration::from_secs(60);
/// Hang guard for a client to come back after a proxy restart. flagd's sync client waits
/// 4 s, then 16 s, then 60 s between attempts.
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(150);
/// How long the Go client stays connected without traffic before the update: more than two of
/// its 30 s keepalive pings.
const GO_IDLE: Duration = Duration::from_secs(70);
/// Sessions (proxy + client) run at once; the machine has two cores.
const PARALLEL_SESSIONS: usize = 4;

const NAMESPACE: &str = "default";
const NAME: &str = "demo";
const DECOY: &str = "decoy";
const SELECTOR: &str = "core.openfeature.dev/default/demo";
/// The same resource in flagd's `key=value` selector grammar (flagd v0.13 and later).
const SOURCE_SELECTOR: &str = "source=core.openfeature.dev/default/demo";
/// The `--context-value` entry the targeting rule of the context-value run looks at.
const CONTEXT_KEY: &str = "region";
const CONTEXT_VALUE: &str = "eu-west";
const FLAG_KEY: &str = "color";
const INITIAL: &str = "red";
const UPDATED: &str = "blue";
const DECOY_VALUE: &str = "green";

const DOC: &str = "docs/compatibility.md";
const UPDATE_ENV: &str = "FLAGD_PROXY_UPDATE_DOCS";
/// The old flagd's complaint when the proxy refuses its selector-less request.
const NO_SELECTOR: &str = "no selector given";
/// Stderr of the Go client that would mean its connection was dropped while idle.
const GO_DISCONNECT_SIGNS: [&str; 5] = [
    "too_many_pings",
    "GoAway",
    "GOAWAY",
    "event PROVIDER_ERROR",
    "event PROVIDER_STALE",
];
/// Lines of a client's output kept for failure messages and searches.
const LOG_LINES: usize = 4000;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_repo_file(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
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

// ---------------------------------------------------------------------------------------------
// Versions, read from the files that pin them (so the document is the same on every machine).
// ---------------------------------------------------------------------------------------------

/// The version a `go.mod` requires of `module` (`module vX.Y.Z` on a line of its own or in a
/// require block).
fn go_mod_version(go_mod: &str, module: &str) -> String {
    go_mod
        .lines()
        .map(|l| l.trim().trim_start_matches("require").trim())
        .find_map(|l| {
            let mut parts = l.split_whitespace();
            (parts.next() == Some(module))
                .then(|| parts.next().map(str::to_owned))
                .flatten()
        })
        .unwrap_or_else(|| panic!("{module} is not required in the go.mod"))
}

fn cargo_lock_version(lock: &str, name: &str) -> String {
    let needle = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == needle
            && let Some(version) = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = \""))
        {
            return version.trim_end_matches('"').to_owned();
        }
    }
    panic!("{name} is not in Cargo.lock")
}

fn requirement_version(requirements: &str, name: &str) -> String {
    requirements
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{name}==")))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("{name} is not pinned in requirements.txt"))
}

fn npm_lock_version(lock: &str, package: &str) -> String {
    let lock: Value = serde_json::from_str(lock).expect("package-lock.json");
    lock["packages"][format!("node_modules/{package}")]["version"]
        .as_str()
        .unwrap_or_else(|| panic!("{package} is not in package-lock.json"))
        .to_owned()
}

/// The `<version>` right after `<artifactId>{artifact}</artifactId>` in a pom.
fn pom_version(pom: &str, artifact: &str) -> String {
    let tag = format!("<artifactId>{artifact}</artifactId>");
    let rest = &pom[pom
        .find(&tag)
        .unwrap_or_else(|| panic!("{artifact} not in pom.xml"))..];
    let start = rest.find("<version>").expect("<version>") + "<version>".len();
    let end = rest[start..].find("</version>").expect("</version>");
    rest[start..start + end].trim().to_owned()
}

struct Versions {
    flagd: String,
    flagd_core: String,
    flagd_legacy: String,
    js: String,
    js_sdk: String,
    python: String,
    python_sdk: String,
    rust: String,
    rust_sdk: String,
    java: String,
    java_sdk: String,
    go: String,
    go_sdk: String,
    go_legacy: String,
    go_legacy_core: String,
    go_legacy_sdk: String,
}

impl Versions {
    fn read() -> Versions {
        let flagd_mod = read_repo_file("interop/flagd/current/go.mod");
        let core_replacement = flagd_mod
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("replace github.com/open-feature/flagd/core ")
                    .and_then(|r| r.split("=>").nth(1))
                    .and_then(|r| r.split_whitespace().nth(1))
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| go_mod_version(&flagd_mod, "github.com/open-feature/flagd/core"));
        let js_lock = read_repo_file("interop/js/package-lock.json");
        let requirements = read_repo_file("interop/python/requirements.txt");
        let cargo_lock = read_repo_file("interop/rust/Cargo.lock");
        let pom = read_repo_file("interop/java/pom.xml");
        let go_mod = read_repo_file("interop/go/go.mod");
        let go_legacy_mod = read_repo_file("interop/go/legacy/go.mod");
        Versions {
            flagd: go_mod_version(&flagd_mod, "github.com/open-feature/flagd/flagd"),
            flagd_core: core_replacement,
            flagd_legacy: go_mod_version(
                &read_repo_file("interop/flagd/legacy/go.mod"),
                "github.com/open-feature/flagd",
            ),
            js: npm_lock_version(&js_lock, "@openfeature/flagd-provider"),
            js_sdk: npm_lock_version(&js_lock, "@openfeature/server-sdk"),
            python: requirement_version(&requirements, "openfeature-provider-flagd"),
            python_sdk: requirement_version(&requirements, "openfeature-sdk"),
            rust: cargo_lock_version(&cargo_lock, "open-feature-flagd"),
            rust_sdk: cargo_lock_version(&cargo_lock, "open-feature"),
            java: pom_version(&pom, "flagd"),
            java_sdk: pom_version(&pom, "sdk"),
            go: go_mod_version(
                &go_mod,
                "github.com/open-feature/go-sdk-contrib/providers/flagd",
            ),
            go_sdk: go_mod_version(&go_mod, "github.com/open-feature/go-sdk"),
            go_legacy: go_mod_version(
                &go_legacy_mod,
                "github.com/open-feature/go-sdk-contrib/providers/flagd",
            ),
            go_legacy_core: go_mod_version(&go_legacy_mod, "github.com/open-feature/flagd/core"),
            go_legacy_sdk: go_mod_version(&go_legacy_mod, "github.com/open-feature/go-sdk"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Flagd,
    FlagdLegacy,
    Js,
    Python,
    Rust,
    Java,
    Go,
    GoLegacy,
}

const KINDS: [Kind; 8] = [
    Kind::Flagd,
    Kind::FlagdLegacy,
    Kind::Js,
    Kind::Python,
    Kind::Rust,
    Kind::Java,
    Kind::Go,
    Kind::GoLegacy,
];

/// How a client sends its selector (a fact of the client version, from its source).
#[derive(Clone, Copy, PartialEq, Eq)]
enum SelectorMode {
    /// Only the `selector` field of the request body.
    BodyOnly,
    /// The `flagd-selector` header and the body field.
    HeaderAndBody,
    /// No selector at all.
    None,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Flagd => "flagd",
            Kind::FlagdLegacy => "flagd (old, sync.v1)",
            Kind::Js => "JS provider",
            Kind::Python => "Python provider",
            Kind::Rust => "Rust provider",
            Kind::Java => "Java provider",
            Kind::Go => "Go provider",
            Kind::GoLegacy => "Go provider (old, sync.v1)",
        }
    }

    fn install_hint(self) -> &'static str {
        match self {
            Kind::Js | Kind::Python | Kind::Rust => "scripts/install-interop.sh",
            _ => "scripts/install-compat.sh",
        }
    }

    /// The name of the step of `scripts/install-compat.sh` that installs this client.
    fn compat_step(self) -> Option<&'static str> {
        match self {
            Kind::Flagd => Some("flagd"),
            Kind::FlagdLegacy => Some("flagd-legacy"),
            Kind::Java => Some("java"),
            Kind::Go => Some("go"),
            Kind::GoLegacy => Some("go-legacy"),
            Kind::Js | Kind::Python | Kind::Rust => None,
        }
    }

    fn selector_mode(self) -> SelectorMode {
        match self {
            Kind::Flagd | Kind::Rust | Kind::Java | Kind::GoLegacy => SelectorMode::BodyOnly,
            Kind::Js | Kind::Python | Kind::Go => SelectorMode::HeaderAndBody,
            Kind::FlagdLegacy => SelectorMode::None,
        }
    }

    /// Package and version, for the document.
    fn package(self, v: &Versions) -> String {
        match self {
            Kind::Flagd => format!(
                "`github.com/open-feature/flagd/flagd` {} (with `flagd/core` {})",
                v.flagd, v.flagd_core
            ),
            Kind::FlagdLegacy => format!("`github.com/open-feature/flagd` {}", v.flagd_legacy),
            Kind::Js => format!(
                "npm `@openfeature/flagd-provider` {} + `@openfeature/server-sdk` {}",
                v.js, v.js_sdk
            ),
            Kind::Python => format!(
                "PyPI `openfeature-provider-flagd` {} + `openfeature-sdk` {}",
                v.python, v.python_sdk
            ),
            Kind::Rust => format!(
                "crates.io `open-feature-flagd` {} + `open-feature` {}",
                v.rust, v.rust_sdk
            ),
            Kind::Java => format!(
                "Maven `dev.openfeature.contrib.providers:flagd` {} + `dev.openfeature:sdk` {}",
                v.java, v.java_sdk
            ),
            Kind::Go => format!(
                "`github.com/open-feature/go-sdk-contrib/providers/flagd` {} + `github.com/open-feature/go-sdk` {}",
                v.go, v.go_sdk
            ),
            Kind::GoLegacy => format!(
                "`github.com/open-feature/go-sdk-contrib/providers/flagd` {} (with `flagd/core` {}) + `github.com/open-feature/go-sdk` {}",
                v.go_legacy, v.go_legacy_core, v.go_legacy_sdk
            ),
        }
    }

    fn launch(self, v: &Versions) -> Result<Launch, Missing> {
        let root = repo_root();
        let cache = cache_dir();
        if let Some(step) = self.compat_step() {
            let recorded = cache.join("compat").join(format!("{step}.not-installable"));
            if let Ok(error) = std::fs::read_to_string(&recorded) {
                let error = error.split_whitespace().collect::<Vec<_>>().join(" ");
                return Err(Missing::NotInstallable(error));
            }
        }
        let file = |path: PathBuf| {
            if path.is_file() {
                Ok(path)
            } else {
                Err(Missing::NotInstalled(format!(
                    "{} is missing",
                    path.display()
                )))
            }
        };
        match self {
            Kind::Flagd => Ok(Launch::Flagd {
                bin: file(cache.join(format!("bin/flagd-{}/flagd", v.flagd)))?,
                legacy: false,
            }),
            Kind::FlagdLegacy => Ok(Launch::Flagd {
                bin: file(cache.join(format!("bin/flagd-{}/flagd", v.flagd_legacy)))?,
                legacy: true,
            }),
            Kind::Js => {
                let dir = root.join("interop/js");
                if !on_path("node") {
                    return Err(Missing::NotInstalled("`node` is not on PATH".into()));
                }
                file(dir.join("node_modules/@openfeature/flagd-provider/package.json"))?;
                let mut cmd = StdCommand::new("node");
                cmd.arg(dir.join("client.mjs")).current_dir(dir);
                Ok(Launch::Stdout(cmd))
            }
            Kind::Python => {
                let python = file(cache.join("venv/bin/python"))?;
                let dir = root.join("interop/python");
                let mut cmd = StdCommand::new(python);
                cmd.arg("-u").arg(dir.join("client.py")).current_dir(dir);
                Ok(Launch::Stdout(cmd))
            }
            Kind::Rust => Ok(Launch::Stdout(StdCommand::new(file(
                cache.join("target-interop/release/flagd-proxy-interop-rust"),
            )?))),
            Kind::Java => {
                let java_home = cache.join("java");
                file(java_home.join("classes/interop/Client.class"))?;
                if !on_path("java") {
                    return Err(Missing::NotInstalled("`java` is not on PATH".into()));
                }
                let mut cmd = StdCommand::new("java");
                cmd.arg("-cp")
                    .arg(format!(
                        "{}:{}/*",
                        java_home.join("classes").display(),
                        java_home.join("lib").display()
                    ))
                    .arg("interop.Client");
                Ok(Launch::Stdout(cmd))
            }
            Kind::Go => Ok(Launch::Stdout(StdCommand::new(file(
                cache.join("bin/interop-go/flagd-proxy-interop-go"),
            )?))),
            Kind::GoLegacy => Ok(Launch::Stdout(StdCommand::new(file(
                cache.join("bin/interop-go-legacy/flagd-proxy-interop-go-legacy"),
            )?))),
        }
    }
}

enum Missing {
    /// The install script has not been run (or its output is gone).
    NotInstalled(String),
    /// The install script ran and recorded why the client cannot be installed here.
    NotInstallable(String),
}

enum Launch {
    /// A program speaking the READY/VALUE stdout protocol.
    Stdout(StdCommand),
    /// A flagd binary, evaluated over its HTTP API.
    Flagd { bin: PathBuf, legacy: bool },
}

impl Clone for Launch {
    fn clone(&self) -> Self {
        match self {
            Launch::Stdout(cmd) => Launch::Stdout(clone_command(cmd)),
            Launch::Flagd { bin, legacy } => Launch::Flagd {
                bin: bin.clone(),
                legacy: *legacy,
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Matrix cells
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Column {
    Plain,
    Tls,
    HeaderSelector,
    BodySelector,
    Update,
    Reconnect,
}

const COLUMNS: [Column; 6] = [
    Column::Plain,
    Column::Tls,
    Column::HeaderSelector,
    Column::BodySelector,
    Column::Update,
    Column::Reconnect,
];

impl Column {
    fn title(self) -> &'static str {
        match self {
            Column::Plain => "plain",
            Column::Tls => "TLS",
            Column::HeaderSelector => "header selector",
            Column::BodySelector => "body selector",
            Column::Update => "update",
            Column::Reconnect => "reconnect",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Cell {
    Pass,
    Fail(String),
    NotApplicable(String),
    NotInstallable(String),
    NotInstalled(String),
}

impl Cell {
    fn markdown(&self) -> String {
        let text = match self {
            Cell::Pass => "pass".to_owned(),
            Cell::Fail(why) => format!("fail: {why}"),
            Cell::NotApplicable(why) => format!("n/a: {why}"),
            Cell::NotInstallable(why) => format!("not installable: {why}"),
            Cell::NotInstalled(why) => format!("not installed: {why}"),
        };
        text.replace('|', "\\|").replace('\n', " ")
    }

    fn from_result(result: Result<(), String>) -> Cell {
        match result {
            Ok(()) => Cell::Pass,
            Err(why) => Cell::Fail(why),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A running client
// ---------------------------------------------------------------------------------------------

type Log = Arc<Mutex<VecDeque<String>>>;

fn collect_lines<R: AsyncRead + Unpin + Send + 'static>(reader: R, log: Log) {
    tokio::spawn(async move {
        let mut reader = BufReader::new(reader);
        let mut raw = Vec::new();
        while matches!(reader.read_until(b'\n', &mut raw).await, Ok(n) if n > 0) {
            let line = String::from_utf8_lossy(&raw).trim_end().to_owned();
            raw.clear();
            let mut log = log.lock().unwrap();
            log.push_back(line);
            if log.len() > LOG_LINES {
                log.pop_front();
            }
        }
    });
}

/// How to reach a flagd's evaluation API.
struct FlagdEndpoint {
    /// flagd serves evaluation on this unix socket (`--socket-path`) rather than on a TCP
    /// port: it has no option to bind its TCP listeners to loopback only.
    socket: PathBuf,
    legacy: bool,
    _dir: tempfile::TempDir,
}

/// A client process: killed on drop.
/// Forwards connections on a unix socket to the proxy's loopback port, until dropped.
struct Relay(tokio::task::JoinHandle<()>);

impl Relay {
    fn start(socket: &Path, proxy_port: u16) -> Relay {
        let listener = tokio::net::UnixListener::bind(socket).expect("binding the relay socket");
        Relay(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", proxy_port)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        }))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Session {
    _relay: Option<Relay>,
    name: &'static str,
    child: Child,
    _stdin: Option<ChildStdin>,
    lines: Option<Lines<BufReader<ChildStdout>>>,
    flagd: Option<FlagdEndpoint>,
    log: Log,
}

/// What a client is pointed at besides the proxy's port.
struct Target {
    selector: &'static str,
    /// The proxy's unix socket, used instead of its port.
    socket: Option<PathBuf>,
}

impl Default for Target {
    fn default() -> Self {
        Target {
            selector: SELECTOR,
            socket: None,
        }
    }
}

impl Session {
    fn spawn(kind: Kind, launch: &Launch, proxy_port: u16, ca: Option<&Path>) -> Session {
        Self::spawn_to(kind, launch, proxy_port, ca, &Target::default())
    }

    fn spawn_to(
        kind: Kind,
        launch: &Launch,
        proxy_port: u16,
        ca: Option<&Path>,
        target: &Target,
    ) -> Session {
        let log: Log = Arc::new(Mutex::new(VecDeque::new()));
        match launch {
            Launch::Stdout(cmd) => {
                let mut cmd = Command::from(clone_command(cmd));
                cmd.env("FLAGD_HOST", "127.0.0.1")
                    .env("FLAGD_PORT", proxy_port.to_string())
                    .env("FLAGD_SOURCE_SELECTOR", target.selector)
                    .env("INTEROP_FLAG_KEY", FLAG_KEY)
                    // The clients configure their provider explicitly; keep stray variables
                    // from steering a provider elsewhere through its own environment lookup.
                    .env_remove("FLAGD_RESOLVER")
                    .env_remove("FLAGD_SYNC_PORT")
                    .env_remove("FLAGD_TARGET_URI")
                    .env_remove("FLAGD_SOCKET_PATH")
                    .env_remove("FLAGD_OFFLINE_FLAG_SOURCE_PATH")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true);
                match &target.socket {
                    Some(socket) => cmd.env("INTEROP_SOCKET_PATH", socket),
                    None => cmd.env_remove("INTEROP_SOCKET_PATH"),
                };
                match ca {
                    Some(ca) => cmd
                        .env("FLAGD_TLS", "true")
                        .env("FLAGD_SERVER_CERT_PATH", ca),
                    None => cmd
                        .env("FLAGD_TLS", "false")
                        .env_remove("FLAGD_SERVER_CERT_PATH"),
                };
                if let (Kind::GoLegacy, Some(ca)) = (kind, ca) {
                    // Its in-process resolver never hands the CA file to its sync client, which
                    // then trusts the system roots only; Go reads those from SSL_CERT_FILE.
                    cmd.env("SSL_CERT_FILE", ca);
                }
                let mut child = cmd
                    .spawn()
                    .unwrap_or_else(|e| panic!("starting the {} client: {e}", kind.name()));
                collect_lines(child.stderr.take().expect("stderr"), log.clone());
                Session {
                    _relay: None,
                    name: kind.name(),
                    _stdin: child.stdin.take(),
                    lines: Some(BufReader::new(child.stdout.take().expect("stdout")).lines()),
                    child,
                    flagd: None,
                    log,
                }
            }
            Launch::Flagd { bin, legacy } => {
                let dir = tempfile::tempdir().expect("socket directory");
                let socket = dir.path().join("flagd.sock");
                // flagd cannot bind its management/OFREP ports to loopback, so it runs in a
                // network namespace of its own and reaches the proxy through a unix socket
                // relayed to the proxy's loopback port.
                let relay_socket = dir.path().join("proxy.sock");
                let relay = Relay::start(&relay_socket, proxy_port);
                // A unix socket of the proxy's own is reached directly (sockets are files, not
                // part of the network namespace).
                let relay_uri = match &target.socket {
                    Some(socket) => format!("unix://{}", socket.display()),
                    None => format!("unix://{}", relay_socket.display()),
                };
                let mut cmd = Command::new("unshare");
                cmd.arg("--net").arg(bin);
                cmd.arg("start").arg("--socket-path").arg(&socket);
                // Its remaining listeners (metrics/management, OFREP) get free ports.
                let source = if *legacy {
                    // flagd v0.4: `grpc://` or `grpcs://` URIs, no selector option.
                    cmd.args(["--metrics-port", &support::free_port().to_string()]);
                    match ca {
                        Some(ca) => json!({
                            "uri": format!("grpcs://{relay_uri}"),
                            "provider": "grpc",
                            "certPath": ca,
                        }),
                        None => json!({
                            "uri": format!("grpc://{relay_uri}"),
                            "provider": "grpc",
                        }),
                    }
                } else {
                    cmd.arg("--sync-socket-path")
                        .arg(dir.path().join("sync.sock"));
                    for flag in ["--management-port", "--ofrep-port", "--sync-port"] {
                        cmd.args([flag, &support::free_port().to_string()]);
                    }
                    let mut source = json!({
                        "uri": relay_uri,
                        "provider": "grpc",
                        "selector": target.selector,
                    });
                    if let Some(ca) = ca {
                        source["tls"] = json!(true);
                        source["certPath"] = json!(ca);
                    }
                    source
                };
                cmd.args(["--sources", &json!([source]).to_string()])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true);
                let mut child = cmd
                    .spawn()
                    .unwrap_or_else(|e| panic!("starting {}: {e}", kind.name()));
                collect_lines(child.stdout.take().expect("stdout"), log.clone());
                collect_lines(child.stderr.take().expect("stderr"), log.clone());
                Session {
                    _relay: Some(relay),
                    name: kind.name(),
                    _stdin: None,
                    lines: None,
                    child,
                    flagd: Some(FlagdEndpoint {
                        socket,
                        legacy: *legacy,
                        _dir: dir,
                    }),
                    log,
                }
            }
        }
    }

    fn log_len(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// The first logged line (from index `from` on) containing one of `needles`.
    fn find_in_log(&self, from: usize, needles: &[&str]) -> Option<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .skip(from)
            .find(|line| needles.iter().any(|n| line.contains(n)))
            .cloned()
    }

    fn log_tail(&self, lines: usize) -> String {
        let log = self.log.lock().unwrap();
        let skip = log.len().saturating_sub(lines);
        log.iter()
            .skip(skip)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// flagd's answer for the flag: `Some(value)` once it resolves, `None` while it cannot.
    async fn flagd_value(&self) -> Option<String> {
        let endpoint = self.flagd.as_ref()?;
        let path = if endpoint.legacy {
            "/schema.v1.Service/ResolveString"
        } else {
            "/flagd.evaluation.v1.Service/ResolveString"
        };
        let body = json!({"flagKey": FLAG_KEY, "context": {}}).to_string();
        let response = http_post_json(&endpoint.socket, path, &body).await.ok()?;
        response["value"].as_str().map(str::to_owned)
    }

    /// Waits for the stdout client's `READY` (a no-op for flagd).
    async fn ready(&mut self) -> Result<(), String> {
        let Some(lines) = self.lines.as_mut() else {
            return Ok(());
        };
        match timeout(EVENT_TIMEOUT, lines.next_line()).await {
            Ok(Ok(Some(line))) if line == "READY" => Ok(()),
            Ok(Ok(Some(line))) => Err(format!("expected READY, got {line:?}")),
            Ok(Ok(None)) | Ok(Err(_)) => Err("exited before it was ready".into()),
            Err(_) => Err(format!("not ready within {EVENT_TIMEOUT:?}")),
        }
    }

    /// Waits until the client evaluates the flag to `want`. The decoy's value always fails.
    /// `strict`: for a stdout client, the next `VALUE` line must be `want` (otherwise values
    /// on the way, such as the default while reconnecting, are skipped).
    async fn expect_value(
        &mut self,
        want: &str,
        strict: bool,
        limit: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        if let Some(lines) = self.lines.as_mut() {
            loop {
                let line = match tokio::time::timeout_at(deadline, lines.next_line()).await {
                    Ok(Ok(Some(line))) => line,
                    Ok(Ok(None)) | Ok(Err(_)) => {
                        return Err(format!("exited while waiting for {want:?}"));
                    }
                    Err(_) => return Err(format!("no {want:?} within {limit:?}")),
                };
                match line.strip_prefix("VALUE ") {
                    Some(got) if got == want => return Ok(()),
                    Some(DECOY_VALUE) => {
                        return Err("evaluated the decoy resource's flag: wrong selector".into());
                    }
                    Some(got) if strict => return Err(format!("expected {want:?}, got {got:?}")),
                    Some(_) => {}
                    None => return Err(format!("unexpected output {line:?}")),
                }
            }
        }
        loop {
            match self.flagd_value().await.as_deref() {
                Some(got) if got == want => return Ok(()),
                Some(DECOY_VALUE) => {
                    return Err("evaluated the decoy resource's flag: wrong selector".into());
                }
                _ => {}
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited ({status}) while waiting for {want:?}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("no {want:?} within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// For the old flagd: waits until it either resolves `want` (`Ok(None)`) or logs that the
    /// proxy refused it for lack of a selector (`Ok(Some(line))`).
    async fn expect_value_or_refusal(&mut self, want: &str) -> Result<Option<String>, String> {
        let deadline = Instant::now() + EVENT_TIMEOUT;
        loop {
            if let Some(line) = self.find_in_log(0, &[NO_SELECTOR]) {
                return Ok(Some(line));
            }
            if self.flagd_value().await.as_deref() == Some(want) {
                return Ok(None);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited ({status})"));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "neither {want:?} nor a refusal within {EVENT_TIMEOUT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the client and describes a failure with both sides' logs.
    async fn report(&mut self, what: &str, proxy: &Proxy) -> String {
        let _ = self.child.kill().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        format!(
            "{} client: {what}\n--- client output (tail) ---\n{}\n--- proxy log (tail) ---\n{}\n---",
            self.name,
            self.log_tail(60),
            tail(&proxy.log_text(), 60)
        )
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn clone_command(cmd: &StdCommand) -> StdCommand {
    let mut copy = StdCommand::new(cmd.get_program());
    copy.args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        copy.current_dir(dir);
    }
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => copy.env(key, value),
            None => copy.env_remove(key),
        };
    }
    copy
}

/// A minimal HTTP/1.1 JSON POST over a unix socket: the response body parsed as JSON.
async fn http_post_json(socket: &Path, path: &str, body: &str) -> Result<Value, String> {
    let request = async {
        let mut stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| e.to_string())?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        stream
            .write_all(body.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(String::from_utf8_lossy(&response).into_owned())
    };
    let text = timeout(Duration::from_secs(5), request)
        .await
        .map_err(|_| "no HTTP answer".to_owned())??;
    let (_, body) = text.split_once("\r\n\r\n").ok_or("no HTTP body")?;
    // A small body may come as one chunk; the JSON object is all between the outer braces.
    let (start, end) = (
        body.find('{').ok_or("no JSON")?,
        body.rfind('}').ok_or("no JSON")?,
    );
    serde_json::from_str(&body[start..=end]).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------------
// Runs
// ---------------------------------------------------------------------------------------------

fn color_flags(default_variant: &str) -> Value {
    json!({
        FLAG_KEY: {
            "state": "ENABLED",
            "variants": { "red": "red", "blue": "blue", "green": "green" },
            "defaultVariant": default_variant,
        }
    })
}

/// A manifests directory with `demo` (the selected resource) and `decoy` (same flag key, the
/// decoy's value), plus the proxy arguments to serve it.
struct Setup {
    manifests: tempfile::TempDir,
    ca: Option<TestCa>,
    args: Vec<String>,
}

impl Setup {
    fn new(tls: bool) -> Setup {
        let manifests = tempfile::tempdir().expect("manifests directory");
        support::write_manifest(manifests.path(), NAMESPACE, NAME, color_flags(INITIAL));
        support::write_manifest(manifests.path(), NAMESPACE, DECOY, color_flags(DECOY_VALUE));
        let ca = tls.then(TestCa::new);
        let mut args = vec![
            "--manifests".to_owned(),
            manifests.path().display().to_string(),
        ];
        if let Some(ca) = &ca {
            args.extend(ca.proxy_args());
        }
        Setup {
            manifests,
            ca,
            args,
        }
    }

    fn args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }

    fn ca_file(&self) -> Option<&Path> {
        self.ca.as_ref().map(|ca| ca.ca_cert.as_path())
    }

    fn change_to(&self, variant: &str) {
        support::write_manifest(self.manifests.path(), NAMESPACE, NAME, color_flags(variant));
    }
}

type Cells = Vec<(Column, Cell)>;

/// Connect (plain or TLS) and see the initial value; without TLS, then change the manifest
/// and see the new value.
async fn live_run(kind: Kind, launch: Launch, tls: bool) -> Cells {
    let setup = Setup::new(tls);
    let proxy = Proxy::start(&setup.args()).await;
    let mut client = Session::spawn(kind, &launch, proxy.port, setup.ca_file());
    let connect_column = if tls { Column::Tls } else { Column::Plain };

    if kind == Kind::FlagdLegacy {
        return match client.expect_value_or_refusal(INITIAL).await {
            Ok(None) => vec![(connect_column, Cell::Pass)],
            Ok(Some(_)) => {
                let why = if tls {
                    "sends no selector; over TLS too the proxy answers INVALID_ARGUMENT \"no selector given\""
                } else {
                    "sends no selector (its sync.v1 request carries none); the proxy answers INVALID_ARGUMENT \"no selector given\""
                };
                vec![(connect_column, Cell::NotApplicable(why.into()))]
            }
            Err(why) => {
                eprintln!("{}", client.report(&why, &proxy).await);
                vec![(connect_column, Cell::Fail(why))]
            }
        };
    }

    let initial = match client.ready().await {
        Ok(()) => client.expect_value(INITIAL, true, EVENT_TIMEOUT).await,
        Err(why) => Err(why),
    };
    if let Err(why) = &initial {
        eprintln!("{}", client.report(why, &proxy).await);
        let mut cells = vec![(connect_column, Cell::Fail(why.clone()))];
        if !tls {
            cells.push((Column::Update, Cell::Fail("not connected".into())));
        }
        return cells;
    }
    let mut cells = vec![(connect_column, Cell::Pass)];
    if tls {
        return cells;
    }

    let update = async {
        if kind == Kind::Go {
            // The Go provider pings after 30 s without traffic, with or without a stream (the
            // proxy's own pings count as traffic, so its ping may come only after 60 s). Stay
            // connected and idle past that; the connection must survive it.
            let from = client.log_len();
            tokio::time::sleep(GO_IDLE).await;
            if let Some(line) = client.find_in_log(from, &GO_DISCONNECT_SIGNS) {
                return Err(format!("connection dropped while idle: {line}"));
            }
        }
        setup.change_to(UPDATED);
        client.expect_value(UPDATED, true, EVENT_TIMEOUT).await
    }
    .await;
    if let Err(why) = &update {
        eprintln!("{}", client.report(why, &proxy).await);
    }
    cells.push((Column::Update, Cell::from_result(update)));
    cells
}

/// Restart the proxy under a connected client, changing the manifest while it is down.
async fn reconnect_run(kind: Kind, launch: Launch) -> Cells {
    let setup = Setup::new(false);
    let args = setup.args();
    let mut proxy = Proxy::start(&args).await;
    let mut client = Session::spawn(kind, &launch, proxy.port, None);
    let result = async {
        client.ready().await?;
        client.expect_value(INITIAL, true, EVENT_TIMEOUT).await?;
        let (port, management_port) = (proxy.port, proxy.management_port);
        proxy.terminate().await;
        setup.change_to(UPDATED);
        proxy = Proxy::start_on(port, management_port, &args, &[]).await;
        client.expect_value(UPDATED, false, RECONNECT_TIMEOUT).await
    }
    .await;
    if let Err(why) = &result {
        eprintln!("{}", client.report(why, &proxy).await);
    }
    vec![(Column::Reconnect, Cell::from_result(result))]
}

/// What current flagd speaks besides the columns of the main table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Feature {
    SourceSelector,
    UnixSocket,
    ContextValue,
}

const FEATURES: [Feature; 3] = [
    Feature::SourceSelector,
    Feature::UnixSocket,
    Feature::ContextValue,
];

/// The clients the features are tried with: flagd as the sidecar and two in-process providers.
const FEATURE_KINDS: [Kind; 3] = [Kind::Flagd, Kind::Js, Kind::Python];

impl Feature {
    fn title(self) -> &'static str {
        match self {
            Feature::SourceSelector => "`source=` selector",
            Feature::UnixSocket => "unix socket",
            Feature::ContextValue => "context values",
        }
    }

    fn description(self) -> String {
        match self {
            Feature::SourceSelector => format!(
                "the client is given the selector `{SOURCE_SELECTOR}` (flagd v0.13's grammar: \
                 one `key=value` pair, a bare value meaning `source=`); it must evaluate \
                 `{INITIAL}`, then `{UPDATED}` after the manifest changes."
            ),
            Feature::UnixSocket => format!(
                "the proxy serves the sync protocols only on a unix socket \
                 (`--sync-socket-path`, `--sync-socket-only`) and the client connects to that \
                 (flagd: `\"uri\":\"unix://<path>\"`; JS: `socketPath`); it must evaluate \
                 `{INITIAL}`, then `{UPDATED}` after the manifest changes."
            ),
            Feature::ContextValue => format!(
                "the proxy runs with `--context-value {CONTEXT_KEY}={CONTEXT_VALUE}`; the flag's \
                 default variant is `{INITIAL}` and its targeting rule answers `{UPDATED}` when \
                 `{CONTEXT_KEY}` is `{CONTEXT_VALUE}`. The client evaluates with an empty \
                 context, so it evaluates `{UPDATED}` only if it merged the proxy's \
                 `sync_context` into its evaluation context."
            ),
        }
    }

    /// Why a client cannot take part, if it cannot.
    fn not_applicable(self, kind: Kind) -> Option<&'static str> {
        match (self, kind) {
            (Feature::ContextValue, Kind::Flagd) => Some(
                "the in-process providers are the clients that merge `sync_context` into their \
                 evaluations; flagd is not asked",
            ),
            (Feature::UnixSocket, Kind::Python) => Some(
                "its in-process sync dials `host:port` only (its `socket_path` option serves the \
                 RPC resolver)",
            ),
            _ => None,
        }
    }
}

/// The flags of the context-value run: `color` answers `UPDATED` for the context value.
fn targeted_flags() -> Value {
    let mut flags = color_flags(INITIAL);
    flags[FLAG_KEY]["targeting"] = json!({
        "if": [{"==": [{"var": CONTEXT_KEY}, CONTEXT_VALUE]}, UPDATED, INITIAL]
    });
    flags
}

/// One client with one feature.
async fn feature_run(kind: Kind, launch: Launch, feature: Feature) -> Cell {
    let setup = Setup::new(false);
    let socket_dir = tempfile::tempdir().expect("socket directory");
    let socket = socket_dir.path().join("proxy.sock");
    let mut args: Vec<String> = setup.args.clone();
    let mut target = Target::default();
    match feature {
        Feature::SourceSelector => target.selector = SOURCE_SELECTOR,
        Feature::UnixSocket => {
            args.extend([
                "--sync-socket-path".to_owned(),
                socket.display().to_string(),
                "--sync-socket-only".to_owned(),
            ]);
            target.socket = Some(socket.clone());
        }
        Feature::ContextValue => {
            support::write_manifest(setup.manifests.path(), NAMESPACE, NAME, targeted_flags());
            args.extend([
                "--context-value".to_owned(),
                format!("{CONTEXT_KEY}={CONTEXT_VALUE}"),
            ]);
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let proxy = Proxy::start(&args).await;
    let mut client = Session::spawn_to(kind, &launch, proxy.port, None, &target);
    let result = async {
        client.ready().await?;
        if feature == Feature::ContextValue {
            return client.expect_value(UPDATED, false, EVENT_TIMEOUT).await;
        }
        client.expect_value(INITIAL, true, EVENT_TIMEOUT).await?;
        setup.change_to(UPDATED);
        client.expect_value(UPDATED, true, EVENT_TIMEOUT).await
    }
    .await;
    if let Err(why) = &result {
        eprintln!(
            "{}",
            client
                .report(&format!("{}: {why}", feature.title()), &proxy)
                .await
        );
    }
    Cell::from_result(result)
}

type FeatureMatrix = BTreeMap<Feature, BTreeMap<Kind, Cell>>;

#[derive(Clone, Copy, Debug)]
enum Run {
    Plain,
    Tls,
    Reconnect,
}

fn runs_for(kind: Kind) -> &'static [Run] {
    match kind {
        // Without a selector the old flagd gets nothing; reconnecting proves nothing more.
        Kind::FlagdLegacy => &[Run::Plain, Run::Tls],
        _ => &[Run::Plain, Run::Tls, Run::Reconnect],
    }
}

/// Fills in the selector columns from the plain run and what the client sends, and the
/// columns of the old flagd that follow from it sending no selector.
fn derive_cells(kind: Kind, row: &mut BTreeMap<Column, Cell>) {
    let plain = row
        .get(&Column::Plain)
        .cloned()
        .unwrap_or(Cell::Fail("no plain run".into()));
    let (header, body) = match kind.selector_mode() {
        SelectorMode::HeaderAndBody => (
            plain,
            Cell::NotApplicable(
                "also sends the `flagd-selector` header, which the proxy reads first".into(),
            ),
        ),
        SelectorMode::BodyOnly => (
            Cell::NotApplicable("sends the selector only in the request body".into()),
            plain,
        ),
        SelectorMode::None => {
            let none = || Cell::NotApplicable("sends no selector".into());
            row.entry(Column::Update).or_insert_with(none);
            row.entry(Column::Reconnect).or_insert_with(none);
            (none(), none())
        }
    };
    row.insert(Column::HeaderSelector, header);
    row.insert(Column::BodySelector, body);
}

// ---------------------------------------------------------------------------------------------
// The document
// ---------------------------------------------------------------------------------------------

fn render_doc(
    matrix: &BTreeMap<Kind, BTreeMap<Column, Cell>>,
    features: &FeatureMatrix,
    versions: &Versions,
) -> String {
    let mut doc = String::new();
    let w = &mut doc;
    let _ = writeln!(w, "# Client compatibility");
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "<!-- Generated by `cargo test --test compatibility` ({UPDATE_ENV}=1 rewrites it); do not edit. -->"
    );
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "Real flagd sync clients against flagd-proxy serving FeatureFlag manifests (`--manifests`). \
         Every client asks for `{SELECTOR}` and evaluates the string flag `{FLAG_KEY}`. A second \
         resource, `{NAMESPACE}/{DECOY}`, holds the same flag with the value `{DECOY_VALUE}`: a \
         client that ever evaluates `{DECOY_VALUE}` was served the wrong resource and fails."
    );
    let _ = writeln!(w);
    let mut header = "| client |".to_owned();
    let mut rule = "|---|".to_owned();
    for column in COLUMNS {
        header.push_str(&format!(" {} |", column.title()));
        rule.push_str("---|");
    }
    let _ = writeln!(w, "{header}");
    let _ = writeln!(w, "{rule}");
    for (kind, row) in matrix {
        let mut line = format!("| {} |", kind.name());
        for column in COLUMNS {
            let cell = row
                .get(&column)
                .cloned()
                .unwrap_or(Cell::Fail("not run".into()));
            line.push_str(&format!(" {} |", cell.markdown()));
        }
        let _ = writeln!(w, "{line}");
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "## Columns");
    let _ = writeln!(w);
    let columns = [
        (
            Column::Plain,
            format!(
                "plaintext gRPC. The client starts against a running proxy, syncs and evaluates \
                 `{FLAG_KEY}` to the default variant `{INITIAL}`."
            ),
        ),
        (
            Column::Tls,
            "the same over TLS: the proxy has a certificate from a throwaway test CA (SANs \
             `localhost` and `127.0.0.1`) and the client is given that CA file (`certPath` / \
             `FLAGD_SERVER_CERT_PATH`)."
                .to_owned(),
        ),
        (
            Column::HeaderSelector,
            "the client sends the selector in the `flagd-selector` gRPC header (as well as in \
             the body); pass means the plain run was served the right resource. n/a for clients \
             that do not send the header."
                .to_owned(),
        ),
        (
            Column::BodySelector,
            "the client sends the selector only in the `selector` field of the request body \
             (flagd's own sync client and older providers do); pass means the plain run was \
             served the right resource. n/a for clients that also send the header."
                .to_owned(),
        ),
        (
            Column::Update,
            format!(
                "after the plain run, the manifest's default variant changes to `{UPDATED}` while \
                 the client stays connected; the client must evaluate `{UPDATED}` next. The Go \
                 client first stays connected and idle for {} s: it sends a keepalive ping after \
                 30 s without traffic, with or without a stream, and must show no dropped \
                 connection (`too_many_pings`, GOAWAY, or a stale/error provider event).",
                GO_IDLE.as_secs()
            ),
        ),
        (
            Column::Reconnect,
            format!(
                "with the client connected and on `{INITIAL}`, the proxy is stopped (SIGTERM), the \
                 manifest changes to `{UPDATED}` while it is down, and the proxy starts again on \
                 the same port; the client must come back by itself and end on `{UPDATED}`."
            ),
        ),
    ];
    for (column, text) in columns {
        let _ = writeln!(w, "- **{}**: {text}", column.title());
    }
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "Cells: `pass`; `fail: <what went wrong>`; `n/a: <why the mode does not apply to this \
         client>`; `not installable: <the exact error>` when the client cannot be installed \
         here."
    );
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "## Current flagd: `source=` selector, unix socket, context values"
    );
    let _ = writeln!(w);
    let mut header = "| feature |".to_owned();
    let mut rule = "|---|".to_owned();
    for kind in FEATURE_KINDS {
        header.push_str(&format!(" {} |", kind.name()));
        rule.push_str("---|");
    }
    let _ = writeln!(w, "{header}");
    let _ = writeln!(w, "{rule}");
    for feature in FEATURES {
        let mut line = format!("| {} |", feature.title());
        for kind in FEATURE_KINDS {
            let cell = features
                .get(&feature)
                .and_then(|row| row.get(&kind))
                .cloned()
                .unwrap_or(Cell::Fail("not run".into()));
            line.push_str(&format!(" {} |", cell.markdown()));
        }
        let _ = writeln!(w, "{line}");
    }
    let _ = writeln!(w);
    for feature in FEATURES {
        let _ = writeln!(w, "- **{}**: {}", feature.title(), feature.description());
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "## Clients");
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "| client | package | selector sent in | how it is driven |"
    );
    let _ = writeln!(w, "|---|---|---|---|");
    for kind in KINDS {
        let selector = match kind.selector_mode() {
            SelectorMode::BodyOnly => "body",
            SelectorMode::HeaderAndBody => "header and body",
            SelectorMode::None => "none",
        };
        let driven = match kind {
            Kind::Flagd => {
                "`flagd start --sources '[{\"uri\":\"unix://<relay>\",\"provider\":\"grpc\",\"selector\":\"…\"}]'` (TLS: `\"tls\":true,\"certPath\":\"<ca.pem>\"`) in its own network namespace (`unshare --net`: flagd cannot bind its other ports to loopback), reaching the proxy through a unix socket relayed to its port; evaluated over its HTTP API (`POST /flagd.evaluation.v1.Service/ResolveString`, on a unix socket: `--socket-path`)"
            }
            Kind::FlagdLegacy => {
                "`flagd start --sources '[{\"uri\":\"grpc://unix://<relay>\",\"provider\":\"grpc\"}]'` (TLS: `grpcs://` and `certPath`), in its own network namespace like flagd above; this version has no selector option"
            }
            Kind::Js => "`interop/js/client.mjs` (in-process resolver)",
            Kind::Python => "`interop/python/client.py` (in-process resolver)",
            Kind::Rust => "`interop/rust` (in-process resolver)",
            Kind::Java => "`interop/java` (in-process resolver)",
            Kind::Go => "`interop/go` (in-process resolver)",
            Kind::GoLegacy => "`interop/go/legacy` (in-process resolver, syncing over `sync.v1`)",
        };
        let _ = writeln!(
            w,
            "| {} | {} | {selector} | {driven} |",
            kind.name(),
            kind.package(versions)
        );
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "## Notes");
    let _ = writeln!(w);
    let notes = [
        format!(
            "flagd {} cannot be installed with `go install github.com/open-feature/flagd/flagd@{}` \
             here: the Go module proxy refuses two of its dependencies (`flagd/core` v0.15.6 and \
             `open-feature-operator/api` v0.2.47, 403 \"This module version is not available\"). \
             `interop/flagd/current` builds flagd {}'s own `main` with `flagd/core` {} (which \
             holds the gRPC sync client) and a stand-in for the operator API types, which only \
             flagd's Kubernetes sync source uses.",
            versions.flagd, versions.flagd, versions.flagd, versions.flagd_core
        ),
        format!(
            "The old flagd: flagd switched to `flagd.sync.v1` in v0.9.0. Of the earlier releases \
             tried, the module proxy serves only `github.com/open-feature/flagd` v0.3.7 (no gRPC \
             sync source yet) and {}; it refuses with 403 \"This module version is not \
             available\" `github.com/open-feature/flagd` v0.4.0, v0.4.1, v0.4.3 to v0.4.5 and \
             `github.com/open-feature/flagd/flagd` v0.5.0, v0.6.0, v0.7.0 and v0.8.0 to v0.8.3. {} speaks only `sync.v1` but predates selectors: its `SyncFlagsRequest` \
             is empty, so the proxy cannot know which resource it wants. The row \
             \"Go provider (old, sync.v1)\" covers a real `sync.v1` client instead: its `flagd/core` \
             {} sync client acts on each message by its state and drops those whose state is \
             unspecified, so it sees a value only if the proxy marks its full snapshots \
             `SYNC_STATE_ALL`.",
            versions.flagd_legacy, versions.flagd_legacy, versions.go_legacy_core
        ),
        "The Java provider allows 1 s for its first sync, including gRPC channel set-up on a \
         cold JVM; on a busy machine its first attempt can miss that (the proxy answers the \
         stream within milliseconds of receiving it), after which the provider connects on its \
         own and emits PROVIDER_READY. The client reports READY on that event."
            .to_owned(),
        format!(
            "The old Go provider ({}) ignores the CA file for its in-process sync: it builds \
             its `flagd/core` sync client without the certificate path, so that client trusts \
             the system roots only (the proxy sees `BadCertificate` alerts). Its TLS run makes \
             the test CA a system root through `SSL_CERT_FILE`.",
            versions.go_legacy
        ),
        "flagd has no option to bind its TCP listeners to loopback; the test serves its \
         evaluation and sync APIs on unix sockets, and only its management and OFREP listeners \
         take (free) TCP ports while a run lasts."
            .to_owned(),
        "Install: `scripts/install-interop.sh` (JS, Python, Rust) and \
         `scripts/install-compat.sh` (flagd, old flagd, Java, Go, old Go)."
            .to_owned(),
    ];
    for note in notes {
        let _ = writeln!(w, "- {note}");
    }
    doc
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_compatibility_matrix() {
    let versions = Versions::read();
    let in_ci = std::env::var_os("CI").is_some();

    let mut matrix: BTreeMap<Kind, BTreeMap<Column, Cell>> = BTreeMap::new();
    let mut not_installed = Vec::new();
    let semaphore = Arc::new(Semaphore::new(PARALLEL_SESSIONS));
    let mut tasks = Vec::new();
    for kind in KINDS {
        match kind.launch(&versions) {
            Ok(launch) => {
                for &run in runs_for(kind) {
                    let launch = launch.clone();
                    let semaphore = semaphore.clone();
                    tasks.push(tokio::spawn(async move {
                        let _permit = semaphore.acquire_owned().await.expect("semaphore");
                        let cells = match run {
                            Run::Plain => live_run(kind, launch, false).await,
                            Run::Tls => live_run(kind, launch, true).await,
                            Run::Reconnect => reconnect_run(kind, launch).await,
                        };
                        (kind, cells)
                    }));
                }
            }
            // The whole row shares one reason: give it once, in the first column.
            Err(Missing::NotInstallable(error)) => {
                let row = matrix.entry(kind).or_default();
                for column in COLUMNS {
                    let cell = if column == Column::Plain {
                        error.clone()
                    } else {
                        "see plain".into()
                    };
                    row.insert(column, Cell::NotInstallable(cell));
                }
            }
            Err(Missing::NotInstalled(why)) => {
                let row = matrix.entry(kind).or_default();
                for column in COLUMNS {
                    let cell = if column == Column::Plain {
                        why.clone()
                    } else {
                        "see plain".into()
                    };
                    row.insert(column, Cell::NotInstalled(cell));
                }
                not_installed.push(format!(
                    "{}: {why} (run {})",
                    kind.name(),
                    kind.install_hint()
                ));
            }
        }
    }
    let mut features: FeatureMatrix = BTreeMap::new();
    let mut feature_tasks = Vec::new();
    for kind in FEATURE_KINDS {
        let launch = kind.launch(&versions);
        for feature in FEATURES {
            let row = features.entry(feature).or_default();
            if let Some(why) = feature.not_applicable(kind) {
                row.insert(kind, Cell::NotApplicable(why.into()));
                continue;
            }
            match &launch {
                Ok(launch) => {
                    let launch = launch.clone();
                    let semaphore = semaphore.clone();
                    feature_tasks.push(tokio::spawn(async move {
                        let _permit = semaphore.acquire_owned().await.expect("semaphore");
                        (feature, kind, feature_run(kind, launch, feature).await)
                    }));
                }
                Err(Missing::NotInstallable(_)) => {
                    row.insert(kind, Cell::NotInstallable("see the main table".into()));
                }
                Err(Missing::NotInstalled(_)) => {
                    row.insert(kind, Cell::NotInstalled("see the main table".into()));
                }
            }
        }
    }
    if in_ci && !not_installed.is_empty() {
        panic!(
            "clients are not installed (CI is set):\n  {}",
            not_installed.join("\n  ")
        );
    }

    for task in tasks {
        let (kind, cells) = task.await.expect("a client run panicked");
        matrix.entry(kind).or_default().extend(cells);
    }
    for task in feature_tasks {
        let (feature, kind, cell) = task.await.expect("a feature run panicked");
        features.entry(feature).or_default().insert(kind, cell);
    }
    for (kind, row) in matrix.iter_mut() {
        if !row
            .values()
            .any(|c| matches!(c, Cell::NotInstalled(_) | Cell::NotInstallable(_)))
        {
            derive_cells(*kind, row);
        }
    }

    let doc = render_doc(&matrix, &features, &versions);
    eprintln!("{doc}");

    let failures: Vec<String> = matrix
        .iter()
        .flat_map(|(kind, row)| {
            row.iter().filter_map(move |(column, cell)| match cell {
                Cell::Fail(why) => Some(format!("{} / {}: {why}", kind.name(), column.title())),
                _ => None,
            })
        })
        .chain(features.iter().flat_map(|(feature, row)| {
            row.iter().filter_map(move |(kind, cell)| match cell {
                Cell::Fail(why) => Some(format!("{} / {}: {why}", kind.name(), feature.title())),
                _ => None,
            })
        }))
        .collect();
    assert!(
        failures.is_empty(),
        "compatibility failures (details above):\n  {}",
        failures.join("\n  ")
    );

    if !not_installed.is_empty() {
        eprintln!(
            "NOTICE: not checking {DOC}: some clients are not installed:\n  {}",
            not_installed.join("\n  ")
        );
        return;
    }
    let path = repo_root().join(DOC);
    if std::env::var(UPDATE_ENV).is_ok_and(|v| v == "1") {
        std::fs::write(&path, &doc).expect("writing the compatibility document");
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == doc,
        "{DOC} is not what this run produced; regenerate it with \
         `{UPDATE_ENV}=1 cargo test --test compatibility` and commit it"
    );
}
