//! The report of `--tiers`: per source, the table of every run, the faults and the targets.

use faults::FaultResult;
use serde_json::{Value, json};

use super::topology::TierResult;
use super::{Shape, SourceRuns, faults};
use crate::args::Args;
use crate::report::{fmt_opt, machine};

/// What the whole invocation shares.
pub(crate) struct Summary<'a> {
    pub(crate) args: &'a Args,
    pub(crate) go_note: Option<String>,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
    pub(crate) seconds: f64,
}

/// The problems of this proxy in every run (the Go flagd-proxy's are shown, not counted).
pub(crate) fn problems(sittings: &[SourceRuns]) -> Vec<String> {
    let mut problems = Vec::new();
    for s in sittings {
        for (name, run) in columns(s) {
            let Some(run) = run else { continue };
            if run.peer {
                continue;
            }
            for problem in run.problems() {
                problems.push(format!("{} source, {name}: {problem}", s.source));
            }
        }
    }
    problems
}

/// The columns of a source's table, in order.
fn columns(s: &SourceRuns) -> [(&'static str, Option<&TierResult>); 5] {
    [
        ("two tiers", s.tiers.as_ref()),
        ("flat, this proxy", s.flat.as_ref()),
        ("flat, Go flagd-proxy", s.flat_go.as_ref()),
        (
            "one node's share, reading the source",
            s.share_flat.as_ref(),
        ),
        ("one node's share, chained", s.share_chained.as_ref()),
    ]
}

type Cell = fn(&TierResult) -> Option<f64>;

/// The rows of the main table: name, value, digits.
const ROWS: &[(&str, Cell, usize)] = &[
    ("node proxies (0: flat)", |r| Some(r.nodes as f64), 0),
    ("subscribers connected", |r| Some(r.connected as f64), 0),
    (
        "connect all subscribers (s)",
        |r| Some(r.connect_seconds),
        2,
    ),
    ("propagation to all p50 (ms)", |r| r.propagation.p50_ms, 1),
    ("propagation to all p99 (ms)", |r| r.propagation.p99_ms, 1),
    ("propagation to all max (ms)", |r| r.propagation.max_ms, 1),
    (
        "paced updates not delivered to all",
        |r| Some(r.updates_incomplete as f64),
        0,
    ),
    (
        "burst: subscribers not on the final version",
        |r| Some(r.stale_after_burst as f64),
        0,
    ),
    (
        "stream errors (before the faults)",
        |r| Some(r.stream_errors as f64),
        0,
    ),
    (
        "CPU per update: central (flat: the proxy) (s)",
        |r| Some(r.central_cpu_per_update),
        4,
    ),
    (
        "CPU per update: node proxies together (s)",
        |r| r.nodes_cpu_per_update,
        3,
    ),
    (
        "CPU per update: load generator (s)",
        |r| Some(r.load_generator_cpu_per_update),
        3,
    ),
    (
        "RSS idle: central (flat: the proxy) (MiB)",
        |r| Some(r.central_rss_mib),
        1,
    ),
    (
        "RSS idle per node proxy: mean (MiB)",
        |r| r.node_rss_mib_mean,
        1,
    ),
    (
        "RSS idle per node proxy: max (MiB)",
        |r| r.node_rss_mib_max,
        1,
    ),
    (
        "central: streams (`sync_active_streams`)",
        |r| r.central_streams,
        0,
    ),
    ("central: sync connections", |r| r.central_connections, 0),
    ("central: watches at its source", |r| r.central_watches, 0),
    ("node proxies: streams, together", |r| r.node_streams, 0),
    (
        "API server: FeatureFlag watches open",
        |r| r.apiserver_watches.map(|v| v as f64),
        0,
    ),
    (
        "API server: LIST/WATCH/GET on FeatureFlags, start to burst",
        |r| r.apiserver_requests.map(|v| v as f64),
        0,
    ),
];

impl Summary<'_> {
    pub(crate) fn markdown(&self, sittings: &[SourceRuns], problems: &[String]) -> String {
        let args = self.args;
        let mut out = String::from("## Two tiers\n\n");
        out += &format!(
            "`--tiers`: {} node proxies; {} updates paced {:?} apart, a burst of {}; {} stream(s) per HTTP/2 connection; {} s in all; load average {} before, {} after.\n\n",
            args.tier_nodes,
            args.updates,
            args.update_gap,
            args.burst,
            args.streams_per_connection,
            self.seconds.round(),
            self.load_before,
            self.load_after
        );
        if let Some(note) = &self.go_note {
            out += &format!("Note: {note}.\n\n");
        }
        for s in sittings {
            out += &self.sitting(s);
        }
        out += &if problems.is_empty() {
            "Verdict: every subscriber got every update through both tiers, and every fault healed.\n".to_owned()
        } else {
            format!(
                "Verdict: **FAILED**\n\n{}\n",
                problems
                    .iter()
                    .map(|p| format!("- {p}\n"))
                    .collect::<String>()
            )
        };
        out
    }

    fn sitting(&self, s: &SourceRuns) -> String {
        let Some(shape) = s.shape else {
            return String::new();
        };
        let mut out = format!(
            "### {} subscribers: {} node proxies × {}, {} resource(s), {} B payload, {} source\n\n",
            shape.subscribers(),
            shape.nodes,
            shape.per_node,
            shape.resources,
            shape.payload,
            s.source
        );
        let present: Vec<_> = columns(s)
            .into_iter()
            .filter_map(|(n, r)| Some((n, r?)))
            .collect();
        out += &format!(
            "| | {} |\n|---|{}\n",
            present
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(" | "),
            "---|".repeat(present.len())
        );
        for (name, cell, digits) in ROWS {
            let values: Vec<String> = present
                .iter()
                .map(|(_, r)| {
                    if r.failed.is_some() && r.connected == 0 {
                        "–".to_owned()
                    } else {
                        fmt_opt(cell(r), *digits)
                    }
                })
                .collect();
            out += &format!("| {name} | {} |\n", values.join(" | "));
        }
        out += "\n";
        for (name, run) in &present {
            if let Some(error) = &run.failed {
                out += &format!("{name}: failed or cut short: {error}\n\n");
            }
        }
        let churned: Vec<(&str, &crate::churn::ChurnResult)> = present
            .iter()
            .filter_map(|(name, r)| Some((*name, r.churn.as_ref()?)))
            .collect();
        out += &crate::churn::table(&churned);
        if let Some(faults) = s.tiers.as_ref().and_then(|t| t.faults.as_ref()) {
            out += &faults_table(faults);
        }
        out += &targets(s, shape);
        out
    }

    pub(crate) fn json(&self, sittings: &[SourceRuns], problems: &[String]) -> Value {
        json!({
            "scenario": "tiers",
            "machine": machine(),
            "load_before": self.load_before,
            "load_after": self.load_after,
            "seconds": self.seconds,
            "go_note": self.go_note,
            "sittings": sittings,
            "problems": problems,
        })
    }
}

