//! The binary's exit status and messages for `--config` and for a Kubernetes configuration it
//! cannot use.
use std::process::{Command, Output};

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flagd-proxy"))
        .args(args)
        .env_remove("FLAGD_PROXY_CONFIG")
        .output()
        .expect("run flagd-proxy")
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
