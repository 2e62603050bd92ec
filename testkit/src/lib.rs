//! Helpers for flagd-proxy's integration tests and benchmark: run the proxy binary, write
//! manifests, make certificates, talk to the proxy with a gRPC sync client, and run a
//! Kubernetes control plane ([`control_plane`]) with client identities on it ([`identities`]) or
//! a cluster ([`cluster`]), run a real Prometheus ([`prometheus`]) or OpenTelemetry Collector
//! ([`otelcol`]), break the path to a server ([`relay`]), and run a proxy in a memory cgroup of
//! its own ([`memory_cgroup`]); the hostile attacks, one catalogue for the tests and the
//! benchmark ([`attacks`]).
//!
//! Integration tests take it in as `use flagd_proxy_testkit as support;`.

pub mod attacks;
pub mod client;
pub mod cluster;
pub mod control_plane;
pub mod flag_sets;
pub mod helm;
pub mod identities;
pub mod memory_cgroup;
pub mod otelcol;
pub mod prometheus;
pub mod raw_h2;
pub mod relay;
pub mod scrape;
pub mod skip;
pub mod unix_http;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flagd_proxy::introspection::{Process, Samples, StatusPage};
use serde_json::Value;

/// The repository's root folder (this package lives in `testkit/` below it).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ has a parent folder")
        .to_path_buf()
}

/// The folder cargo builds into for the running test or benchmark binary (`target/debug`,
/// `target/release`): test binaries run from its `deps/` folder, other binaries from it.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running binary");
    let dir = exe.parent().expect("the running binary's folder");
    if dir.file_name().is_some_and(|name| name == "deps") {
        dir.parent().expect("the profile folder").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The `flagd-proxy` binary under test: `$FLAGD_PROXY_BIN`, else the one cargo built beside the
/// running test binary (`target/<profile>/flagd-proxy`). Panics, naming the command that builds
/// it, when it is not there.
pub fn proxy_bin() -> PathBuf {
    let path = match std::env::var_os("FLAGD_PROXY_BIN") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => profile_dir().join("flagd-proxy"),
    };
    assert!(
        path.is_file(),
        "no flagd-proxy binary at {}: build it with `cargo build --bin flagd-proxy` (or set \
         FLAGD_PROXY_BIN)",
        path.display()
    );
    path
}

/// A folder for files tests keep between runs (`target/tmp`, as cargo's `CARGO_TARGET_TMPDIR`).
pub fn target_tmpdir() -> PathBuf {
    let dir = profile_dir()
        .parent()
        .expect("the target folder")
        .join("tmp");
    std::fs::create_dir_all(&dir).expect("create target/tmp");
    dir
}

/// A generous bound for one expected event, guarding only against hangs.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Calls `call` until it succeeds, printing each failure, for calls that may fail while a
/// server settles (a fresh CRD, RBAC caches, a restarted API server); panics after
/// [`EVENT_TIMEOUT`].
pub async fn eventually<T, E, F, Fut>(what: &str, call: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    eventually_within(what, EVENT_TIMEOUT, call).await
}

/// [`eventually`] with another bound than [`EVENT_TIMEOUT`] (still a hang guard, never a
/// measurement).
pub async fn eventually_within<T, E, F, Fut>(what: &str, timeout: Duration, mut call: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match call().await {
            Ok(value) => return value,
            Err(error) if tokio::time::Instant::now() < deadline => {
                eprintln!("{what}: {error}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("{what}: {error}"),
        }
    }
}

/// Waits until nothing accepts connections on 127.0.0.1:`port` (a draining proxy has closed its
/// listener).
pub async fn wait_until_refused(port: u16) {
    eventually("the port to refuse connections", || async move {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(_) => Err("a connection was accepted"),
            Err(_) => Ok(()),
        }
    })
    .await;
}

/// A port that was free a moment ago on 127.0.0.1 and not handed out before in this process.
pub fn free_port() -> u16 {
    control_plane::free_port().expect("a free loopback port")
}

/// A FeatureFlag object (`core.openfeature.dev/v1beta1`) `namespace/name` whose flag spec holds
/// `flags` (as [`string_flag`] makes them, or any flagd flag definitions).
pub fn feature_flag(namespace: &str, name: &str, flags: Value) -> Value {
    serde_json::json!({
        "apiVersion": format!("{}/{}", control_plane::GROUP, control_plane::VERSION),
        "kind": "FeatureFlag",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"flagSpec": {"flags": flags}}
    })
}