fn faults_table(f: &FaultResult) -> String {
    let opt = |v: Option<f64>| fmt_opt(v, 0);
    let mut out = String::from("| fault | what happened |\n|---|---|\n");
    out += &format!(
        "| central killed (SIGKILL), down {:.1} s, a version written meanwhile | streams ended: {}; subscribers off the last good version while down: {}; a new subscriber on a node proxy got {}; every subscriber on the new version {} ms after the central started again ({} ms after the change) |\n",
        f.outage_seconds,
        f.outage_streams_ended,
        f.outage_not_on_last_good,
        f.outage_new_subscriber,
        opt(f.restart_to_all_ms),
        opt(f.change_to_all_ms)
    );
    out += &format!(
        "| one node proxy killed (SIGKILL) and started again | its streams ended: {} of {}; other streams ended: {}; its subscribers served again: {} of {}, {} ms after its start; central streams after: {} (one per node proxy and resource: {}); the next version reached all in {} ms |\n",
        f.killed_node_streams_ended,
        f.killed_node_subscribers,
        f.other_streams_ended,
        f.node_reconnected,
        f.killed_node_subscribers,
        opt(f.node_restart_to_served_ms),
        fmt_opt(f.central_streams_after, 0),
        f.central_streams_expected,
        opt(f.after_node_to_all_ms)
    );
    for step in &f.rollout {
        out += &format!(
            "| rollout of the central: {} | a version written after the stop reached all in {} ms; stale: {} |\n",
            step.step,
            opt(step.to_all_ms),
            step.stale
        );
    }
    out += &format!(
        "| rollout, both steps | streams ended: {} |\n\n",
        f.rollout_streams_ended
    );
    out
}

