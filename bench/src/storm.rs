//! The reconnect storm: every subscriber drops its connection at once (a proxy restart, a
//! network blip, a node drain) and all of them reconnect within `--storm-spread`. Measured: the
//! time from the drop until every one has its snapshot again, the proxy's CPU and RSS meanwhile,
//! and whether the proxy kept answering those it already served: `/readyz` on the management
//! port (polled every 100 ms) and a few witness streams that stay connected throughout and must
//! get a version written in the middle of the storm.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flagd_proxy::introspection::Process;

use crate::churn::subscriber;
use crate::kit::latency::Stats;
use crate::load::{Dial, Tracker, open_channel, open_stream};
use crate::sampling::{mib, ms, proc_sample};
use crate::sources::Sources;

/// What the storm did to one proxy.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct StormResult {
    pub subscribers: usize,
    /// Subscribers that had their snapshot again before the storm timeout.
    pub served_again: usize,
    /// From the drop until the last subscriber had its snapshot again.
    pub seconds_to_all: Option<f64>,
    /// Per subscriber: from its reconnect attempt to its snapshot.
    pub reconnect_to_snapshot: Stats,
    /// Connection or stream attempts that failed and were tried again.
    pub retries: u64,
    /// Subscribers still without a snapshot when the storm timeout ran out.
    pub gave_up: usize,
    pub rss_peak_mib: f64,
    pub cpu_seconds: f64,
    pub readyz_probes: usize,
    pub readyz_failures: usize,
    pub readyz_max_ms: Option<f64>,
    pub witnesses: usize,
    /// The version written in the middle of the storm: until every witness had it.
    pub witness_update_ms: Option<f64>,
    pub witness_stream_errors: u64,
}

pub struct StormSetup<'a> {
    pub dial: &'a Dial,
    pub management_port: u16,
    pub pid: u32,
    pub sources: &'a Sources,
    pub subscribers: usize,
    pub spread: Duration,
    pub timeout: Duration,
    /// The version to write in the middle of the storm.
    pub seq: u64,
    pub versions: usize,
    /// Open file descriptors of the proxy before any subscriber connected.
    pub fds_before: usize,
}

/// Runs the storm; `drop_all` must end every subscriber's connection (it is called after the
/// witnesses are connected) and returns once it has.
pub async fn run(
    setup: StormSetup<'_>,
    drop_all: impl std::future::Future<Output = ()>,
) -> anyhow::Result<StormResult> {
    let n = setup.subscribers;
    let mut result = StormResult {
        subscribers: n,
        ..StormResult::default()
    };

    // Witnesses: connected before, kept through the storm.
    result.witnesses = (n / 100).clamp(1, 20);
    let (witness_tracker, mut witness_tasks) = witnesses(&setup, result.witnesses).await?;

    // Drop everyone else, and wait until the proxy has let go of their connections.
    drop_all.await;
    let_go(&setup, result.witnesses).await;

    let reconnects = Reconnects::new(&setup);
    let cpu_before = proc_sample(setup.pid).cpu_seconds;
    let start = Instant::now();
    let mut clients = reconnects.spawn(&setup, start);

    // /readyz, every 100 ms, throughout, from a thread of its own so that the load generator's
    // own backlog does not count against the proxy.
    let probing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let probes = probe_readyz(setup.management_port, probing.clone());

    // A new version in the middle of the storm, for the witnesses.
    tokio::time::sleep_until((start + setup.spread / 2).into()).await;
    let witness_wait = update_witnesses(&setup, &witness_tracker).await?;

    let peak = reconnects.wait_served(&setup, start, &mut result).await;
    result.cpu_seconds = proc_sample(setup.pid).cpu_seconds - cpu_before;
    result.served_again = reconnects.tracker.connected.load(Ordering::Relaxed);
    result.retries = reconnects.retries.load(Ordering::Relaxed);
    result.gave_up = n - result.served_again;
    result.witness_update_ms = witness_wait.await.ok().flatten();
    result.witness_stream_errors = witness_tracker.failures.errors();
    probing.store(false, Ordering::Relaxed);
    let (samples, failures) = probes.join().unwrap_or_default();
    result.readyz_probes = samples.len() + failures;
    result.readyz_failures = failures;
    result.readyz_max_ms = samples.iter().copied().reduce(f64::max);
    result.rss_peak_mib = mib(peak.max(proc_sample(setup.pid).rss_kib));
    result.reconnect_to_snapshot = Stats::of(
        reconnects
            .latencies
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default(),
    );

    clients.abort_all();
    while clients.join_next().await.is_some() {}
    witness_tasks.abort_all();
    while witness_tasks.join_next().await.is_some() {}
    Ok(result)
}

