//! The storm's clients: each connects from its identity's address (with its token where the
//! mode uses tokens), opens a stream for its identity's FeatureFlag and waits for the snapshot,
//! trying again after a failure; then it stays subscribed. What they did is counted, not timed
//! one by one.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tonic::metadata::AsciiMetadataValue;

use crate::load::{Dial, open_channel, open_stream_as};

/// How long one attempt (connect, stream, snapshot) may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause before a failed attempt is tried again.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// One client: where it connects from, what it presents and what it asks for.
#[derive(Clone)]
pub(crate) struct Client {
    pub(crate) address: Ipv4Addr,
    pub(crate) authorization: Option<AsciiMetadataValue>,
    pub(crate) selector: Arc<str>,
}

/// What the clients of one phase did.
#[derive(Default)]
pub(crate) struct Counters {
    /// Clients that have their snapshot.
    pub(crate) served: AtomicUsize,
    /// Clients that gave up (the phase's time ran out).
    pub(crate) gave_up: AtomicUsize,
    /// Attempts the proxy answered with an error status, by status code.
    refusals: std::sync::Mutex<BTreeMap<String, u64>>,
    /// Attempts that failed before the proxy answered (connect, timeout), tried again.
    pub(crate) connect_failures: AtomicU64,
    /// Streams that ended after their client was served.
    pub(crate) streams_ended: AtomicU64,
}

impl Counters {
    fn refused(&self, status: &tonic::Status) {
        let mut refusals = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        let message: String = status.message().chars().take(120).collect();
        *refusals
            .entry(format!("{:?}: {message}", status.code()))
            .or_default() += 1;
    }

    /// The refusals, by status code and message.
    pub(crate) fn refusals(&self) -> BTreeMap<String, u64> {
        self.refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The clients of one phase, running.
pub(crate) struct Crowd {
    pub(crate) counters: Arc<Counters>,
    tasks: tokio::task::JoinSet<()>,
}

/// When and how fast a phase's clients start.
pub(crate) enum Start {
    /// As fast as `in_flight` attempts at a time allow.
    Paced { in_flight: usize },
    /// Each at its own instant, spread evenly over the window, all at once if it is zero.
    Spread(Duration),
}

impl Crowd {
    /// Starts every client; each tries until it is served or `deadline` has passed.
    pub(crate) fn start(dial: &Dial, clients: &[Client], start: Start, deadline: Instant) -> Self {
        let counters = Arc::new(Counters::default());
        let mut tasks = tokio::task::JoinSet::new();
        let n = clients.len().max(1);
        let began = Instant::now();
        let gate = match start {
            Start::Paced { in_flight } => Some(Arc::new(Semaphore::new(in_flight.max(1)))),
            Start::Spread(_) => None,
        };
        for (slot, client) in clients.iter().enumerate() {
            let at = match start {
                // In an order unrelated to the slot, so the identities are mixed.
                Start::Spread(window) => {
                    began
                        + window
                            .mul_f64(((slot as u64 * 2_654_435_761) % n as u64) as f64 / n as f64)
                }
                Start::Paced { .. } => began,
            };
            let run = Run {
                dial: dial.clone(),
                client: client.clone(),
                counters: counters.clone(),
                gate: gate.clone(),
                deadline,
            };
            tasks.spawn(run.run(at));
        }
        Crowd { counters, tasks }
    }

    /// Waits until every client is served or has given up; the peak of `sample()` meanwhile.
    pub(crate) async fn wait(&self, clients: usize, mut sample: impl FnMut() -> u64) -> u64 {
        let mut peak = 0;
        loop {
            peak = peak.max(sample());
            let c = &self.counters;
            if c.served.load(Ordering::Relaxed) + c.gave_up.load(Ordering::Relaxed) >= clients {
                return peak;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Drops every client's connection at once (as a proxy restart or a network blip would).
    pub(crate) async fn drop_all(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// One client's part in a phase.
struct Run {
    dial: Dial,
    client: Client,
    counters: Arc<Counters>,
    gate: Option<Arc<Semaphore>>,
    deadline: Instant,
}

/// How an attempt failed.
enum Failure {
    /// The proxy answered with an error status.
    Refused(tonic::Status),
    /// No answer: the connection failed, or the attempt timed out.
    NoAnswer,
}

impl Run {
    /// At `at`, tries until served (then stays subscribed) or until the deadline.
    async fn run(self, at: Instant) {
        tokio::time::sleep_until(at.into()).await;
        loop {
            let permit = match &self.gate {
                Some(gate) => gate.clone().acquire_owned().await.ok(),
                None => None,
            };
            let attempt = tokio::time::timeout(ATTEMPT_TIMEOUT, self.attempt()).await;
            drop(permit);
            let failure = match attempt {
                Ok(Ok(mut stream)) => {
                    self.counters.served.fetch_add(1, Ordering::Relaxed);
                    while let Ok(Some(_)) = stream.message().await {}
                    self.counters.streams_ended.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Ok(Err(failure)) => failure,
                Err(_) => Failure::NoAnswer,
            };
            match failure {
                Failure::Refused(status) => self.counters.refused(&status),
                Failure::NoAnswer => {
                    self.counters
                        .connect_failures
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            if Instant::now() + RETRY_AFTER >= self.deadline {
                self.counters.gave_up.fetch_add(1, Ordering::Relaxed);
                return;
            }
            tokio::time::sleep(RETRY_AFTER).await;
        }
    }

    /// Connects, opens the stream and waits for the snapshot.
    async fn attempt(&self) -> Result<tonic::Streaming<u64>, Failure> {
        let client = &self.client;
        let channel = open_channel(&self.dial, Some(client.address))
            .await
            .map_err(|_| Failure::NoAnswer)?;
        let mut stream = open_stream_as(channel, &client.selector, client.authorization.as_ref())
            .await
            .map_err(Failure::Refused)?;
        match stream.message().await {
            Ok(Some(_)) => Ok(stream),
            Ok(None) => Err(Failure::Refused(tonic::Status::unknown(
                "the stream ended before its snapshot",
            ))),
            Err(status) => Err(Failure::Refused(status)),
        }
    }
}
