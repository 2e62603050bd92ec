//! A running client: its process, its log, and what it reports.

use super::*;

pub(crate) type Log = Arc<Mutex<VecDeque<String>>>;

pub(crate) fn collect_lines<R: AsyncRead + Unpin + Send + 'static>(reader: R, log: Log) {
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

/// The first line of `log` (from index `from` on) containing one of `needles`.
pub(crate) fn find_line(log: &Log, from: usize, needles: &[&str]) -> Option<String> {
    log.lock()
        .unwrap()
        .iter()
        .skip(from)
        .find(|line| needles.iter().any(|n| line.contains(n)))
        .cloned()
}

/// How to reach a flagd's evaluation API.
pub(crate) struct FlagdEndpoint {
    /// flagd serves evaluation on this unix socket (`--socket-path`) rather than on a TCP
    /// port: it has no option to bind its TCP listeners to loopback only.
    pub(crate) socket: PathBuf,
    pub(crate) legacy: bool,
    pub(crate) _dir: tempfile::TempDir,
}

/// A client process: killed on drop.
/// Forwards connections on a unix socket to the proxy's loopback port, until dropped.
pub(crate) struct Relay(tokio::task::JoinHandle<()>);

impl Relay {
    pub(crate) fn start(socket: &Path, proxy_port: u16) -> Relay {
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

pub(crate) struct Session {
    pub(crate) _relay: Option<Relay>,
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) _stdin: Option<ChildStdin>,
    pub(crate) lines: Option<Lines<BufReader<ChildStdout>>>,
    pub(crate) flagd: Option<FlagdEndpoint>,
    pub(crate) log: Log,
}

/// What a client is pointed at besides the proxy's port.
pub(crate) struct Target {
    pub(crate) selector: &'static str,
    /// The proxy's unix socket, used instead of its port.
    pub(crate) socket: Option<PathBuf>,
    /// The flag a stdout client evaluates.
    pub(crate) flag_key: &'static str,
    /// A stdout client logs its provider's debug messages too (`INTEROP_DEBUG`).
    pub(crate) debug: bool,
    /// The providers' deadline for their first sync, in milliseconds (`FLAGD_DEADLINE_MS`).
    pub(crate) deadline_ms: Option<u32>,
}

impl Default for Target {
    fn default() -> Self {
        Target {
            selector: SELECTOR,
            socket: None,
            flag_key: FLAG_KEY,
            debug: false,
            deadline_ms: None,
        }
    }
}

impl Session {
    pub(crate) fn spawn(
        kind: Kind,
        launch: &Launch,
        proxy_port: u16,
        ca: Option<&Path>,
    ) -> Session {
        Self::spawn_to(kind, launch, proxy_port, ca, &Target::default())
    }

    pub(crate) fn spawn_to(
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
                    .env("INTEROP_FLAG_KEY", target.flag_key)
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
                match target.deadline_ms {
                    Some(ms) => cmd.env("FLAGD_DEADLINE_MS", ms.to_string()),
                    None => cmd.env_remove("FLAGD_DEADLINE_MS"),
                };
                match target.debug {
                    true => cmd.env("INTEROP_DEBUG", "1"),
                    false => cmd.env_remove("INTEROP_DEBUG"),
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

    pub(crate) fn log_len(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// The first logged line (from index `from` on) containing one of `needles`.
    pub(crate) fn find_in_log(&self, from: usize, needles: &[&str]) -> Option<String> {
        find_line(&self.log, from, needles)
    }

    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let log = self.log.lock().unwrap();
        let skip = log.len().saturating_sub(lines);
        log.iter()
            .skip(skip)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// flagd's answer for the flag: `Some(value)` once it resolves, `None` while it cannot.
    pub(crate) async fn flagd_value(&self) -> Option<String> {
        let response = self.flagd_resolve(FLAG_KEY).await?;
        response["value"].as_str().map(str::to_owned)
    }

    /// flagd's whole answer (a value, or an error) for the string flag `key`.
    pub(crate) async fn flagd_resolve(&self, key: &str) -> Option<Value> {
        let endpoint = self.flagd.as_ref()?;
        let path = if endpoint.legacy {
            "/schema.v1.Service/ResolveString"
        } else {
            "/flagd.evaluation.v1.Service/ResolveString"
        };
        let body = json!({"flagKey": key, "context": {}}).to_string();
        support::unix_http::post_json(&endpoint.socket, path, &body)
            .await
            .ok()
    }

    /// Waits until the client has logged a line containing `needle`.
    pub(crate) async fn expect_log(&self, needle: &str, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if self.find_in_log(0, &[needle]).is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("logged nothing with {needle:?} within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for the stdout client's `READY` (a no-op for flagd).
    pub(crate) async fn ready(&mut self) -> Result<(), String> {
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
    pub(crate) async fn expect_value(
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
    pub(crate) async fn expect_value_or_refusal(
        &mut self,
        want: &str,
    ) -> Result<Option<String>, String> {
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
    pub(crate) async fn report(&mut self, what: &str, proxy: &Proxy) -> String {
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

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub(crate) fn clone_command(cmd: &StdCommand) -> StdCommand {
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
