//! Steady reconnects (`--churn`): flagd providers give their sync stream a deadline (600 s), so
//! every subscriber reopens its stream once per deadline, at a point of its own: about N / 600
//! new `SyncFlags` streams a second in steady state, each needing a first snapshot.
//!
//! The phase runs two windows of `--churn-seconds` with the same updates written every
//! `--churn-update-every`: first without reconnects (the baseline), then with the subscribers'
//! streams ending one by one, in a random order, evenly spread at `--churn-per-second`. A stream
//! whose deadline passes is dropped (the client cancels it) and another is opened on the same
//! connection, as a gRPC channel does. Measured: each reopened stream's time to its first
//! snapshot, the reopen attempts that failed, the CPU each process spent per second in both
//! windows (the difference, per reconnect), what the API server answered in each window, and,
//! once the reconnects stop and one more version is written, the subscribers not on it.
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flagd_proxy_testkit::control_plane::ControlPlane;
use tokio::sync::Notify;
use tonic::Status;
use tonic::transport::Channel;

use crate::args::Args;
use crate::kit::latency::Stats;
use crate::kit::table::{Blank, Figure, figure_table, fmt_opt};
use crate::load::{Tracker, open_stream};
use crate::sampling::{ms, proc_sample};
use crate::sources::{Sources, api_requests};

/// How long a client waits before trying a failed reopen again.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// The subscribers' stream deadlines, and what the reopened streams saw.
pub(crate) struct Churn {
    /// Per subscriber: woken when its stream's deadline passes.
    deadlines: Vec<Notify>,
    /// Per reopened stream: from the end of the old stream to the new one's first message (ms).
    first_snapshot_ms: Mutex<Vec<f64>>,
    /// Streams ended by their deadline.
    ended: AtomicU64,
    /// Streams ended and not yet served again.
    pending: AtomicUsize,
    /// Reopen attempts that failed (and were tried again).
    failures: AtomicU64,
}

impl Churn {
    pub(crate) fn new(subscribers: usize) -> Arc<Self> {
        Arc::new(Churn {
            deadlines: (0..subscribers).map(|_| Notify::new()).collect(),
            first_snapshot_ms: Mutex::new(Vec::new()),
            ended: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
        })
    }

    /// The stream of subscriber `slot` reaches its deadline.
    fn end(&self, slot: usize) {
        self.deadlines[slot].notify_one();
    }

    fn served(&self, since: Instant) {
        let took = since.elapsed().as_secs_f64() * 1e3;
        self.pending.fetch_sub(1, Ordering::Relaxed);
        self.first_snapshot_ms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(took);
    }
}

/// The rate of `--churn-per-second` (N / 600 for `n` subscribers when only `--churn` is given);
/// none without churn.
pub(crate) fn rate(args: &Args, n: usize) -> Option<f64> {
    (args.churn || args.churn_per_second.is_some())
        .then(|| args.churn_per_second.unwrap_or(n as f64 / 600.0))
}

/// Versions the churn phase writes: each window's updates, and the final one.
pub(crate) fn versions(args: &Args) -> u64 {
    if rate(args, 1).is_none() {
        return 0;
    }
    2 * updates_per_window(args) + 1
}

fn updates_per_window(args: &Args) -> u64 {
    let every = args.churn_update_every.as_secs_f64().max(0.001);
    (args.churn_seconds.as_secs_f64() / every).ceil() as u64
}

/// Follows `selector` on `channel`, handing each version to `record` (with `true` for the first
/// message of a stream reopened after its deadline), until the stream ends other than by its
/// deadline; how it ended. A reopen that fails is counted and tried again after 100 ms.
pub(crate) async fn follow(
    channel: Channel,
    selector: &str,
    slot: usize,
    churn: Option<&Churn>,
    mut record: impl FnMut(u64, bool),
) -> Status {
    let mut ended_at: Option<Instant> = None;
    loop {
        let status = match open_stream(channel.clone(), selector).await {
            Ok(stream) => match serve(stream, slot, churn, &mut ended_at, &mut record).await {
                Ok(()) => continue,
                Err(status) => status,
            },
            Err(status) => status,
        };
        match (ended_at, churn) {
            (Some(_), Some(churn)) => {
                churn.failures.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(RETRY_AFTER).await;
            }
            _ => return status,
        }
    }
}

