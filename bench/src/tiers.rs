//! The two tiers as a system (`--tiers`): one central proxy (files or Kubernetes) behind one
//! address, node proxies chained to it with `--upstream`, and the subscribers spread over the
//! node proxies. Measured: connect all, propagation to all through both tiers (clocked from the
//! change at the source), CPU per update and RSS of each tier, streams and connections at the
//! central, API-server watches and requests; then the faults of `faults.rs`.
//!
//! Beside it, in the same invocation and with the same subscribers: the flat runs of
//! `scenario.rs` (this proxy and the Go flagd-proxy serving every subscriber alone), and the
//! extra hop on its own: one node proxy's share of subscribers on a proxy reading the source
//! itself against the same share on one node proxy chained to the central.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::args::Args;
use crate::kit::header::Clock;
use crate::options::SourceKind;
use crate::proxy::{Kind, ProxyProcess};
use crate::run::run_one;
use crate::scenario::Scenario;
use crate::sitting::{proxies, rust_bin};
use crate::soak;
use crate::verdict::publish;

pub(crate) mod balancer;
pub(crate) mod faults;
pub(crate) mod measure;
pub(crate) mod report;
pub(crate) mod topology;

use flagd_proxy::introspection::Samples;
use topology::{TierResult, Topology};

/// The first argument that makes this program the central tier's balancer (`balancer.rs`).
pub(crate) const BALANCER_COMMAND: &str = "__tiers-balancer";

/// How long a fault may take to heal (every subscriber on the newest version) before it counts
/// as not healed.
const FAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// One topology: the source, the node proxies and their subscribers.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub(crate) struct Shape {
    pub(crate) source: SourceKind,
    pub(crate) nodes: usize,
    pub(crate) per_node: usize,
    pub(crate) resources: usize,
    pub(crate) payload: usize,
    /// Run the faults after the burst.
    pub(crate) faults: bool,
}

impl Shape {
    pub(crate) fn subscribers(&self) -> usize {
        self.nodes * self.per_node
    }

    /// The flat scenario with the same subscribers on one proxy.
    fn flat(&self, subscribers: usize) -> Scenario {
        Scenario {
            source: self.source,
            subscribers,
            resources: self.resources,
            payload: self.payload,
            tls: false,
        }
    }
}

/// Every column of one source's table.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct SourceRuns {
    pub(crate) source: String,
    pub(crate) shape: Option<Shape>,
    /// The two tiers, with the faults.
    pub(crate) tiers: Option<TierResult>,
    /// The same subscribers on this proxy alone, and on the Go flagd-proxy alone.
    pub(crate) flat: Option<TierResult>,
    pub(crate) flat_go: Option<TierResult>,
    /// One node proxy's share: on a proxy reading the source, and on one chained node proxy.
    pub(crate) share_flat: Option<TierResult>,
    pub(crate) share_chained: Option<TierResult>,
}

/// `--tiers`: every source of `--source`, printed and written; the exit status (1 when this
/// proxy was found incorrect in any run).
pub(crate) async fn main(args: &Args) -> anyhow::Result<u8> {
    let (kinds, go_note) = proxies(args)?;
    let bin = rust_bin(args)?;
    let go = kinds.iter().find(|(k, _)| *k == Kind::Go).map(|(_, b)| b);
    let workdir =
        std::env::temp_dir().join(format!("flagd-proxy-bench-tiers-{}", std::process::id()));
    std::fs::create_dir_all(&workdir)?;
    let clock = Clock::start();
    let nodes = args.tier_nodes.max(1);
    let mut sittings = Vec::new();
    for &source in &args.source {
        let shape = Shape {
            source,
            nodes,
            per_node: (args.subscribers / nodes).max(1),
            resources: args.resources.first().copied().unwrap_or(1),
            payload: args.payload_bytes.first().copied().unwrap_or(1024),
            faults: true,
        };
        sittings.push(sitting(args, &workdir, &bin, go, shape).await);
    }
    let summary = report::Summary {
        args,
        go_note,
        header: clock.stop(),
    };
    let problems = report::problems(&sittings);
    let markdown = summary.markdown(&sittings, &problems);
    publish(
        args,
        &workdir,
        &markdown,
        || summary.json(&sittings, &problems),
        &problems,
    )
}

/// One source: the flat runs, the hop runs and the two tiers, one after the other.
async fn sitting(
    args: &Args,
    workdir: &Path,
    bin: &Path,
    go: Option<&PathBuf>,
    shape: Shape,
) -> SourceRuns {
    let mut sitting = SourceRuns {
        source: shape.source.label().to_owned(),
        shape: Some(shape),
        ..SourceRuns::default()
    };
    let n = shape.subscribers();
    if !args.no_flat {
        sitting.flat = Some(flat(args, workdir, Kind::Rust, bin, shape.flat(n)).await);
        if let Some(go) = go {
            sitting.flat_go = Some(flat(args, workdir, Kind::Go, go, shape.flat(n)).await);
        }
        let share = shape.flat(shape.per_node);
        sitting.share_flat = Some(flat(args, workdir, Kind::Rust, bin, share).await);
        let chained = Shape {
            nodes: 1,
            faults: false,
            ..shape
        };
        sitting.share_chained = Some(chained_run(args, workdir, bin, chained, "share").await);
    }
    sitting.tiers = Some(chained_run(args, workdir, bin, shape, "tiers").await);
    sitting
}

