//! What subscribers see: versions of a resource's flag configuration and its availability.
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::budget::{Charge, Kind, MemoryBudget};

/// One version of a resource's flag configuration.
#[derive(Debug)]
pub struct Snapshot {
    /// Increases by one with every new version of this resource while it is watched.
    pub version: u64,
    /// The flag configuration document (JSON).
    pub flag_configuration: Arc<str>,
    /// When the source saw the change that produced this version.
    pub changed_at: Instant,
    /// Subscribers when this version was published: those its propagation waits for.
    pub subscribers: usize,
    /// What clients report about some of its flags (joined; none: no problem), for `/status`.
    pub warnings: Option<Arc<str>>,
    /// Subscribers counted when this version was published that have not been sent it yet (nor
    /// left, nor been passed by a newer version).
    pending: AtomicUsize,
    /// Nanoseconds from `changed_at` to the latest time it was sent to a subscriber, plus one
    /// (0: not sent to anyone yet).
    last_sent: AtomicU64,
    encodings: Encodings,
    /// The budget this version's document and encodings are charged to.
    budget: Arc<MemoryBudget>,
    /// The document's charge, given back when the version is dropped (each encoding carries
    /// its own, given back when the last stream holding it lets go).
    _document: Charge,
}

/// How a version's propagation ended: the last subscriber counted at its publication was sent
/// it, left, or was passed by a newer version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Settled {
    /// From the change until the last subscriber that was sent it had it (`None`: nobody was).
    pub(super) propagation: Option<Duration>,
    /// Counted subscribers a newer version reached first (they were never sent this one).
    pub(super) skipped: usize,
}

/// The name of one encoding of a snapshot. The hub knows no protocol: whoever sends snapshots
/// names its encodings (the wire names them after its protocols).
pub type EncodingName = &'static str;

/// Encodings made so far: few (one per protocol in use), made once, read by every subscriber.
#[derive(Debug, Default)]
struct Encodings(RwLock<Vec<(EncodingName, Bytes)>>);

impl Encodings {
    fn find(entries: &[(EncodingName, Bytes)], name: EncodingName) -> Option<Bytes> {
        entries
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, bytes)| bytes.clone())
    }
}

impl Snapshot {
    pub(super) fn new(
        version: u64,
        flag_configuration: Arc<str>,
        changed_at: Instant,
        pending: usize,
        warnings: Option<Arc<str>>,
        budget: Arc<MemoryBudget>,
    ) -> Self {
        let document = budget.charge(flag_configuration.len(), Kind::Versions);
        Self {
            version,
            flag_configuration,
            changed_at,
            subscribers: pending,
            warnings,
            pending: AtomicUsize::new(pending),
            last_sent: AtomicU64::new(0),
            encodings: Encodings::default(),
            budget,
            _document: document,
        }
    }

    /// Notes that a counted subscriber was sent this version; the end of its propagation if
    /// this was the last one.
    pub(super) fn sent_to_one(&self) -> Option<Settled> {
        let elapsed = self.changed_at.elapsed();
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX - 1);
        self.last_sent.fetch_max(nanos + 1, Ordering::AcqRel);
        self.settle_one().then_some(Settled {
            propagation: Some(elapsed),
            skipped: 0,
        })
    }

    /// Notes that a counted subscriber left without being sent this version; the end of its
    /// propagation if this was the last one.
    pub(super) fn left_by_one(&self) -> Option<Settled> {
        self.settle_one().then(|| Settled {
            propagation: self.last_sent(),
            skipped: 0,
        })
    }

    /// Ends the count: a newer version replaces this one, and the subscribers not sent this one
    /// yet will be sent the newer one instead. The end of its propagation, unless it had ended
    /// already.
    pub(super) fn superseded(&self) -> Option<Settled> {
        match self.pending.swap(0, Ordering::AcqRel) {
            0 => None,
            skipped => Some(Settled {
                propagation: self.last_sent(),
                skipped,
            }),
        }
    }

    /// One fewer counted subscriber to wait for; true for the last one.
    fn settle_one(&self) -> bool {
        self.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            == Ok(1)
    }

    fn last_sent(&self) -> Option<Duration> {
        match self.last_sent.load(Ordering::Acquire) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos - 1)),
        }
    }

    /// This version's encoding called `name`, made by `encode` the first time any subscriber
    /// asks for it and shared afterwards. Subscribers asking while it is made wait for it.
    pub fn encoded(&self, name: EncodingName, encode: impl FnOnce(&Snapshot) -> Bytes) -> Bytes {
        // Entries are only ever appended whole, so a poisoned lock still holds good ones.
        let read = crate::locks::read(&self.encodings.0);
        if let Some(bytes) = Encodings::find(&read, name) {
            return bytes;
        }
        drop(read);
        let mut write = crate::locks::write(&self.encodings.0);
        if let Some(bytes) = Encodings::find(&write, name) {
            return bytes;
        }
        let bytes = self.budget.hold(encode(self));
        write.push((name, bytes.clone()));
        bytes
    }

    /// A snapshot of `flag_configuration` as version 1, for tests of what is made from one.
    #[cfg(test)]
    pub(crate) fn for_test(flag_configuration: &str) -> Self {
        let budget = MemoryBudget::unlimited(Arc::new(crate::metrics::Metrics::new()));
        Self::new(
            1,
            flag_configuration.into(),
            Instant::now(),
            0,
            None,
            budget,
        )
    }
}

/// What the source last said about a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// The source has not answered yet.
    Pending,
    /// The resource exists and its newest version is the current snapshot.
    Present,
    /// The resource does not exist (yet, or any more). A snapshot may remain from before.
    Absent,
    /// The resource exists but its newest version was rejected; the snapshot is the last good one.
    Invalid(Arc<str>),
    /// The source may not read this resource.
    Forbidden(Arc<str>),
    /// The source cannot reach its backend at the moment; it keeps retrying.
    Unreachable(Arc<str>),
    /// The resource does not exist and `limit` other resources that do not exist are already
    /// waited on. Final: subscriptions end and the watch stops.
    TooManyWaiting { limit: usize },
}

/// The state of one watched resource, as seen by its subscribers.
#[derive(Clone, Debug)]
pub struct ResourceState {
    pub snapshot: Option<Arc<Snapshot>>,
    pub availability: Availability,
    /// The snapshot is the version kept from an earlier run (`--state-dir`), served because the
    /// source has not delivered one since this watch started; the first version the source
    /// delivers replaces it.
    pub stale: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_encoding_is_made_once_and_shared() {
        let snapshot = Snapshot::for_test("{}");
        let mut made = 0;
        let a = snapshot.encoded("a", |_| {
            made += 1;
            Bytes::from_static(b"A")
        });
        let again = snapshot.encoded("a", |_| unreachable!("made once"));
        let b = snapshot.encoded("b", |_| Bytes::from_static(b"B"));
        assert_eq!(made, 1);
        assert_eq!(a.as_ptr(), again.as_ptr());
        assert_eq!((&a[..], &b[..]), (&b"A"[..], &b"B"[..]));
    }
}
