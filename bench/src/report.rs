//! The report: the machine, the rows of the table, and the Markdown.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::args::Args;
use crate::churn;
use crate::proxy::Kind;
use crate::scenario::{RunResult, Scenario};
use crate::targets::targets;
use crate::verdict::Verdict;

pub(crate) fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned());
    let memory_kib = flagd_proxy::introspection::procfs::meminfo()
        .ok()
        .and_then(|meminfo| meminfo.number("MemTotal"));
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": model,
        "memory_gib": memory_kib.map(|k| (k as f64 / 1048576.0 * 10.0).round() / 10.0),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
    })
}

/// The machine of [`machine`] in words: CPUs, their model, memory and kernel.
pub(crate) fn machine_line(m: &Value) -> String {
    format!(
        "{} CPUs ({}), {} GiB, Linux {}",
        m["cpus"],
        m["cpu_model"].as_str().unwrap_or("?"),
        m["memory_gib"],
        m["kernel"].as_str().unwrap_or("?"),
    )
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "–".to_owned())
}

/// One scenario's results, by proxy key, and why a proxy has none.
pub(crate) struct ScenarioRuns {
    pub(crate) scenario: Scenario,
    pub(crate) results: BTreeMap<&'static str, RunResult>,
    pub(crate) skipped: BTreeMap<&'static str, String>,
    /// Why a proxy's run failed, by proxy key.
    pub(crate) failed: BTreeMap<&'static str, String>,
}

pub(crate) type Getter = fn(&RunResult) -> Option<f64>;

