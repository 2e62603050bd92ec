//! `flagd-proxy-bench`: fan-out benchmark for flagd sync proxies.
//!
//! Starts a proxy (this project's, the Go flagd-proxy when its binary is available, and the
//! floor: a minimal server that only writes, see `floor.rs`), opens many `flagd.sync.v1`
//! `SyncFlags` streams against it, rewrites the flag source files and measures how long each
//! version takes to reach every subscriber, whether every subscriber ends on the final version,
//! how long a new subscriber waits for its first snapshot, what the proxy process costs in memory
//! and CPU time, and, with `--storm`, how it takes every subscriber reconnecting at once (see
//! `storm.rs`). Prints a Markdown table and can write JSON.
//!
//! The load generator shares the machine with the proxy, so it is kept cheap: one tokio runtime,
//! one task per stream, and responses are not decoded: the sequence number every version carries
//! is found by searching the raw message bytes.

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Buf, BufMut};
use clap::Parser;
use futures::StreamExt;
use serde_json::{Value, json};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Request, Status};

use flagd_proxy::wire::proto::client::flagd_sync_v1::SyncFlagsRequest;

// The same control plane the integration tests use: etcd and kube-apiserver on loopback.
use flagd_proxy_testkit::control_plane::{self, ControlPlane, free_port};

mod args;
mod floor;
mod load;
mod phases;
mod proxy;
mod report;
mod sampling;
mod scenario;
mod sources;
mod storm;
mod targets;

use args::*;
use load::*;
use phases::*;
use proxy::*;
use report::*;
use sampling::*;
use scenario::*;
use sources::*;
use targets::*;

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

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(floor::FLOOR_COMMAND) {
        let number = |i: usize| -> anyhow::Result<usize> {
            Ok(argv
                .get(i)
                .context("floor server: missing argument")?
                .parse()?)
        };
        floor::serve(u16::try_from(number(2)?)?, number(3)?)?;
        return Ok(());
    }
    let mut args = Args::parse();
    args.apply_smoke();
    if args.subscribers == 0 || args.streams_per_connection == 0 || args.source_addrs == 0 {
        bail!("--subscribers, --streams-per-connection and --source-addrs must be positive");
    }
    if args.resources.contains(&0) {
        bail!("--resources must be positive");
    }
    raise_fd_limit(args.subscribers + args.first_snapshot_samples + 1024)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    let ok = runtime.block_on(run(args))?;
    // Subscriber tasks may still be parked; do not wait for them.
    runtime.shutdown_background();
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

/// The Go flagd-proxy when none is given: `FLAGD_PROXY_GO_BIN`, else `../shared/bin/flagd-proxy-go`
/// beside this repository, else the one scripts/install-go-proxy.sh installs in the cache.
fn default_go_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("FLAGD_PROXY_GO_BIN") {
        return Some(PathBuf::from(bin));
    }
    let beside = flagd_proxy_testkit::repo_root().join("../shared/bin/flagd-proxy-go");
    if beside.exists() {
        return Some(beside);
    }
    let cache = std::env::var_os("FLAGD_PROXY_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/flagd-proxy"))
        })?;
    let bin = cache.join("bin/flagd-proxy-go");
    bin.exists().then_some(bin)
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let (kinds, go_note) = proxies(&args)?;
    let workdir = std::env::temp_dir().join(format!("flagd-proxy-bench-{}", std::process::id()));
    std::fs::create_dir_all(&workdir)?;
    let load_before = loadavg();
    let started = Instant::now();
    let mut runs = Vec::new();
    let mut ok = true;
    // The floor does not depend on the source: one run per payload serves every source.
    let mut floors: BTreeMap<usize, RunResult> = BTreeMap::new();
    for scenario in scenarios(&args) {
        let mut sitting = Sitting {
            args: &args,
            workdir: &workdir,
            floors: &mut floors,
            ok: &mut ok,
        };
        runs.push(sitting.run(scenario, &kinds, go_note.is_some()).await);
    }
    let summary = Summary {
        args: &args,
        go_note,
        load_before,
        load_after: loadavg(),
        machine: machine(),
        seconds: started.elapsed().as_secs_f64(),
        ok,
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
    Ok(ok)
}

/// The proxies to run, each with its binary.
type Proxies = Vec<(Kind, PathBuf)>;

