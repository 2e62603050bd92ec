//! Answers from the API server, shared: one request per question in flight, and a successful
//! answer kept for a while.
//!
//! Callers asking the same question while it is being asked wait for that one request
//! (single-flight) instead of making their own. An answer is kept for the TTL; an error
//! ([`AuthzError`], the API could not be asked) is handed to the callers that waited for it and
//! then forgotten, so the next caller asks again.
//!
//! At most [`MAX_ENTRIES`] answers taking at most [`MAX_BYTES`] are kept, each charged to the
//! process's memory budget ([`Kind::Authorization`]) while it is. Beyond those bounds, or when
//! the budget has no room, the least recently used answer goes, and answers a memo values (an
//! identity, a permission) go only when no other is left: a flood of questions with new keys
//! (invented tokens) cannot push out the answers the honest clients keep asking for. When the
//! budget has no room even then, the new answer is not kept (it is still given).
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use super::AuthzError;
use crate::budget::{Charge, Kind, MemoryBudget};

/// The most answers kept; the least recently used go first (the memo only saves API calls).
pub(super) const MAX_ENTRIES: usize = 10_000;
/// The most bytes the answers kept take ([`Footprint`]), per memo: 10,000 identities of the
/// usual size (about 300 bytes each with their key) fit.
pub(super) const MAX_BYTES: usize = 4 << 20;
/// What a map entry costs beyond its key and value: the hash table's control bytes and spare
/// room, and the recency tree's node share.
const ENTRY_OVERHEAD: usize = 48;

/// What a key or an answer holds on the heap, for the bytes a kept answer is charged.
pub(super) trait Footprint {
    fn heap_bytes(&self) -> usize;
}

impl Footprint for String {
    fn heap_bytes(&self) -> usize {
        self.capacity()
    }
}

impl Footprint for () {
    fn heap_bytes(&self) -> usize {
        0
    }
}

impl<const N: usize> Footprint for [u8; N] {
    fn heap_bytes(&self) -> usize {
        0
    }
}

impl Footprint for std::net::IpAddr {
    fn heap_bytes(&self) -> usize {
        0
    }
}

impl<T: Footprint, E: Footprint> Footprint for Result<T, E> {
    fn heap_bytes(&self) -> usize {
        match self {
            Ok(value) => value.heap_bytes(),
            Err(error) => error.heap_bytes(),
        }
    }
}

impl<A: Footprint, B: Footprint> Footprint for (A, B) {
    fn heap_bytes(&self) -> usize {
        self.0.heap_bytes() + self.1.heap_bytes()
    }
}

impl<T: Footprint> Footprint for Vec<T> {
    fn heap_bytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>() + self.iter().map(T::heap_bytes).sum::<usize>()
    }
}

impl<T: Footprint> Footprint for Option<T> {
    fn heap_bytes(&self) -> usize {
        self.as_ref().map_or(0, T::heap_bytes)
    }
}

type Flight<T> = Shared<BoxFuture<'static, Result<T, AuthzError>>>;

/// A kept answer: when it was given, its place in the recency order of its kind, and its
/// bytes, charged to the budget until it goes.
struct Kept<T> {
    answer: T,
    at: Instant,
    used: u64,
    valued: bool,
    bytes: usize,
    _charge: Charge,
}

/// The bytes an answer kept under `key` takes: the key twice (in the table and in the recency
/// order), the kept answer and what both hold on the heap.
fn entry_bytes<K: Footprint, T: Footprint>(key: &K, answer: &T) -> usize {
    2 * (std::mem::size_of::<K>() + key.heap_bytes())
        + std::mem::size_of::<Kept<T>>()
        + answer.heap_bytes()
        + ENTRY_OVERHEAD
}

struct State<K, T> {
    answers: HashMap<K, Kept<T>>,
    /// The bytes of the answers kept ([`entry_bytes`]).
    bytes: usize,
    /// Keys by last use, oldest first: answers the memo values, and the others.
    valued: BTreeMap<u64, K>,
    other: BTreeMap<u64, K>,
    uses: u64,
    flights: HashMap<K, Flight<T>>,
}

impl<K: Hash + Eq + Clone + Footprint, T: Footprint> State<K, T> {
    fn order(&mut self, valued: bool) -> &mut BTreeMap<u64, K> {
        if valued {
            &mut self.valued
        } else {
            &mut self.other
        }
    }