/// A row of a scenario's table: name, value, digits.
pub(crate) type Row = (&'static str, Getter, usize);

/// The rows of a scenario's table: those of every scenario, then those that only some
/// scenarios have values for.
pub(crate) fn rows(runs: &ScenarioRuns) -> Vec<Row> {
    let mut rows = connect_rows();
    rows.extend(update_rows());
    rows.extend(cost_rows());
    let any = |f: fn(&RunResult) -> bool| runs.results.values().any(f);
    if any(|r| r.kib_per_resource.is_some()) {
        rows.push((
            "RSS per watched resource, with its subscribers (KiB)",
            |r| r.kib_per_resource,
            2,
        ));
    }
    if any(|r| r.apiserver_watches.is_some()) {
        rows.extend(kubernetes_rows());
    }
    if any(|r| r.storm.is_some()) {
        rows.extend(storm_rows());
    }
    if any(|r| r.killed_for_rss) {
        rows.push((
            "killed for RSS over --max-rss-mib",
            |r| Some(f64::from(u8::from(r.killed_for_rss))),
            0,
        ));
    }
    rows
}

/// Connecting the subscribers and their first snapshots.
fn connect_rows() -> Vec<Row> {
    vec![
        (
            "subscribers connected",
            |r| Some(r.subscribers_connected as f64),
            0,
        ),
        (
            "connect all subscribers (s)",
            |r| Some(r.connect_seconds),
            2,
        ),
        ("connect: CPU (s)", |r| Some(r.connect_cpu_seconds), 2),
        (
            "connect: load generator CPU (s)",
            |r| Some(r.connect_load_generator_cpu_seconds),
            2,
        ),
        (
            "time to first snapshot p50 (ms)",
            |r| r.first_snapshot.p50_ms,
            2,
        ),
        (
            "time to first snapshot p99 (ms)",
            |r| r.first_snapshot.p99_ms,
            2,
        ),
    ]
}

/// Paced updates and the burst.
fn update_rows() -> Vec<Row> {
    vec![
        ("propagation to all p50 (ms)", |r| r.propagation.p50_ms, 1),
        ("propagation to all p99 (ms)", |r| r.propagation.p99_ms, 1),
        ("propagation to all max (ms)", |r| r.propagation.max_ms, 1),
        ("first subscriber p50 (ms)", |r| r.first_receiver.p50_ms, 1),
        (
            "paced updates not delivered to all",
            |r| Some(r.updates_incomplete as f64),
            0,
        ),
        (
            "messages per subscriber per update",
            |r| Some(r.messages_per_subscriber_per_update),
            2,
        ),
        ("burst: convergence (ms)", |r| r.burst_convergence_ms, 1),
        (
            "burst: subscribers not on final version",
            |r| Some(r.stale_after_settle as f64),
            0,
        ),
    ]
}

/// Memory, CPU and errors.
fn cost_rows() -> Vec<Row> {
    vec![
        ("RSS, no subscribers (MiB)", |r| Some(r.rss_empty_mib), 1),
        ("RSS, subscribers idle (MiB)", |r| Some(r.rss_idle_mib), 1),
        (
            "RSS, during updates (MiB)",
            |r| Some(r.rss_after_updates_mib),
            1,
        ),
        ("RSS peak (VmHWM, MiB)", |r| Some(r.rss_peak_mib), 1),
        (
            "memory per idle subscriber (KiB)",
            |r| Some(r.kib_per_idle_subscriber),
            2,
        ),
        (
            "CPU while idle (% of a core)",
            |r| Some(r.cpu_idle_percent),
            2,
        ),
        ("CPU per update (s)", |r| Some(r.cpu_seconds_per_update), 3),
        (
            "bytes written per update (MiB)",
            |r| Some(r.bytes_written_per_update / (1024.0 * 1024.0)),
            1,
        ),
        ("CPU total (s)", |r| Some(r.cpu_seconds_total), 2),
        (
            "load generator CPU per update (s)",
            |r| Some(r.load_generator_cpu_seconds_per_update),
            3,
        ),
        (
            "load generator: large messages decoded per update",
            |r| Some(r.decoded_per_update),
            1,
        ),
        ("stream errors", |r| Some(r.stream_errors as f64), 0),
        (
            "first-snapshot failures",
            |r| Some(r.first_snapshot_failures as f64),
            0,
        ),
    ]
}

/// The API server, and resources nobody watched before (Kubernetes source).
fn kubernetes_rows() -> Vec<Row> {
    vec![
        (
            "API server: FeatureFlag watches open",
            (|r| r.apiserver_watches.map(|v| v as f64)) as Getter,
            0,
        ),
        (
            "API server: connections from the proxy",
            |r| r.apiserver_connections.map(|v| v as f64),
            0,
        ),
        (
            "new resource: time to first snapshot p50 (ms)",
            |r| r.cold_first_snapshot.p50_ms,
            1,
        ),
        (
            "new resource: time to first snapshot p99 (ms)",
            |r| r.cold_first_snapshot.p99_ms,
            1,
        ),
        (
            "new resource: failures",
            |r| Some(r.cold_first_snapshot_failures as f64),
            0,
        ),
    ]
}

/// The reconnect storm.
fn storm_rows() -> Vec<Row> {
    vec![
        (
            "storm: subscribers served again",
            (|r| r.storm.as_ref().map(|s| s.served_again as f64)) as Getter,
            0,
        ),
        (
            "storm: all served again after (s)",
            |r| r.storm.as_ref().and_then(|s| s.seconds_to_all),
            2,
        ),
        (
            "storm: reconnect to snapshot p50 (ms)",
            |r| {
                r.storm
                    .as_ref()
                    .and_then(|s| s.reconnect_to_snapshot.p50_ms)
            },
            1,
        ),
        (
            "storm: reconnect to snapshot p99 (ms)",
            |r| {
                r.storm
                    .as_ref()
                    .and_then(|s| s.reconnect_to_snapshot.p99_ms)
            },
            1,
        ),
        (
            "storm: attempts retried",
            |r| r.storm.as_ref().map(|s| s.retries as f64),
            0,
        ),
        (
            "storm: clients never served",
            |r| r.storm.as_ref().map(|s| s.gave_up as f64),
            0,
        ),
        (
            "storm: CPU (s)",
            |r| r.storm.as_ref().map(|s| s.cpu_seconds),
            2,
        ),
        (
            "storm: RSS peak (MiB)",
            |r| r.storm.as_ref().map(|s| s.rss_peak_mib),
            1,
        ),
        (
            "storm: /readyz slowest (ms)",
            |r| r.storm.as_ref().and_then(|s| s.readyz_max_ms),
            1,
        ),
        (
            "storm: /readyz failed",
            |r| r.storm.as_ref().map(|s| s.readyz_failures as f64),
            0,
        ),
        (
            "storm: /readyz probes",
            |r| r.storm.as_ref().map(|s| s.readyz_probes as f64),
            0,
        ),
        (
            "storm: update to the connected streams (ms)",
            |r| r.storm.as_ref().and_then(|s| s.witness_update_ms),
            1,
        ),
        (
            "storm: connected streams broken",
            |r| r.storm.as_ref().map(|s| s.witness_stream_errors as f64),
            0,
        ),
    ]
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
    let results = &runs.results;
    let mut out = heading(runs, streams_per_connection);
    let model = results.contains_key("model") || runs.skipped.contains_key("model");
    let floor = results.contains_key("floor") || runs.skipped.contains_key("floor");
    let mut header = format!("| metric | flagd-proxy (Rust) | {go_label} | Go / Rust |");
    let mut rule = String::from("|---|---:|---:|---:|");
    if model {
        header.push_str(&format!(" {} |", Kind::Model.label()));
        rule.push_str("---:|");
    }
    if floor {
        header.push_str(" floor | Rust / floor |");
        rule.push_str("---:|---:|");
    }
    out.push_str(&format!("{header}\n{rule}\n"));
    let cell = |key: &str, v: Option<f64>, digits: usize| match results.get(key) {
        Some(_) => fmt_opt(v, digits),
        None => runs
            .skipped
            .get(key)
            .cloned()
            .unwrap_or_else(|| "failed".to_owned()),
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:.2}", b / a),
        _ => "–".to_owned(),
    };
    for (name, get, digits) in rows(runs) {
        let value = |key: &str| results.get(key).and_then(get);
        let (r, g) = (value("rust"), value("go"));
        let mut line = format!(
            "| {name} | {} | {} | {} |",
            cell("rust", r, digits),
            cell("go", g, digits),
            ratio(r, g)
        );
        if model {
            line.push_str(&format!(" {} |", cell("model", value("model"), digits)));
        }
        if floor {
            let f = value("floor");
            let fc = if results.contains_key("floor") && f.is_none() {
                "–".to_owned()
            } else {
                cell("floor", f, digits)
            };
            line.push_str(&format!(" {fc} | {} |", ratio(f, r)));
        }
        out.push_str(&line);
        out.push('\n');
    }
    let churned: Vec<(&str, &churn::ChurnResult)> = results
        .values()
        .filter_map(|r| Some((r.proxy.as_str(), r.churn.as_ref()?)))
        .collect();
    if !churned.is_empty() {
        out.push('\n');
        out.push_str(&churn::table(&churned));
    }
    for (key, run) in results {
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
    out.push('\n');
    out
}

/// What the report says besides the tables, and the JSON's settings.
pub(crate) struct Summary<'a> {
    pub(crate) args: &'a Args,
    pub(crate) go_note: Option<String>,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
    pub(crate) machine: Value,
    pub(crate) seconds: f64,
    pub(crate) verdict: Verdict,
}

impl Summary<'_> {
    /// The Markdown report: the machine and settings, a table per scenario, the targets and the
    /// verdict.
    pub(crate) fn markdown(&self, runs: &[ScenarioRuns]) -> String {
        let (args, machine) = (self.args, &self.machine);
        let mut report = String::from("## flagd-proxy fan-out benchmark\n\n");
        report.push_str(&format!(
            "Machine: {} CPUs ({}), {} GiB, Linux {}. Load average before: {}; after: {}. Duration: {:.0} s.\n\n",
            machine["cpus"],
            machine["cpu_model"].as_str().unwrap_or("?"),
            machine["memory_gib"],
            machine["kernel"].as_str().unwrap_or("?"),
            self.load_before,
            self.load_after,
            self.seconds
        ));
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
        json!({
            "machine": self.machine,
            "load_average_before": self.load_before,
            "load_average_after": self.load_after,
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
        })
    }
}
