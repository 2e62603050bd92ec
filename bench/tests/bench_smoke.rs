//! The benchmark program still runs end to end, and this proxy passes its correctness checks
//! (every subscriber gets every paced update and ends on the final version of a burst), with
//! both sources: manifest files, and FeatureFlag resources on the test control plane. A proxy
//! that misses updates fails the run. A short soak (`--soak --smoke`) comes back to its
//! baseline, and one whose watches outlive it fails. The authorization storm counts the API
//! requests each mode makes and keeps them within its target. Every hostile attack
//! (`--attacks --smoke`) yields its figures. The smoke runs report timings but assert none.
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use flagd_proxy_testkit::control_plane::{
    ControlPlaneError, OPERATOR_CRDS, bin_dir, find_binaries, test_data,
};
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
        flagd_proxy_testkit::skip::skip(format_args!("no control plane: {err}"));
        return;
    }
    smoke("kubernetes", &["--source", "kubernetes"]);
}

/// A folder of its own under cargo's temporary folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    /// `<name>-<pid>` under cargo's temporary folder, made.
    fn new(name: &str) -> Self {
        let scratch = Scratch(
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id())),
        );
        std::fs::create_dir_all(&scratch.0).expect("scratch folder");
        scratch
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `path` quoted for bash.
fn quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// Writes `dir/name`: a bash wrapper around this proxy that runs `replace` (bash, with the flag's
/// value in `$2`, adding to `args`) in place of the flag `flag` and its value, and passes every
/// other argument on.
fn wrapper(dir: &Path, name: &str, flag: &str, replace: &str) -> PathBuf {
    let path = dir.join(name);
    let script = format!(
        r#"#!/usr/bin/env bash
set -euo pipefail
args=()
while [[ $# -gt 0 ]]; do
  if [[ $1 == {flag} ]]; then
    {replace}
    shift 2
  else
    args+=("$1")
    shift
  fi
done
exec {proxy} "${{args[@]}}"
"#,
        proxy = quoted(&proxy_bin()),
    );
    std::fs::write(&path, script).expect("write the wrapper");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .expect("make the wrapper executable");
    path
}

/// This proxy behind a wrapper that hands it a copy of its manifests directory taken at start:
/// it serves the first version and never sees an update. The run must fail after printing and
/// writing its report, and say on standard error which proxy was wrong, in which scenario, and
/// how.
#[test]
fn benchmark_smoke_run_fails_when_the_proxy_misses_updates() {
    let scratch = Scratch::new("bench-frozen-proxy");
    let replace = format!(
        r#"frozen="$(mktemp -d -p {scratch})"
    cp -R "$2/." "$frozen/"
    args+=(--manifests "$frozen")"#,
        scratch = quoted(&scratch.0)
    );
    let wrapper = wrapper(&scratch.0, "frozen-flagd-proxy", "--manifests", &replace);
    let markdown = scratch.0.join("report.md");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_flagd-proxy-bench"))
        .args([
            "--smoke",
            "--no-floor",
            "--update-timeout",
            "1s",
            "--proxy-bin",
        ])
        .arg(&wrapper)
        .arg("--markdown")
        .arg(&markdown)
        .output()
        .expect("run flagd-proxy-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "{context}");
    // The report is still printed and written, with its table and the verdict.
    assert!(
        stdout.contains("B document, files source") && stdout.contains("**FAILED**"),
        "{context}"
    );
    let written = std::fs::read_to_string(&markdown).expect("the report is written");
    assert!(written.contains("**FAILED**"), "{written}");
    // Standard error names the proxy, the scenario and what was wrong.
    let verdict = stderr
        .lines()
        .find(|line| line.starts_with("flagd-proxy-bench: FAILED: "))
        .unwrap_or_else(|| panic!("no failure named on standard error:\n{context}"));
    for needle in [
        "flagd-proxy (Rust)",
        "50 subscribers, 1 resource(s), 1024 B payload, files source",
        "3 paced update(s) did not reach every subscriber",
    ] {
        assert!(verdict.contains(needle), "{needle:?} not in {verdict:?}");
    }
}

/// Standard output, and both outputs for an assertion message.
fn outputs(output: &std::process::Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let context = format!(
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (stdout, context)
}

/// Runs `flagd-proxy-bench ARGS --proxy-bin <this proxy>` and requires it to succeed; its
/// standard output and, for failure messages, all it printed.
fn bench_run(args: &[&str]) -> (String, String) {
    bench_ok(&with_proxy(args))
}

/// `args`, then `--proxy-bin <this proxy>`.
fn with_proxy(args: &[&str]) -> Vec<OsString> {
    let mut all: Vec<OsString> = args.iter().map(OsString::from).collect();
    all.extend(["--proxy-bin".into(), proxy_bin().into()]);
    all
}

/// Runs `flagd-proxy-bench ARGS` and requires it to succeed; its standard output and, for
/// failure messages, all it printed.
fn bench_ok(args: &[OsString]) -> (String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_flagd-proxy-bench"))
        .args(args)
        .output()
        .expect("run flagd-proxy-bench");
    let (stdout, context) = outputs(&output);
    assert!(output.status.success(), "{args:?}: {context}");
    (stdout, context)
}

/// Runs `flagd-proxy-bench --soak --smoke` against `proxy`, writing its report to `markdown`.
fn soak_smoke(proxy: &Path, markdown: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_flagd-proxy-bench"))
        .args(["--soak", "--smoke", "--proxy-bin"])
        .arg(proxy)
        .arg("--markdown")
        .arg(markdown)
        .output()
        .expect("run flagd-proxy-bench")
}

/// A soak of a few seconds: updates, short-lived connections and resources that come and go;
/// every sampled quantity comes back to its baseline and every steady subscriber ends on the
/// final version.
#[test]
fn soak_smoke_run_returns_to_its_baseline() {
    let scratch = Scratch::new("bench-soak");
    let markdown = scratch.0.join("soak.md");
    let output = soak_smoke(&proxy_bin(), &markdown);
    let (stdout, context) = outputs(&output);
    assert!(output.status.success(), "{context}");
    for needle in [
        "| quantity | baseline | peak during churn | end | tolerance | result |",
        "| watches (`flagd_proxy_upstream_watches`) | 8 |",
        "| short-lived connections (first version, then closed) | 200 |",
        "| failed: short-lived connections / lifecycles | 0 / 0 |",
        "every one of the 40 steady subscribers on the final version of its resource",
    ] {
        assert!(
            stdout.contains(needle),
            "{needle:?} not in the report:\n{context}"
        );
    }
    assert!(!stdout.contains("FAIL"), "{context}");
    let written = std::fs::read_to_string(&markdown).expect("the report is written");
    assert!(written.contains("## flagd-proxy soak"), "{written}");
}

/// This proxy behind a wrapper that raises its `--idle-timeout` to an hour: the watches of the
/// resources that came and went outlive the soak, as leaked watches would. The soak must fail,
/// say so in its report, and name the quantity on standard error.
#[test]
fn soak_smoke_run_fails_when_watches_are_left_behind() {
    let scratch = Scratch::new("bench-soak-leaky");
    let wrapper = wrapper(
        &scratch.0,
        "leaky-flagd-proxy",
        "--idle-timeout",
        "args+=(--idle-timeout 1h)",
    );
    let markdown = scratch.0.join("soak.md");
    let output = soak_smoke(&wrapper, &markdown);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "{context}");
    assert!(stdout.contains("Soak: **FAILED**"), "{context}");
    assert!(
        stdout.contains("| watches (`flagd_proxy_upstream_watches`) | 8 |")
            && stdout.contains("| = baseline | **FAIL** |"),
        "{context}"
    );
    let named = stderr.lines().any(|line| {
        line.starts_with(
            "flagd-proxy-bench: FAILED: soak: watches (`flagd_proxy_upstream_watches`): ",
        ) && line.ends_with("at the baseline (allowed: = baseline)")
    });
    assert!(
        named,
        "the leaked watches are not named on standard error:\n{context}"
    );
    // The subscribers were served all the same.
    assert!(
        !stderr.contains("steady subscriber(s) not on the final version"),
        "{context}"
    );
}

/// Two tiers at tiny scale (`--tiers --smoke`: 2 node proxies × 10 subscribers over 2
/// resources, manifest files): every subscriber gets every version through both tiers, and the
/// faults heal: the central killed and started again, one node proxy killed (its 10 streams end
/// and no other does), a rollout of the central. The flat runs beside it pass too.
#[test]
fn tiers_smoke_run_delivers_every_version_through_both_tiers() {
    let (stdout, context) = bench_run(&["--tiers", "--smoke", "--no-go"]);
    for needle in [
        "### 20 subscribers: 2 node proxies × 10, 2 resource(s), 1024 B payload, files source",
        "| subscribers connected | 20 | 20 | 10 | 10 |",
        "| paced updates not delivered to all | 0 | 0 | 0 | 0 |",
        "| central: streams (`sync_active_streams`) | 4 |",
        "streams ended: 0; subscribers off the last good version while down: 0; a new subscriber on a node proxy got version 6 (the last good one)",
        "its streams ended: 10 of 10; other streams ended: 0; its subscribers served again: 10 of 10",
        "central streams after: 4 (one per node proxy and resource: 4)",
        "| rollout, both steps | streams ended: 0 |",
        "Verdict: every subscriber got every update through both tiers, and every fault healed.",
    ] {
        assert!(
            stdout.contains(needle),
            "{needle:?} not in the report:\n{context}"
        );
    }
}

/// Steady reconnects at tiny scale (`--smoke --churn`: two windows of 2 s, the first without
/// reconnects, the second with every subscriber's stream ending once and reopened on its
/// connection): every reopened stream gets a first snapshot and every subscriber ends on the
/// version written after the reconnects, flat and through both tiers. Reports the figures,
/// asserts no timing.
#[test]
fn churn_smoke_runs_reopen_every_stream_and_leave_none_stale() {
    for args in [&["--churn"][..], &["--tiers", "--no-flat", "--churn"]] {
        let args = [&["--smoke", "--no-go", "--no-floor"][..], args].concat();
        let (stdout, context) = bench_run(&args);
        for needle in [
            "Steady reconnects (`--churn`):",
            "| reopened streams never served | 0 |",
            "| snapshots older than the subscriber had | 0 |",
            "| subscribers stale at the end | 0 |",
            "| first snapshot p99 (ms) |",
            "CPU per reconnect (ms) |",
        ] {
            assert!(
                stdout.contains(needle),
                "{args:?}: {needle:?} not in the report:\n{context}"
            );
        }
        assert!(
            !stdout.contains("| streams reopened | 0 |"),
            "{args:?}: no stream reopened:\n{context}"
        );
    }
}

/// Runs `flagd-proxy-bench ARGS --proxy-bin <this proxy> --json FILE` (FILE in a scratch
/// folder named `name`), requires it to succeed, and returns its JSON report, its standard
/// output and, for failure messages, all it printed.
fn bench_json(name: &str, args: &[&str]) -> (serde_json::Value, String, String) {
    let scratch = Scratch::new(name);
    let json = scratch.0.join("report.json");
    let mut all = with_proxy(args);
    all.extend(["--json".into(), json.clone().into()]);
    let (stdout, context) = bench_ok(&all);
    let text = std::fs::read_to_string(&json).expect("the JSON report is written");
    let report = serde_json::from_str(&text).expect("the report is JSON");
    (report, stdout, context)
}

/// The unit costs at small scale (`--costs --smoke`, manifest files): every probe passes this
/// proxy's correctness checks, every cost comes out as a number, and `--capacity` computes the
/// model from the JSON written. Which values they have is not checked: at this scale, in a debug
/// build on a shared machine, a cost derived as the difference of two small probes can be lost
/// in their noise.
#[test]
fn costs_smoke_run_measures_every_cost_and_feeds_the_model() {
    let scratch = Scratch::new("bench-model");
    let json = scratch.0.join("costs.json");
    let (written, _, context) = bench_json("bench-costs", &["--costs", "--smoke"]);
    std::fs::write(&json, written.to_string()).expect("the costs for --capacity");
    let costs = written["costs"].as_object().expect("a costs object");
    // Measured with Kubernetes only: a smoke run reads manifest files.
    let files_only = ["kib_per_watch_kubernetes", "ms_per_version_kubernetes"];
    for (name, value) in costs {
        if files_only.contains(&name.as_str()) {
            assert!(value.is_null(), "{name}: {value}");
            continue;
        }
        let value = value.as_f64().unwrap_or(f64::NAN);
        assert!(
            value.is_finite(),
            "{name} = {value}, not a number:\n{context}"
        );
    }
    let (stdout, context) = bench_ok(&["--capacity".into(), json.into()]);
    for needle in [
        "| C1 | 100 | 10000 | 1 KiB |",
        "| C12 | 5000 | 100000 | 100 KiB |",
    ] {
        assert!(stdout.contains(needle), "{needle:?} not in:\n{context}");
    }
}

/// The authorization storm at tiny scale (`--authz-storm --smoke`: 2 identities × 20 clients)
/// in two modes: every client is served in both phases, the API server's counts come out, and
/// they are within the target (2 per identity + 10). With tokens and RBAC, the cold phase
/// reviews each identity's token and access at least once.
#[test]
fn authz_storm_smoke_run_counts_api_requests_within_the_target() {
    if let Err(err @ ControlPlaneError::BinariesMissing { .. }) = find_binaries(&bin_dir()) {
        flagd_proxy_testkit::skip::skip(format_args!("no control plane: {err}"));
        return;
    }
    if flagd_proxy_testkit::skip::require(test_data(OPERATOR_CRDS)).is_none() {
        return;
    }
    let (report, stdout, context) = bench_json(
        "bench-authz",
        &[
            "--authz-storm",
            "--smoke",
            "--authz-modes",
            "rbac-token,namespace-pod-ip",
        ],
    );
    assert!(
        stdout.contains("## Authorization in a reconnect storm")
            && stdout.contains("Verdict: every client served in every phase"),
        "{context}"
    );
    assert_eq!(report["target"], 2 * 2 + 10, "{report}");
    let modes = report["modes"].as_array().expect("modes");
    assert_eq!(modes.len(), 2, "{report}");
    let requests =
        |phase: &serde_json::Value, key: &str| phase["requests"][key].as_u64().unwrap_or(0);
    for mode in modes {
        for phase in [&mode["cold"], &mode["storm"]] {
            assert_eq!(phase["clients"], 40, "{mode}");
            assert_eq!(phase["served"], 40, "{mode}");
            let authz: u64 = [
                "POST tokenreviews",
                "POST subjectaccessreviews",
                "LIST pods",
                "WATCH pods",
                "GET pods",
            ]
            .iter()
            .map(|key| requests(phase, key))
            .sum();
            assert!(authz <= 14, "{authz} authorization requests: {mode}");
        }
    }
    // A fresh proxy has decided nothing yet: its first clients' identities and access are
    // reviewed in the cold phase.
    let rbac = &modes[0]["cold"];
    assert!(requests(rbac, "POST tokenreviews") >= 2, "{rbac}");
    assert!(requests(rbac, "POST subjectaccessreviews") >= 2, "{rbac}");
}

/// `--attacks --smoke` runs every attack of docs/security.md at a tiny size against this proxy,
/// and every one of them yields its figures: RSS during and after for the attacks on a running
/// proxy, and an outcome for all. What the figures are is not checked (they are measurements).
#[test]
fn attacks_smoke_run_measures_every_attack() {
    let (report, _, context) = bench_json("bench-attacks", &["--attacks", "--smoke"]);
    let rows = report["rows"].as_array().expect("rows");
    let catalogue = flagd_proxy_testkit::attacks::ROWS;
    assert_eq!(rows.len(), catalogue.len(), "{context}");
    for (row, listed) in rows.iter().zip(catalogue) {
        let number = listed.number;
        assert_eq!(row["attack"], u64::from(number), "{context}");
        let now = &row["builds"]["now"];
        assert!(now["failed"].is_null(), "attack {number}: {now}");
        assert!(
            now["outcome"].as_str().is_some_and(|o| !o.is_empty()),
            "attack {number} has no outcome: {now}"
        );
        // The attacks on a running proxy; the others start it themselves, or read the rest.
        if matches!(number, 1..=8 | 10 | 11 | 15) {
            for figure in ["start_kib", "peak_kib", "after_kib"] {
                assert!(
                    now[figure].as_u64().is_some_and(|kib| kib > 0),
                    "attack {number} has no {figure}: {now}"
                );
            }
        }
    }
}
