//! One subscriber's view of a resource: the newest version, skipping any it was too slow for.
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Sleep;

use crate::hub::propagation::Propagation;
use crate::hub::snapshot::{Availability, ResourceState, Snapshot};
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
    /// The newest version handed to this subscriber's transport.
    sent: Option<u64>,
    propagation: Arc<Propagation>,
}

impl Subscription {
    pub(super) fn new(
        key: ResourceKey,
        rx: watch::Receiver<ResourceState>,
        propagation: Arc<Propagation>,
    ) -> Self {
        let joined_at = rx.borrow().snapshot.as_ref().map(|s| s.version);
        Self {
            key,
            rx,
            last: None,
            joined_at,
            sent: None,
            propagation,
        }
    }

    /// Whether this subscriber was counted for `snapshot` (it was there when it was published).
    fn counted_for(&self, snapshot: &Snapshot) -> bool {
        self.joined_at.is_none_or(|v| snapshot.version > v)
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

    /// Marks `snapshot` as handed to this subscriber's transport, for the propagation metric
    /// and span.
    pub fn delivered(&mut self, snapshot: &Snapshot) {
        self.sent = Some(snapshot.version);
        if !self.counted_for(snapshot) {
            return;
        }
        if let Some(settled) = snapshot.sent_to_one() {
            self.propagation.settled(&self.key, snapshot, settled);
        }
    }

    /// Waits until the source has answered, or a stale version is served while it has not,
    /// then returns the state.
    pub async fn settled(&mut self) -> ResourceState {
        let settled = match self
            .rx
            .wait_for(|s| s.availability != Availability::Pending || s.stale)
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

impl Drop for Subscription {
    /// A subscriber that leaves before it was sent the current version is not waited for: the
    /// version's propagation ends with the last of the others.
    fn drop(&mut self) {
        let current = self.rx.borrow().snapshot.clone();
        if let Some(snapshot) = current
            && self.counted_for(&snapshot)
            && self.sent != Some(snapshot.version)
            && let Some(settled) = snapshot.left_by_one()
        {
            self.propagation.settled(&self.key, &snapshot, settled);
        }
    }
}