/// Writes (atomically, via rename) a FeatureFlag manifest `<dir>/<namespace>-<name>.yaml`.
pub fn write_manifest(dir: &Path, namespace: &str, name: &str, flags: Value) -> PathBuf {
    let object = feature_flag(namespace, name, flags);
    let path = dir.join(format!("{namespace}-{name}.yaml"));
    write_atomically(&path, &serde_norway::to_string(&object).expect("yaml"));
    path
}

/// [`write_manifest`] of `<namespace>/<name>` with one string flag `color` whose default variant
/// is `default`, among `variants`.
pub fn write_color(
    dir: &Path,
    namespace: &str,
    name: &str,
    default: &str,
    variants: &[&str],
) -> PathBuf {
    write_manifest(
        dir,
        namespace,
        name,
        string_flag("color", default, variants),
    )
}

/// The flag configurations kept in a proxy's state directory (`--state-dir`), one for each file
/// that holds one.
pub fn kept_flag_configurations(dir: &Path) -> Vec<String> {
    let mut kept = Vec::new();
    for entry in std::fs::read_dir(dir).expect("list the state directory") {
        let text = std::fs::read_to_string(entry.expect("an entry").path()).unwrap_or_default();
        let record: Value = serde_json::from_str(&text).unwrap_or_default();
        if let Some(document) = record["flagConfiguration"].as_str() {
            kept.push(document.to_owned());
        }
    }
    kept
}

/// Panics naming the first of `needles` that `text` does not contain.
pub fn assert_contains_all(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} missing from {text:?}");
    }
}

/// Writes a file by renaming a finished temporary file over it, as editors and kubelet do.
pub fn write_atomically(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, content).expect("write temporary file");
    std::fs::rename(&tmp, path).expect("rename into place");
}

/// One string flag `key` with the given variants, defaulting to `default`.
pub fn string_flag(key: &str, default: &str, variants: &[&str]) -> Value {
    let variants: serde_json::Map<String, Value> = variants
        .iter()
        .map(|v| ((*v).to_owned(), Value::String((*v).to_owned())))
        .collect();
    serde_json::json!({key: {"state": "ENABLED", "variants": variants, "defaultVariant": default}})
}

/// A running `flagd-proxy` process; killed on drop.
pub struct Proxy {
    pub port: u16,
    pub management_port: u16,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    /// Starts `flagd-proxy start` on free loopback ports with `args` added, and waits until
    /// `/readyz` answers 200.
    pub async fn start(args: &[&str]) -> Proxy {
        Self::start_with_env(args, &[]).await
    }

    pub async fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Proxy {
        let port = free_port();
        let management_port = free_port();
        Self::start_on(port, management_port, args, env).await
    }

