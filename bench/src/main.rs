//! `flagd-proxy-bench`: fan-out benchmark for flagd sync proxies.
//!
//! Starts a proxy (this project's, the Go flagd-proxy when its binary is available, and the
//! floor: a minimal server that only writes, see `floor.rs`), opens many `flagd.sync.v1`
//! `SyncFlags` streams against it, rewrites the flag source files and measures how long each
//! version takes to reach every subscriber, whether every subscriber ends on the final version,
//! how long a new subscriber waits for its first snapshot, what the proxy process costs in memory
//! and CPU time, and, with `--storm`, how it takes every subscriber reconnecting at once (see
//! `storm.rs`). Prints a Markdown table and can write JSON. With `--soak`, it soaks this proxy
//! instead: hours of churn compressed, with the proxy's resources sampled and required to come
//! back to their baseline (see `soak.rs`). With `--tiers`, it measures the two tiers as a
//! system: a central proxy feeding node proxies, and their faults (see `tiers.rs`). With
//! `--costs`, it measures the unit costs the capacity model is built from (see `costs.rs`), and
//! `--capacity FILE` computes the model from them (see `capacity.rs`). With
//! `--authz-storm`, it counts the API requests this proxy's authorization makes when thousands
//! of clients of a few identities connect and reconnect at once (see `authz_storm.rs`). With
//! `--attacks`, it runs the hostile attacks of docs/security.md against this proxy and,
//! with `--baseline-bin`, against an earlier build (see `attacks.rs`).
//!
//! A run that finds the proxy under test incorrect (a subscriber missed an update, ended on an old
//! version or lost its stream; or the run itself failed) still prints and writes its report, then
//! names each scenario and what was wrong on standard error and exits with status 1. The proxy
//! under test is this project's proxy (the Go flagd-proxy with `--only-go`); the peers measured
//! beside it are reported the same way but do not change the exit status (see `verdict.rs`).
//!
//! The load generator shares the machine with the proxy, so it is kept cheap: one tokio runtime,
//! one task per stream, and responses are not decoded: the sequence number every version carries
//! is found by searching the raw message bytes.
//!
//! The modules are built in layers, each importing only from the layers below it (checked by
//! `tests/architecture.rs`), from the bottom:
//!
//! - leaves: `kit`, `sampling`, `messages`, `options` (the values the command line chooses),
//!   `documents` (the flag documents of each version);
//! - the command line (`args`), the load generator's streams (`load`), the floor (`floor`);
//! - the proxy processes (`proxy`);
//! - where the flags live (`sources`);
//! - subscribers and their reconnects (`churn`), paced updates (`pacing`);
//! - the reconnect storm (`storm`);
//! - a scenario and its result (`scenario`);
//! - its phases (`phases`);
//! - one run of a scenario against one proxy (`run`);
//! - the runs of a sitting (`sitting`), a result's rows (`figures`), the verdict (`verdict`);
//! - the targets (`targets`);
//! - the report (`report`);
//! - the other modes: `attacks`, `authz_storm`, `costs`, `soak`;
//! - the modes built on those: `capacity` (on `costs`), `tiers` (on `soak`).

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Parser;

use crate::args::Args;
use crate::kit::header::Clock;
use crate::report::Summary;
use crate::sampling::raise_fd_limit;
use crate::scenario::RunResult;
use crate::sitting::{Sitting, proxies, scenarios};
use crate::verdict::Verdict;

mod args;
mod attacks;
mod authz_storm;
mod capacity;
mod churn;
mod costs;
mod documents;
mod figures;
mod floor;
mod kit;
mod load;
mod messages;
mod options;
mod pacing;
mod phases;
mod proxy;
mod report;
mod run;
mod sampling;
mod scenario;
mod sitting;
mod soak;
mod sources;
mod storm;
mod targets;
mod tiers;
mod verdict;

const SYNC_PATH: &str = "/flagd.sync.v1.FlagSyncService/SyncFlags";
/// Every version carries its sequence number as `"benchSeq":<n>` in a flag's metadata.
const SEQ_MARKER: &[u8] = b"\"benchSeq\":";
/// The flag carrying the sequence number; its key sorts first so the marker is found early.
const SEQ_FLAG: &str = "aaa-bench-seq";
/// A message whose sequence number could not be found.
const NO_SEQ: u64 = u64::MAX;
/// A phase (first-snapshot samples, paced updates) stops after this many failures in a row, so a
/// proxy that has stopped serving does not hold the run for every timeout.
const GIVE_UP_AFTER: u64 = 3;

