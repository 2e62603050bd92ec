//! One run of the two tiers: the central proxy behind its balancer, the node proxies chained to
//! it, their subscribers, and the phases (connect, idle, paced updates, burst; the faults are in
//! `faults.rs`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flagd_proxy_testkit::control_plane::ControlPlane;
use futures::StreamExt;
use tonic::transport::Channel;

use super::{BALANCER_COMMAND, Shape, Tier, faults, stable_port};
use crate::args::Args;
use crate::kit::latency::Stats;
use crate::load::{Dial, Tracker, open_channel, open_stream};
use crate::proxy::{Kind, ProxyProcess};
use crate::run::start_cluster;
use crate::scenario::RunResult;
use crate::sources::{Sources, api_requests};

/// What one column of the table measured: a run of the two tiers, or a flat run on one proxy.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct TierResult {
    pub(crate) label: String,
    /// Node proxies (0: flat).
    pub(crate) nodes: usize,
    pub(crate) subscribers: usize,
    pub(crate) connected: usize,
    pub(crate) connect_seconds: f64,
    /// From the change at the source until every subscriber has it.
    pub(crate) propagation: Stats,
    pub(crate) updates_incomplete: u64,
    pub(crate) stale_after_burst: usize,
    pub(crate) stream_errors: u64,
    /// The central proxy (flat: the one proxy).
    pub(crate) central_cpu_per_update: f64,
    /// Every node proxy together.
    pub(crate) nodes_cpu_per_update: Option<f64>,
    pub(crate) load_generator_cpu_per_update: f64,
    pub(crate) central_rss_mib: f64,
    pub(crate) node_rss_mib_mean: Option<f64>,
    pub(crate) node_rss_mib_max: Option<f64>,
    /// At the central, every subscriber connected: `sync_active_streams`,
    /// `flagd_proxy_open_connections{port="sync"}`, `flagd_proxy_upstream_watches`.
    pub(crate) central_streams: Option<f64>,
    pub(crate) central_connections: Option<f64>,
    pub(crate) central_watches: Option<f64>,
    /// `sync_active_streams` over every node proxy.
    pub(crate) node_streams: Option<f64>,
    /// FeatureFlag watches open at the API server, every subscriber connected.
    pub(crate) apiserver_watches: Option<u64>,
    /// LIST, WATCH and GET requests on FeatureFlags from the central's start to the end of the
    /// burst.
    pub(crate) apiserver_requests: Option<u64>,
    pub(crate) faults: Option<faults::FaultResult>,
    /// Steady reconnects (`--churn`), after the burst.
    pub(crate) churn: Option<crate::churn::ChurnResult>,
    /// The run failed: why.
    pub(crate) failed: Option<String>,
    /// The proxy under test is the Go flagd-proxy (a peer: its problems fail nothing).
    pub(crate) peer: bool,
}

impl TierResult {
    pub(crate) fn of_flat(kind: Kind, r: &RunResult, subscribers: usize) -> Self {
        TierResult {
            label: r.proxy.clone(),
            nodes: 0,
            subscribers,
            connected: r.subscribers_connected,
            connect_seconds: r.connect_seconds,
            propagation: r.propagation.clone(),
            updates_incomplete: r.updates_incomplete,
            stale_after_burst: r.stale_after_settle,
            stream_errors: r.stream_errors,
            central_cpu_per_update: r.cpu_seconds_per_update,
            load_generator_cpu_per_update: r.load_generator_cpu_seconds_per_update,
            central_rss_mib: r.rss_idle_mib,
            apiserver_watches: r.apiserver_watches,
            churn: r.churn.clone(),
            peer: kind != Kind::Rust,
            failed: (!r.gave_up.is_empty() || r.killed_for_rss).then(|| {
                let mut why = r.gave_up.clone();
                if r.killed_for_rss {
                    why.push("killed for going over --max-rss-mib".to_owned());
                }
                why.join("; ")
            }),
            ..TierResult::default()
        }
    }

    pub(crate) fn failed(label: &str, error: String) -> Self {
        TierResult {
            label: label.to_owned(),
            failed: Some(error),
            ..TierResult::default()
        }
    }

