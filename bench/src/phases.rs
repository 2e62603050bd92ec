//! The phases of one scenario against a started proxy, in the order they run: ready, connect
//! every subscriber, idle, first snapshots (and of new resources), paced updates, the burst,
//! and the reconnect storm.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flagd_proxy_testkit::control_plane;
use flagd_proxy_testkit::control_plane::ControlPlane;
use futures::StreamExt;
use tonic::transport::Channel;

use crate::args::Args;
use crate::churn::subscriber;
use crate::kit::latency::Stats;
use crate::kit::table::fmt_opt;
use crate::load::{Dial, Tracker, open_channel, open_stream};
use crate::pacing::paced;
use crate::proxy::{Kind, ProxyProcess};
use crate::sampling::{RssGuard, mib, ms, proc_sample, written_bytes};
use crate::scenario::{RunResult, Scenario};
use crate::sources::Sources;
use crate::{GIVE_UP_AFTER, churn, storm};

/// A scenario running against one started proxy, and what it has measured so far.
pub(crate) struct Live<'a> {
    kind: Kind,
    scenario: Scenario,
    args: &'a Args,
    pub(crate) proxy: ProxyProcess,
    pid: u32,
    sources: Sources,
    dial: Dial,
    pub(crate) result: RunResult,
}

/// What the paced updates are measured by: the proxy's CPU and bytes written, this program's
/// CPU and messages decoded, and the messages the subscribers got.
struct Counters {
    cpu: f64,
    own_cpu: f64,
    written: u64,
    decoded: u64,
    messages: u64,
}

impl Counters {
    fn of(pid: u32, tracker: &Tracker) -> Self {
        Counters {
            cpu: proc_sample(pid).cpu_seconds,
            own_cpu: proc_sample(std::process::id()).cpu_seconds,
            written: written_bytes(pid),
            decoded: crate::messages::DECODED.load(Ordering::Relaxed),
            messages: tracker.messages.load(Ordering::Relaxed),
        }
    }

    /// The costs per update from these counters to `after`, over `applied` updates.
    fn per_update(&self, after: Counters, applied: u64, result: &mut RunResult) {
        if applied == 0 {
            return;
        }
        let per = |a: f64, b: f64| (a - b) / applied as f64;
        result.cpu_seconds_per_update = per(after.cpu, self.cpu);
        result.load_generator_cpu_seconds_per_update = per(after.own_cpu, self.own_cpu);
        result.bytes_written_per_update =
            after.written.saturating_sub(self.written) as f64 / applied as f64;
        result.decoded_per_update = (after.decoded - self.decoded) as f64 / applied as f64;
        if result.subscribers_connected > 0 {
            result.messages_per_subscriber_per_update = (after.messages - self.messages) as f64
                / (applied as f64 * result.subscribers_connected as f64);
        }
    }
}

/// The subscribers and what they saw.
struct Subscribers {
    tracker: Arc<Tracker>,
    tasks: tokio::task::JoinSet<()>,
    /// Versions the tracker keeps.
    versions: usize,
    connect_errors: usize,
    /// The streams' deadlines, with `--churn`.
    churn: Option<Arc<churn::Churn>>,
}

/// The source address of connection `i` (`--source-addrs`), when there is a choice.
fn source_addr(args: &Args, i: usize) -> Option<Ipv4Addr> {
    (args.source_addrs > 1)
        .then(|| Ipv4Addr::new(127, 0, 0, 1 + (i % args.source_addrs as usize) as u8))
}

impl<'a> Live<'a> {
    pub(crate) fn new(
        kind: Kind,
        scenario: Scenario,
        args: &'a Args,
        proxy: ProxyProcess,
        sources: Sources,
        dial: Dial,
        result: RunResult,
    ) -> Self {
        let pid = proxy.pid;
        Live {
            kind,
            scenario,
            args,
            proxy,
            pid,
            sources,
            dial,
            result,
        }
    }

    /// Every phase, in order.
    pub(crate) async fn run(
        &mut self,
        cluster: Option<&ControlPlane>,
        cold: &[Arc<str>],
        guard: RssGuard,
    ) -> anyhow::Result<()> {
        self.wait_ready().await?;
        tokio::time::sleep(self.args.idle.min(Duration::from_secs(1))).await;
        self.result.rss_empty_mib = mib(proc_sample(self.pid).rss_kib);
        let fds_before = storm::open_fds(self.pid);
        let mut subscribers = self.connect().await;
        self.idle(cluster).await;
        self.first_snapshots().await;
        self.cold_snapshots(cold).await;
        self.paced_updates(&subscribers.tracker).await?;
        let mut final_seq = self.burst(&subscribers).await?;
        if let Some(churn) = subscribers.churn.clone() {
            final_seq = self.churn(cluster, &subscribers, &churn, final_seq).await?;
        }
        if self.args.storm && self.kind != Kind::Floor && self.proxy.exited().is_none() {
            self.storm(&mut subscribers, fds_before, final_seq).await;
        }
        self.result.killed_for_rss = guard.killed();
        drop(guard);
        // Close the clients before the proxy goes, so no stream counts as broken.
        subscribers.tasks.abort_all();
        while subscribers.tasks.join_next().await.is_some() {}
        Ok(())
    }