/// Waits until the proxy has closed the connections of the dropped subscribers (its open files
/// back near where they were with only the `witnesses`), or 20 s.
async fn let_go(setup: &StormSetup<'_>, witnesses: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while open_fds(setup.pid) > setup.fds_before + witnesses + 16 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes the storm's version; the task that waits until every witness has it (how long after
/// the write, in ms).
async fn update_witnesses(
    setup: &StormSetup<'_>,
    witness_tracker: &Arc<Tracker>,
) -> anyhow::Result<tokio::task::JoinHandle<Option<f64>>> {
    let mut written = 0;
    setup
        .sources
        .write(setup.seq, || written = witness_tracker.now())
        .await?;
    let witness_tracker = witness_tracker.clone();
    let seq = setup.seq;
    Ok(tokio::spawn(async move {
        witness_tracker
            .wait_all(seq, Duration::from_secs(30))
            .await
            .map(|at| ms(at.saturating_sub(written)))
    }))
}

/// Connects `witnesses` subscribers and waits for their snapshots.
async fn witnesses(
    setup: &StormSetup<'_>,
    witnesses: usize,
) -> anyhow::Result<(Arc<Tracker>, tokio::task::JoinSet<()>)> {
    let resources = setup.sources.selectors.len();
    let witness_tracker = Arc::new(Tracker::new(witnesses, setup.versions));
    let mut witness_tasks = tokio::task::JoinSet::new();
    for slot in 0..witnesses {
        let channel = open_channel(setup.dial, None).await?;
        let selector = setup.sources.selectors[slot % resources].clone();
        witness_tasks.spawn(subscriber(
            channel,
            selector,
            slot,
            witness_tracker.clone(),
            None,
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while witness_tracker.connected.load(Ordering::Relaxed) < witnesses {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the storm's witnesses got no snapshot"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((witness_tracker, witness_tasks))
}

/// What the reconnecting subscribers share.
struct Reconnects {
    tracker: Arc<Tracker>,
    retries: Arc<AtomicU64>,
    gave_up: Arc<AtomicUsize>,
    latencies: Arc<std::sync::Mutex<Vec<f64>>>,
}

impl Reconnects {
    fn new(setup: &StormSetup<'_>) -> Self {
        let n = setup.subscribers;
        Reconnects {
            tracker: Arc::new(Tracker::new(n, setup.versions)),
            retries: Arc::new(AtomicU64::new(0)),
            gave_up: Arc::new(AtomicUsize::new(0)),
            latencies: Arc::new(std::sync::Mutex::new(Vec::with_capacity(n))),
        }
    }

    /// Starts every subscriber's reconnect, spread evenly over the window from `start`, in an
    /// order unrelated to the slot.
    fn spawn(&self, setup: &StormSetup<'_>, start: Instant) -> tokio::task::JoinSet<()> {
        let n = setup.subscribers;
        let resources = setup.sources.selectors.len();
        let mut clients = tokio::task::JoinSet::new();
        for slot in 0..n {
            let at = setup
                .spread
                .mul_f64(((slot as u64 * 2_654_435_761) % n as u64) as f64 / n as f64);
            let client = Reconnect {
                slot,
                dial: setup.dial.clone(),
                selector: setup.sources.selectors[slot % resources].clone(),
                tracker: self.tracker.clone(),
                retries: self.retries.clone(),
                gave_up: self.gave_up.clone(),
                latencies: self.latencies.clone(),
                timeout: setup.timeout,
            };
            clients.spawn(client.run(start, at));
        }
        clients
    }

    /// Waits until every subscriber is served again, has given up, or the storm timeout (plus
    /// one attempt) has passed; returns the peak RSS meanwhile (KiB).
    async fn wait_served(
        &self,
        setup: &StormSetup<'_>,
        start: Instant,
        result: &mut StormResult,
    ) -> u64 {
        let n = setup.subscribers;
        let mut peak = 0u64;
        let deadline = start + setup.timeout + Duration::from_secs(11);
        loop {
            peak = peak.max(proc_sample(setup.pid).rss_kib);
            let served = self.tracker.connected.load(Ordering::Relaxed);
            if served >= n {
                result.seconds_to_all = Some(start.elapsed().as_secs_f64());
                break;
            }
            if self.gave_up.load(Ordering::Relaxed) + served >= n || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        peak
    }
}

/// One subscriber reconnecting in the storm.
struct Reconnect {
    slot: usize,
    dial: Dial,
    selector: Arc<str>,
    tracker: Arc<Tracker>,
    retries: Arc<AtomicU64>,
    gave_up: Arc<AtomicUsize>,
    latencies: Arc<std::sync::Mutex<Vec<f64>>>,
    timeout: Duration,
}

impl Reconnect {
    /// At `start + at`, reconnects until served (then stays connected, as a subscriber does) or
    /// until the storm timeout.
    async fn run(self, start: Instant, at: Duration) {
        let slot = self.slot;
        tokio::time::sleep_until((start + at).into()).await;
        let began = Instant::now();
        loop {
            let attempt = async {
                let channel = open_channel(&self.dial, None).await?;
                let mut stream = open_stream(channel, &self.selector).await?;
                let seq = anyhow::Context::context(stream.message().await?, "stream ended")?;
                Ok::<_, anyhow::Error>((stream, seq))
            };
            match tokio::time::timeout(Duration::from_secs(10), attempt).await {
                Ok(Ok((mut stream, seq))) => {
                    self.tracker.record(slot, seq);
                    if let Ok(mut l) = self.latencies.lock() {
                        l.push(began.elapsed().as_secs_f64() * 1e3);
                    }
                    // Stay connected, as a subscriber does.
                    while let Ok(Some(seq)) = stream.message().await {
                        self.tracker.record(slot, seq);
                    }
                    return;
                }
                _ if start.elapsed() >= self.timeout => {
                    self.gave_up.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                _ => {
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Polls `/readyz` every 100 ms until `probing` turns false: the answer times (ms) of the
/// probes that got 200, and how many did not.
fn probe_readyz(
    port: u16,
    probing: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(Vec<f64>, usize)> {
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        let mut failures = 0;
        while probing.load(Ordering::Relaxed) {
            let began = Instant::now();
            match readyz(port) {
                Ok(true) => samples.push(began.elapsed().as_secs_f64() * 1e3),
                _ => failures += 1,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (samples, failures)
    })
}

/// `GET /readyz` on the management port (2 s to connect, 2 s to answer): whether it answered
/// 200.
pub fn readyz(port: u16) -> std::io::Result<bool> {
    use std::io::{Read, Write};
    let address = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    Ok(response.starts_with(b"HTTP/1.1 200") || response.starts_with(b"HTTP/1.0 200"))
}

/// Open file descriptors of process `pid`.
pub fn open_fds(pid: u32) -> usize {
    Process::Id(pid).open_files().unwrap_or(0)
}