/// One stream, until its deadline (`Ok`, `ended_at` set) or its end (`Err`).
async fn serve(
    mut stream: tonic::Streaming<u64>,
    slot: usize,
    churn: Option<&Churn>,
    ended_at: &mut Option<Instant>,
    record: &mut impl FnMut(u64, bool),
) -> Result<(), Status> {
    loop {
        let message = match churn {
            Some(churn) => tokio::select! {
                biased;
                () = churn.deadlines[slot].notified() => {
                    if ended_at.is_none() {
                        *ended_at = Some(Instant::now());
                        churn.pending.fetch_add(1, Ordering::Relaxed);
                    }
                    churn.ended.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                message = stream.message() => message,
            },
            None => stream.message().await,
        };
        let Some(seq) = message? else {
            return Err(Status::unknown("stream ended"));
        };
        let reopened = ended_at.take();
        if let (Some(since), Some(churn)) = (reopened, churn) {
            churn.served(since);
        }
        record(seq, reopened.is_some());
    }
}

/// A subscriber; with `churn`, its stream reopens when its deadline passes (see [`follow`]).
pub(crate) async fn subscriber(
    channel: Channel,
    selector: Arc<str>,
    slot: usize,
    tracker: Arc<Tracker>,
    churn: Option<Arc<Churn>>,
) {
    let record = |seq, reopened| tracker.record_from(slot, seq, reopened);
    let error = follow(channel, &selector, slot, churn.as_deref(), record).await;
    tracker.failures.stream_failed(None, &error);
}

/// CPU of one process (or group of processes) in both windows.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct ChurnCpu {
    pub(crate) process: String,
    pub(crate) baseline_per_second: f64,
    pub(crate) churn_per_second: f64,
    /// (CPU in the churn window − CPU in the baseline window) / reconnects, in ms.
    pub(crate) per_reconnect_ms: Option<f64>,
}

/// What the churn phase measured on one proxy (or one topology).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct ChurnResult {
    pub(crate) per_second: f64,
    pub(crate) window_seconds: f64,
    pub(crate) updates_per_window: u64,
    /// Streams ended by their deadline in the churn window.
    pub(crate) reconnects: u64,
    /// From the end of a stream to the first message of the one reopened in its place.
    pub(crate) first_snapshot: Stats,
    pub(crate) reconnect_failures: u64,
    /// Reopened streams whose first snapshot was older than what the subscriber already had.
    pub(crate) snapshots_behind: u64,
    /// Streams ended and never served again before the end of the phase.
    pub(crate) never_served: usize,
    /// Subscribers not on the version written after the reconnects stopped.
    pub(crate) stale_at_end: usize,
    pub(crate) cpu: Vec<ChurnCpu>,
    pub(crate) load_generator_baseline_per_second: f64,
    pub(crate) load_generator_churn_per_second: f64,
    /// Write until every subscriber has it, per window.
    pub(crate) propagation_baseline: Stats,
    pub(crate) propagation_churn: Stats,
    /// LIST, WATCH and GET requests on FeatureFlags the API server answered in each window.
    pub(crate) apiserver_requests_baseline: Option<u64>,
    pub(crate) apiserver_requests_churn: Option<u64>,
    /// FeatureFlag watches open at the API server at the end of each window.
    pub(crate) apiserver_watches_baseline: Option<u64>,
    pub(crate) apiserver_watches_churn: Option<u64>,
}

