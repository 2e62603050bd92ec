//! The binary's exit status and messages for `--config` and for a Kubernetes configuration it
//! cannot use.
use std::process::{Child, Command, Output};

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flagd-proxy"))
        .args(args)
        .env_remove("FLAGD_PROXY_CONFIG")
        .output()
        .expect("run flagd-proxy")
}

/// Runs `start` on loopback with ephemeral ports, serving `manifests`, with `extra` arguments.
fn start_on_manifests(manifests: &std::path::Path, extra: &[&std::ffi::OsStr]) -> Output {
    let mut args: Vec<&std::ffi::OsStr> = [
        "start",
        "--port",
        "0",
        "--management-port",
        "0",
        "--bind-address",
        "127.0.0.1",
        "--manifests",
    ]
    .iter()
    .map(|arg| arg.as_ref())
    .collect();
    args.push(manifests.as_os_str());
    args.extend_from_slice(extra);
    run(&args)
}

/// `flagd-proxy start` on free ports of 127.0.0.1, serving the manifests folder `manifests`,
/// with no configuration file and no Kubernetes configuration in its environment; its log
/// (stderr) is piped. More arguments may be added.
fn start_command(manifests: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flagd-proxy"));
    command
        .args(["start", "--port", "0", "--management-port", "0"])
        .args(["--bind-address", "127.0.0.1", "--manifests"])
        .arg(manifests)
        .env_remove("FLAGD_PROXY_CONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    command
}

/// [`start_command`] with `extra` flags, serving a new manifests folder that holds
/// `<namespace>/<name>` (`color` red). The folder lives as long as the first value returned.
fn spawn_serving(namespace: &str, name: &str, extra: &[&str]) -> (tempfile::TempDir, Child) {
    let manifests = tempfile::tempdir().expect("a manifests folder");
    flagd_proxy_testkit::write_color(manifests.path(), namespace, name, "red", &["red", "blue"]);
    let child = start_command(manifests.path())
        .args(extra)
        .spawn()
        .expect("run flagd-proxy");
    (manifests, child)
}

fn config_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("create a temporary file");
    std::fs::write(file.path(), text).expect("write the config file");
    file
}