    /// Starts on the given ports (to restart a proxy where its clients expect it).
    pub async fn start_on(
        port: u16,
        management_port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Proxy {
        Self::launch(
            in_memory_cgroup(proxy_bin()),
            port,
            management_port,
            args,
            env,
        )
        .await
    }

    /// [`Proxy::start`], with file permissions applying to the proxy as they do to an ordinary
    /// user also when the tests run as root: the proxy then runs without the capabilities that
    /// pass over them (`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`), through util-linux's
    /// `setpriv`. `None` (the skip recorded) when that is needed and `setpriv` is missing.
    pub async fn start_bound_by_permissions(args: &[&str]) -> Option<Proxy> {
        let command = if crate::skip::running_as_root() {
            let Some(setpriv) = which("setpriv") else {
                crate::skip::skip("setpriv is missing (Debian: apt-get install util-linux)");
                return None;
            };
            let caps = "-dac_override,-dac_read_search";
            let mut command = in_memory_cgroup(setpriv);
            command
                .args([
                    format!("--inh-caps={caps}"),
                    format!("--bounding-set={caps}"),
                ])
                .arg("--")
                .arg(proxy_bin());
            command
        } else {
            in_memory_cgroup(proxy_bin())
        };
        Some(Self::launch(command, free_port(), free_port(), args, &[]).await)
    }

    /// Runs `command` (the proxy, maybe through a wrapper) with `start` and the ports, and
    /// waits until it is ready.
    async fn launch(
        mut command: Command,
        port: u16,
        management_port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Proxy {
        command
            .args([
                "start",
                "--bind-address",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .args(["--management-port", &management_port.to_string()])
            .args(args)
            .env("RUST_LOG", "info,flagd_proxy=debug")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn flagd-proxy");
        let log = collect_lines(child.stderr.take().expect("stderr"));
        let mut proxy = Proxy {
            port,
            management_port,
            child: Some(child),
            log,
        };
        proxy.wait_ready().await;
        proxy
    }

    async fn wait_ready(&mut self) {
        let child = self.child.as_mut().expect("running");
        wait_answering(
            child,
            "flagd-proxy",
            &self.log,
            self.management_port,
            "/readyz",
        )
        .await;
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Everything the proxy has logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().expect("log").join("\n")
    }

    /// Waits until the proxy has logged a line containing `needle`.
    /// The last `n` lines the proxy has logged, for a failure message.
    pub fn last_log_lines(&self, n: usize) -> String {
        let log = self.log.lock().expect("log");
        log[log.len().saturating_sub(n)..].join("\n")
    }

    pub async fn wait_for_log(&self, needle: &str) {
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        while !self
            .log
            .lock()
            .expect("log")
            .iter()
            .any(|l| l.contains(needle))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no log line with {needle:?}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends a signal (`HUP`, `QUIT`, ...) without waiting.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{name}");
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().expect("try_wait").is_none())
    }

    /// Waits for the process to exit on its own (after a signal) and returns its status.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        tokio::time::timeout(
            EVENT_TIMEOUT,
            tokio::task::spawn_blocking(move || child.wait().expect("wait")),
        )
        .await
        .expect("the proxy exits")
        .expect("join")
    }

    /// The resident memory of the process in bytes (VmRSS in /proc/<pid>/status).
    pub fn rss_bytes(&self) -> u64 {
        let kib = Process::Id(self.pid())
            .status()
            .expect("read /proc/<pid>/status")
            .number("VmRSS")
            .expect("VmRSS");
        kib * 1024
    }

    /// Sends SIGTERM and waits for the exit status.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        tokio::task::spawn_blocking(move || child.wait().expect("wait"))
            .await
            .expect("join")
    }

    /// The value of the sample `sample` (`name` or `name{labels}`) on `/metrics`, or 0.
    pub async fn metric(&self, sample: &str) -> f64 {
        let (_, body) = http_get(self.management_port, "/metrics")
            .await
            .expect("metrics");
        Samples::parse(&body).get(sample).unwrap_or(0.0)
    }

    /// The management port's `/status` page.
    pub async fn status_page(&self) -> StatusPage {
        let (code, body) = http_get_whole(self.management_port, "/status")
            .await
            .expect("/status answers");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body)
            .unwrap_or_else(|error| panic!("/status is not a status page ({error}): {body}"))
    }

    /// Waits until `sample` has the value `want`.
    pub async fn wait_for_metric(&self, sample: &str, want: f64) {
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            let got = self.metric(sample).await;
            if got == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{sample} stayed {got}, want {want}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Kills and reaps the child process, if it is still held (what dropping a process's owner does).
pub(crate) fn stop(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Whether `program --version` runs and succeeds (a tool is installed at `program`).
pub(crate) fn answers_version(program: &Path) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Collects the lines a child process writes to `stream` (its stderr), in a thread of their own.
pub(crate) fn collect_lines(
    stream: impl std::io::Read + Send + 'static,
) -> Arc<Mutex<Vec<String>>> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            sink.lock().expect("log").push(line);
        }
    });
    log
}

/// Waits until the server `child` (called `what`) answers GET `path` on `port` with 200; panics
/// with its `log` when it exits first, or after [`EVENT_TIMEOUT`].
pub(crate) async fn wait_answering(
    child: &mut Child,
    what: &str,
    log: &Mutex<Vec<String>>,
    port: u16,
    path: &str,
) {
    let log_text = || log.lock().expect("log").join("\n");
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!(
                "{what} exited with {status} before it was ready:\n{}",
                log_text()
            );
        }
        if let Ok((200, _)) = http_get_whole(port, path).await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} not ready:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The path of `program` on `PATH`, if it is there.
fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

/// A command that runs `program`. With `FLAGD_PROXY_TEST_MEMORY_CGROUP` set to a memory cgroup's
/// directory (v1, or a v2 group), it runs in that cgroup from its first instruction
/// ([`memory_cgroup::join_command`]), so the kernel judges all of its memory at that cgroup's
/// limit (see docs/security.md for a run).
fn in_memory_cgroup(program: PathBuf) -> Command {
    let Some(dir) = std::env::var_os("FLAGD_PROXY_TEST_MEMORY_CGROUP") else {
        return Command::new(program);
    };
    assert!(
        Path::new(&dir).join("cgroup.procs").exists(),
        "FLAGD_PROXY_TEST_MEMORY_CGROUP={} is not a cgroup's directory",
        Path::new(&dir).display()
    );
    memory_cgroup::join_command(Path::new(&dir), program)
}

