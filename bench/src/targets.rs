//! The targets, checked against the scenarios of this run.

use crate::figures::{Groups, figures};
use crate::kit::table::{Table, fmt_opt, met_cell};
use crate::scenario::{RunResult, ScenarioRuns};
use crate::storm;

/// Targets of one scenario: what, the measured value, and whether it is met.
type Checks = Vec<(String, String, bool)>;

/// The targets, checked against this run's scenarios.
pub(crate) fn targets(runs: &[ScenarioRuns]) -> String {
    let mut table = Table::new(["scenario", "target", "measured", "met"], "l");
    for run in runs {
        let s = &run.scenario;
        let Some(r) = run.results.get("rust") else {
            continue;
        };
        let name = s.short_label();
        let mut checks = Checks::new();
        if let Some(f) = run.results.get("floor")
            && s.payload <= 2048
        {
            floor_checks(r, f, &mut checks);
        }
        if let Some(g) = run.results.get("go") {
            go_checks(run, r, g, &mut checks);
        }
        if let Some(storm) = &r.storm {
            storm_checks(storm, s.tls, &mut checks);
        }
        kubernetes_checks(r, &mut checks);
        if s.resources == 1 && !s.tls {
            checks.push((
                "memory per idle subscriber ≤ 24 KiB".to_owned(),
                format!("{:.2} KiB", r.kib_per_idle_subscriber),
                r.kib_per_idle_subscriber <= 24.0,
            ));
        }
        for (target, measured, ok) in checks {
            table.row([&name, &target, &measured, met_cell(Some(ok))]);
        }
    }
    format!("### Targets\n\n{}\n", table.markdown())
}

/// This proxy against the floor (small documents only).
fn floor_checks(r: &RunResult, f: &RunResult, checks: &mut Checks) {
    if let (Some(rp), Some(fp)) = (r.propagation.p99_ms, f.propagation.p99_ms) {
        checks.push((
            "propagation p99 ≤ 1.25 × floor".to_owned(),
            format!("{rp:.1} vs {fp:.1} ms ({:.2}×)", rp / fp),
            rp <= 1.25 * fp,
        ));
    }
    let (rc, fc) = (r.cpu_seconds_per_update, f.cpu_seconds_per_update);
    if fc > 0.0 {
        checks.push((
            "CPU per update ≤ 1.5 × floor".to_owned(),
            format!("{rc:.3} vs {fc:.3} s ({:.2}×)", rc / fc),
            rc <= 1.5 * fc,
        ));
    }
}

/// This proxy against the Go proxy: at least as good on every row where lower is better.
fn go_checks(run: &ScenarioRuns, r: &RunResult, g: &RunResult, checks: &mut Checks) {
    let lower = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => a < b,
        (Some(_), None) => true,
        _ => false,
    };
    let groups = Groups::of(run);
    for ((label, rv, digits), (_, gv, _)) in figures(r, groups).into_iter().zip(figures(g, groups))
    {
        let label = label.as_str();
        let better_is_lower = !matches!(
            label,
            "subscribers connected" | "storm: subscribers served again" | "storm: /readyz probes"
        ) && !label.contains("messages per subscriber")
            && !label.contains("watches open")
            && !label.contains("CPU while idle");
        if !better_is_lower || (rv == Some(0.0) && gv == Some(0.0)) {
            continue;
        }
        if rv.is_none() && gv.is_none() {
            continue;
        }
        checks.push((
            format!("better than Go: {label}"),
            format!("{} vs {}", fmt_opt(rv, digits), fmt_opt(gv, digits)),
            lower(rv, gv) || rv == gv,
        ));
    }
}

/// The reconnect storm: everyone served again in time, nothing else disturbed.
fn storm_checks(storm: &storm::StormResult, tls: bool, checks: &mut Checks) {
    let limit = if tls { 12.0 } else { 3.0 };
    checks.push((
        format!("storm: all served again within {limit:.0} s"),
        format!("{} s", fmt_opt(storm.seconds_to_all, 2)),
        storm.seconds_to_all.is_some_and(|t| t <= limit),
    ));
    checks.push((
        "storm: /readyz and connected streams answering, no client giving up".to_owned(),
        format!(
            "/readyz {} of {} failed, slowest {} ms; {} streams broken; {} never served",
            storm.readyz_failures,
            storm.readyz_probes,
            fmt_opt(storm.readyz_max_ms, 1),
            storm.witness_stream_errors,
            storm.gave_up
        ),
        storm.readyz_failures == 0 && storm.witness_stream_errors == 0 && storm.gave_up == 0,
    ));
}

/// The Kubernetes source: shared API-server connections, fast first snapshots of new resources.
fn kubernetes_checks(r: &RunResult, checks: &mut Checks) {
    let (Some(watches), Some(connections)) = (r.apiserver_watches, r.apiserver_connections) else {
        return;
    };
    checks.push((
        "API-server connections ≤ watches / 100".to_owned(),
        format!("{connections} connections, {watches} watches"),
        connections as f64 <= (watches as f64 / 100.0).max(1.0),
    ));
    let p99 = r.cold_first_snapshot.p99_ms;
    checks.push((
        "new resource: time to first snapshot p99 < 50 ms".to_owned(),
        format!("{} ms", fmt_opt(p99, 1)),
        p99.is_some_and(|v| v < 50.0) && r.cold_first_snapshot_failures == 0,
    ));
}