#[test]
fn config_file_errors_exit_64_with_one_message() {
    for (text, expected) in [
        (
            "prot: 9000\n",
            "key `prot` is not a flag of `flagd-proxy start` (did you mean `port`?)",
        ),
        (
            "port: abc\n",
            "key `port`: invalid value 'abc' for '--port <PORT>'",
        ),
    ] {
        let file = config_file(text);
        let output = run(&[
            "start".as_ref(),
            "--config".as_ref(),
            file.path().as_os_str(),
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "flagd-proxy: config file {}: ",
                file.path().display()
            )),
            "{stderr}"
        );
        assert!(stderr.contains(expected), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

#[test]
fn help_with_a_config_file_exits_0() {
    let output = run(&[
        "--config".as_ref(),
        "/nonexistent/flagd-proxy.yaml".as_ref(),
        "start".as_ref(),
        "--help".as_ref(),
    ]);
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("--keep-alive-permit-without-stream"),
        "{stdout}"
    );
}

/// A kubeconfig whose cluster goes through an HTTP proxy (`proxy-url`): the proxy's Kubernetes
/// client does not support one, and says so instead of ignoring it.
#[test]
fn a_kubeconfig_proxy_url_is_refused_with_a_clear_error() {
    let kubeconfig = config_file(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
         server: https://127.0.0.1:6443\n    proxy-url: http://127.0.0.1:3128\n    \
         insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\n\
         contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_flagd-proxy"))
        .args(["start", "--port", "0", "--management-port", "0"])
        .args(["--bind-address", "127.0.0.1"])
        .env_remove("FLAGD_PROXY_CONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", kubeconfig.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run flagd-proxy");
    // It must exit by itself; one that ignores proxy-url starts serving instead (only a hang
    // guard: the refusal comes before anything is contacted).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("poll flagd-proxy").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("flagd-proxy started with a kubeconfig proxy-url instead of refusing it");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let output = child.wait_with_output().expect("flagd-proxy's output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("names the proxy http://127.0.0.1:3128/ (kubeconfig proxy-url)"),
        "{stderr}"
    );
}

/// Sends `signal` (a name such as `HUP`) to process `pid`.
fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Reads the proxy's log up to the first line that contains `needle`: `Ok` with every line read
/// (that one last), `Err` with them when the log ends first (the proxy exited).
fn read_log_until(log: &mut impl std::io::BufRead, needle: &str) -> Result<String, String> {
    let mut read = String::new();
    loop {
        let start = read.len();
        if log.read_line(&mut read).expect("a log line") == 0 {
            return Err(read);
        }
        if read[start..].contains(needle) {
            return Ok(read);
        }
    }
}

/// SIGHUP, SIGUSR1 and SIGUSR2 are ignored from the very start: the proxy listens for signals
/// before it does anything else (its first log line says so), and the signals, sent as soon as
/// that line appears (while it is still starting), do not end it; it goes on to serve, and
/// SIGTERM then stops it cleanly.
#[test]
fn reload_signals_during_start_up_are_ignored() {
    use std::io::BufRead as _;
    let (_manifests, mut child) = spawn_serving("default", "demo", &["--debug"]);
    let pid = child.id();
    let mut log = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    log.read_line(&mut line).expect("the first log line");
    assert!(
        line.contains("listening for signals"),
        "the first thing done at start is to listen for signals: {line}"
    );
    for signal in ["HUP", "USR1", "USR2"] {
        send_signal(pid, signal);
    }
    if let Err(rest) = read_log_until(&mut log, "flagd-proxy is serving") {
        let status = child.wait().expect("the exit status");
        panic!("flagd-proxy ended during start-up ({status}) after a reload signal:\n{line}{rest}");
    }
    send_signal(pid, "HUP");
    send_signal(pid, "TERM");
    // The log is read to its end so the proxy never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
    let status = child.wait().expect("the exit status");
    assert!(status.success(), "{status}");
}

/// A proxy whose log pipe has lost its reader (a log collector that went away) drops the lines
/// it cannot write and goes on: SIGTERM still stops it cleanly. (A logger that reports its own
/// write errors on that same stderr panics there, and a panic in the signal task would leave a
/// proxy that no stop signal ends.)
#[test]
fn a_log_pipe_without_a_reader_does_not_keep_the_proxy_from_stopping() {
    let (_manifests, mut child) = spawn_serving("default", "demo", &[]);
    let mut log = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    if read_log_until(&mut log, "flagd-proxy is serving").is_err() {
        panic!(
            "flagd-proxy ended during start-up: {}",
            child.wait().expect("status")
        );
    }
    drop(log);
    let pid = child.id();
    send_signal(pid, "TERM");
    // The exit is the event waited for; the kit's event timeout only bounds a failing run.
    let (exited, exit) = std::sync::mpsc::channel();
    std::thread::spawn(move || exited.send(child.wait().expect("the exit status")));
    let Ok(status) = exit.recv_timeout(flagd_proxy_testkit::EVENT_TIMEOUT) else {
        send_signal(pid, "KILL");
        panic!("flagd-proxy did not stop on SIGTERM once its log pipe had no reader");
    };
    assert!(status.success(), "{status}");
}

/// A command whose output or message has no reader any more (`| head`, a log collector gone)
/// ends with the status it would have had, not with a panic (101): `generate-cli-docs` into a
/// pipe without a reader ends with 0, `status` of an address nothing serves still says 1 with
/// its stderr such a pipe. Output that cannot be written for another reason (a full disk) is lost
/// output: said on stderr, with status 1.
#[test]
fn output_without_a_reader_ends_with_the_commands_status() {
    use std::process::Stdio;
    let closed_pipe = || {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        Stdio::from(writer)
    };
    let command = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flagd-proxy"));
        command.args(args).env_remove("FLAGD_PROXY_CONFIG");
        command
    };
    let docs = command(&["generate-cli-docs"])
        .stdout(closed_pipe())
        .output()
        .expect("run flagd-proxy");
    assert_eq!(docs.status.code(), Some(0), "{docs:?}");
    assert!(
        docs.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&docs.stderr)
    );

    // Port 1 of loopback: nothing serves it, and the command cannot say so.
    let status = command(&["status", "--address", "127.0.0.1:1"])
        .stderr(closed_pipe())
        .output()
        .expect("run flagd-proxy");
    assert_eq!(status.status.code(), Some(1), "{status:?}");

    let full =
        std::fs::File::create("/dev/full").expect("/dev/full, the device that is always full");
    let docs = command(&["generate-cli-docs"])
        .stdout(full)
        .output()
        .expect("run flagd-proxy");
    assert_eq!(docs.status.code(), Some(1), "{docs:?}");
    let said = String::from_utf8_lossy(&docs.stderr);
    assert!(
        said.starts_with("flagd-proxy: cannot write the output: "),
        "{said}"
    );
    assert_eq!(said.lines().count(), 1, "{said}");
}

