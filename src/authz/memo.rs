//! Answers from the API server, shared: one request per question in flight, and a successful
//! answer kept for a while.
//!
//! Callers asking the same question while it is being asked wait for that one request
//! (single-flight) instead of making their own. An answer is kept for the TTL; an error
//! ([`AuthzError`], the API could not be asked) is handed to the callers that waited for it and
//! then forgotten, so the next caller asks again.
//!
//! At most [`MAX_ENTRIES`] answers are kept. Beyond that the least recently used answer goes,
//! and answers a memo values (an identity, a permission) go only when no other is left: a
//! flood of questions with new keys (invented tokens) cannot push out the answers the honest
//! clients keep asking for.
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use super::AuthzError;

/// The most answers kept; the least recently used go first (the memo only saves API calls).
pub(super) const MAX_ENTRIES: usize = 10_000;

type Flight<T> = Shared<BoxFuture<'static, Result<T, AuthzError>>>;

/// A kept answer: when it was given, and its place in the recency order of its kind.
struct Kept<T> {
    answer: T,
    at: Instant,
    used: u64,
    valued: bool,
}

struct State<K, T> {
    answers: HashMap<K, Kept<T>>,
    /// Keys by last use, oldest first: answers the memo values, and the others.
    valued: BTreeMap<u64, K>,
    other: BTreeMap<u64, K>,
    uses: u64,
    flights: HashMap<K, Flight<T>>,
}

impl<K: Hash + Eq + Clone, T> State<K, T> {
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

    fn insert(&mut self, key: K, answer: T, valued: bool, capacity: usize) {
        self.remove(&key);
        while self.answers.len() >= capacity.max(1) {
            let oldest = self
                .other
                .first_key_value()
                .or_else(|| self.valued.first_key_value())
                .map(|(_, key)| key.clone());
            match oldest {
                Some(oldest) => self.remove(&oldest),
                None => break,
            }
        }
        self.uses += 1;
        let used = self.uses;
        self.order(valued).insert(used, key.clone());
        let at = Instant::now();
        self.answers.insert(
            key,
            Kept {
                answer,
                at,
                used,
                valued,
            },
        );
    }

    fn remove(&mut self, key: &K) {
        if let Some(kept) = self.answers.remove(key) {
            self.order(kept.valued).remove(&kept.used);
        }
    }
}

/// Answers by question `K`, kept for `ttl` (zero: only shared while in flight).
pub(super) struct Memo<K, T> {
    ttl: Duration,
    capacity: usize,
    /// Which answers are worth keeping over others.
    valued: fn(&T) -> bool,
    state: Mutex<State<K, T>>,
}

impl<K, T> Memo<K, T>
where
    K: Hash + Eq + Clone,
    T: Clone + Send + Sync + 'static,
{
    /// A memo of at most [`MAX_ENTRIES`] answers; `valued` answers outlast the others.
    pub(super) fn new(ttl: Duration, valued: fn(&T) -> bool) -> Self {
        Self::with_capacity(ttl, valued, MAX_ENTRIES)
    }

    pub(super) fn with_capacity(ttl: Duration, valued: fn(&T) -> bool, capacity: usize) -> Self {
        Self {
            ttl,
            capacity,
            valued,
            state: Mutex::new(State {
                answers: HashMap::new(),
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
                state.insert(key, answer.clone(), valued, self.capacity);
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
        let memo = Memo::<&str, u32>::new(Duration::from_secs(3600), |_| true);
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
        let memo = Memo::<&str, u32>::new(Duration::from_secs(3600), |_| true);
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
        let memo = Memo::<&str, u32>::new(Duration::ZERO, |_| true);
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
        let memo = Memo::<u32, u32>::with_capacity(Duration::from_secs(3600), |a| a % 2 == 0, 4);
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
        let memo = Memo::<u32, u32>::with_capacity(Duration::from_secs(3600), |_| true, 2);
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
}