/// A flat run (`scenario.rs`): every subscriber on one proxy.
async fn flat(
    args: &Args,
    workdir: &Path,
    kind: Kind,
    bin: &Path,
    scenario: Scenario,
) -> TierResult {
    eprintln!("{} flat: {}", kind.label_in(args), scenario.label());
    let result = run_one(kind, bin, scenario, args, workdir).await;
    // Let sockets and the scheduler calm down between runs.
    tokio::time::sleep(Duration::from_secs(1)).await;
    match result {
        Ok(result) => TierResult::of_flat(kind, &result, scenario.subscribers),
        Err(error) => {
            eprintln!("  failed: {error:#}");
            TierResult::failed(kind.label_in(args), format!("{error:#}"))
        }
    }
}

/// A run of the two tiers (`topology.rs`), named `name` in the working directory.
async fn chained_run(
    args: &Args,
    workdir: &Path,
    bin: &Path,
    shape: Shape,
    name: &str,
) -> TierResult {
    eprintln!(
        "two tiers: {} node proxies × {} subscribers, {} resource(s), {} source",
        shape.nodes,
        shape.per_node,
        shape.resources,
        shape.source.label()
    );
    let dir = workdir.join(format!("{name}-{}", shape.source.label()));
    let result = match Topology::start(args, &dir, bin, shape).await {
        Ok(mut topology) => {
            let result = topology.run().await;
            topology.stop().await;
            result
        }
        Err(error) => Err(error),
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    result.unwrap_or_else(|error| {
        eprintln!("  failed: {error:#}");
        TierResult::failed("two tiers", format!("{error:#}"))
    })
}

/// A free loopback port below the kernel's ephemeral range, so that no outgoing connection can
/// take it while its proxy is down (killed, or not started yet: the rollout's second replica)
/// and it can be bound again.
pub(crate) fn stable_port() -> anyhow::Result<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    // 8,000 ports below the range, from a place that differs between concurrent runs.
    let span = 8000.min(low - 1024);
    let start = std::process::id() % span;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(low - span + offset)?;
        if std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port below {low}")
}

/// A proxy process of one tier, started again on the same ports after it is killed.
pub(crate) struct Tier {
    bin: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    pub(crate) port: u16,
    pub(crate) management_port: u16,
    pub(crate) process: Option<ProxyProcess>,
}

impl Tier {
    /// A proxy on free loopback ports, with `source` arguments (where its flags come from) and
    /// `extra` (`--proxy-arg`); not started yet.
    pub(crate) fn new(
        bin: &Path,
        log: PathBuf,
        source: Vec<String>,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let (port, management_port) = (stable_port()?, stable_port()?);
        let mut args: Vec<String> = [
            "start",
            "--bind-address",
            "127.0.0.1",
            // Every subscriber connects from 127.0.0.1; lift the per-address cap.
            "--max-connections-per-address",
            "0",
        ]
        .map(str::to_owned)
        .into();
        args.extend(["--port".to_owned(), port.to_string()]);
        args.extend(["--management-port".to_owned(), management_port.to_string()]);
        args.extend(source);
        args.extend(extra.iter().cloned());
        Ok(Self {
            bin: bin.to_owned(),
            args,
            log,
            port,
            management_port,
            process: None,
        })
    }

    /// Starts the process (again), appending to its log.
    pub(crate) fn start(&mut self) -> anyhow::Result<()> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.process = Some(ProxyProcess {
            pid: child.id(),
            child: Some(child),
            port: self.port,
            management_port: self.management_port,
            log: self.log.clone(),
            control: None,
        });
        Ok(())
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid)
    }

    /// SIGKILL, and the exit collected.
    pub(crate) fn kill(&mut self) {
        if let Some(mut process) = self.process.take()
            && let Some(mut child) = process.child.take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, waiting for the exit (up to ten seconds, then SIGKILL) on a blocking thread.
    pub(crate) async fn stop(&mut self) {
        if let Some(process) = self.process.take() {
            let _ = tokio::task::spawn_blocking(move || drop(process)).await;
        }
    }

    /// `/metrics` of the management port: every sample by name and labels (empty when it does
    /// not answer).
    pub(crate) async fn metrics(&self) -> Samples {
        let port = self.management_port;
        tokio::task::spawn_blocking(move || soak::probe::fetch_metrics(port).unwrap_or_default())
            .await
            .unwrap_or_default()
    }

    pub(crate) fn log_tail(&self) -> String {
        self.process
            .as_ref()
            .map(ProxyProcess::log_tail)
            .unwrap_or_default()
    }
}
