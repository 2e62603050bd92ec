//! The report: the machine, the rows of the table, and the Markdown.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::args::Args;
use crate::churn;
use crate::kit::header::Header;
pub(crate) use crate::kit::header::{loadavg, machine};
use crate::kit::latency::Point::{Max, P50, P99};
use crate::kit::table::{Figure, Table, absent, count, figure, fmt_opt};
use crate::proxy::Kind;
use crate::scenario::{RunResult, Scenario};
use crate::storm::StormResult;
use crate::targets::targets;
use crate::verdict::Verdict;

/// One scenario's results, by proxy key, and why a proxy has none.
pub(crate) struct ScenarioRuns {
    pub(crate) scenario: Scenario,
    pub(crate) results: BTreeMap<&'static str, RunResult>,
    pub(crate) skipped: BTreeMap<&'static str, String>,
    /// Why a proxy's run failed, by proxy key.
    pub(crate) failed: BTreeMap<&'static str, String>,
}

/// Which groups of rows beyond the common ones a scenario's table has: those some result has
/// values for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Groups {
    resources: bool,
    kubernetes: bool,
    storm: bool,
    killed: bool,
}

impl Groups {
    pub(crate) fn of(runs: &ScenarioRuns) -> Self {
        let any = |f: fn(&RunResult) -> bool| runs.results.values().any(f);
        Groups {
            resources: any(|r| r.kib_per_resource.is_some()),
            kubernetes: any(|r| r.apiserver_watches.is_some()),
            storm: any(|r| r.storm.is_some()),
            killed: any(|r| r.killed_for_rss),
        }
    }
}

/// The rows of a scenario's table for one result: those of every scenario, then the `groups`.
pub(crate) fn figures(r: &RunResult, groups: Groups) -> Vec<Figure> {
    let mut rows = connect_figures(r);
    rows.extend(update_figures(r));
    rows.extend(cost_figures(r));
    if groups.resources {
        rows.push(figure(
            "RSS per watched resource, with its subscribers (KiB)",
            r.kib_per_resource,
            2,
        ));
    }
    if groups.kubernetes {
        rows.extend(kubernetes_figures(r));
    }
    if groups.storm {
        rows.extend(match &r.storm {
            Some(storm) => storm_figures(storm),
            None => absent(storm_figures(&StormResult::default())),
        });
    }
    if groups.killed {
        let killed = f64::from(u8::from(r.killed_for_rss));
        rows.push(figure("killed for RSS over --max-rss-mib", Some(killed), 0));
    }
    rows
}

/// Connecting the subscribers and their first snapshots.
fn connect_figures(r: &RunResult) -> Vec<Figure> {
    let mut rows = vec![
        figure("subscribers connected", count(r.subscribers_connected), 0),
        figure("connect all subscribers (s)", Some(r.connect_seconds), 2),
        figure("connect: CPU (s)", Some(r.connect_cpu_seconds), 2),
        figure(
            "connect: load generator CPU (s)",
            Some(r.connect_load_generator_cpu_seconds),
            2,
        ),
    ];
    rows.extend(
        r.first_snapshot
            .figures("time to first snapshot", 2, &[P50, P99]),
    );
    rows
}

/// Paced updates and the burst.
fn update_figures(r: &RunResult) -> Vec<Figure> {
    let mut rows = r
        .propagation
        .figures("propagation to all", 1, &[P50, P99, Max]);
    rows.extend(r.first_receiver.figures("first subscriber", 1, &[P50]));
    rows.extend([
        figure(
            "paced updates not delivered to all",
            count(r.updates_incomplete),
            0,
        ),
        figure(
            "messages per subscriber per update",
            Some(r.messages_per_subscriber_per_update),
            2,
        ),
        figure("burst: convergence (ms)", r.burst_convergence_ms, 1),
        figure(
            "burst: subscribers not on final version",
            count(r.stale_after_settle),
            0,
        ),
    ]);
    rows
}

/// Memory, CPU and errors.
fn cost_figures(r: &RunResult) -> Vec<Figure> {
    let written_mib = r.bytes_written_per_update / (1024.0 * 1024.0);
    vec![
        figure("RSS, no subscribers (MiB)", Some(r.rss_empty_mib), 1),
        figure("RSS, subscribers idle (MiB)", Some(r.rss_idle_mib), 1),
        figure(
            "RSS, during updates (MiB)",
            Some(r.rss_after_updates_mib),
            1,
        ),
        figure("RSS peak (VmHWM, MiB)", Some(r.rss_peak_mib), 1),
        figure(
            "memory per idle subscriber (KiB)",
            Some(r.kib_per_idle_subscriber),
            2,
        ),
        figure("CPU while idle (% of a core)", Some(r.cpu_idle_percent), 2),
        figure("CPU per update (s)", Some(r.cpu_seconds_per_update), 3),
        figure("bytes written per update (MiB)", Some(written_mib), 1),
        figure("CPU total (s)", Some(r.cpu_seconds_total), 2),
        figure(
            "load generator CPU per update (s)",
            Some(r.load_generator_cpu_seconds_per_update),
            3,
        ),
        figure(
            "load generator: large messages decoded per update",
            Some(r.decoded_per_update),
            1,
        ),
        figure("stream errors", count(r.stream_errors), 0),
        figure(
            "first-snapshot failures",
            count(r.first_snapshot_failures),
            0,
        ),
    ]
}