    /// Each way this run broke what the proxy promises, in words.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(error) = &self.failed {
            problems.push(format!("the run failed: {error}"));
            return problems;
        }
        if self.connected != self.subscribers {
            problems.push(format!(
                "{} of {} subscribers connected",
                self.connected, self.subscribers
            ));
        }
        for (n, what) in [
            (
                self.updates_incomplete,
                "paced update(s) did not reach every subscriber",
            ),
            (
                self.stale_after_burst as u64,
                "subscriber(s) not on the final version after the burst",
            ),
            (self.stream_errors, "stream error(s) before the faults"),
        ] {
            if n > 0 {
                problems.push(format!("{n} {what}"));
            }
        }
        if let Some(churn) = &self.churn {
            problems.extend(churn.problems());
        }
        if let Some(faults) = &self.faults {
            problems.extend(faults.problems.iter().cloned());
        }
        problems
    }
}

/// The subscribers: what they saw, and which streams ended.
pub(crate) struct Crowd {
    pub(crate) tracker: Arc<Tracker>,
    /// Per subscriber: its stream ended (the task is gone).
    pub(crate) ended: Arc<Vec<AtomicBool>>,
    pub(crate) tasks: tokio::task::JoinSet<()>,
    /// The streams' deadlines, with `--churn`.
    pub(crate) churn: Option<Arc<crate::churn::Churn>>,
}

impl Crowd {
    /// Subscribers in `slots` whose stream ended.
    pub(crate) fn ended_in(&self, slots: std::ops::Range<usize>) -> usize {
        self.ended[slots]
            .iter()
            .filter(|e| e.load(Ordering::Relaxed))
            .count()
    }
}

/// Versions the tracker keeps: the first, the paced updates, the burst, the churn's and four for
/// the faults.
fn versions(args: &Args) -> usize {
    (1 + args.updates + args.burst + crate::churn::versions(args) + 4 + 1) as usize
}

/// A running topology: the source, the central (and its second replica for the rollout) behind
/// the balancer, and the node proxies.
pub(crate) struct Topology<'a> {
    pub(crate) args: &'a Args,
    pub(crate) shape: Shape,
    pub(crate) cluster: Option<ControlPlane>,
    pub(crate) sources: Sources,
    pub(crate) central: Tier,
    pub(crate) replica: Tier,
    pub(crate) balancer: Option<ProxyProcess>,
    pub(crate) nodes: Vec<Tier>,
    pub(crate) result: TierResult,
    /// API requests on FeatureFlags before the central started.
    requests_before: Option<u64>,
}

/// The source flags of the central: the API server of `cluster`, or the manifests under
/// `source_dir`; and room for every resource's watch.
fn central_source(cluster: Option<&ControlPlane>, source_dir: &Path) -> Vec<String> {
    let mut source = match cluster {
        Some(cluster) => cluster.proxy_args(&[]),
        None => vec![
            "--manifests".to_owned(),
            source_dir.join("manifests").display().to_string(),
        ],
    };
    source.extend(["--max-watches".to_owned(), "10000".to_owned()]);
    source
}

/// `count` node proxies reading from the balancer at `balancer_port`; not started yet.
fn node_tiers(
    bin: &Path,
    dir: &Path,
    balancer_port: u16,
    count: usize,
    extra: &[String],
) -> anyhow::Result<Vec<Tier>> {
    let upstream = [
        "--upstream".to_owned(),
        format!("127.0.0.1:{balancer_port}"),
    ];
    (0..count)
        .map(|i| {
            Tier::new(
                bin,
                dir.join(format!("node-{i}.log")),
                upstream.to_vec(),
                extra,
            )
        })
        .collect()
}