impl ChurnResult {
    /// Each way the phase broke what the proxy promises, in words.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (n, what) in [
            (self.stale_at_end as u64, "subscriber(s) stale at the end"),
            (self.never_served as u64, "reopened stream(s) never served"),
            (
                self.snapshots_behind,
                "reopened stream(s) served an older version",
            ),
        ] {
            if n > 0 {
                problems.push(format!("churn: {n} {what}"));
            }
        }
        if self.reconnects > 0 && self.first_snapshot.samples == 0 {
            problems.push("churn: no reopened stream got a first snapshot".to_owned());
        }
        problems
    }
}

/// What the churn phase works on.
pub(crate) struct Phase<'a> {
    pub(crate) args: &'a Args,
    pub(crate) sources: &'a Sources,
    pub(crate) tracker: &'a Tracker,
    pub(crate) churn: &'a Churn,
    /// Subscribers (slots `0..subscribers`) and the reconnects a second.
    pub(crate) subscribers: usize,
    pub(crate) per_second: f64,
    /// The processes whose CPU is measured, by name, and their CPU seconds so far.
    pub(crate) processes: &'a [&'a str],
    pub(crate) cpu: &'a (dyn Fn() -> Vec<f64> + Sync),
    pub(crate) cluster: Option<&'a ControlPlane>,
}

/// What one window measured.
#[derive(Default)]
struct Window {
    seconds: f64,
    cpu: Vec<f64>,
    own_cpu: f64,
    propagation: Stats,
    requests: Option<u64>,
    watches: Option<u64>,
}

impl Phase<'_> {
    /// The baseline window, the churn window and the final version, starting at version
    /// `first`; what was measured and the last version written.
    pub(crate) async fn run(&self, first: u64) -> anyhow::Result<(ChurnResult, u64)> {
        let per_window = updates_per_window(self.args);
        eprintln!(
            "  churn: {:.1} reconnects/s over {} s, after as long without",
            self.per_second,
            self.args.churn_seconds.as_secs()
        );
        let baseline = self.window(first, false).await?;
        let churned = self.window(first + per_window, true).await?;
        let drained = Instant::now() + self.args.settle;
        while self.churn.pending.load(Ordering::Relaxed) > 0 && Instant::now() < drained {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let last = first + 2 * per_window;
        self.sources.write(last, || {}).await?;
        self.tracker.wait_all(last, self.args.settle).await;
        let connected = self.tracker.target.load(Ordering::Relaxed);
        let stale = self.tracker.not_on(last, self.subscribers);
        let result = ChurnResult {
            stale_at_end: stale.saturating_sub(self.subscribers - connected),
            ..self.result(&baseline, &churned, per_window)
        };
        eprintln!(
            "  churn: {} reconnects, first snapshot p99 {} ms, {} failed, {} stale",
            result.reconnects,
            fmt_opt(result.first_snapshot.p99_ms, 2),
            result.reconnect_failures,
            result.stale_at_end
        );
        Ok((result, last))
    }

    fn result(&self, baseline: &Window, churned: &Window, per_window: u64) -> ChurnResult {
        let reconnects = self.churn.ended.load(Ordering::Relaxed);
        let per_second = |cpu: f64, w: &Window| cpu / w.seconds.max(1e-9);
        let cpu = self
            .processes
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let (base, churn) = (baseline.cpu[i], churned.cpu[i]);
                // The baseline's CPU scaled to the churn window's length.
                let extra = churn - base * churned.seconds / baseline.seconds.max(1e-9);
                ChurnCpu {
                    process: (*name).to_owned(),
                    baseline_per_second: per_second(base, baseline),
                    churn_per_second: per_second(churn, churned),
                    per_reconnect_ms: (reconnects > 0).then(|| 1e3 * extra / reconnects as f64),
                }
            })
            .collect();
        let samples = std::mem::take(
            &mut *self
                .churn
                .first_snapshot_ms
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        ChurnResult {
            per_second: self.per_second,
            window_seconds: churned.seconds,
            updates_per_window: per_window,
            reconnects,
            first_snapshot: Stats::of(samples),
            reconnect_failures: self.churn.failures.load(Ordering::Relaxed),
            snapshots_behind: self.tracker.behind.load(Ordering::Relaxed),
            never_served: self.churn.pending.load(Ordering::Relaxed),
            stale_at_end: 0,
            cpu,
            load_generator_baseline_per_second: per_second(baseline.own_cpu, baseline),
            load_generator_churn_per_second: per_second(churned.own_cpu, churned),
            propagation_baseline: baseline.propagation.clone(),
            propagation_churn: churned.propagation.clone(),
            apiserver_requests_baseline: baseline.requests,
            apiserver_requests_churn: churned.requests,
            apiserver_watches_baseline: baseline.watches,
            apiserver_watches_churn: churned.watches,
        }
    }
}

