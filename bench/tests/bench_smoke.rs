//! The benchmark program still runs end to end, and this proxy passes its correctness checks
//! (every subscriber gets every paced update and ends on the final version of a burst), with
//! both sources: manifest files, and FeatureFlag resources on the test control plane. The smoke
//! runs report timings but assert none.
use flagd_proxy_testkit::control_plane::{ControlPlaneError, bin_dir, find_binaries};
use flagd_proxy_testkit::proxy_bin;

/// Runs `flagd-proxy-bench --smoke` with `extra` and checks its verdict and that the scenario ran
/// on `source`.
fn smoke(source: &str, extra: &[&str]) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_flagd-proxy-bench"))
        .args(["--smoke", "--proxy-bin"])
        .arg(proxy_bin())
        .args(extra)
        .output()
        .expect("run flagd-proxy-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "flagd-proxy-bench --smoke {extra:?} failed:\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!("B document, {source} source")),
        "no {source} scenario in the report:\n{stdout}"
    );
    assert!(
        stdout.contains("every subscriber got every paced update"),
        "no correctness verdict in the report:\n{stdout}"
    );
}

#[test]
fn benchmark_smoke_run_passes_its_checks() {
    smoke("files", &[]);
}

#[test]
fn benchmark_smoke_run_on_kubernetes_passes_its_checks() {
    if let Err(err @ ControlPlaneError::BinariesMissing { .. }) = find_binaries(&bin_dir()) {
        if std::env::var_os("CI").is_some() {
            panic!("{err}");
        }
        eprintln!("SKIPPED (no control plane): {err}");
        return;
    }
    smoke("kubernetes", &["--source", "kubernetes"]);
}
