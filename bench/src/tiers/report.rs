//! The report of `--tiers`: per source, the table of every run, the faults and the targets.

use faults::FaultResult;
use serde_json::{Value, json};

use super::topology::TierResult;
use super::{Shape, SourceRuns, faults};
use crate::args::Args;
use crate::figures::watches_figure;
use crate::kit::header::Header;
use crate::kit::latency::Point::{Max, P50, P99};
use crate::kit::table::{
    Blank, Figure, Table, absent, count, figure, figure_table, fmt_opt, met_cell,
};

/// What the whole invocation shares.
pub(crate) struct Summary<'a> {
    pub(crate) args: &'a Args,
    pub(crate) go_note: Option<String>,
    pub(crate) header: Header,
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

/// The rows of the main table for one run.
fn figures(r: &TierResult) -> Vec<Figure> {
    let mut rows = vec![
        figure("node proxies (0: flat)", count(r.nodes), 0),
        figure("subscribers connected", count(r.connected), 0),
        figure("connect all subscribers (s)", Some(r.connect_seconds), 2),
    ];
    rows.extend(
        r.propagation
            .figures("propagation to all", 1, &[P50, P99, Max]),
    );
    rows.extend([
        figure(
            "paced updates not delivered to all",
            count(r.updates_incomplete),
            0,
        ),
        figure(
            "burst: subscribers not on the final version",
            count(r.stale_after_burst),
            0,
        ),
        figure(
            "stream errors (before the faults)",
            count(r.stream_errors),
            0,
        ),
    ]);
    rows.extend(cost_figures(r));
    rows
}

/// The CPU and memory of each tier, what the central serves, and the API server.
fn cost_figures(r: &TierResult) -> Vec<Figure> {
    vec![
        figure(
            "CPU per update: central (flat: the proxy) (s)",
            Some(r.central_cpu_per_update),
            4,
        ),
        figure(
            "CPU per update: node proxies together (s)",
            r.nodes_cpu_per_update,
            3,
        ),
        figure(
            "CPU per update: load generator (s)",
            Some(r.load_generator_cpu_per_update),
            3,
        ),
        figure(
            "RSS idle: central (flat: the proxy) (MiB)",
            Some(r.central_rss_mib),
            1,
        ),
        figure(
            "RSS idle per node proxy: mean (MiB)",
            r.node_rss_mib_mean,
            1,
        ),
        figure("RSS idle per node proxy: max (MiB)", r.node_rss_mib_max, 1),
        figure(
            "central: streams (`sync_active_streams`)",
            r.central_streams,
            0,
        ),
        figure("central: sync connections", r.central_connections, 0),
        figure("central: watches at its source", r.central_watches, 0),
        figure("node proxies: streams, together", r.node_streams, 0),
        watches_figure(r.apiserver_watches),
        figure(
            "API server: LIST/WATCH/GET on FeatureFlags, start to burst",
            r.apiserver_requests.and_then(count),
            0,
        ),
    ]
}

impl Summary<'_> {
    pub(crate) fn markdown(&self, sittings: &[SourceRuns], problems: &[String]) -> String {
        let args = self.args;
        let mut out = String::from("## Two tiers\n\n");
        out += &format!(
            "`--tiers`: {} node proxies; {} updates paced {:?} apart, a burst of {}; {} stream(s) per HTTP/2 connection.\n\n{}.\n\n",
            args.tier_nodes,
            args.updates,
            args.update_gap,
            args.burst,
            args.streams_per_connection,
            self.header.sentence()
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
        let columns: Vec<(&str, Vec<Figure>)> = present
            .iter()
            .map(|(name, r)| {
                let values = figures(r);
                let nothing = r.failed.is_some() && r.connected == 0;
                (*name, if nothing { absent(values) } else { values })
            })
            .collect();
        out += &figure_table(&columns, Blank::Keep, "l").markdown();
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
        self.header.stamp(json!({
            "scenario": "tiers",
            "go_note": self.go_note,
            "sittings": sittings,
            "problems": problems,
        }))
    }
}