/// A socket path that cannot be served (a regular file is in the way) is a configuration error:
/// exit status 64 before anything listens, the reason said once, the file untouched.
#[test]
fn a_socket_path_that_cannot_be_served_exits_64_with_one_message() {
    let dir = tempfile::tempdir().expect("a folder");
    let path = dir.path().join("sync.sock");
    std::fs::write(&path, "data").expect("write a file");
    let manifests = tempfile::tempdir().expect("a manifests folder");
    let output = start_on_manifests(
        manifests.path(),
        &["--sync-socket-path".as_ref(), path.as_os_str()],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert_eq!(
        stderr
            .matches("a file that is not a socket is in the way")
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&path).expect("read"), "data");
}

/// The start-up log speaks plainly: where the proxy serves (addresses, `off`; no `Some(..)`),
/// and with the manifests source which selectors it serves and how to try one.
#[test]
fn the_start_up_log_says_what_is_served() {
    let (_manifests, mut child) = spawn_serving("team-a", "checkout", &[]);
    let mut log = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let read = read_log_until(&mut log, "FeatureFlags served")
        .unwrap_or_else(|read| panic!("the log ended before naming what is served:\n{read}"));
    let lines: Vec<&str> = read.lines().collect();
    let line = lines.last().copied().unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    let serving = lines
        .iter()
        .find(|l| l.contains("flagd-proxy is serving"))
        .expect("the serving line");
    assert!(
        !serving.contains("Some(") && !serving.contains("None"),
        "{serving}"
    );
    assert!(serving.contains("sync_socket=off"), "{serving}");
    assert!(
        line.contains("core.openfeature.dev/team-a/checkout")
            && line.contains("flagd start --sources"),
        "{line}"
    );
}

/// `--context-value` entries go into every message: a large one is refused before anything
/// listens, with exit status 64 and the limit named.
#[test]
fn oversized_context_values_exit_64() {
    let manifests = tempfile::tempdir().expect("a manifests folder");
    let large = format!("notes={}", "n".repeat(100_000));
    let output = start_on_manifests(
        manifests.path(),
        &["--context-value".as_ref(), large.as_ref()],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("over the limit of 2048"), "{stderr}");
}

/// A memory budget too small to hold one client, most likely a size written without its unit,
/// is refused before anything listens, with exit status 64 and the unit suggested (0, no limit,
/// is taken: `budget::parse_budget`'s unit test).
#[test]
fn a_memory_budget_written_without_its_unit_exits_64() {
    let manifests = tempfile::tempdir().expect("a manifests folder");
    let output = start_on_manifests(
        manifests.path(),
        &["--memory-budget".as_ref(), "36".as_ref()],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("cannot hold one client"), "{stderr}");
    assert!(stderr.contains("36Mi"), "{stderr}");
}

/// Row 13 of docs/security.md: the `--context-value` entries of the attack (a 100 KB value,
/// keys naming the message's own fields, a look-alike of the proxy's own) are refused at start;
/// `rev`, an ordinary label, is served.
#[tokio::test]
async fn the_context_values_of_the_attack_are_refused_at_start_and_an_ordinary_label_is_served() {
    use flagd_proxy_testkit::attacks::context;
    for entry in context::entries() {
        let argument = ["--context-value".as_ref(), entry.entry.as_ref()];
        if entry.refused {
            let (code, log) = refused_at_start(&argument);
            assert_eq!(code, Some(context::EXIT_STATUS), "{}: {log}", entry.what);
        } else {
            let manifests = tempfile::tempdir().expect("a manifests folder");
            let dir = manifests.path().to_str().expect("utf-8");
            let proxy = flagd_proxy_testkit::Proxy::start(&[
                "--manifests",
                dir,
                "--context-value",
                &entry.entry,
            ])
            .await;
            drop(proxy);
        }
    }
}