/// The targets, measured against the runs of one source.
fn targets(s: &SourceRuns, shape: Shape) -> String {
    let mut out = String::from("| target | measured | met |\n|---|---|---|\n");
    let mut row = |target: &str, measured: String, met: Option<bool>| {
        let met = match met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "–",
        };
        out += &format!("| {target} | {measured} | {met} |\n");
    };
    let ok = |r: &Option<TierResult>| r.clone().filter(|r| r.failed.is_none());
    let (tiers, flat) = (ok(&s.tiers), ok(&s.flat));
    if let (Some(t), Some(f)) = (&tiers, &flat) {
        let ratio = t.central_cpu_per_update / f.central_cpu_per_update;
        row(
            "central CPU per update with the node tier ≤ 1/100 of flat",
            format!(
                "{:.4} s vs {:.3} s = 1/{:.0}",
                t.central_cpu_per_update,
                f.central_cpu_per_update,
                1.0 / ratio
            ),
            Some(ratio <= 0.01),
        );
        if let (Some(tp), Some(fp)) = (t.propagation.p99_ms, f.propagation.p99_ms) {
            row(
                "propagation p99 through two tiers ≤ 1.25 × flat",
                format!("{tp:.0} vs {fp:.0} ms = {:.2} ×", tp / fp),
                Some(tp <= 1.25 * fp),
            );
        }
    }
    if let (Some(c), Some(f)) = (ok(&s.share_chained), ok(&s.share_flat))
        && let (Some(cp), Some(fp)) = (c.propagation.p50_ms, f.propagation.p50_ms)
    {
        row(
            &format!(
                "the extra hop adds ≤ 20 ms to the median ({} subscribers)",
                shape.per_node
            ),
            format!("{cp:.1} vs {fp:.1} ms: {:+.1} ms", cp - fp),
            Some(cp - fp <= 20.0),
        );
    }
    if let Some(t) = &tiers {
        row(
            &format!("RSS per node proxy with {} subscribers", shape.per_node),
            format!(
                "mean {} MiB, max {} MiB",
                fmt_opt(t.node_rss_mib_mean, 1),
                fmt_opt(t.node_rss_mib_max, 1)
            ),
            None,
        );
        let streams = (shape.nodes * shape.per_node.min(shape.resources)) as f64;
        row(
            "central: one stream per node proxy and resource in use, over one connection per node proxy",
            format!(
                "{} streams over {} connections (expected {streams} over {})",
                fmt_opt(t.central_streams, 0),
                fmt_opt(t.central_connections, 0),
                shape.nodes
            ),
            Some(
                t.central_streams == Some(streams)
                    && t.central_connections == Some(shape.nodes as f64),
            ),
        );
        if let Some(watches) = t.apiserver_watches {
            row(
                "API server: one watch per resource",
                format!("{watches} watches, {} resources", shape.resources),
                Some(watches == shape.resources as u64),
            );
        }
    }
    out + "\n"
}