    /// Marks `key` as just used.
    fn touch(&mut self, key: &K) {
        self.uses += 1;
        let uses = self.uses;
        let Some(kept) = self.answers.get_mut(key) else {
            return;
        };
        let (old, valued) = (kept.used, kept.valued);
        kept.used = uses;
        let order = self.order(valued);
        order.remove(&old);
        order.insert(uses, key.clone());
    }

    /// Keeps `answer` under `key` within `bounds`, making room by letting the least recently
    /// used answers go (valued ones last; for the budget, never: a valued answer is not pushed
    /// out for another).
    fn insert(&mut self, key: K, answer: T, valued: bool, bounds: &Bounds) {
        self.remove(&key);
        let bytes = entry_bytes(&key, &answer);
        if bytes > bounds.max_bytes {
            return;
        }
        while self.answers.len() >= bounds.capacity.max(1) || self.bytes + bytes > bounds.max_bytes
        {
            if !self.evict_oldest(true) {
                break;
            }
        }
        let charge = loop {
            match bounds.budget.try_charge_spare(bytes, Kind::Authorization) {
                Some(charge) => break charge,
                None if self.evict_oldest(false) => {}
                None => return,
            }
        };
        self.uses += 1;
        let used = self.uses;
        self.order(valued).insert(used, key.clone());
        self.bytes += bytes;
        let at = Instant::now();
        self.answers.insert(
            key,
            Kept {
                answer,
                at,
                used,
                valued,
                bytes,
                _charge: charge,
            },
        );
    }