fn faults_table(f: &FaultResult) -> String {
    let opt = |v: Option<f64>| fmt_opt(v, 0);
    let (outage, node) = (&f.outage, &f.node);
    let mut table = Table::new(["fault", "what happened"], "l");
    table.row([
        format!("central killed (SIGKILL), down {:.1} s, a version written meanwhile", outage.seconds),
        format!("streams ended: {}; subscribers off the last good version while down: {}; a new subscriber on a node proxy got {}; every subscriber on the new version {} ms after the central started again ({} ms after the change)",
        outage.streams_ended,
        outage.not_on_last_good,
        outage.new_subscriber,
        opt(outage.restart_to_all_ms),
        opt(outage.change_to_all_ms)
    )]);
    table.row(["one node proxy killed (SIGKILL) and started again".to_owned(), format!(
        "its streams ended: {} of {}; other streams ended: {}; its subscribers served again: {} of {}, {} ms after its start; central streams after: {} (one per node proxy and resource: {}); the next version reached all in {} ms",
        node.streams_ended,
        node.subscribers,
        node.others_ended,
        node.reconnected,
        node.subscribers,
        opt(node.restart_to_served_ms),
        fmt_opt(node.central_streams_after, 0),
        node.central_streams_expected,
        opt(node.next_to_all_ms)
    )]);
    for step in &f.rollout.steps {
        table.row([
            format!("rollout of the central: {}", step.step),
            format!(
                "a version written after the stop reached all in {} ms; stale: {}",
                opt(step.to_all_ms),
                step.stale
            ),
        ]);
    }
    table.row([
        "rollout, both steps".to_owned(),
        format!("streams ended: {}", f.rollout.streams_ended),
    ]);
    table.markdown() + "\n"
}

/// The targets, measured against the runs of one source.
fn targets(s: &SourceRuns, shape: Shape) -> String {
    let ok = |r: &Option<TierResult>| r.clone().filter(|r| r.failed.is_none());
    let (tiers, flat) = (ok(&s.tiers), ok(&s.flat));
    let mut checks = Vec::new();
    if let (Some(t), Some(f)) = (&tiers, &flat) {
        checks.extend(against_flat(t, f));
    }
    if let (Some(c), Some(f)) = (ok(&s.share_chained), ok(&s.share_flat))
        && let (Some(cp), Some(fp)) = (c.propagation.p50_ms, f.propagation.p50_ms)
    {
        checks.push((
            format!(
                "the extra hop adds ≤ 20 ms to the median ({} subscribers)",
                shape.per_node
            ),
            format!("{cp:.1} vs {fp:.1} ms: {:+.1} ms", cp - fp),
            Some(cp - fp <= 20.0),
        ));
    }
    if let Some(t) = &tiers {
        checks.extend(tier_checks(t, shape));
    }
    let mut table = Table::new(["target", "measured", "met"], "l");
    for (target, measured, met) in checks {
        table.row([target.as_str(), &measured, met_cell(met)]);
    }
    table.markdown() + "\n"
}

/// A target: what, the measured value, and whether it is met (`None`: shown, not judged).
type Check = (String, String, Option<bool>);

/// The two tiers against the flat run: the central's CPU and the propagation.
fn against_flat(t: &TierResult, f: &TierResult) -> Vec<Check> {
    let ratio = t.central_cpu_per_update / f.central_cpu_per_update;
    let mut checks = vec![(
        "central CPU per update with the node tier ≤ 1/100 of flat".to_owned(),
        format!(
            "{:.4} s vs {:.3} s = 1/{:.0}",
            t.central_cpu_per_update,
            f.central_cpu_per_update,
            1.0 / ratio
        ),
        Some(ratio <= 0.01),
    )];
    if let (Some(tp), Some(fp)) = (t.propagation.p99_ms, f.propagation.p99_ms) {
        checks.push((
            "propagation p99 through two tiers ≤ 1.25 × flat".to_owned(),
            format!("{tp:.0} vs {fp:.0} ms = {:.2} ×", tp / fp),
            Some(tp <= 1.25 * fp),
        ));
    }
    checks
}

/// The two tiers alone: node proxies' memory, the central's streams and the API server's
/// watches.
fn tier_checks(t: &TierResult, shape: Shape) -> Vec<Check> {
    let streams = (shape.nodes * shape.per_node.min(shape.resources)) as f64;
    let mut checks = vec![
        (
            format!("RSS per node proxy with {} subscribers", shape.per_node),
            format!(
                "mean {} MiB, max {} MiB",
                fmt_opt(t.node_rss_mib_mean, 1),
                fmt_opt(t.node_rss_mib_max, 1)
            ),
            None,
        ),
        (
            "central: one stream per node proxy and resource in use, over one connection per node proxy".to_owned(),
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
        ),
    ];
    if let Some(watches) = t.apiserver_watches {
        checks.push((
            "API server: one watch per resource".to_owned(),
            format!("{watches} watches, {} resources", shape.resources),
            Some(watches == shape.resources as u64),
        ));
    }
    checks
}