/// The FeatureFlag watches open at the API server, as every table with a Kubernetes source
/// shows them.
pub(crate) fn watches_figure(watches: Option<u64>) -> Figure {
    figure(
        "API server: FeatureFlag watches open",
        watches.and_then(count),
        0,
    )
}

/// The API server, and resources nobody watched before (Kubernetes source).
fn kubernetes_figures(r: &RunResult) -> Vec<Figure> {
    let mut rows = vec![
        watches_figure(r.apiserver_watches),
        figure(
            "API server: connections from the proxy",
            r.apiserver_connections.and_then(count),
            0,
        ),
    ];
    let cold = &r.cold_first_snapshot;
    rows.extend(cold.figures("new resource: time to first snapshot", 1, &[P50, P99]));
    let failures = count(r.cold_first_snapshot_failures);
    rows.push(figure("new resource: failures", failures, 0));
    rows
}

/// The reconnect storm.
fn storm_figures(s: &StormResult) -> Vec<Figure> {
    let reconnect = &s.reconnect_to_snapshot;
    let mut rows = vec![
        figure("storm: subscribers served again", count(s.served_again), 0),
        figure("storm: all served again after (s)", s.seconds_to_all, 2),
    ];
    rows.extend(reconnect.figures("storm: reconnect to snapshot", 1, &[P50, P99]));
    rows.extend([
        figure("storm: attempts retried", count(s.retries), 0),
        figure("storm: clients never served", count(s.gave_up), 0),
        figure("storm: CPU (s)", Some(s.cpu_seconds), 2),
        figure("storm: RSS peak (MiB)", Some(s.rss_peak_mib), 1),
        figure("storm: /readyz slowest (ms)", s.readyz_max_ms, 1),
        figure("storm: /readyz failed", count(s.readyz_failures), 0),
        figure("storm: /readyz probes", count(s.readyz_probes), 0),
        figure(
            "storm: update to the connected streams (ms)",
            s.witness_update_ms,
            1,
        ),
        figure(
            "storm: connected streams broken",
            count(s.witness_stream_errors),
            0,
        ),
    ]);
    rows
}

/// The heading of a scenario's table.
fn heading(runs: &ScenarioRuns, streams_per_connection: usize) -> String {
    let scenario = &runs.scenario;
    let doc = runs
        .results
        .values()
        .next()
        .map(|r| r.document_bytes)
        .unwrap_or_default();
    format!(
        "### {} subscribers, {} resource(s), {} B document, {} source{}{}\n\n",
        scenario.subscribers,
        scenario.resources,
        doc,
        scenario.source.label(),
        if scenario.tls { ", TLS" } else { "" },
        if streams_per_connection > 1 {
            format!(", {streams_per_connection} streams per connection")
        } else {
            String::new()
        }
    )
}

/// A scenario's table: a row per metric, a column per proxy, and the ratios.
pub(crate) fn markdown_table(
    runs: &ScenarioRuns,
    go_label: &str,
    streams_per_connection: usize,
) -> String {
    let mut out = heading(runs, streams_per_connection);
    out.push_str(&metric_table(runs, go_label));
    let churned: Vec<(&str, &churn::ChurnResult)> = runs
        .results
        .values()
        .filter_map(|r| Some((r.proxy.as_str(), r.churn.as_ref()?)))
        .collect();
    if !churned.is_empty() {
        out.push('\n');
        out.push_str(&churn::table(&churned));
    }
    out.push_str(&notes(runs));
    out.push('\n');
    out
}

