//! The bound on resources waited on that do not exist (see the hub's module header).
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// One watch's share of the resources waited on that do not exist. It changes only inside the
/// watch channel's `send_if_modified` (which holds the channel's lock), so one watch's
/// transitions never race each other.
pub(super) struct WaitingPlace {
    count: Arc<AtomicUsize>,
    pub(super) limit: usize,
    metrics: Arc<Metrics>,
    /// This watch holds one place in `count`.
    held: AtomicBool,
    /// The watch has stopped; it takes no place any more.
    closed: AtomicBool,
    /// Cancelled when the resource was refused a place: the watch stops at once.
    pub(super) refused: CancellationToken,
}

impl WaitingPlace {
    /// A watch's place among the `limit` resources waited on, counted in `count`.
    pub(super) fn new(count: Arc<AtomicUsize>, limit: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            count,
            limit,
            metrics,
            held: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            refused: CancellationToken::new(),
        }
    }

    /// Takes a place for this watch unless it holds one already; false if none is left.
    pub(super) fn take(&self) -> bool {
        if self.held.load(Ordering::Acquire) || self.closed.load(Ordering::Acquire) {
            return true;
        }
        let taken = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok();
        if taken {
            self.held.store(true, Ordering::Release);
            self.metrics.waiting_resources.inc();
        }
        taken
    }

    /// Gives the place back: the resource has a version now, or the watch stopped.
    pub(super) fn release(&self) {
        if self.held.swap(false, Ordering::AcqRel) {
            self.count.fetch_sub(1, Ordering::AcqRel);
            self.metrics.waiting_resources.dec();
        }
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.release();
    }
}
