//! The soak's clients: the steady subscribers, the short-lived connections, and the subscribers
//! of the resources that come and go.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use tonic::Status;
use tonic::transport::{Channel, Endpoint, Uri};

use super::files::{Steady, Template};
use super::{files, probe};
use crate::NO_SEQ;
use crate::load::{Dial, Failures, open_channel, open_stream};

/// A connection to the sync port. One opened for an abrupt end keeps a duplicate of its socket,
/// with zero linger, so it can be cut from under the HTTP/2 client.
pub(crate) struct Conn {
    pub(crate) channel: Channel,
    socket: Option<std::net::TcpStream>,
}

impl Conn {
    pub(crate) async fn open(port: u16, abrupt: bool) -> anyhow::Result<Self> {
        let slot: Arc<Mutex<Option<std::net::TcpStream>>> = Arc::default();
        let theirs = slot.clone();
        let connector = tower::service_fn(move |_: Uri| {
            let theirs = theirs.clone();
            async move {
                let stream =
                    tokio::net::TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                        .await?;
                stream.set_nodelay(true)?;
                let stream = if abrupt {
                    // Closing the last descriptor of a socket with zero linger sends a reset.
                    stream.set_zero_linger()?;
                    let std = stream.into_std()?;
                    *probe::lock(&theirs) = Some(std.try_clone()?);
                    tokio::net::TcpStream::from_std(std)?
                } else {
                    stream
                };
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        });
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
            .connect_timeout(Duration::from_secs(10))
            .connect_with_connector(connector)
            .await?;
        let socket = probe::lock(&slot).take();
        Ok(Self { channel, socket })
    }

    /// Ends the connection. Abruptly, when opened so: the socket is shut down under the client,
    /// which sends neither RST_STREAM nor GOAWAY, and its last descriptor closes with a TCP
    /// reset. Else by dropping it: the client cancels its streams and closes the connection.
    pub(crate) fn close(self) {
        if let Some(socket) = &self.socket {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Steady subscribers

/// What the steady subscribers saw: each one's newest version and message count.
pub(crate) struct SteadyTracker {
    pub(crate) latest: Vec<AtomicU64>,
    pub(crate) received: Vec<AtomicU64>,
    /// Messages older than one the subscriber already had.
    pub(crate) backwards: AtomicU64,
    /// Messages with the version the subscriber already had.
    pub(crate) repeats: AtomicU64,
    pub(crate) failures: Failures,
}

impl SteadyTracker {
    pub(crate) fn new(subscribers: usize) -> Self {
        let vec64 = |v: u64| (0..subscribers).map(|_| AtomicU64::new(v)).collect();
        Self {
            latest: vec64(NO_SEQ),
            received: vec64(0),
            backwards: AtomicU64::new(0),
            repeats: AtomicU64::new(0),
            failures: Failures::default(),
        }
    }

    fn record(&self, slot: usize, seq: u64) {
        self.received[slot].fetch_add(1, Ordering::Relaxed);
        if seq == NO_SEQ {
            self.failures.unparsed_message();
            return;
        }
        let previous = self.latest[slot].load(Ordering::Relaxed);
        if previous != NO_SEQ && seq < previous {
            self.backwards.fetch_add(1, Ordering::Relaxed);
        } else if previous == seq {
            self.repeats.fetch_add(1, Ordering::Relaxed);
        } else {
            self.latest[slot].store(seq, Ordering::Relaxed);
        }
    }

    /// Subscribers whose newest version is not `finals[slot % finals.len()]`.
    pub(crate) fn not_on(&self, finals: &[u64]) -> usize {
        self.latest
            .iter()
            .enumerate()
            .filter(|(slot, v)| v.load(Ordering::Relaxed) != finals[slot % finals.len()])
            .count()
    }

    /// Waits until every subscriber is on its final version, or `timeout`; those that are not.
    pub(crate) async fn wait_on(&self, finals: &[u64], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let stale = self.not_on(finals);
            if stale == 0 || Instant::now() >= deadline {
                return stale;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Versions received per subscriber: fewest, median, most.
    pub(crate) fn received_spread(&self) -> (u64, u64, u64) {
        let mut counts: Vec<u64> = self
            .received
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        counts.sort_unstable();
        match (counts.first(), counts.last()) {
            (Some(&min), Some(&max)) => (min, counts[counts.len() / 2], max),
            _ => (0, 0, 0),
        }
    }
}

/// Connects `subscribers` streams over `connections` connections, subscriber `slot` on
/// connection `slot % connections` for steady resource `slot % resources`.
pub(crate) async fn connect_steady(
    dial: &Dial,
    steady: &Steady,
    subscribers: usize,
    connections: usize,
    tracker: &Arc<SteadyTracker>,
) -> anyhow::Result<tokio::task::JoinSet<()>> {
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        channels.push(open_channel(dial, None).await?);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for slot in 0..subscribers {
        let channel = channels[slot % connections].clone();
        let selector = steady.selector(slot % steady.names.len());
        let tracker = tracker.clone();
        tasks.spawn(async move {
            let error =
                crate::load::follow(channel, &selector, |seq| tracker.record(slot, seq)).await;
            let who = format!("steady subscriber {slot}");
            tracker.failures.stream_failed(Some(&who), &error);
        });
    }
    Ok(tasks)
}

// ---------------------------------------------------------------------------------------------
// The churn

/// After this many failed short-lived connections or lifecycles, the churn stops: the proxy
/// is not serving, and waiting out every timeout would only hold the run.
const GIVE_UP_AFTER_FAILURES: u64 = 10;
/// Names each lifecycle loop cycles through (so names come back, to a watch that may or may not
/// have stopped yet).
const NAMES_PER_LOOP: usize = 8;
/// Resource lifecycles run at once.
pub(crate) const LIFECYCLE_LOOPS: usize = 8;
/// Versions of the resources that come and go start here, above any steady version, and only
/// grow, so that a name that comes back never repeats an earlier version.
const EPHEMERAL_SEQ_START: u64 = 1 << 40;

/// Counts of the churn, as the report gives them.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct ChurnCounts {
    /// Short-lived connections that got their first version and closed.
    pub(crate) connects: AtomicU64,
    pub(crate) connects_abrupt: AtomicU64,
    pub(crate) connects_held: AtomicU64,
    /// Versions the held short-lived streams got after their first.
    pub(crate) held_messages: AtomicU64,
    pub(crate) connect_failures: AtomicU64,
    pub(crate) lifecycles_appearing: AtomicU64,
    pub(crate) lifecycles_never: AtomicU64,
    pub(crate) lifecycle_failures: AtomicU64,
    /// Connections of the subscribers of the resources that come and go.
    pub(crate) lifecycle_connects: AtomicU64,
    pub(crate) files_created: AtomicU64,
    pub(crate) files_deleted: AtomicU64,
}

/// What the churn's tasks share.
pub(crate) struct Churn {
    pub(crate) port: u16,
    pub(crate) steady: Arc<Steady>,
    pub(crate) payload: usize,
    pub(crate) timeout: Duration,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) counts: ChurnCounts,
    /// The first failures, in words.
    pub(crate) errors: Mutex<Vec<String>>,
    ephemeral_seq: AtomicU64,
}

/// Evenly spaced instants: the n-th of `count` at `start + n × over / count`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    start: Instant,
    interval: Duration,
}

impl Pace {
    pub(crate) fn new(start: Instant, count: u64, over: Duration) -> Self {
        let interval = if count == 0 {
            Duration::ZERO
        } else {
            over.div_f64(count as f64)
        };
        Self { start, interval }
    }

    async fn wait(&self, n: u64) {
        tokio::time::sleep_until((self.start + self.interval.mul_f64(n as f64)).into()).await;
    }
}

impl Churn {
    pub(crate) fn new(
        port: u16,
        steady: Arc<Steady>,
        payload: usize,
        timeout: Duration,
        stop: Arc<AtomicBool>,
    ) -> Self {
        Self {
            port,
            steady,
            payload,
            timeout,
            stop,
            counts: ChurnCounts::default(),
            errors: Mutex::new(Vec::new()),
            ephemeral_seq: AtomicU64::new(EPHEMERAL_SEQ_START),
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn fail(&self, counter: &AtomicU64, what: String) {
        counter.fetch_add(1, Ordering::Relaxed);
        let mut errors = probe::lock(&self.errors);
        if errors.len() < 10 {
            errors.push(what);
        }
        let failures = self.counts.connect_failures.load(Ordering::Relaxed)
            + self.counts.lifecycle_failures.load(Ordering::Relaxed);
        if failures >= GIVE_UP_AFTER_FAILURES {
            self.stop.store(true, Ordering::Relaxed);
        }
    }

    /// Starts `workers` tasks that make `total` short-lived connections between them, the n-th
    /// not before its instant of `pace`.
    pub(crate) fn spawn_connects(
        self: &Arc<Self>,
        tasks: &mut tokio::task::JoinSet<()>,
        workers: usize,
        total: u64,
        pace: Pace,
    ) {
        let tickets = Arc::new(AtomicU64::new(0));
        for _ in 0..workers.max(1) {
            let (churn, tickets) = (self.clone(), tickets.clone());
            tasks.spawn(async move {
                loop {
                    let n = tickets.fetch_add(1, Ordering::Relaxed);
                    if n >= total || churn.stopped() {
                        return;
                    }
                    pace.wait(n).await;
                    let outcome = tokio::time::timeout(churn.timeout, churn.connect_once(n)).await;
                    let error = match outcome {
                        Ok(Ok(())) => continue,
                        Ok(Err(error)) => format!("{error:#}"),
                        Err(_) => format!("no answer within {:?}", churn.timeout),
                    };
                    churn.fail(
                        &churn.counts.connect_failures,
                        format!("short-lived connection {n}: {error}"),
                    );
                }
            });
        }
    }

    /// One short-lived connection: a stream for a steady resource, its first version, then
    /// (every other one) the stream held up to 250 ms, and the connection closed, abruptly
    /// every other time.
    async fn connect_once(&self, n: u64) -> anyhow::Result<()> {
        let (abrupt, hold) = (n % 2 == 1, n % 4 >= 2);
        let resources = self.steady.names.len() as u64;
        let r = ((n / 4).wrapping_mul(2_654_435_761) % resources) as usize;
        let conn = Conn::open(self.port, abrupt).await?;
        let mut stream = open_stream(conn.channel.clone(), &self.steady.selector(r)).await?;
        let first = stream
            .message()
            .await?
            .context("the stream ended before its first version")?;
        self.check_steady(r, first)?;
        if hold {
            let mut last = first;
            let held = async {
                while let Some(seq) = stream.message().await? {
                    self.check_steady(r, seq)?;
                    anyhow::ensure!(seq >= last, "version {seq} after {last}");
                    last = seq;
                    self.counts.held_messages.fetch_add(1, Ordering::Relaxed);
                }
                Err::<(), _>(anyhow::anyhow!("the stream ended while held"))
            };
            // Running out the time is the normal end.
            let time = Duration::from_millis((n / 4) % 250);
            if let Ok(Err(error)) = tokio::time::timeout(time, held).await {
                return Err(error);
            }
            self.counts.connects_held.fetch_add(1, Ordering::Relaxed);
        }
        if abrupt {
            conn.close();
            drop(stream);
            self.counts.connects_abrupt.fetch_add(1, Ordering::Relaxed);
        } else {
            drop(stream);
            conn.close();
        }
        self.counts.connects.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A version a subscriber of steady resource `r` got must carry a number, and one that was
    /// written.
    fn check_steady(&self, r: usize, seq: u64) -> anyhow::Result<()> {
        anyhow::ensure!(seq != NO_SEQ, "a message without a version number");
        let written = self.steady.written[r].load(Ordering::Acquire);
        anyhow::ensure!(
            seq <= written,
            "version {seq} of {} was never written (newest: {written})",
            self.steady.names[r]
        );
        Ok(())
    }

    /// Starts [`LIFECYCLE_LOOPS`] tasks that run `total` resource lifecycles between them.
    pub(crate) fn spawn_lifecycles(
        self: &Arc<Self>,
        tasks: &mut tokio::task::JoinSet<()>,
        total: u64,
        pace: Pace,
    ) {
        let tickets = Arc::new(AtomicU64::new(0));
        for lane in 0..LIFECYCLE_LOOPS {
            let (churn, tickets) = (self.clone(), tickets.clone());
            tasks.spawn(async move {
                for cycle in 0.. {
                    let n = tickets.fetch_add(1, Ordering::Relaxed);
                    if n >= total || churn.stopped() {
                        return;
                    }
                    pace.wait(n).await;
                    let slot = lane + LIFECYCLE_LOOPS * (cycle % NAMES_PER_LOOP);
                    let lifecycle = async {
                        if n % 4 == 3 {
                            churn.never_appears(slot, n).await
                        } else {
                            churn.appears(slot, n % 4 == 1).await
                        }
                    };
                    let outcome = tokio::time::timeout(churn.timeout * 4, lifecycle).await;
                    let error = match outcome {
                        Ok(Ok(())) => continue,
                        Ok(Err(error)) => format!("{error:#}"),
                        Err(_) => format!("not done within {:?}", churn.timeout * 4),
                    };
                    // Leave no file behind for the next lifecycle of this name.
                    let _ = churn.steady.dirs.remove(&format!("e{slot}"));
                    churn.fail(
                        &churn.counts.lifecycle_failures,
                        format!("resource lifecycle {n} (e{slot}): {error}"),
                    );
                }
            });
        }
    }

    /// A resource that comes and goes: a subscriber asks for `e<slot>` before its file exists,
    /// the file is created, a second subscriber comes, the file is rewritten and deleted
    /// (`twice`: created and deleted once more), and both subscribers leave, the second
    /// abruptly. Each must get each version.
    async fn appears(&self, slot: usize, twice: bool) -> anyhow::Result<()> {
        let name = format!("e{slot}");
        let selector = files::selector(&name);
        let template = Template::new(&name, self.payload)?;
        let early = self.follow(&selector, false).await?;
        // Let the request reach the proxy: its watch starts and waits for the resource.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let first = self.create(&name, &template)?;
        early
            .wait_for(first, self.timeout)
            .await
            .context("the subscriber that asked before the resource existed")?;
        let late = self.follow(&selector, true).await?;
        late.wait_for(first, self.timeout)
            .await
            .context("the subscriber that came once it existed")?;
        let rounds = if twice { 2 } else { 1 };
        for round in 0..rounds {
            let seq = if round == 0 {
                let seq = self.next_ephemeral();
                self.steady.dirs.write(&name, &template.render(seq))?;
                seq
            } else {
                self.create(&name, &template)?
            };
            for (who, follower) in [("early", &early), ("late", &late)] {
                follower
                    .wait_for(seq, self.timeout)
                    .await
                    .with_context(|| format!("the {who} subscriber, round {round}"))?;
            }
            self.steady.dirs.remove(&name)?;
            self.counts.files_deleted.fetch_add(1, Ordering::Relaxed);
            // Let the proxy see it gone while the subscribers are still there.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        early.close()?;
        late.close()?;
        self.counts
            .lifecycles_appearing
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A subscriber asks for `n<slot>`, which never exists, and leaves after 100 ms (abruptly
    /// every other time); it must get nothing.
    async fn never_appears(&self, slot: usize, n: u64) -> anyhow::Result<()> {
        let selector = files::selector(&format!("n{slot}"));
        let follower = self.follow(&selector, (n / 4) % 2 == 1).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let seen = follower.seen.latest.load(Ordering::Relaxed);
        anyhow::ensure!(
            seen == NO_SEQ,
            "got version {seen} of a resource that never existed"
        );
        follower.close()?;
        self.counts.lifecycles_never.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn next_ephemeral(&self) -> u64 {
        self.ephemeral_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Creates resource `name`'s file with a new version; the version.
    fn create(&self, name: &str, template: &Template) -> anyhow::Result<u64> {
        let seq = self.next_ephemeral();
        self.steady.dirs.write(name, &template.render(seq))?;
        self.counts.files_created.fetch_add(1, Ordering::Relaxed);
        Ok(seq)
    }

    async fn follow(&self, selector: &Arc<str>, abrupt: bool) -> anyhow::Result<Follower> {
        let follower = Follower::open(self.port, selector.clone(), abrupt).await?;
        self.counts
            .lifecycle_connects
            .fetch_add(1, Ordering::Relaxed);
        Ok(follower)
    }
}

/// What one subscriber of a resource that comes and goes has seen.
#[derive(Default)]
struct Seen {
    latest: AtomicU64,
    backwards: AtomicU64,
    ended: Mutex<Option<String>>,
}

/// A subscriber of a resource that comes and goes, on a connection of its own.
struct Follower {
    conn: Conn,
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Seen>,
}

impl Follower {
    /// Connects and asks for `selector`; the stream is read by a task of its own (the proxy may
    /// answer only once the resource exists).
    async fn open(port: u16, selector: Arc<str>, abrupt: bool) -> anyhow::Result<Self> {
        let conn = Conn::open(port, abrupt).await?;
        let seen = Arc::new(Seen {
            latest: AtomicU64::new(NO_SEQ),
            ..Seen::default()
        });
        let (channel, ours) = (conn.channel.clone(), seen.clone());
        let task = tokio::spawn(async move {
            let result = async {
                let mut stream = open_stream(channel, &selector).await?;
                while let Some(seq) = stream.message().await? {
                    let previous = ours.latest.load(Ordering::Relaxed);
                    if previous != NO_SEQ && seq < previous {
                        ours.backwards.fetch_add(1, Ordering::Relaxed);
                    } else {
                        ours.latest.store(seq, Ordering::Relaxed);
                    }
                }
                Ok::<(), Status>(())
            }
            .await;
            let why = match result {
                Ok(()) => "the stream ended".to_owned(),
                Err(status) => format!("{:?}: {}", status.code(), status.message()),
            };
            *probe::lock(&ours.ended) = Some(why);
        });
        Ok(Self { conn, task, seen })
    }

    /// Waits until this subscriber has version `seq` (or a newer one).
    async fn wait_for(&self, seq: u64, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let latest = self.seen.latest.load(Ordering::Relaxed);
            if latest != NO_SEQ && latest >= seq {
                return Ok(());
            }
            if let Some(why) = probe::lock(&self.seen.ended).clone() {
                anyhow::bail!("waiting for version {seq}: {why}");
            }
            if Instant::now() >= deadline {
                let had = if latest == NO_SEQ {
                    "none".to_owned()
                } else {
                    latest.to_string()
                };
                anyhow::bail!("version {seq} did not come within {timeout:?} (it had {had})");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Leaves (abruptly, when opened so); an error if it saw a version older than one it had,
    /// or its stream ended before.
    fn close(self) -> anyhow::Result<()> {
        let ended = probe::lock(&self.seen.ended).clone();
        let backwards = self.seen.backwards.load(Ordering::Relaxed);
        if self.conn.socket.is_some() {
            self.conn.close();
            self.task.abort();
        } else {
            self.task.abort();
            self.conn.close();
        }
        if let Some(why) = ended {
            anyhow::bail!("the stream ended while subscribed: {why}");
        }
        anyhow::ensure!(
            backwards == 0,
            "{backwards} version(s) older than one it had"
        );
        Ok(())
    }
}
