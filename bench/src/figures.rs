//! The rows of a scenario's table for one proxy's result: those every scenario has, and the
//! groups (resources, Kubernetes, the storm) that only some results have values for.

use crate::kit::latency::Point::{Max, P50, P99};
use crate::kit::table::{Figure, absent, count, figure};
use crate::scenario::{RunResult, ScenarioRuns};
use crate::storm::StormResult;

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