    /// Lets the least recently used answer go: one the memo does not value, or (with
    /// `valued_too`) any. False when there was none.
    fn evict_oldest(&mut self, valued_too: bool) -> bool {
        let oldest = self
            .other
            .first_key_value()
            .or_else(|| valued_too.then(|| self.valued.first_key_value()).flatten())
            .map(|(_, key)| key.clone());
        match oldest {
            Some(oldest) => {
                self.remove(&oldest);
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some(kept) = self.answers.remove(key) {
            self.order(kept.valued).remove(&kept.used);
            self.bytes -= kept.bytes;
        }
    }
}

/// What a memo may keep: answers, bytes, and room in the process's budget.
struct Bounds {
    capacity: usize,
    max_bytes: usize,
    budget: Arc<MemoryBudget>,
}

/// Answers by question `K`, kept for `ttl` (zero: only shared while in flight).
pub(super) struct Memo<K, T> {
    ttl: Duration,
    bounds: Bounds,
    /// Which answers are worth keeping over others.
    valued: fn(&T) -> bool,
    state: Mutex<State<K, T>>,
}

impl<K, T> Memo<K, T>
where
    K: Hash + Eq + Clone + Footprint,
    T: Clone + Send + Sync + Footprint + 'static,
{
    /// A memo of at most [`MAX_ENTRIES`] answers and [`MAX_BYTES`], charged to `budget`;
    /// `valued` answers outlast the others.
    pub(super) fn new(ttl: Duration, valued: fn(&T) -> bool, budget: Arc<MemoryBudget>) -> Self {
        Self::with_bounds(ttl, valued, MAX_ENTRIES, MAX_BYTES, budget)
    }

    fn with_bounds(
        ttl: Duration,
        valued: fn(&T) -> bool,
        capacity: usize,
        max_bytes: usize,
        budget: Arc<MemoryBudget>,
    ) -> Self {
        Self {
            ttl,
            bounds: Bounds {
                capacity,
                max_bytes,
                budget,
            },
            valued,
            state: Mutex::new(State {
                answers: HashMap::new(),
                bytes: 0,
                valued: BTreeMap::new(),
                other: BTreeMap::new(),
                uses: 0,
                flights: HashMap::new(),
            }),
        }
    }

    /// The answer to `key`: a kept one, the one being asked, or `ask()`'s.
    pub(super) async fn get(
        &self,
        key: K,
        ask: impl FnOnce() -> BoxFuture<'static, Result<T, AuthzError>>,
    ) -> Result<T, AuthzError> {
        let flight = {
            let mut state = self.lock();
            if let Some(kept) = state.answers.get(&key)
                && kept.at.elapsed() < self.ttl
            {
                let answer = kept.answer.clone();
                state.touch(&key);
                return Ok(answer);
            }
            match state.flights.get(&key) {
                Some(flight) => flight.clone(),
                None => {
                    let flight = ask().shared();
                    state.flights.insert(key.clone(), flight.clone());
                    flight
                }
            }
        };
        let result = flight.clone().await;
        let mut state = self.lock();
        // The first waiter to finish settles the flight; the others find it gone (or replaced
        // by a newer one, which they leave alone).
        if state
            .flights
            .get(&key)
            .is_some_and(|current| current.ptr_eq(&flight))
        {
            state.flights.remove(&key);
            if let Ok(answer) = &result
                && !self.ttl.is_zero()
            {
                let valued = (self.valued)(answer);
                state.insert(key, answer.clone(), valued, &self.bounds);
            }
        }
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K, T>> {
        crate::locks::lock(&self.state)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::metrics::Metrics;

    impl Footprint for u32 {
        fn heap_bytes(&self) -> usize {
            0
        }
    }

    impl Footprint for &str {
        fn heap_bytes(&self) -> usize {
            0
        }
    }

    fn unlimited() -> Arc<MemoryBudget> {
        MemoryBudget::unlimited(Arc::new(Metrics::new()))
    }

    const HOUR: Duration = Duration::from_secs(3600);

    fn counting(
        calls: &Arc<AtomicUsize>,
        gate: &Arc<tokio::sync::Semaphore>,
        answer: Result<u32, AuthzError>,
    ) -> impl FnOnce() -> BoxFuture<'static, Result<u32, AuthzError>> {
        let calls = calls.clone();
        let gate = gate.clone();
        move || {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let _open = gate.acquire().await.expect("open");
                answer
            }
            .boxed()
        }
    }

    #[tokio::test]
    async fn concurrent_questions_share_one_request_and_the_answer_is_kept() {
        let memo = Memo::<&str, u32>::new(HOUR, |_| true, unlimited());
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let all = futures::future::join_all(
            (0..20).map(|_| memo.get("q", counting(&calls, &gate, Ok(7)))),
        );
        tokio::pin!(all);
        // One poll registers every caller; the request is still held at the gate.
        assert!(futures::poll!(&mut all).is_pending());
        gate.add_permits(100);
        assert!(all.await.into_iter().all(|r| r == Ok(7)));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(memo.get("q", counting(&calls, &gate, Ok(8))).await, Ok(7));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "kept for the TTL");
    }

    #[tokio::test]
    async fn errors_reach_the_waiters_and_are_not_kept() {
        let memo = Memo::<&str, u32>::new(HOUR, |_| true, unlimited());
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let down = Err(AuthzError::Unavailable("down".into()));
        let all = futures::future::join_all(
            (0..5).map(|_| memo.get("q", counting(&calls, &gate, down.clone()))),
        );
        tokio::pin!(all);
        assert!(futures::poll!(&mut all).is_pending());
        gate.add_permits(100);
        assert!(all.await.into_iter().all(|r| r == down));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        gate.add_permits(100);
        assert_eq!(memo.get("q", counting(&calls, &gate, Ok(1))).await, Ok(1));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "the error was asked again");
    }

