//! The process's one source of randomness: retry jitter ([`crate::backoff`]) and trace and span
//! IDs ([`crate::telemetry`]). Values differ between calls and are unpredictable enough for
//! those uses; they are not for secrets.
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// A random 64-bit value: SipHash of a constant under fresh keys (each `RandomState` has keys
/// of its own, so hashing the same input gives unrelated outputs).
pub fn next_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(0);
    hasher.finish()
}

/// A random number in [0, 1).
pub fn unit() -> f64 {
    (next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_differ_between_calls_and_units_stay_below_one() {
        let values: std::collections::HashSet<u64> = (0..1000).map(|_| next_u64()).collect();
        assert!(values.len() > 990, "{} distinct values", values.len());
        assert!((0..1000).map(|_| unit()).all(|u| (0.0..1.0).contains(&u)));
    }
}