/// A minimal HTTP/1.1 GET against 127.0.0.1:`port`: (status, body).
pub async fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http_request(port, &format!("GET {path} HTTP/1.1\r\nConnection: close")).await
}

/// An HTTP/1.0 GET against 127.0.0.1:`port`, whose answer is never chunked: (status, body).
pub async fn http_get_whole(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http_request(port, &format!("GET {path} HTTP/1.0")).await
}

/// Sends `head` (the request line and any headers but Host) with an empty body: (status, body).
async fn http_request(port: u16, head: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("{head}\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    // Bodies may be chunked; tests only search them for lines, which chunk headers do not break.
    Ok((status, body))
}

/// A calendar day: year, month, day.
pub type Day = (i32, u8, u8);

/// A new self-signed CA certificate named `common_name`, and the issuer that signs with it.
pub fn new_ca(common_name: &str) -> (rcgen::Certificate, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let key = rcgen::KeyPair::generate().expect("ca key");
    let cert = params.self_signed(&key).expect("ca cert");
    (cert, rcgen::Issuer::new(params, key))
}

/// A throwaway certificate authority and a server certificate for 127.0.0.1 and localhost,
/// written as PEM files into a temporary directory.
pub struct TestCa {
    pub dir: tempfile::TempDir,
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    ca: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, ca) = new_ca("flagd-proxy test CA");
        let ca_cert = dir.path().join("ca.pem");
        std::fs::write(&ca_cert, cert.pem()).expect("write ca");
        let mut this = TestCa {
            server_cert: dir.path().join("server.pem"),
            server_key: dir.path().join("server-key.pem"),
            dir,
            ca_cert,
            ca,
        };
        this.issue_server("localhost");
        this
    }

    /// Issues a new server certificate (common name `cn`) and replaces the server files.
    pub fn issue_server(&mut self, cn: &str) {
        self.issue_server_valid(cn, None);
    }

    /// Like [`TestCa::issue_server`], valid only from the first to the second day (year,
    /// month, day) when given.
    pub fn issue_server_valid(&mut self, cn: &str, validity: Option<(Day, Day)>) {
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("params");
        if let Some((not_before, not_after)) = validity {
            params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
            params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        }
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &self.ca).expect("server cert");
        write_atomically(&self.server_key, &key.serialize_pem());
        write_atomically(&self.server_cert, &cert.pem());
    }

    /// Issues a client certificate; returns (cert PEM, key PEM).
    pub fn issue_client(&self, cn: &str) -> (String, String) {
        self.issue_client_with_uri(cn, None)
    }

    /// Issues a client certificate carrying a URI SAN such as a SPIFFE ID.
    pub fn issue_client_with_uri(&self, cn: &str, uri: Option<&str>) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        if let Some(uri) = uri {
            params.subject_alt_names = vec![rcgen::SanType::URI(
                rcgen::string::Ia5String::try_from(uri).expect("ascii uri"),
            )];
        }
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().expect("client key");
        let cert = params.signed_by(&key, &self.ca).expect("client cert");
        (cert.pem(), key.serialize_pem())
    }

    /// Arguments that turn TLS on for the proxy.
    pub fn proxy_args(&self) -> Vec<String> {
        vec![
            "--server-cert-path".into(),
            self.server_cert.display().to_string(),
            "--server-key-path".into(),
            self.server_key.display().to_string(),
        ]
    }
}

impl TestCa {
    /// A TLS client handshake over `tcp` with the server as `localhost`, trusting this CA and
    /// offering h2 by ALPN.
    pub async fn tls_connect(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        use rustls_pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(&self.ca_cert)?;
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots
                .add(cert.map_err(std::io::Error::other)?)
                .map_err(std::io::Error::other)?;
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let name =
            rustls_pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads from `stream` until the proxy closes it (end of stream or an error); panics with
/// `kept` when it stays open for [`EVENT_TIMEOUT`].
pub async fn wait_closed<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, kept: &str) {
    use tokio::io::AsyncReadExt;
    let closed = tokio::time::timeout(EVENT_TIMEOUT, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "{kept}");
}
