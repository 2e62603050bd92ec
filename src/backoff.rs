//! The one retry policy of the process: exponential backoff with jitter.
//!
//! Every retry (a Kubernetes watch that failed, an upstream stream that was lost, a source's
//! watch that ended) waits [`Backoff::next_delay`] before the next attempt. The parameters are
//! client-go's reflector policy, the same as `kube::runtime::watcher::DefaultBackoff`: the first
//! pause is 800 ms, each one doubles up to 30 s, each is stretched by a random 0–100 % (so
//! retries of many watches do not arrive together), and a backoff that has not been asked for a
//! delay for 120 s starts over from the first pause. [`Backoff::reset`] starts over at once (for
//! example after an attempt that delivered something).
//!
//! This is a small implementation of its own rather than a wrapper around kube-runtime's
//! `DefaultBackoff`: that one has fixed bounds (a test cannot shorten them, see
//! [`Backoff::with_bounds`]), exposes no way to ask what a delay's range is, and lives in a
//! Kubernetes crate that the hub and the upstream source have no business depending on.
use std::time::Duration;

use tokio::time::Instant;

/// The first pause after a failure.
pub const FIRST_DELAY: Duration = Duration::from_millis(800);
/// The longest nominal pause; a jittered delay is at most twice this.
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// A backoff not asked for a delay for this long starts over from [`FIRST_DELAY`].
pub const RESET_AFTER: Duration = Duration::from_secs(120);

/// The state of one retry loop. Each loop owns one; it is cheap.
#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    /// The nominal delay the next call to [`Backoff::next_delay`] stretches.
    next: Duration,
    /// When the last delay was handed out.
    last: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// The process-wide policy (800 ms doubling to 30 s, jittered, reset after 120 s quiet).
    pub fn new() -> Self {
        Self::with_bounds(FIRST_DELAY, MAX_DELAY)
    }

    /// The same policy between other bounds (tests use short ones). `max` below `first` is
    /// taken as `first`.
    pub fn with_bounds(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max: max.max(first),
            next: first,
            last: None,
        }
    }

    /// The pause before the next attempt: the nominal delay (which doubles with every call, up
    /// to the maximum) stretched by a random 0–100 %.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_with(crate::random::unit())
    }

    /// Starts over from the first delay: the last attempt succeeded.
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// [`Backoff::next_delay`] with the random number given (in [0, 1)).
    fn next_delay_with(&mut self, random: f64) -> Duration {
        let now = Instant::now();
        if self.last.is_some_and(|at| now - at >= RESET_AFTER) {
            self.reset();
        }
        self.last = Some(now);
        let nominal = self.next;
        self.next = nominal.saturating_mul(2).min(self.max);
        nominal.mul_f64(1.0 + random.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nominals(backoff: &mut Backoff, count: usize) -> Vec<Duration> {
        (0..count).map(|_| backoff.next_delay_with(0.0)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn delays_double_up_to_the_maximum() {
        let mut backoff = Backoff::new();
        let ms = Duration::from_millis;
        assert_eq!(
            nominals(&mut backoff, 8),
            [
                ms(800),
                ms(1_600),
                ms(3_200),
                ms(6_400),
                ms(12_800),
                ms(25_600),
                MAX_DELAY,
                MAX_DELAY
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_stretches_by_at_most_the_nominal_delay() {
        let mut backoff = Backoff::new();
        assert_eq!(backoff.next_delay_with(0.5), FIRST_DELAY.mul_f64(1.5));
        // Out-of-range numbers are clamped: never more than twice the nominal delay.
        assert_eq!(backoff.next_delay_with(7.0), FIRST_DELAY * 4);
        let mut backoff = Backoff::new();
        let mut seen = Vec::new();
        for _ in 0..200 {
            backoff.reset();
            let delay = backoff.next_delay();
            assert!(
                (FIRST_DELAY..FIRST_DELAY * 2).contains(&delay),
                "{delay:?} is outside [800 ms, 1.6 s)"
            );
            seen.push(delay);
        }
        seen.sort();
        seen.dedup();
        assert!(seen.len() > 100, "the jitter is random: {seen:?}");
        let mut capped = Backoff::new();
        for _ in 0..50 {
            let delay = capped.next_delay();
            assert!(delay < MAX_DELAY * 2, "{delay:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reset_starts_over() {
        let mut backoff = Backoff::new();
        nominals(&mut backoff, 5);
        backoff.reset();
        assert_eq!(backoff.next_delay_with(0.0), FIRST_DELAY);
        assert_eq!(backoff.next_delay_with(0.0), FIRST_DELAY * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_backoff_starts_over() {
        let mut backoff = Backoff::new();
        nominals(&mut backoff, 5);
        tokio::time::advance(RESET_AFTER - Duration::from_secs(1)).await;
        assert_eq!(
            backoff.next_delay_with(0.0),
            FIRST_DELAY * 32,
            "not quiet long enough"
        );
        tokio::time::advance(RESET_AFTER).await;
        assert_eq!(backoff.next_delay_with(0.0), FIRST_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn other_bounds() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::with_bounds(ms(10), ms(25));
        assert_eq!(nominals(&mut backoff, 4), [ms(10), ms(20), ms(25), ms(25)]);
        let mut inverted = Backoff::with_bounds(ms(10), ms(1));
        assert_eq!(nominals(&mut inverted, 2), [ms(10), ms(10)]);
    }
}
