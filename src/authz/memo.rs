//! Answers from the API server, shared: one request per question in flight, and a successful
//! answer kept for a while.
//!
//! Callers asking the same question while it is being asked wait for that one request
//! (single-flight) instead of making their own. An answer is kept for the TTL; an error
//! ([`AuthzError`], the API could not be asked) is handed to the callers that waited for it and
//! then forgotten, so the next caller asks again.
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use super::AuthzError;

/// Entries beyond this are dropped wholesale (the memo only saves API calls).
const MAX_ENTRIES: usize = 10_000;

type Flight<T> = Shared<BoxFuture<'static, Result<T, AuthzError>>>;

struct State<K, T> {
    answers: HashMap<K, (T, Instant)>,
    flights: HashMap<K, Flight<T>>,
}

/// Answers by question `K`, kept for `ttl` (zero: only shared while in flight).
pub(super) struct Memo<K, T> {
    ttl: Duration,
    state: Mutex<State<K, T>>,
}

impl<K, T> Memo<K, T>
where
    K: Hash + Eq + Clone,
    T: Clone + Send + Sync + 'static,
{
    pub(super) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            state: Mutex::new(State {
                answers: HashMap::new(),
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
            if let Some((answer, at)) = state.answers.get(&key)
                && at.elapsed() < self.ttl
            {
                return Ok(answer.clone());
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
                if state.answers.len() >= MAX_ENTRIES {
                    state.answers.clear();
                }
                state.answers.insert(key, (answer.clone(), Instant::now()));
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
        let memo = Memo::<&str, u32>::new(Duration::from_secs(3600));
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
        let memo = Memo::<&str, u32>::new(Duration::from_secs(3600));
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
        let memo = Memo::<&str, u32>::new(Duration::ZERO);
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        gate.add_permits(100);
        assert_eq!(memo.get("q", counting(&calls, &gate, Ok(1))).await, Ok(1));
        gate.add_permits(100);
        assert_eq!(memo.get("q", counting(&calls, &gate, Ok(2))).await, Ok(2));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