/// The table of the figures: a row per figure, a column per proxy, and the ratios.
fn metric_table(runs: &ScenarioRuns, go_label: &str) -> String {
    let results = &runs.results;
    let has = |key: &str| results.contains_key(key) || runs.skipped.contains_key(key);
    let (model, floor) = (has("model"), has("floor"));
    let mut columns = vec!["metric", "flagd-proxy (Rust)", go_label, "Go / Rust"];
    if model {
        columns.push(Kind::Model.label());
    }
    if floor {
        columns.extend(["floor", "Rust / floor"]);
    }
    let mut table = Table::new(columns, "lr");
    // A proxy without a result: why it was skipped, or that it failed.
    let cell = |key: &str, v: Option<f64>, digits: usize| match results.get(key) {
        Some(_) => fmt_opt(v, digits),
        None => runs
            .skipped
            .get(key)
            .cloned()
            .unwrap_or_else(|| "failed".to_owned()),
    };
    let groups = Groups::of(runs);
    let by_key: BTreeMap<&str, Vec<Figure>> = results
        .iter()
        .map(|(key, r)| (*key, figures(r, groups)))
        .collect();
    for (i, (name, _, digits)) in figures(&RunResult::default(), groups).iter().enumerate() {
        let value = |key: &str| by_key.get(key).and_then(|f| f[i].1);
        let (r, g) = (value("rust"), value("go"));
        let mut line = vec![
            name.to_owned(),
            cell("rust", r, *digits),
            cell("go", g, *digits),
            ratio(r, g),
        ];
        if model {
            line.push(cell("model", value("model"), *digits));
        }
        if floor {
            let f = value("floor");
            line.extend([cell("floor", f, *digits), ratio(f, r)]);
        }
        table.row(line);
    }
    table.markdown()
}

/// `b / a` with two decimals, or "–".
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:.2}", b / a),
        _ => "–".to_owned(),
    }
}

/// The last stream error and the phases cut short of each proxy, and the runs that failed.
fn notes(runs: &ScenarioRuns) -> String {
    let mut out = String::new();
    for (key, run) in &runs.results {
        if let Some(error) = &run.last_error {
            out.push_str(&format!("\n{key}: last stream error: {error}\n"));
        }
        for note in &run.gave_up {
            out.push_str(&format!("\n{key}: {note}\n"));
        }
    }
    for (key, error) in &runs.failed {
        out.push_str(&format!("\n{key}: the run failed: {error}\n"));
    }
    out
}

/// What the report says besides the tables, and the JSON's settings.
pub(crate) struct Summary<'a> {
    pub(crate) args: &'a Args,
    pub(crate) go_note: Option<String>,
    pub(crate) header: Header,
    pub(crate) verdict: Verdict,
}

impl Summary<'_> {
    /// The Markdown report: the machine and settings, a table per scenario, the targets and the
    /// verdict.
    pub(crate) fn markdown(&self, runs: &[ScenarioRuns]) -> String {
        let args = self.args;
        let mut report = String::from("## flagd-proxy fan-out benchmark\n\n");
        report.push_str(&format!("{}.\n\n", self.header.sentence()));
        report.push_str(&format!(
            "Settings: {} streams per connection, {} paced updates ({} gap), burst of {} ({} apart, settle {}), {} first-snapshot samples, {} load-generator threads.\n\n",
            args.streams_per_connection,
            args.updates,
            humantime::format_duration(args.update_gap),
            args.burst,
            humantime::format_duration(args.burst_gap),
            humantime::format_duration(args.settle),
            args.first_snapshot_samples,
            args.threads
        ));
        if let Some(note) = &self.go_note {
            report.push_str(&format!("Note: {note}.\n\n"));
        }
        for run in runs {
            report.push_str(&markdown_table(
                run,
                &args.go_label,
                args.streams_per_connection,
            ));
        }
        report.push_str(&targets(runs));
        report.push_str(&self.verdict.markdown());
        report
    }

    /// The results as JSON (`--json`).
    pub(crate) fn json(&self, runs: &[ScenarioRuns]) -> Value {
        let args = self.args;
        let scenarios: Vec<Value> = runs
            .iter()
            .map(|run| {
                let s = &run.scenario;
                json!({
                    "source": s.source,
                    "subscribers": s.subscribers,
                    "resources": s.resources,
                    "payload_bytes": s.payload,
                    "tls": s.tls,
                    "streams_per_connection": args.streams_per_connection,
                    "results": run.results,
                    "skipped": run.skipped,
                    "failed": run.failed,
                })
            })
            .collect();
        self.header.stamp(json!({
            "settings": {
                "updates": args.updates,
                "update_gap_ms": args.update_gap.as_millis() as u64,
                "burst": args.burst,
                "burst_gap_ms": args.burst_gap.as_millis() as u64,
                "settle_ms": args.settle.as_millis() as u64,
                "first_snapshot_samples": args.first_snapshot_samples,
                "threads": args.threads,
                "smoke": args.smoke,
            },
            "go_note": self.go_note,
            "correct": self.verdict.ok(),
            "failures": self.verdict.failures,
            "scenarios": scenarios,
        }))
    }
}