/// OTLP settings that cannot work are refused before anything listens, with exit status 64 and
/// the flag named; the collector is never needed to start.
#[test]
fn unusable_otlp_settings_exit_64() {
    let manifests = tempfile::tempdir().expect("a manifests folder");
    for (args, needle) in [
        (
            &["--otlp-endpoint", "collector:4317"][..],
            "http:// or https://",
        ),
        (
            &[
                "--otlp-endpoint",
                "http://collector:4317",
                "--otlp-ca-file",
                "ca.pem",
            ][..],
            "https:// --otlp-endpoint",
        ),
        (
            &[
                "--otlp-endpoint",
                "https://collector:4317",
                "--otlp-ca-file",
                "/no/such/ca.pem",
            ][..],
            "--otlp-ca-file /no/such/ca.pem",
        ),
        (
            &[
                "--otlp-endpoint",
                "http://collector:4317",
                "--otlp-header",
                "x-key=line\u{7f}",
            ][..],
            "--otlp-header \"x-key\"",
        ),
        (
            &[
                "--otlp-endpoint",
                "http://collector:4317",
                "--otlp-interval",
                "0s",
            ][..],
            "--otlp-interval",
        ),
    ] {
        let extra: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        let output = start_on_manifests(manifests.path(), &extra);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {needle:?} in {stderr}");
    }
}

/// `flagd-proxy start` on loopback, serving an empty manifests folder with `extra` flags, when
/// it must refuse them: its exit status and log. One that starts serving instead is stopped and
/// the test fails (the log says so: no waiting on a clock).
fn refused_at_start(extra: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    use std::io::BufRead as _;
    let manifests = tempfile::tempdir().expect("a manifests folder");
    let mut child = start_command(manifests.path())
        .args(extra)
        .spawn()
        .expect("run flagd-proxy");
    let mut log = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut seen = Vec::new();
    loop {
        let mut line = Vec::new();
        if log.read_until(b'\n', &mut line).expect("a log line") == 0 {
            break;
        }
        seen.extend_from_slice(&line);
        if String::from_utf8_lossy(&line).contains("flagd-proxy is serving") {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "flagd-proxy started serving with {extra:?} instead of refusing it:\n{}",
                String::from_utf8_lossy(&seen)
            );
        }
    }
    let status = child.wait().expect("the exit status");
    (status.code(), String::from_utf8_lossy(&seen).into_owned())
}

/// Characters that would act on a terminal (or hide what follows) in a message.
fn has_terminal_controls(text: &str) -> bool {
    text.chars()
        .any(|c| c != '\n' && (c.is_control() || ('\u{200b}'..='\u{200f}').contains(&c)))
}

/// Context keys a client could not tell from a reserved one (another case, a look-alike letter,
/// an invisible character around it) or could not read (a line break, an escape sequence) are
/// refused before anything listens: exit status 64, one message naming the key escaped, nothing
/// raw from it on the terminal.
#[test]
fn look_alike_and_unreadable_context_keys_exit_64_with_the_key_escaped() {
    for (key, shown) in [
        ("a\nb", r#""a\nb""#),
        ("x\u{1b}[31m", r#""x\u{1b}[31m""#),
        ("\u{0455}elector", r#""\u{455}elector""#),
        ("ver\u{0455}ion", r#""ver\u{455}ion""#),
        ("\u{200b}flagSetId", r#""\u{200b}flagSetId""#),
        ("FLAGSETID", r#""FLAGSETID""#),
    ] {
        let entry = format!("{key}=v");
        let (code, log) = refused_at_start(&["--context-value".as_ref(), entry.as_ref()]);
        assert_eq!(code, Some(64), "{key:?}: {log}");
        assert!(log.contains(shown), "{key:?}: {shown} in {log}");
        assert_eq!(log.lines().count(), 1, "{key:?}: {log}");
        assert!(!has_terminal_controls(&log), "{key:?}: {log:?}");
    }
    // Whitespace around a key is dropped: the reserved key it surrounds is refused.
    let (code, log) = refused_at_start(&["--context-value".as_ref(), " version\u{a0}=v".as_ref()]);
    assert_eq!(code, Some(64), "{log}");
    assert!(log.contains("\"version\""), "{log}");
}

/// A unix socket path longer than the kernel takes (sun_path: 108 bytes with the final NUL) is
/// refused before anything listens, with exit status 64 and the limit named; the proxy never
/// serves a socket no client could connect to.
#[test]
fn a_socket_path_longer_than_the_platform_allows_exits_64() {
    let dir = tempfile::tempdir().expect("a folder");
    let name = "s".repeat(120 - dir.path().as_os_str().len());
    let path = dir.path().join(name);
    let (code, log) = refused_at_start(&["--sync-socket-path".as_ref(), path.as_os_str()]);
    assert_eq!(code, Some(64), "{log}");
    assert!(
        log.contains(&format!(
            "--sync-socket-path {}: 121 bytes, longer than the 107",
            path.display()
        )),
        "{log}"
    );
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(!path.exists());
}

/// The bit of signal `number` in a `/proc/<pid>/status` signal mask.
fn signal_bit(number: u32) -> u64 {
    1 << (number - 1)
}

/// The signals process `pid` catches (`SigCgt` of `/proc/<pid>/status`).
fn caught_signals(pid: u32) -> u64 {
    flagd_proxy::introspection::Process::Id(pid)
        .status()
        .expect("the status")
        .mask("SigCgt")
        .expect("a SigCgt line")
}

/// Opens the FIFO at `path` for writing, which returns once `child` has opened it to read; if
/// `child` ends first, the test fails with its log.
fn open_when_read(path: &std::path::Path, child: &mut Child) -> std::fs::File {
    let (tx, rx) = std::sync::mpsc::channel();
    let fifo = path.to_owned();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::OpenOptions::new().write(true).open(fifo));
    });
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(50)) {
            Ok(file) => return file.expect("open the FIFO for writing"),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(error) => panic!("the opening thread ended: {error}"),
        }
        if let Some(status) = child.try_wait().expect("poll flagd-proxy") {
            // Lets the opening thread go.
            let _ = std::fs::File::open(path);
            let mut log = String::new();
            if let Some(mut stderr) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut stderr, &mut log);
            }
            panic!("flagd-proxy ended ({status}) before reading its config file:\n{log}");
        }
    }
}

