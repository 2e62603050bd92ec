//! What the services can learn about the connection a request came on. A leaf: the listener
//! fills it in, authorization and the wire read it.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::task::AtomicWaker;

use crate::budget::{self, Charge, Kind, MemoryBudget};

/// The client's address and certificate chain, as seen when the connection was accepted.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    pub remote_addr: Option<SocketAddr>,
    /// The client certificate chain, when the client presented one.
    pub peer_certificates: Option<Arc<Vec<rustls_pki_types::CertificateDer<'static>>>>,
    /// The connection's streams, when the server counts them.
    pub activity: Option<Arc<Activity>>,
}

/// What a connection is doing, for the limits that close idle connections: the streams open on
/// it and when it was last busy. The server keeps one per connection and hands it to every
/// request in its [`ConnectionInfo`]; each request holds an [`OpenStream`] while it runs.
#[derive(Debug)]
pub struct Activity {
    streams: AtomicUsize,
    /// The most streams open at once so far.
    peak: AtomicUsize,
    /// What the connection keeps for that many streams until it closes (see [`Activity::retain`]).
    retained: Mutex<Option<Charge>>,
    /// [`clock_ms`] when the connection last did something (opened, was read from, or saw its
    /// last stream end).
    heard: AtomicU64,
    /// Woken when the last stream ends, so the connection can start counting its idle time.
    idle: AtomicWaker,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            streams: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            retained: Mutex::new(None),
            heard: AtomicU64::new(clock_ms()),
            idle: AtomicWaker::new(),
        }
    }
}

impl Activity {
    /// Counts a stream as open until the returned guard is dropped.
    pub fn open_stream(self: &Arc<Self>) -> OpenStream {
        self.streams.fetch_add(1, Ordering::SeqCst);
        OpenStream(self.clone())
    }

    /// Notes that the connection's HTTP/2 layer holds `streams` at once now, and charges to
    /// `budget`, until the connection closes, what it keeps for the streams that adds to the
    /// most it ever held (its stream store grows to the connection's busiest moment and does
    /// not shrink). Charged whether or not it fits: it is held already; new work is what the
    /// budget refuses.
    pub fn retain_peak(&self, streams: usize, budget: &Arc<MemoryBudget>) {
        let grown = streams.saturating_sub(self.peak.fetch_max(streams, Ordering::SeqCst));
        if grown > 0 {
            self.keep(budget.charge(grown * budget::RETAINED_STREAM_BYTES, Kind::Connections));
        }
    }

    /// As [`Activity::retain_peak`], for `streams` the HTTP/2 layer is about to hold: a single
    /// new stream is charged whether or not it fits (the services refuse it at the budget), a
    /// burst of them only if it fits beside what its streams will be charged once the services
    /// take them. `false` when it does not (the budget counts a refusal): the bytes that open
    /// them must not reach the HTTP/2 layer.
    pub fn retain_burst(&self, streams: usize, budget: &Arc<MemoryBudget>) -> bool {
        let grown = self.growth(streams);
        if grown <= 1 {
            self.retain_peak(streams, budget);
            return true;
        }
        let kept = grown * budget::RETAINED_STREAM_BYTES;
        let admitted = grown * budget::STREAM_BYTES;
        let Some(mut charge) = budget.try_charge(kept + admitted, Kind::Connections) else {
            return false;
        };
        drop(charge.split_off(admitted));
        // Another stream may have raised the peak since: only what this one adds is kept.
        let added = streams.saturating_sub(self.peak.fetch_max(streams, Ordering::SeqCst));
        drop(charge.split_off((grown - added.min(grown)) * budget::RETAINED_STREAM_BYTES));
        self.keep(charge);
        true
    }

    /// How many places holding `streams` adds to the most the connection held.
    fn growth(&self, streams: usize) -> usize {
        streams.saturating_sub(self.peak.load(Ordering::SeqCst))
    }

    /// Keeps `charge` (for places a new peak added) until the connection closes.
    fn keep(&self, charge: Charge) {
        let mut retained = crate::locks::lock(&self.retained);
        match retained.as_mut() {
            Some(held) => held.absorb(charge),
            None => *retained = Some(charge),
        }
    }

    /// Streams open now.
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::SeqCst)
    }

    /// The places the connection keeps (and is charged for) beyond the streams open now: the
    /// most it held at once, less those.
    pub fn unused_places(&self) -> usize {
        self.peak
            .load(Ordering::SeqCst)
            .saturating_sub(self.streams())
    }

    /// Notes that the connection did something now.
    pub fn heard(&self) {
        self.heard.store(clock_ms(), Ordering::Relaxed);
    }

    /// [`clock_ms`] when the connection last did something.
    pub fn last_heard(&self) -> u64 {
        self.heard.load(Ordering::Relaxed)
    }

    /// Wakes `waker` when the connection's last stream ends.
    pub fn wake_when_idle(&self, waker: &std::task::Waker) {
        self.idle.register(waker);
    }
}

/// One open stream of a connection (see [`Activity::open_stream`]).
#[derive(Debug)]
pub struct OpenStream(Arc<Activity>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.heard();
        if self.0.streams.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.wake();
        }
    }
}

/// Milliseconds on a monotonic clock shared by the whole process.
pub fn clock_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    /// A connection is charged for the most streams it held at once, once each, until it
    /// closes: streams that come and go below that peak cost nothing more.
    #[test]
    fn a_connection_is_charged_its_busiest_moment_until_it_closes() {
        let budget = MemoryBudget::unlimited(Arc::new(Metrics::new()));
        let activity = Arc::new(Activity::default());
        let streams: Vec<OpenStream> = (0..3).map(|_| activity.open_stream()).collect();
        activity.retain_peak(activity.streams(), &budget);
        assert_eq!(budget.used(), 3 * budget::RETAINED_STREAM_BYTES);
        drop(streams);
        assert_eq!(activity.streams(), 0);
        for _ in 0..5 {
            let _again = activity.open_stream();
            activity.retain_peak(activity.streams(), &budget);
        }
        assert_eq!(
            budget.used(),
            3 * budget::RETAINED_STREAM_BYTES,
            "below the peak"
        );
        activity.retain_peak(4, &budget);
        assert_eq!(budget.used(), 4 * budget::RETAINED_STREAM_BYTES);
        drop(activity);
        assert_eq!(budget.used(), 0, "given back when the connection goes");
    }

    /// A burst is charged before the HTTP/2 layer holds it, only if it fits beside what its
    /// streams will be charged; a single new stream is charged anyway (the services refuse it).
    #[test]
    fn a_burst_that_does_not_fit_is_refused_and_a_single_stream_is_charged_anyway() {
        let per_stream = budget::RETAINED_STREAM_BYTES + budget::STREAM_BYTES;
        let budget = MemoryBudget::new(8 * per_stream, Arc::new(Metrics::new()));
        let activity = Activity::default();
        assert!(activity.retain_burst(8, &budget), "8 streams fit exactly");
        assert_eq!(budget.used(), 8 * budget::RETAINED_STREAM_BYTES);
        assert!(!activity.retain_burst(16, &budget), "8 more do not fit");
        assert_eq!(
            budget.used(),
            8 * budget::RETAINED_STREAM_BYTES,
            "nothing charged for them"
        );
        assert!(activity.retain_burst(8, &budget), "no new place");
        let _full = budget.charge(budget.limit(), Kind::Streams);
        assert!(
            activity.retain_burst(9, &budget),
            "one new stream is charged anyway"
        );
        assert_eq!(
            budget.used(),
            budget.limit() + 9 * budget::RETAINED_STREAM_BYTES,
            "its place kept"
        );
    }
}
