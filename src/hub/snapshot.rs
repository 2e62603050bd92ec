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
    /// `flag_configuration` as bytes, without a copy: encodings may carry it as one of their
    /// pieces. It carries the document's charge, given back when the last of them lets go.
    document: Bytes,
    encodings: Encodings,
    /// The budget this version's encodings are charged to (each piece of theirs that is not
    /// the document carries its own charge, given back when the last stream holding it lets go).
    budget: Arc<MemoryBudget>,
}

/// The document's text, charged to the budget for as long as anything holds it.
struct Document {
    text: Arc<str>,
    _charge: Charge,
}

impl AsRef<[u8]> for Document {
    fn as_ref(&self) -> &[u8] {
        self.text.as_bytes()
    }
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

/// One encoding of a snapshot: its bytes in pieces, handed on one after another. A piece may be
/// the snapshot's [`document`](Snapshot::document) itself or a piece of another of its
/// encodings: such pieces are shared, not copied, so a version held in several encodings costs
/// its document once plus what each encoding adds around it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Encoded(Arc<[Bytes]>);

impl Encoded {
    /// The pieces, in order (none: nothing could be encoded).
    pub fn pieces(&self) -> &[Bytes] {
        &self.0
    }

    /// The length of all pieces together.
    pub fn len(&self) -> usize {
        self.0.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Bytes::is_empty)
    }
}

impl Encoded {
    /// An encoding made of `pieces`, charged to no budget (for tests of what is sent).
    #[cfg(test)]
    pub(crate) fn from_pieces(pieces: Vec<Bytes>) -> Self {
        Self(pieces.into())
    }
}

impl From<Bytes> for Encoded {
    fn from(bytes: Bytes) -> Self {
        Self(Arc::from([bytes]))
    }
}

/// Encodings made so far: few (one per protocol in use), made once, read by every subscriber.
#[derive(Debug, Default)]
struct Encodings(RwLock<Vec<(EncodingName, Encoded)>>);

impl Encodings {
    fn find(entries: &[(EncodingName, Encoded)], name: EncodingName) -> Option<Encoded> {
        entries
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, encoded)| encoded.clone())
    }
}

/// Whether `piece` is `other` or a slice of it: the same memory, charged already.
fn within(piece: &Bytes, other: &Bytes) -> bool {
    let (start, end) = (
        piece.as_ptr() as usize,
        piece.as_ptr() as usize + piece.len(),
    );
    let (from, to) = (
        other.as_ptr() as usize,
        other.as_ptr() as usize + other.len(),
    );
    !piece.is_empty() && from <= start && end <= to
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
        let document = Bytes::from_owner(Document {
            text: flag_configuration.clone(),
            _charge: budget.charge(flag_configuration.len(), Kind::Versions),
        });
        Self {
            version,
            flag_configuration,
            document,
            changed_at,
            subscribers: pending,
            warnings,
            pending: AtomicUsize::new(pending),
            last_sent: AtomicU64::new(0),
            encodings: Encodings::default(),
            budget,
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

    /// The document as bytes, shared (no copy): an encoding may hand it on as one of its pieces.
    pub fn document(&self) -> Bytes {
        self.document.clone()
    }

    /// This version's encoding called `name`, made from the pieces `encode` returns the first
    /// time any subscriber asks for it and shared afterwards. Subscribers asking while it is made
    /// wait for it. Each piece is charged to the budget unless it is the document's memory or
    /// another encoding's (already charged).
    pub fn encoded(
        &self,
        name: EncodingName,
        encode: impl FnOnce(&Snapshot) -> Vec<Bytes>,
    ) -> Encoded {
        // Entries are only ever appended whole, so a poisoned lock still holds good ones.
        let read = crate::locks::read(&self.encodings.0);
        if let Some(encoded) = Encodings::find(&read, name) {
            return encoded;
        }
        drop(read);
        let mut write = crate::locks::write(&self.encodings.0);
        if let Some(encoded) = Encodings::find(&write, name) {
            return encoded;
        }
        let pieces: Vec<Bytes> = encode(self)
            .into_iter()
            .map(|piece| {
                let charged = within(&piece, &self.document)
                    || write
                        .iter()
                        .flat_map(|(_, encoded)| encoded.pieces())
                        .any(|other| within(&piece, other));
                if charged || piece.is_empty() {
                    piece
                } else {
                    self.budget.hold(piece)
                }
            })
            .collect();
        let encoded = Encoded(pieces.into());
        write.push((name, encoded.clone()));
        encoded
    }

    /// A snapshot of `flag_configuration` as version 1, for tests of what is made from one.
    #[cfg(test)]
    pub(crate) fn for_test(flag_configuration: &str) -> Self {
        let budget = MemoryBudget::unlimited(Arc::new(crate::metrics::Metrics::new()));
        Self::charged_for_test(flag_configuration, budget)
    }

    /// [`for_test`](Self::for_test), charged to `budget`.
    #[cfg(test)]
    pub(crate) fn charged_for_test(flag_configuration: &str, budget: Arc<MemoryBudget>) -> Self {
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
            vec![Bytes::from_static(b"A")]
        });
        let again = snapshot.encoded("a", |_| unreachable!("made once"));
        let b = snapshot.encoded("b", |_| vec![Bytes::from_static(b"B")]);
        assert_eq!(made, 1);
        assert_eq!(a.pieces()[0].as_ptr(), again.pieces()[0].as_ptr());
        assert_eq!(
            (&a.pieces()[0][..], &b.pieces()[0][..]),
            (&b"A"[..], &b"B"[..])
        );
    }

    /// The document is charged once, however many encodings carry it; what they add around it,
    /// once each; a piece shared with another encoding, not again.
    #[test]
    fn shared_pieces_are_charged_once() {
        let budget = MemoryBudget::new(1 << 30, Arc::new(crate::metrics::Metrics::new()));
        let document = "d".repeat(10_000);
        let snapshot = Snapshot::new(1, document.into(), Instant::now(), 0, None, budget.clone());
        assert_eq!(budget.used(), 10_000);
        let head = Bytes::from(vec![1u8; 7]);
        let a = snapshot.encoded("a", |s| vec![head, s.document()]);
        assert_eq!(budget.used(), 10_007);
        let b = snapshot.encoded("b", |s| {
            vec![
                Bytes::from(vec![2u8; 3]),
                s.document().slice(1..),
                Bytes::new(),
            ]
        });
        assert_eq!(budget.used(), 10_010);
        let c = snapshot.encoded("c", |_| a.pieces().to_vec());
        assert_eq!(budget.used(), 10_010);
        assert_eq!((a.len(), b.len(), c.len()), (10_007, 10_002, 10_007));
        drop(snapshot);
        // Streams still holding the pieces keep them charged.
        assert_eq!(budget.used(), 10_010);
        drop((a, b, c));
        assert_eq!(budget.used(), 0);
    }
}