fn main() -> anyhow::Result<ExitCode> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(floor::FLOOR_COMMAND) {
        let number = |i: usize| -> anyhow::Result<usize> {
            Ok(argv
                .get(i)
                .context("floor server: missing argument")?
                .parse()?)
        };
        floor::serve(u16::try_from(number(2)?)?, number(3)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if argv.get(1).map(String::as_str) == Some(tiers::BALANCER_COMMAND) {
        tiers::balancer::serve(&argv[2..])?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut args = Args::parse();
    if let Some(path) = &args.capacity {
        return capacity::report::main(path, args.markdown.as_deref());
    }
    args.apply_smoke();
    if args.subscribers == 0 || args.streams_per_connection == 0 || args.source_addrs == 0 {
        bail!("--subscribers, --streams-per-connection and --source-addrs must be positive");
    }
    if args.resources.contains(&0) {
        bail!("--resources must be positive");
    }
    // The costs' probes open up to 8,000 subscribers whatever --subscribers says.
    let most = if args.costs { 8_000 } else { args.subscribers };
    raise_fd_limit(most.max(args.subscribers) + args.first_snapshot_samples + 1024)?;
    load::ACCEPT_GZIP.store(args.accept_gzip, std::sync::atomic::Ordering::Relaxed);
    messages::DECODE_EACH.store(args.decode_each, std::sync::atomic::Ordering::Relaxed);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    if args.soak || args.tiers || args.costs || args.authz_storm || args.attacks {
        let status = if args.soak {
            runtime.block_on(soak::main(&args))?
        } else if args.costs {
            runtime.block_on(costs::main(&args))?
        } else if args.attacks {
            runtime.block_on(attacks::main(&args))?
        } else if args.tiers {
            runtime.block_on(tiers::main(&args))?
        } else {
            runtime.block_on(authz_storm::main(&args))?
        };
        runtime.shutdown_background();
        return Ok(ExitCode::from(status));
    }
    let verdict = runtime.block_on(run(args))?;
    // Subscriber tasks may still be parked; do not wait for them.
    runtime.shutdown_background();
    for message in verdict.messages() {
        eprintln!("flagd-proxy-bench: {message}");
    }
    Ok(ExitCode::from(verdict.exit_code()))
}

/// Runs every scenario against every proxy, prints and writes the report; what it found.
async fn run(args: Args) -> anyhow::Result<Verdict> {
    let (kinds, go_note) = proxies(&args)?;
    let workdir = std::env::temp_dir().join(format!("flagd-proxy-bench-{}", std::process::id()));
    std::fs::create_dir_all(&workdir)?;
    let clock = Clock::start();
    let mut runs = Vec::new();
    // The floor does not depend on the source: one run per payload serves every source.
    let mut floors: BTreeMap<usize, RunResult> = BTreeMap::new();
    for scenario in scenarios(&args) {
        let mut sitting = Sitting {
            args: &args,
            workdir: &workdir,
            floors: &mut floors,
        };
        runs.push(sitting.run(scenario, &kinds, go_note.is_some()).await);
    }
    let summary = Summary {
        args: &args,
        go_note,
        header: clock.stop(),
        verdict: Verdict::of(&runs, &args),
    };
    let report = summary.markdown(&runs);
    println!("{report}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&summary.json(&runs))?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.keep_workdir {
        eprintln!("working directory kept: {}", workdir.display());
    } else {
        let _ = std::fs::remove_dir_all(&workdir);
    }
    Ok(summary.verdict)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::documents::flags;
    use crate::kit::latency::Stats;
    use crate::messages::find_seq;

    #[test]
    fn finds_the_sequence_number() {
        let doc = json!({"flags": flags(1234, 2048)}).to_string();
        assert_eq!(find_seq(doc.as_bytes()), Some(1234));
        assert_eq!(find_seq(b"{\"flags\":{}}"), None);
    }

    #[test]
    fn documents_have_about_the_asked_size() {
        for payload in [1024, 102_400] {
            let len = json!({"flags": flags(1, payload)}).to_string().len();
            assert!(
                len <= payload && len > payload * 3 / 4,
                "{len} for {payload}"
            );
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let stats = Stats::of((1..=100).map(f64::from).collect());
        assert_eq!(
            (stats.p50_ms, stats.p99_ms, stats.max_ms),
            (Some(50.0), Some(99.0), Some(100.0))
        );
    }
}
