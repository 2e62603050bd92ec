//! One subscriber's view of a resource: the newest version, skipping any it was too slow for.
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Sleep;

use crate::hub::snapshot::{Availability, ResourceState, Snapshot};
use crate::metrics::Metrics;
use crate::selector::ResourceKey;

/// How a subscription ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionEnd {
    /// The source may not read the resource.
    Forbidden(Arc<str>),
    /// The resource does not exist and `limit` other resources that do not exist are already
    /// waited on.
    TooManyWaiting { limit: usize },
    /// The resource exists but has no version clients can use: the newest was rejected for this
    /// reason and no earlier one was accepted. Given after [`INVALID_GRACE`], so a client that
    /// reconnects at once cannot make the proxy answer it in a tight loop.
    Invalid(Arc<str>),
}

/// How long a subscriber to a resource without a valid version waits for one before its
/// subscription ends with [`SubscriptionEnd::Invalid`]. A valid version that comes in the
/// meantime is delivered as usual. This is also the shortest time between two such answers to a
/// client that reconnects at once, whatever its own backoff.
pub const INVALID_GRACE: Duration = Duration::from_secs(5);

/// One subscriber's view of a resource.
pub struct Subscription {
    key: ResourceKey,
    rx: watch::Receiver<ResourceState>,
    /// The newest version this subscriber has been given.
    last: Option<u64>,
    /// The version current when this subscriber joined; it was not counted for that one.
    joined_at: Option<u64>,
}

impl Subscription {
    pub(super) fn new(key: ResourceKey, rx: watch::Receiver<ResourceState>) -> Self {
        let joined_at = rx.borrow().snapshot.as_ref().map(|s| s.version);
        Self {
            key,
            rx,
            last: None,
            joined_at,
        }
    }

    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// Waits for a version newer than the last one returned (the current one, the first time).
    /// Intermediate versions published while the caller was busy are skipped.
    pub async fn next(&mut self) -> Result<Arc<Snapshot>, SubscriptionEnd> {
        // Runs while the resource has no valid version (boxed: an idle subscriber, the common
        // case, does not carry a timer).
        let mut grace: Option<Pin<Box<Sleep>>> = None;
        loop {
            let invalid = {
                let state = self.rx.borrow_and_update();
                match &state.availability {
                    Availability::Forbidden(reason) => {
                        return Err(SubscriptionEnd::Forbidden(reason.clone()));
                    }
                    Availability::TooManyWaiting { limit } => {
                        return Err(SubscriptionEnd::TooManyWaiting { limit: *limit });
                    }
                    _ => {}
                }
                if let Some(snapshot) = &state.snapshot
                    && self.last != Some(snapshot.version)
                {
                    self.last = Some(snapshot.version);
                    return Ok(snapshot.clone());
                }
                match (&state.snapshot, &state.availability) {
                    (None, Availability::Invalid(reason)) => Some(reason.clone()),
                    _ => None,
                }
            };
            match (&invalid, &grace) {
                (Some(_), None) => grace = Some(Box::pin(tokio::time::sleep(INVALID_GRACE))),
                (None, Some(_)) => grace = None,
                _ => {}
            }
            let expired = async {
                match grace.as_mut() {
                    Some(sleep) => sleep.await,
                    None => futures::future::pending().await,
                }
            };
            tokio::select! {
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        // The sender lives as long as any receiver does; this cannot happen, but
                        // if it did, waiting forever is the safe answer for a stream.
                        futures::future::pending::<()>().await;
                    }
                }
                () = expired => {
                    if let Some(reason) = invalid {
                        return Err(SubscriptionEnd::Invalid(reason));
                    }
                }
            }
        }
    }

    /// Marks `snapshot` as handed to this subscriber's transport, for the propagation metric.
    pub fn delivered(&self, snapshot: &Snapshot, metrics: &Metrics) {
        if self.joined_at.is_some_and(|v| snapshot.version <= v) {
            return;
        }
        if snapshot.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            metrics
                .propagation_seconds
                .observe(snapshot.changed_at.elapsed().as_secs_f64());
        }
    }

    /// Waits until the source has answered, then returns the state.
    pub async fn settled(&mut self) -> ResourceState {
        let settled = match self
            .rx
            .wait_for(|s| s.availability != Availability::Pending)
            .await
        {
            Ok(state) => Some(state.clone()),
            Err(_) => None,
        };
        match settled {
            Some(state) => state,
            None => futures::future::pending().await,
        }
    }
}