/// The proxies to run, and why the Go proxy is not among them.
fn proxies(args: &Args) -> anyhow::Result<(Proxies, Option<String>)> {
    let rust_bin = match &args.proxy_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory for this program")?
            .join("flagd-proxy"),
    };
    let mut kinds = Vec::new();
    if !args.only_go {
        if !rust_bin.exists() {
            bail!(
                "{} not found: build it (cargo build --release --bin flagd-proxy) or pass --proxy-bin",
                rust_bin.display()
            );
        }
        kinds.push((Kind::Rust, rust_bin.clone()));
    }
    let go_note = if args.no_go {
        Some("the Go flagd-proxy was not run (--no-go)".to_owned())
    } else {
        match args.go_proxy_bin.clone().or_else(default_go_bin) {
            Some(bin) if bin.exists() => {
                kinds.push((Kind::Go, bin));
                None
            }
            _ => Some(
                "the Go flagd-proxy was not run: no binary (run scripts/install-go-proxy.sh or pass --go-proxy-bin)"
                    .to_owned(),
            ),
        }
    };
    if let Some(note) = &go_note {
        eprintln!("note: {note}");
    }
    if let Some(model) = &args.go_model_bin {
        kinds.push((Kind::Model, model.clone()));
    }
    if !args.no_floor && args.streams_per_connection == 1 {
        kinds.push((Kind::Floor, std::env::current_exe()?));
    }
    if kinds.is_empty() {
        bail!("nothing to run");
    }
    Ok((kinds, go_note))
}

/// Every combination of the listed sources, payloads and resource counts.
fn scenarios(args: &Args) -> Vec<Scenario> {
    let mut scenarios = Vec::new();
    for &source in &args.source {
        for &payload in &args.payload_bytes {
            for &resources in &args.resources {
                scenarios.push(Scenario {
                    source,
                    subscribers: args.subscribers,
                    resources,
                    payload,
                    tls: args.tls,
                });
            }
        }
    }
    scenarios
}

/// What the scenarios of one invocation share.
struct Sitting<'a> {
    args: &'a Args,
    workdir: &'a Path,
    /// The floor's result per payload, reused by the scenarios of other sources.
    floors: &'a mut BTreeMap<usize, RunResult>,
    /// Whether this project's proxy has been correct so far.
    ok: &'a mut bool,
}

impl Sitting<'_> {
    /// One scenario against every proxy that applies to it.
    async fn run(
        &mut self,
        scenario: Scenario,
        kinds: &[(Kind, PathBuf)],
        go_not_run: bool,
    ) -> ScenarioRuns {
        let mut results = BTreeMap::new();
        let mut skipped = BTreeMap::new();
        if go_not_run {
            skipped.insert(Kind::Go.key(), "not run".to_owned());
        }
        for (kind, bin) in kinds {
            if let Some(reason) = skip_reason(*kind, scenario) {
                skipped.insert(kind.key(), reason.to_owned());
                continue;
            }
            if *kind == Kind::Floor
                && let Some(floor) = self.floors.get(&scenario.payload)
            {
                results.insert(kind.key(), floor.clone());
                continue;
            }
            if let Some(result) = self.run_one(*kind, bin, scenario).await {
                results.insert(kind.key(), result);
            }
            // Let sockets and the scheduler calm down between runs.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        ScenarioRuns {
            scenario,
            results,
            skipped,
        }
    }

    /// One scenario against one proxy; `None` when the run failed.
    async fn run_one(&mut self, kind: Kind, bin: &Path, scenario: Scenario) -> Option<RunResult> {
        let label = match kind {
            Kind::Go => self.args.go_label.as_str(),
            _ => kind.label(),
        };
        eprintln!(
            "{label}: {} subscribers, {} resource(s), {} B payload, {} source{}",
            scenario.subscribers,
            scenario.resources,
            scenario.payload,
            scenario.source.label(),
            if scenario.tls { ", TLS" } else { "" }
        );
        match run_one(kind, bin, scenario, self.args, self.workdir).await {
            Ok(result) => {
                if kind == Kind::Rust && !result.correct(scenario.subscribers) {
                    *self.ok = false;
                }
                if kind == Kind::Floor {
                    self.floors.insert(scenario.payload, result.clone());
                }
                Some(result)
            }
            Err(error) => {
                eprintln!("  {label} failed: {error:#}");
                if kind == Kind::Rust {
                    *self.ok = false;
                }
                None
            }
        }
    }
}

/// Why a proxy does not run a scenario (shown in its column), if it does not.
fn skip_reason(kind: Kind, scenario: Scenario) -> Option<&'static str> {
    match kind {
        Kind::Go | Kind::Model if scenario.tls => Some("no TLS"),
        Kind::Floor if scenario.tls => Some("plain only"),
        Kind::Floor if scenario.resources > 1 => Some("–"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
