//! The report: the machine, a table per scenario (its rows are in `figures.rs`), and the
//! Markdown.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::args::Args;
use crate::churn;
use crate::figures::{Groups, figures};
use crate::kit::header::Header;
pub(crate) use crate::kit::header::{loadavg, machine};
use crate::kit::table::{Figure, Table, fmt_opt};
use crate::proxy::Kind;
use crate::scenario::{RunResult, ScenarioRuns};
use crate::targets::targets;
use crate::verdict::Verdict;

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
