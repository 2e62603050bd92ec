//! The benchmark program still runs end to end, and this proxy passes its correctness checks
//! (every subscriber gets every paced update and ends on the final version of a burst). The
//! smoke run reports timings but asserts none.
#[test]
fn benchmark_smoke_run_passes_its_checks() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_flagd-proxy-bench"))
        .args(["--smoke", "--proxy-bin", env!("CARGO_BIN_EXE_flagd-proxy")])
        .output()
        .expect("run flagd-proxy-bench");
    assert!(
        output.status.success(),
        "flagd-proxy-bench --smoke failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
