//! Configuration errors and start-up, no control plane needed.

use super::*;

fn run_proxy_expecting_exit(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flagd-proxy"));
    command
        .args(["start", "--bind-address", "127.0.0.1", "--port", "0"])
        .args(["--management-port", "0"])
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT");
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command.output().expect("running flagd-proxy");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs the proxy with `args` and `env`; asserts that it exits with 64 naming every one of
/// `needles` on stderr.
fn assert_usage_error(args: &[&str], env: &[(&str, &str)], needles: &[&str]) {
    let (code, stderr) = run_proxy_expecting_exit(args, env);
    assert_eq!(code, Some(64), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} missing from: {stderr}");
    }
}

#[test]
fn configuration_errors_exit_before_listening() {
    let dir = tempfile::tempdir().expect("tempdir");

    // Nothing configured: the message tells every way to configure the proxy.
    assert_usage_error(
        &[],
        &[],
        &["KUBECONFIG", "--kube-api-server", "--manifests DIR"],
    );

    // A broken KUBECONFIG is an error naming the file, never a fallback.
    let broken = dir.path().join("broken-kubeconfig");
    std::fs::write(&broken, "clusters: [").expect("write");
    let broken = broken.display().to_string();
    assert_usage_error(
        &[],
        &[
            ("KUBECONFIG", &broken),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ],
        &[&broken],
    );
    let missing = dir.path().join("missing-kubeconfig").display().to_string();
    assert_usage_error(&[], &[("KUBECONFIG", &missing)], &[&missing]);

    // Unreadable token and CA files name the flag and the file.
    let token = dir.path().join("no-token").display().to_string();
    assert_usage_error(
        &[
            "--kube-api-server",
            "https://127.0.0.1:1",
            "--kube-token-path",
            &token,
        ],
        &[],
        &["--kube-token-path", &token],
    );
    let ca = dir.path().join("no-ca.pem").display().to_string();
    assert_usage_error(
        &[
            "--kube-api-server",
            "https://127.0.0.1:1",
            "--kube-ca-path",
            &ca,
        ],
        &[],
        &["--kube-ca-path", &ca],
    );
}

#[tokio::test]
async fn an_unreachable_api_server_does_not_block_start_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "not-a-real-token\n").expect("write");
    let url = format!("https://127.0.0.1:{}", support::free_port());
    let proxy = Proxy::start(&[
        "--kube-api-server",
        &url,
        "--kube-token-path",
        token.to_str().expect("utf-8"),
    ])
    .await;
    let mut client = client(&proxy).await;
    let status = client
        .fetch_all_flags(with_selector(
            v1::FetchAllFlagsRequest::default(),
            &selector("any", "flags"),
        ))
        .await
        .expect_err("nothing to fetch");
    assert_status(
        &status,
        Code::Unavailable,
        "cannot reach the Kubernetes API server",
    );
    assert!(
        proxy
            .metric("flagd_proxy_source_errors_total{source=\"kubernetes\",kind=\"unreachable\"}")
            .await
            > 0.0
    );
}