    /// Ready: a probe stream gets the first snapshot.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let kind = self.kind;
        let ready_deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.proxy.exited() {
                bail!(
                    "{} exited with {status}:\n{}",
                    kind.label(),
                    self.proxy.log_tail()
                );
            }
            let probe = async {
                let channel = open_channel(&self.dial, None).await?;
                let mut stream = open_stream(channel, &self.sources.selectors[0]).await?;
                stream.message().await?.context("stream ended")
            };
            match tokio::time::timeout(Duration::from_secs(5), probe).await {
                Ok(Ok(0)) => return Ok(()),
                Ok(Ok(seq)) => bail!("probe got version {seq}, expected 0"),
                _ if Instant::now() > ready_deadline => {
                    bail!(
                        "{} did not serve a snapshot:\n{}",
                        kind.label(),
                        self.proxy.log_tail()
                    )
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

impl Live<'_> {
    /// Connects every subscriber and waits for their first snapshots.
    async fn connect(&mut self) -> Subscribers {
        let (args, pid, dial) = (self.args, self.pid, &self.dial);
        let versions = (2 + args.updates + args.burst + churn::versions(args)) as usize;
        let n = self.scenario.subscribers;
        let tracker = Arc::new(Tracker::new(n, versions));
        // The floor answers one stream per connection: no reopening there.
        let churn = (self.kind != Kind::Floor && churn::rate(args, n).is_some())
            .then(|| churn::Churn::new(n));
        let mut tasks = tokio::task::JoinSet::new();
        let connect_cpu = proc_sample(pid).cpu_seconds;
        let connect_own_cpu = proc_sample(std::process::id()).cpu_seconds;
        let started = Instant::now();
        let connections = n.div_ceil(args.streams_per_connection);
        let mut opened = futures::stream::iter(0..connections)
            .map(|c| async move { (c, open_channel(dial, source_addr(args, c)).await) })
            .buffer_unordered(args.connect_concurrency.max(1));
        let (mut connect_errors, mut spawned) = (0usize, 0usize);
        while let Some((c, channel)) = opened.next().await {
            match channel {
                Ok(channel) => {
                    let first = c * args.streams_per_connection;
                    let slots = first..(first + args.streams_per_connection).min(n);
                    spawned += self.spawn_on(&mut tasks, &channel, slots, &tracker, &churn);
                }
                Err(error) => {
                    connect_errors += 1;
                    if connect_errors == 1 {
                        eprintln!("connect failed: {error:#}");
                    }
                }
            }
        }
        drop(opened);
        self.wait_connected(&tracker, spawned, started + args.connect_timeout)
            .await;
        let result = &mut self.result;
        result.connect_seconds = started.elapsed().as_secs_f64();
        result.connect_cpu_seconds = proc_sample(pid).cpu_seconds - connect_cpu;
        result.connect_load_generator_cpu_seconds =
            proc_sample(std::process::id()).cpu_seconds - connect_own_cpu;
        result.subscribers_connected = tracker.connected.load(Ordering::Relaxed);
        // Versions count as delivered once every connected subscriber has them.
        tracker
            .target
            .store(result.subscribers_connected, Ordering::Relaxed);
        eprintln!(
            "  {} subscribers connected in {:.1} s ({} connect errors, {} stream errors)",
            result.subscribers_connected,
            result.connect_seconds,
            connect_errors,
            tracker.failures.errors()
        );
        Subscribers {
            tracker,
            tasks,
            versions,
            connect_errors,
            churn,
        }
    }

    /// Waits until each of the `spawned` subscribers is connected or has failed, the proxy
    /// exited, or `deadline`.
    async fn wait_connected(&mut self, tracker: &Tracker, spawned: usize, deadline: Instant) {
        while tracker.connected.load(Ordering::Relaxed) + (tracker.failures.errors() as usize)
            < spawned
            && Instant::now() < deadline
            && self.proxy.exited().is_none()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Spawns the subscribers of `slots` on `channel`, each on its resource; how many.
    fn spawn_on(
        &self,
        tasks: &mut tokio::task::JoinSet<()>,
        channel: &Channel,
        slots: std::ops::Range<usize>,
        tracker: &Arc<Tracker>,
        churn: &Option<Arc<churn::Churn>>,
    ) -> usize {
        let count = slots.len();
        for slot in slots {
            let selector = self.sources.selectors[slot % self.scenario.resources].clone();
            tasks.spawn(subscriber(
                channel.clone(),
                selector,
                slot,
                tracker.clone(),
                churn.clone(),
            ));
        }
        count
    }

    /// Idle: memory and CPU with every subscriber connected.
    async fn idle(&mut self, cluster: Option<&ControlPlane>) {
        let (args, pid, result) = (self.args, self.pid, &mut self.result);
        tokio::time::sleep(args.idle / 2).await;
        let idle_start = proc_sample(pid);
        let idle_clock = Instant::now();
        tokio::time::sleep(args.idle).await;
        let idle_end = proc_sample(pid);
        result.rss_idle_mib = mib(idle_end.rss_kib);
        result.cpu_idle_percent = 100.0 * (idle_end.cpu_seconds - idle_start.cpu_seconds)
            / idle_clock.elapsed().as_secs_f64();
        if result.subscribers_connected > 0 {
            result.kib_per_idle_subscriber = (idle_end.rss_kib as f64
                - result.rss_empty_mib * 1024.0)
                / result.subscribers_connected as f64;
        }
        if self.scenario.resources > 1 {
            result.kib_per_resource = Some(
                (idle_end.rss_kib as f64 - result.rss_empty_mib * 1024.0)
                    / self.scenario.resources as f64,
            );
        }
        if let Some(cluster) = cluster {
            result.apiserver_watches = Some(cluster.open_watches("featureflags").await);
            let port = cluster.port();
            result.apiserver_connections = Some(control_plane::connections_to(pid, port));
        }
    }

    /// Time to first snapshot for a new subscriber, on a new connection.
    async fn first_snapshots(&mut self) {
        let (args, dial, result) = (self.args, &self.dial, &mut self.result);
        let mut first_snapshot = Vec::with_capacity(args.first_snapshot_samples);
        let mut failed_in_a_row = 0;
        for i in 0..args.first_snapshot_samples {
            if failed_in_a_row == GIVE_UP_AFTER {
                let left = args.first_snapshot_samples - i;
                result.first_snapshot_failures += left;
                result.gave_up.push(format!(
                    "time to first snapshot: {GIVE_UP_AFTER} samples in a row failed; the other {left} were not tried and count as failures"
                ));
                break;
            }
            let selector = self.sources.selectors[i % self.scenario.resources].clone();
            let begin = Instant::now();
            let sample = async {
                let channel = open_channel(dial, source_addr(args, i)).await?;
                let mut stream = open_stream(channel, &selector).await?;
                stream.message().await?.context("stream ended")
            };
            match tokio::time::timeout(Duration::from_secs(10), sample).await {
                Ok(Ok(_)) => {
                    failed_in_a_row = 0;
                    first_snapshot.push(begin.elapsed().as_secs_f64() * 1e3);
                }
                _ => {
                    failed_in_a_row += 1;
                    result.first_snapshot_failures += 1;
                }
            }
        }
        result.first_snapshot = Stats::of(first_snapshot);
    }

    /// Time to first snapshot for resources nobody watched yet (Kubernetes).
    async fn cold_snapshots(&mut self, cold: &[Arc<str>]) {
        let (args, dial, result) = (self.args, &self.dial, &mut self.result);
        let mut cold_samples = Vec::with_capacity(cold.len());
        for (i, selector) in cold.iter().enumerate() {
            let begin = Instant::now();
            let sample = async {
                let channel = open_channel(dial, source_addr(args, i)).await?;
                let mut stream = open_stream(channel, selector).await?;
                stream.message().await?.context("stream ended")
            };
            match tokio::time::timeout(Duration::from_secs(10), sample).await {
                Ok(Ok(_)) => cold_samples.push(begin.elapsed().as_secs_f64() * 1e3),
                _ => result.cold_first_snapshot_failures += 1,
            }
            if result.cold_first_snapshot_failures >= GIVE_UP_AFTER as usize {
                break;
            }
        }
        result.cold_first_snapshot = Stats::of(cold_samples);
    }
}

impl Live<'_> {
    /// Paced updates: each is written once the previous one reached every subscriber.
    async fn paced_updates(&mut self, tracker: &Tracker) -> anyhow::Result<()> {
        let pid = self.pid;
        let before = Counters::of(pid, tracker);
        let connected = self.result.subscribers_connected as u64;
        let (mut first_receiver, mut peak_rss, mut missed) = (Vec::new(), 0u64, 0u64);
        let proxy = &mut self.proxy;
        let paced = paced(
            self.args,
            &self.sources,
            tracker,
            || proxy.exit_note(),
            |w| {
                if w.reached.is_none() {
                    let reached = tracker.reached[w.seq as usize].load(Ordering::Relaxed) as u64;
                    missed += connected.saturating_sub(reached);
                }
                if let Some(at) = tracker.first_at(w.seq) {
                    first_receiver.push(ms(at.saturating_sub(w.at)));
                }
                peak_rss = peak_rss.max(proc_sample(pid).rss_kib);
            },
        )
        .await?;
        let after = proc_sample(pid);
        let result = &mut self.result;
        result.updates_incomplete += paced.incomplete;
        result.subscriber_versions_missed += missed;
        result.gave_up.extend(paced.stopped);
        result.propagation = Stats::of(paced.propagation);
        result.first_receiver = Stats::of(first_receiver);
        before.per_update(Counters::of(pid, tracker), paced.applied, result);
        result.rss_after_updates_mib = mib(after.rss_kib.max(peak_rss));
        Ok(())
    }

    /// Burst: updates back to back; then everyone must end on the final one. Returns the final
    /// version.
    async fn burst(&mut self, subscribers: &Subscribers) -> anyhow::Result<u64> {
        let (args, tracker) = (self.args, &subscribers.tracker);
        let n = self.scenario.subscribers;
        self.result.burst_updates = args.burst;
        let final_seq = args.updates + args.burst;
        let mut burst_end = 0;
        for seq in args.updates + 1..=final_seq {
            self.sources
                .write(seq, || burst_end = tracker.now())
                .await?;
            if seq < final_seq {
                tokio::time::sleep(args.burst_gap).await;
            }
        }
        let converged = tracker.wait_all(final_seq, args.settle).await;
        let result = &mut self.result;
        result.burst_convergence_ms = converged.map(|at| ms(at.saturating_sub(burst_end)));
        result.stale_after_settle = tracker
            .not_on(final_seq, n)
            .saturating_sub(n - result.subscribers_connected);
        let end = proc_sample(self.pid);
        result.rss_peak_mib = mib(end.hwm_kib);
        result.cpu_seconds_total = end.cpu_seconds;
        result.duplicate_messages = tracker.duplicates.load(Ordering::Relaxed);
        result.stream_errors = tracker.failures.errors() + subscribers.connect_errors as u64;
        result.unparsed_messages = tracker.failures.unparsed();
        result.last_error = tracker.failures.last();
        Ok(final_seq)
    }

    /// Steady reconnects (`--churn`) from version `last` + 1; the last version written.
    async fn churn(
        &mut self,
        cluster: Option<&ControlPlane>,
        subscribers: &Subscribers,
        churn: &churn::Churn,
        last: u64,
    ) -> anyhow::Result<u64> {
        let n = self.scenario.subscribers;
        let pid = self.pid;
        let cpu = move || vec![proc_sample(pid).cpu_seconds];
        let phase = churn::Phase {
            args: self.args,
            sources: &self.sources,
            tracker: &subscribers.tracker,
            churn,
            subscribers: n,
            per_second: churn::rate(self.args, n).unwrap_or_default(),
            processes: &["proxy"],
            cpu: &cpu,
            cluster,
        };
        let (result, last) = phase.run(last + 1).await?;
        self.result.churn = Some(result);
        if let Some(note) = self.proxy.exit_note() {
            self.result.gave_up.push(format!("churn: {note}"));
        }
        Ok(last)
    }

    /// The reconnect storm (`--storm`): every subscriber dropped and reconnected at once.
    async fn storm(&mut self, subscribers: &mut Subscribers, fds_before: usize, final_seq: u64) {
        let n = self.scenario.subscribers;
        eprintln!("  reconnect storm: {n} subscribers");
        let setup = storm::StormSetup {
            dial: &self.dial,
            management_port: self.proxy.management_port,
            pid: self.pid,
            sources: &self.sources,
            subscribers: n,
            spread: self.args.storm_spread,
            timeout: self.args.storm_timeout,
            seq: final_seq + 1,
            versions: subscribers.versions,
            fds_before,
        };
        let tasks = &mut subscribers.tasks;
        let drop_all = async {
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        };
        match storm::run(setup, drop_all).await {
            Ok(storm) => {
                eprintln!(
                    "  served again: {} of {} in {} s",
                    storm.served_again,
                    n,
                    fmt_opt(storm.seconds_to_all, 2)
                );
                self.result.storm = Some(storm);
            }
            Err(error) => self
                .result
                .gave_up
                .push(format!("reconnect storm: {error:#}")),
        }
        self.result.rss_peak_mib = mib(proc_sample(self.pid).hwm_kib);
    }
}
