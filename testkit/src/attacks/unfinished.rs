//! Row 4: one connection from each of many addresses (127.0.0.2 on) opens SyncFlags streams
//! whose request never comes, each address under its own limits; the proxy must end every one
//! (at `--request-timeout`, or refused at once) and the memory budget bounds them all together.

use std::net::Ipv4Addr;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use flagd_proxy::introspection::Samples;

use super::streams::{open_from, read_ends};

/// What the streams are charged, on `/metrics`.
const STREAMS_HELD: &str = "flagd_proxy_memory_charged_bytes{kind=\"streams\"}";
/// What the connections are charged.
const CONNECTIONS_HELD: &str = "flagd_proxy_memory_charged_bytes{kind=\"connections\"}";
/// The budget's refusals.
const REFUSED: &str = "flagd_proxy_rejected_requests_total{reason=\"memory_budget\"}";

/// The attack's size.
#[derive(Clone, Copy, Debug)]
pub struct Unfinished {
    pub addresses: u8,
    /// Streams on each address's connection.
    pub streams: u32,
}

/// What the attack achieved.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Streams the proxy ended (all of them, unless it closed their connections first).
    pub ended: u64,
    /// Connections the proxy closed before all of their streams had ended.
    pub closed: u32,
    /// The most the streams were charged at once, and the streams and connections together,
    /// read every 100 ms while the attack ran (bytes).
    pub peak_streams_charged: f64,
    pub peak_charged: f64,
    /// The budget's refusals, once every stream had ended.
    pub refused: f64,
}

impl Unfinished {
    /// Runs the attack on the proxy's sync `port`, watching its `management_port`; the error
    /// when a connection was refused or a stream neither ended nor had its connection closed.
    pub async fn run(self, port: u16, management_port: u16) -> Result<Outcome, String> {
        let mut attackers = tokio::task::JoinSet::new();
        for host in 2..2 + self.addresses {
            attackers.spawn(async move {
                let from = Ipv4Addr::new(127, 0, 0, host);
                let (mut read, _write) = open_from(from, port, self.streams, false)
                    .await
                    .map_err(|error| format!("{from}: {error}"))?;
                let ended = AtomicU32::new(0);
                let all = read_ends(&mut read, self.streams, &ended).await?;
                Ok::<_, String>((ended.into_inner(), all))
            });
        }
        let mut outcome = Outcome::default();
        while !attackers.is_empty() {
            let samples = metrics(management_port).await;
            let streams = samples.get(STREAMS_HELD).unwrap_or(0.0);
            let connections = samples.get(CONNECTIONS_HELD).unwrap_or(0.0);
            outcome.peak_streams_charged = outcome.peak_streams_charged.max(streams);
            outcome.peak_charged = outcome.peak_charged.max(streams + connections);
            let Ok(Some(done)) =
                tokio::time::timeout(Duration::from_millis(100), attackers.join_next()).await
            else {
                continue;
            };
            let (ended, all) = done.map_err(|error| format!("an attacker failed: {error}"))??;
            outcome.ended += u64::from(ended);
            outcome.closed += u32::from(!all);
        }
        outcome.refused = metrics(management_port).await.get(REFUSED).unwrap_or(0.0);
        Ok(outcome)
    }
}

impl Outcome {
    /// The bound with a memory budget of `budget` bytes that the attack reaches: streams beyond
    /// it were refused, the streams were never charged more than it, and what they and their
    /// connections were charged came near it (so they were counted).
    pub fn bounded_by(&self, budget: f64) -> Result<(), String> {
        if self.refused == 0.0 {
            return Err("nothing refused".to_owned());
        }
        if self.peak_streams_charged > budget {
            return Err(format!("streams held {} bytes", self.peak_streams_charged));
        }
        if self.peak_charged <= budget / 2.0 {
            return Err(format!(
                "streams and connections held {} bytes: not counted?",
                self.peak_charged
            ));
        }
        Ok(())
    }
}

/// The proxy's `/metrics` now (none when it does not answer).
async fn metrics(management_port: u16) -> Samples {
    let body = crate::http_get(management_port, "/metrics")
        .await
        .map(|(_, body)| body)
        .unwrap_or_default();
    Samples::parse(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_needs_refusals_a_capped_streams_charge_and_a_counted_one() {
        const BUDGET: f64 = 4.0 * 1024.0 * 1024.0;
        let held = Outcome {
            peak_streams_charged: BUDGET - 1.0,
            peak_charged: BUDGET,
            refused: 12.0,
            ..Outcome::default()
        };
        assert_eq!(held.bounded_by(BUDGET), Ok(()));
        let unrefused = Outcome {
            refused: 0.0,
            ..held.clone()
        };
        assert!(unrefused.bounded_by(BUDGET).is_err());
        let over = Outcome {
            peak_streams_charged: BUDGET + 1.0,
            ..held.clone()
        };
        assert!(over.bounded_by(BUDGET).is_err());
        let uncounted = Outcome {
            peak_charged: BUDGET / 2.0,
            ..held
        };
        assert!(uncounted.bounded_by(BUDGET).is_err());
    }
}