impl<'a> Topology<'a> {
    /// The source with version 0, the central and the balancer, and every node proxy serving.
    pub(crate) async fn start(
        args: &'a Args,
        dir: &Path,
        bin: &Path,
        shape: Shape,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let cluster = start_cluster(Kind::Rust, shape.flat(1)).await?;
        // The manifests in a directory of their own, apart from the 52 processes' logs: the
        // central watches the manifests directory's parent for swaps of the directory, and a
        // parent where every log line is a change notification is not what a cluster has.
        let source_dir = dir.join("source");
        let sources = Sources::new(
            Kind::Rust,
            &source_dir,
            shape.resources,
            (shape.payload, args.documents),
            cluster.as_ref(),
        )?;
        sources.write(0, || {}).await?;
        let requests_before = api_requests(cluster.as_ref()).await;
        let source = central_source(cluster.as_ref(), &source_dir);
        let extra = &args.proxy_arg;
        let mut central = Tier::new(bin, dir.join("central.log"), source.clone(), extra)?;
        let replica = Tier::new(bin, dir.join("replica.log"), source, extra)?;
        let balancer_port = stable_port()?;
        let balancer = start_balancer(dir, balancer_port, &[central.port, replica.port])?;
        central.start()?;
        let nodes = node_tiers(bin, dir, balancer_port, shape.nodes, extra)?;
        let result = TierResult {
            label: "two tiers (this proxy)".to_owned(),
            nodes: shape.nodes,
            subscribers: shape.subscribers(),
            ..TierResult::default()
        };
        let mut topology = Topology {
            args,
            shape,
            cluster,
            sources,
            central,
            replica,
            balancer: Some(balancer),
            nodes,
            result,
            requests_before,
        };
        topology.serving().await?;
        Ok(topology)
    }

    /// Starts the node proxies and waits until the central and each of them serve a snapshot.
    async fn serving(&mut self) -> anyhow::Result<()> {
        let selector = self.sources.selectors[0].clone();
        wait_serving(&self.central, &selector).await?;
        for node in &mut self.nodes {
            node.start()?;
        }
        for node in &self.nodes {
            wait_serving(node, &selector).await?;
        }
        Ok(())
    }

    /// Every phase, then the faults; what was measured.
    pub(crate) async fn run(&mut self) -> anyhow::Result<TierResult> {
        let mut crowd = self.connect().await;
        self.idle().await;
        self.paced(&crowd.tracker).await?;
        let mut last = self.burst(&crowd).await?;
        if let Some(churn) = crowd.churn.clone() {
            last = self.churn(&crowd, &churn, last).await?;
        }
        if let (Some(before), Some(after)) = (
            self.requests_before,
            api_requests(self.cluster.as_ref()).await,
        ) {
            self.result.apiserver_requests = Some(after.saturating_sub(before));
        }
        if self.shape.faults {
            self.result.faults = Some(faults::run(self, &mut crowd, last).await);
        }
        // Close the clients before the proxies go.
        crowd.tasks.abort_all();
        while crowd.tasks.join_next().await.is_some() {}
        Ok(self.result.clone())
    }

    /// Stops every process: the node proxies, the balancer, the centrals.
    pub(crate) async fn stop(&mut self) {
        for node in &mut self.nodes {
            node.stop().await;
        }
        if let Some(balancer) = self.balancer.take() {
            let _ = tokio::task::spawn_blocking(move || drop(balancer)).await;
        }
        self.central.stop().await;
        self.replica.stop().await;
    }
}

/// The balancer process in front of the central replicas' `ports`.
fn start_balancer(dir: &Path, port: u16, backends: &[u16]) -> anyhow::Result<ProxyProcess> {
    let log = dir.join("balancer.log");
    let out = std::fs::File::create(&log)?;
    let child = Command::new(std::env::current_exe()?)
        .arg(BALANCER_COMMAND)
        .arg(port.to_string())
        .args(backends.iter().map(u16::to_string))
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting the balancer")?;
    Ok(ProxyProcess {
        pid: child.id(),
        child: Some(child),
        port,
        management_port: 0,
        log,
        control: None,
    })
}

