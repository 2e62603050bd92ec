//! Row 2: one connection opens the connection's window but never a stream's, and opens a new
//! SyncFlags stream for each version of a large document: each stream pins the version it
//! cannot send. The memory budget must bound them: once pinned versions fill it, new streams
//! are refused.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;

use super::sample;
use super::streams::{read_ends, subscription};
use crate::raw_h2;

/// The resource the attacker writes and asks for.
pub const SELECTOR: &str = "core.openfeature.dev/default/big";
/// What the versions held are charged, on `/metrics`.
pub const PINNED: &str = "flagd_proxy_memory_charged_bytes{kind=\"versions\"}";
const PUBLISHED: &str = "flagd_proxy_versions_published_total";
const REFUSED: &str = "flagd_proxy_rejected_requests_total{reason=\"memory_budget\"}";
const MIB: f64 = 1024.0 * 1024.0;

/// The attack's size.
#[derive(Clone, Copy, Debug)]
pub struct Pinned {
    /// Versions written, each asked for by a stream of its own.
    pub versions: usize,
    /// The size of each version's one flag value.
    pub bytes: usize,
}

/// What the attack achieved.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The most the versions were charged at once, read after each stream was opened (bytes).
    pub peak_pinned: f64,
    /// Versions published, and the budget's refusals, once the last stream was opened.
    pub published: f64,
    pub refused: f64,
}

/// The attacker's connection, still open: its streams keep their versions until it is dropped.
pub struct Attacker {
    _write: OwnedWriteHalf,
    reader: tokio::task::JoinHandle<Result<bool, String>>,
    ended: Arc<AtomicU32>,
}

impl Attacker {
    /// The attacker's streams the proxy refused or ended so far.
    pub fn ended(&self) -> u32 {
        self.ended.load(Ordering::Relaxed)
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Pinned {
    /// Runs the attack on the proxy reading the manifests folder `manifests`, on its sync
    /// `port`, watching its `management_port`: each version is written once the one before was
    /// published, and asked for by a new stream. The error when the proxy stops answering.
    pub async fn run(
        self,
        manifests: &Path,
        port: u16,
        management_port: u16,
    ) -> Result<(Outcome, Attacker), String> {
        let (mut read, mut write) = raw_h2::try_connect_from(std::net::Ipv4Addr::LOCALHOST, port)
            .await
            .map_err(|error| format!("connect: {error}"))?;
        let gone = |error: std::io::Error| format!("the proxy is gone: {error}");
        write
            .write_all(&raw_h2::window_update(0, 0x7fff_ffff - 65_535))
            .await
            .map_err(gone)?;
        // Whatever the proxy sends is read: only the streams' windows stay shut.
        let ended = Arc::new(AtomicU32::new(0));
        let counted = ended.clone();
        let reader = tokio::spawn(async move { read_ends(&mut read, u32::MAX, &counted).await });
        let mut outcome = Outcome::default();
        for i in 0..self.versions {
            let published = sample(management_port, PUBLISHED).await?;
            let value = format!("{i}-{}", "x".repeat(self.bytes));
            let flags = json!({"big": {"state": "ENABLED", "variants": {"a": value}, "defaultVariant": "a"}});
            crate::write_manifest(manifests, "default", "big", flags);
            // The first stream starts the watch; later ones each take a version of their own.
            if i > 0 {
                published_after(management_port, published).await?;
            }
            let stream = 2 * u32::try_from(i).map_err(|e| e.to_string())? + 1;
            write
                .write_all(&subscription(stream, SELECTOR))
                .await
                .map_err(gone)?;
            if i == 0 {
                published_after(management_port, published).await?;
            }
            outcome.peak_pinned = outcome
                .peak_pinned
                .max(sample(management_port, PINNED).await?);
        }
        outcome.published = sample(management_port, PUBLISHED).await?;
        outcome.refused = sample(management_port, REFUSED).await?;
        let attacker = Attacker {
            _write: write,
            reader,
            ended,
        };
        Ok((outcome, attacker))
    }
}

impl Outcome {
    /// The bound with a memory budget of `budget_mib` MiB: streams were refused, and the pinned
    /// versions were counted and bounded (the budget, plus the newest version, which is always
    /// taken).
    pub fn bounded_by(&self, budget_mib: f64) -> Result<(), String> {
        let peak = self.peak_pinned / MIB;
        if self.refused == 0.0 {
            return Err(format!("no stream was refused; pinned peak {peak} MiB"));
        }
        if peak <= budget_mib / 2.0 || peak >= budget_mib + 4.0 {
            return Err(format!("pinned peak {peak} MiB"));
        }
        Ok(())
    }
}

/// Waits until more versions than `before` have been published.
async fn published_after(management_port: u16, before: f64) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + crate::EVENT_TIMEOUT;
    loop {
        let now = sample(management_port, PUBLISHED).await?;
        if now > before {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("no version published after {before}"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_needs_refusals_and_a_pinned_peak_near_the_budget() {
        let held = Outcome {
            peak_pinned: 17.0 * MIB,
            published: 40.0,
            refused: 3.0,
        };
        assert_eq!(held.bounded_by(16.0), Ok(()));
        let unrefused = Outcome {
            refused: 0.0,
            ..held.clone()
        };
        assert!(unrefused.bounded_by(16.0).is_err());
        let uncounted = Outcome {
            peak_pinned: 8.0 * MIB,
            ..held.clone()
        };
        assert!(uncounted.bounded_by(16.0).is_err());
        let over = Outcome {
            peak_pinned: 20.0 * MIB,
            ..held
        };
        assert!(over.bounded_by(16.0).is_err());
    }
}