impl Phase<'_> {
    /// One window: an update every `--churn-update-every` from version `first` on and, with
    /// `reconnects`, the deadlines passing meanwhile.
    async fn window(&self, first: u64, reconnects: bool) -> anyhow::Result<Window> {
        let (cpu_before, own_before) = ((self.cpu)(), own_cpu());
        let requests_before = api_requests(self.cluster).await;
        let started = Instant::now();
        let deadlines = async {
            if reconnects {
                self.deadlines(started).await;
            }
        };
        let (written, ()) = tokio::join!(self.updates(first, started), deadlines);
        let written = written?;
        let seconds = started.elapsed().as_secs_f64();
        let (cpu_after, own_after) = ((self.cpu)(), own_cpu());
        let requests_after = api_requests(self.cluster).await;
        let propagation = written
            .iter()
            .filter_map(|&(seq, at)| Some(ms(self.tracker.all_at(seq)?.saturating_sub(at))))
            .collect();
        let watches = match self.cluster {
            Some(cluster) => Some(cluster.open_watches("featureflags").await),
            None => None,
        };
        Ok(Window {
            seconds,
            cpu: cpu_after
                .iter()
                .zip(&cpu_before)
                .map(|(a, b)| a - b)
                .collect(),
            own_cpu: own_after - own_before,
            propagation: Stats::of(propagation),
            requests: requests_after
                .zip(requests_before)
                .map(|(a, b)| a.saturating_sub(b)),
            watches,
        })
    }

    /// Writes this window's updates on their schedule; each version and when it was written.
    async fn updates(&self, first: u64, started: Instant) -> anyhow::Result<Vec<(u64, u64)>> {
        let every = self.args.churn_update_every;
        let mut written = Vec::new();
        for i in 0..updates_per_window(self.args) {
            tokio::time::sleep_until((started + every * i as u32).into()).await;
            let seq = first + i;
            let mut at = 0;
            self.sources.write(seq, || at = self.tracker.now()).await?;
            written.push((seq, at));
        }
        tokio::time::sleep_until((started + self.args.churn_seconds).into()).await;
        Ok(written)
    }

    /// Ends the subscribers' streams in a random order, evenly spread at the phase's rate,
    /// until the window is over.
    async fn deadlines(&self, started: Instant) {
        let order = shuffled(self.subscribers);
        let gap = Duration::from_secs_f64(1.0 / self.per_second.max(1e-6));
        let end = started + self.args.churn_seconds;
        let mut next = started + gap / 2;
        for slot in order {
            if next >= end {
                break;
            }
            tokio::time::sleep_until(next.into()).await;
            self.churn.end(slot);
            next += gap;
        }
        tokio::time::sleep_until(end.into()).await;
    }
}

/// The processes whose CPU the first and second CPU rows show.
const PROCESSES: [&str; 2] = ["proxy (two tiers: central)", "node proxies"];

/// The figures of one run, in the table's order.
fn rows(c: &ChurnResult) -> Vec<Figure> {
    let named = |rows: Vec<(&str, Option<f64>, usize)>| {
        rows.into_iter()
            .map(|(name, value, digits)| (name.to_owned(), value, digits))
            .collect::<Vec<Figure>>()
    };
    let mut rows = named(served(c));
    rows.extend(cpu_rows(c));
    rows.extend(named(around(c)));
    rows
}