/// The signals are caught before the proxy does any start-up work: when it opens its config
/// file (here a FIFO, so it waits there for the test, with nothing logged and nothing bound),
/// SIGHUP, SIGUSR1, SIGUSR2, SIGTERM, SIGINT and SIGQUIT already have its handlers, not their
/// default action (which ends the process). The reload signals sent at that point are ignored:
/// it goes on to serve and logs each as ignored; SIGTERM then stops it cleanly. (What this
/// cannot show: a signal that arrives before `main` runs finds the default action; no program
/// can catch it.)
#[test]
fn signals_are_caught_before_the_config_file_is_read() {
    use std::io::{BufRead as _, Write as _};
    let dir = tempfile::tempdir().expect("a folder");
    let fifo = dir.path().join("config.yaml");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo {}", fifo.display());
    let manifests = tempfile::tempdir().expect("a manifests folder");
    let mut child = start_command(manifests.path())
        .arg("--config")
        .arg(&fifo)
        .spawn()
        .expect("run flagd-proxy");
    let pid = child.id();
    let mut config = open_when_read(&fifo, &mut child);

    let caught = caught_signals(pid);
    for (number, name) in [
        (1, "SIGHUP"),
        (2, "SIGINT"),
        (3, "SIGQUIT"),
        (10, "SIGUSR1"),
        (12, "SIGUSR2"),
        (15, "SIGTERM"),
    ] {
        assert_ne!(
            caught & signal_bit(number),
            0,
            "{name} is not caught yet when flagd-proxy reads its config file (SigCgt {caught:016x})"
        );
    }
    for signal in ["HUP", "USR1", "USR2"] {
        send_signal(pid, signal);
    }
    config
        .write_all(b"log-format: console\n")
        .expect("write the config file");
    drop(config);

    let mut log = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut seen = String::new();
    let mut ignored = Vec::new();
    let mut serving = false;
    // Each signal is logged as ignored, during start-up or after it (its delivery is the
    // kernel's to time), and the proxy serves.
    while !(serving && ignored.len() == 3) {
        let mut line = String::new();
        if log.read_line(&mut line).expect("a log line") == 0 {
            let status = child.wait().expect("the exit status");
            panic!("flagd-proxy ended ({status}) after a reload signal during start-up:\n{seen}");
        }
        serving |= line.contains("flagd-proxy is serving");
        for name in ["SIGHUP", "SIGUSR1", "SIGUSR2"] {
            if line.contains(name) && line.contains("ignored") && !ignored.contains(&name) {
                ignored.push(name);
            }
        }
        seen.push_str(&line);
    }
    send_signal(pid, "TERM");
    // The log is read to its end so the proxy never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
    let status = child.wait().expect("the exit status");
    assert!(status.success(), "{status}\n{seen}");
}