/// Waits until a probe stream on `tier` for `selector` gets a version; which one.
pub(crate) async fn wait_serving(tier: &Tier, selector: &str) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let dial = Dial::plain(tier.port);
    loop {
        let probe = async {
            let channel = open_channel(&dial, None).await?;
            let mut stream = open_stream(channel, selector).await?;
            stream.message().await?.context("stream ended")
        };
        match tokio::time::timeout(Duration::from_secs(5), probe).await {
            Ok(Ok(seq)) => return Ok(seq),
            _ if Instant::now() > deadline => {
                bail!(
                    "the proxy on port {} did not serve a snapshot:\n{}",
                    tier.port,
                    tier.log_tail()
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The subscribers' shared state, as each subscriber task holds it.
pub(crate) type Shared = (
    Arc<Tracker>,
    Arc<Vec<AtomicBool>>,
    Option<Arc<crate::churn::Churn>>,
);

/// One subscriber on `channel`: records what it sees; marks its slot ended when its stream
/// ends (a stream that reaches its deadline, with `--churn`, is reopened instead). `served`
/// counts the subscribers that got their first message.
pub(crate) async fn subscribe(
    channel: Channel,
    selector: Arc<str>,
    slot: usize,
    crowd: Shared,
    served: Option<Arc<AtomicUsize>>,
) {
    let (tracker, ended, churn) = crowd;
    let mut first = true;
    let record = |seq, reopened| {
        if std::mem::take(&mut first)
            && let Some(served) = &served
        {
            served.fetch_add(1, Ordering::Relaxed);
        }
        tracker.record_from(slot, seq, reopened);
    };
    let error = crate::churn::follow(channel, &selector, slot, churn.as_deref(), record).await;
    ended[slot].store(true, Ordering::Relaxed);
    tracker.failures.stream_failed(None, &error);
}

impl Topology<'_> {
    /// Opens the streams of the subscribers of node proxies `nodes` (their connections
    /// `--connect-concurrency` at a time); the connections that failed.
    pub(crate) async fn open(
        &self,
        crowd: &mut Crowd,
        nodes: std::ops::Range<usize>,
        served: Option<Arc<AtomicUsize>>,
    ) -> usize {
        let (spc, per_node) = (self.args.streams_per_connection, self.shape.per_node);
        let connections = per_node.div_ceil(spc);
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        let jobs = nodes.flat_map(|k| (0..connections).map(move |c| (k, c)));
        let ports = &ports;
        let mut opened = futures::stream::iter(jobs)
            .map(|(k, c)| async move {
                let dial = Dial::plain(ports[k]);
                (k, c, open_channel(&dial, None).await)
            })
            .buffer_unordered(self.args.connect_concurrency.max(1));
        let mut failed = 0;
        while let Some((k, c, channel)) = opened.next().await {
            let Ok(channel) = channel else {
                failed += 1;
                continue;
            };
            let first = k * per_node + c * spc;
            for slot in first..(first + spc).min((k + 1) * per_node) {
                let selector = self.sources.selectors[slot % self.shape.resources].clone();
                let shared = (
                    crowd.tracker.clone(),
                    crowd.ended.clone(),
                    crowd.churn.clone(),
                );
                let task = subscribe(channel.clone(), selector, slot, shared, served.clone());
                crowd.tasks.spawn(task);
            }
        }
        failed
    }

    /// Connects every subscriber and waits for their first snapshots.
    async fn connect(&mut self) -> Crowd {
        let n = self.shape.subscribers();
        let mut crowd = Crowd {
            tracker: Arc::new(Tracker::new(n, versions(self.args))),
            ended: Arc::new((0..n).map(|_| AtomicBool::new(false)).collect()),
            tasks: tokio::task::JoinSet::new(),
            churn: crate::churn::rate(self.args, n).map(|_| crate::churn::Churn::new(n)),
        };
        let started = Instant::now();
        let failed = self.open(&mut crowd, 0..self.shape.nodes, None).await;
        let tracker = &crowd.tracker;
        let deadline = started + self.args.connect_timeout;
        let spawned = crowd.tasks.len();
        while tracker.connected.load(Ordering::Relaxed) + (tracker.failures.errors() as usize)
            < spawned
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let result = &mut self.result;
        result.connect_seconds = started.elapsed().as_secs_f64();
        result.connected = tracker.connected.load(Ordering::Relaxed);
        tracker.target.store(result.connected, Ordering::Relaxed);
        eprintln!(
            "  {} subscribers connected in {:.1} s ({failed} connections failed)",
            result.connected, result.connect_seconds
        );
        crowd
    }
}