/// The reopens and how they were served.
fn served(c: &ChurnResult) -> Vec<(&'static str, Option<f64>, usize)> {
    let n = |v: u64| Some(v as f64);
    vec![
        ("reconnects a second", Some(c.per_second), 1),
        ("window (s)", Some(c.window_seconds), 1),
        ("updates written in each window", n(c.updates_per_window), 0),
        ("streams reopened", n(c.reconnects), 0),
        ("first snapshot p50 (ms)", c.first_snapshot.p50_ms, 2),
        ("first snapshot p99 (ms)", c.first_snapshot.p99_ms, 2),
        ("first snapshot max (ms)", c.first_snapshot.max_ms, 2),
        ("reopens failed (tried again)", n(c.reconnect_failures), 0),
        ("reopened streams never served", n(c.never_served as u64), 0),
        (
            "snapshots older than the subscriber had",
            n(c.snapshots_behind),
            0,
        ),
        ("subscribers stale at the end", n(c.stale_at_end as u64), 0),
    ]
}

/// Each process's CPU in both windows, and per reconnect.
fn cpu_rows(c: &ChurnResult) -> Vec<Figure> {
    let mut rows = Vec::new();
    for (i, process) in PROCESSES.iter().enumerate() {
        let cpu = c.cpu.get(i);
        rows.extend([
            (
                format!("{process}: CPU without reconnects (s/s)"),
                cpu.map(|p| p.baseline_per_second),
                3,
            ),
            (
                format!("{process}: CPU with reconnects (s/s)"),
                cpu.map(|p| p.churn_per_second),
                3,
            ),
            (
                format!("{process}: CPU per reconnect (ms)"),
                cpu.and_then(|p| p.per_reconnect_ms),
                3,
            ),
        ]);
    }
    rows
}

/// The load generator, the updates and the API server in both windows.
fn around(c: &ChurnResult) -> Vec<(&'static str, Option<f64>, usize)> {
    let n = |v: Option<u64>| v.map(|v| v as f64);
    let (base, churn) = (&c.propagation_baseline, &c.propagation_churn);
    vec![
        (
            "load generator: CPU without reconnects (s/s)",
            Some(c.load_generator_baseline_per_second),
            3,
        ),
        (
            "load generator: CPU with reconnects (s/s)",
            Some(c.load_generator_churn_per_second),
            3,
        ),
        ("propagation p99 without reconnects (ms)", base.p99_ms, 1),
        ("propagation p99 with reconnects (ms)", churn.p99_ms, 1),
        (
            "API requests on FeatureFlags without reconnects",
            n(c.apiserver_requests_baseline),
            0,
        ),
        (
            "API requests on FeatureFlags with reconnects",
            n(c.apiserver_requests_churn),
            0,
        ),
        (
            "API watches open after the window without reconnects",
            n(c.apiserver_watches_baseline),
            0,
        ),
        (
            "API watches open after the window with reconnects",
            n(c.apiserver_watches_churn),
            0,
        ),
    ]
}

/// The churn table: a row per figure, a column per run; rows no column has a value for are left
/// out.
pub(crate) fn table(columns: &[(&str, &ChurnResult)]) -> String {
    if columns.is_empty() {
        return String::new();
    }
    let columns: Vec<(&str, Vec<Figure>)> =
        columns.iter().map(|(name, c)| (*name, rows(c))).collect();
    let table = figure_table(&columns, Blank::Skip, "lr").markdown();
    format!("Steady reconnects (`--churn`):\n\n{table}\n")
}

fn own_cpu() -> f64 {
    proc_sample(std::process::id()).cpu_seconds
}

/// `0..n` in a random order (Fisher–Yates with splitmix64, seeded from the clock).
fn shuffled(n: usize) -> Vec<usize> {
    let mut state = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x9e37_79b9, |d| d.as_nanos() as u64);
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::shuffled;

    #[test]
    fn shuffled_is_a_permutation() {
        let mut order = shuffled(1000);
        order.sort_unstable();
        assert_eq!(order, (0..1000).collect::<Vec<_>>());
    }
}