    #[tokio::test]
    async fn zero_ttl_shares_only_while_in_flight() {
        let memo = Memo::<&str, u32>::new(Duration::ZERO, |_| true, unlimited());
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        gate.add_permits(100);
        assert_eq!(memo.get("q", counting(&calls, &gate, Ok(1))).await, Ok(1));
        gate.add_permits(100);
        assert_eq!(memo.get("q", counting(&calls, &gate, Ok(2))).await, Ok(2));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// A flood of questions whose answers the memo does not value (odd numbers here, refused
    /// tokens in the proxy) pushes out the least recently used of them only; the valued answers
    /// stay, however many others come.
    #[tokio::test]
    async fn a_flood_of_new_keys_evicts_the_least_recently_used_and_keeps_valued_answers() {
        let memo = Memo::<u32, u32>::with_bounds(HOUR, |a| a % 2 == 0, 4, MAX_BYTES, unlimited());
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(1000));
        let ask = |key: u32| memo.get(key, counting(&calls, &gate, Ok(key)));
        // Two valued answers, kept.
        assert_eq!(ask(0).await, Ok(0));
        assert_eq!(ask(2).await, Ok(2));
        for key in (1..200).step_by(2) {
            assert_eq!(ask(key).await, Ok(key));
        }
        let asked = calls.load(Ordering::SeqCst);
        assert_eq!(ask(0).await, Ok(0));
        assert_eq!(ask(2).await, Ok(2));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            asked,
            "the valued answers were kept"
        );
        // The newest of the flood is kept, its oldest went.
        assert_eq!(ask(199).await, Ok(199));
        assert_eq!(calls.load(Ordering::SeqCst), asked);
        assert_eq!(ask(1).await, Ok(1));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            asked + 1,
            "the oldest was asked again"
        );
        // Among valued answers, the least recently used goes when only they are left.
        let memo = Memo::<u32, u32>::with_bounds(HOUR, |_| true, 2, MAX_BYTES, unlimited());
        let ask = |key: u32| memo.get(key, counting(&calls, &gate, Ok(key)));
        ask(10).await.expect("answer");
        ask(12).await.expect("answer");
        ask(10).await.expect("kept");
        ask(14).await.expect("answer");
        let asked = calls.load(Ordering::SeqCst);
        ask(10).await.expect("kept: used last");
        assert_eq!(calls.load(Ordering::SeqCst), asked);
        ask(12).await.expect("asked again");
        assert_eq!(calls.load(Ordering::SeqCst), asked + 1);
    }

    /// Each kept answer is charged to the budget until it goes; the bytes bound lets the least
    /// recently used go like the count bound does.
    #[tokio::test]
    async fn kept_answers_are_charged_and_bounded_in_bytes() {
        let budget = unlimited();
        let one = entry_bytes(&0_u32, &0_u32);
        let memo = Memo::<u32, u32>::with_bounds(HOUR, |_| true, 100, 3 * one, budget.clone());
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(1000));
        let ask = |key: u32| memo.get(key, counting(&calls, &gate, Ok(key)));
        for key in 0..3 {
            ask(key).await.expect("answer");
        }
        assert_eq!(budget.used(), 3 * one);
        ask(3).await.expect("answer");
        assert_eq!(budget.used(), 3 * one, "the oldest went to make room");
        let asked = calls.load(Ordering::SeqCst);
        ask(0).await.expect("asked again");
        assert_eq!(calls.load(Ordering::SeqCst), asked + 1);
        drop(memo);
        assert_eq!(budget.used(), 0, "released with the memo");
    }

    /// With no room in the budget, answers the memo does not value give way to valued ones and
    /// are otherwise not kept; a valued answer is never pushed out for the budget, and none of
    /// this counts as a refusal.
    #[tokio::test]
    async fn a_full_budget_keeps_valued_answers_and_drops_the_others() {
        let metrics = Arc::new(Metrics::new());
        let one = entry_bytes(&0_u32, &0_u32);
        let budget = MemoryBudget::new(2 * one, metrics.clone());
        let memo = Memo::<u32, u32>::with_bounds(HOUR, |a| a % 2 == 0, 100, MAX_BYTES, budget);
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(1000));
        let ask = |key: u32| memo.get(key, counting(&calls, &gate, Ok(key)));
        ask(1).await.expect("answer");
        ask(0).await.expect("answer");
        // The budget is full: the valued 2 takes the place of 1.
        ask(2).await.expect("answer");
        let asked = calls.load(Ordering::SeqCst);
        for key in [0, 2] {
            ask(key).await.expect("kept");
        }
        assert_eq!(calls.load(Ordering::SeqCst), asked, "both valued kept");
        // A valued 4 and a flood of others find no room and are not kept.
        for key in [4, 3, 5] {
            ask(key).await.expect("answer");
        }
        for key in [0, 2] {
            ask(key).await.expect("kept");
        }
        assert_eq!(calls.load(Ordering::SeqCst), asked + 3);
        ask(4).await.expect("not kept");
        assert_eq!(calls.load(Ordering::SeqCst), asked + 4);
        let refusals = crate::metrics::ReasonLabels {
            reason: "memory_budget",
        };
        assert_eq!(
            metrics.rejected_requests.get_or_create(&refusals).get(),
            0,
            "no refusal counted"
        );
    }
}
