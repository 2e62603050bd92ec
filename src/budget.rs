//! One memory budget for the whole process. What clients can make the proxy hold is counted
//! against it: versions (each document and each encoding of it, counted once however many
//! streams share it, until the last stream lets go of it), open connections, open streams (with
//! their request until it has arrived) and watches (each at its measured size). Above the
//! budget, new connections, new streams and new watches are refused; versions are always taken
//! (the newest one is what every subscriber needs), and established streams keep being served.
//!
//! The budget is sized from the container's memory limit by default ([`default_limit`]), so a
//! flood of clients is refused before the kernel kills the process.
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::{KindLabels, Metrics};

/// What an open HTTP/2 connection holds (buffers, codec and connection state), as measured
/// (`docs/security.md`, "Budgets against hostile clients").
pub const CONNECTION_BYTES: usize = 18 * 1024;
/// What an open stream holds before its response is written (the request and the task serving
/// it): 8 KiB measured, less its place in the connection's stream store, which the connection
/// is charged ([`RETAINED_STREAM_BYTES`]).
pub const STREAM_BYTES: usize = 8 * 1024 - RETAINED_STREAM_BYTES;
/// What a connection keeps, for as long as it is open, for each stream of the most it has had
/// open at once: the HTTP/2 layer's stream store grows to its busiest moment and never shrinks
/// (1,555 bytes measured, `docs/security.md`, "Budgets against hostile clients").
pub const RETAINED_STREAM_BYTES: usize = 1536;

/// What a charge is for, shown as the `kind` label of `flagd_proxy_memory_charged_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Versions,
    Connections,
    Streams,
    Watches,
    /// Answers the authorization memos keep (token reviews, access decisions).
    Authorization,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Versions => "versions",
            Kind::Connections => "connections",
            Kind::Streams => "streams",
            Kind::Watches => "watches",
            Kind::Authorization => "authorization",
        }
    }
}

/// The process's memory budget; 0 bytes means no limit.
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
    metrics: Arc<Metrics>,
    /// Notified when new work is refused, so that what serves no one can be let go.
    pressure: tokio::sync::Notify,
}

impl MemoryBudget {
    pub fn new(limit: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        metrics
            .memory_budget
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
            metrics,
            pressure: tokio::sync::Notify::new(),
        })
    }

    /// A budget with no limit (it still counts).
    pub fn unlimited(metrics: Arc<Metrics>) -> Arc<Self> {
        Self::new(0, metrics)
    }

    /// The limit in bytes (0: none).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// Charges `bytes` for new work if they fit in the budget; `None` (counted as a refusal
    /// with reason `memory_budget`) if they do not.
    pub fn try_charge(self: &Arc<Self>, bytes: usize, kind: Kind) -> Option<Charge> {
        let charge = self.try_charge_spare(bytes, kind);
        if charge.is_none() {
            self.metrics.reject("memory_budget");
            self.pressure.notify_one();
        }
        charge
    }

    /// Charges `bytes` if they fit, for what is only worth keeping while there is room (a memo
    /// of answers): not fitting is no refusal, so nothing is counted or shed for it.
    pub fn try_charge_spare(self: &Arc<Self>, bytes: usize, kind: Kind) -> Option<Charge> {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                let after = used.saturating_add(bytes);
                (self.limit == 0 || after <= self.limit).then_some(after)
            })
            .ok()
            .map(|_| self.charged(bytes, kind))
    }

    /// Charges `bytes` whether or not they fit (for what must be held anyway).
    pub fn charge(self: &Arc<Self>, bytes: usize, kind: Kind) -> Charge {
        self.used.fetch_add(bytes, Ordering::SeqCst);
        self.charged(bytes, kind)
    }

    /// Whether `bytes` of new work would fit now.
    pub fn has_room(&self, bytes: usize) -> bool {
        self.limit == 0 || self.used().saturating_add(bytes) <= self.limit
    }

    /// Completes after new work has been refused (at once if it was since the last call).
    pub async fn refused(&self) {
        self.pressure.notified().await;
    }

    fn charged(self: &Arc<Self>, bytes: usize, kind: Kind) -> Charge {
        let gauge = self
            .metrics
            .memory_charged
            .get_or_create(&KindLabels { kind: kind.label() })
            .clone();
        gauge.inc_by(i64::try_from(bytes).unwrap_or(i64::MAX));
        Charge {
            budget: self.clone(),
            bytes,
            gauge,
        }
    }

    /// `bytes`, charged as a version for as long as any copy of the returned handle lives
    /// (however many streams share it).
    pub fn hold(self: &Arc<Self>, bytes: Bytes) -> Bytes {
        let charge = self.charge(bytes.len(), Kind::Versions);
        Bytes::from_owner(Held {
            bytes,
            _charge: charge,
        })
    }
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("limit", &self.limit)
            .field("used", &self.used())
            .finish()
    }
}

/// Bytes counted against a [`MemoryBudget`] until dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<MemoryBudget>,
    bytes: usize,
    gauge: Gauge,
}

impl Charge {
    /// The budget this is charged to.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// Moves `bytes` of this charge (at most all of it) into a charge of their own, let go of
    /// separately; the budget's total is unchanged.
    pub fn split_off(&mut self, bytes: usize) -> Charge {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Charge {
            budget: self.budget.clone(),
            bytes,
            gauge: self.gauge.clone(),
        }
    }

    /// Takes `other` (charged to the same budget, of the same kind) into this charge; the
    /// budget's total is unchanged.
    pub fn absorb(&mut self, mut other: Charge) {
        self.bytes += std::mem::take(&mut other.bytes);
    }

    /// Charges `bytes` more to this charge, whether or not they fit (for what is held anyway).
    pub fn grow(&mut self, bytes: usize) {
        self.budget.used.fetch_add(bytes, Ordering::SeqCst);
        self.gauge.inc_by(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.bytes += bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::SeqCst);
        self.gauge
            .dec_by(i64::try_from(self.bytes).unwrap_or(i64::MAX));
    }
}

/// The owner of bytes handed out by [`MemoryBudget::hold`].
struct Held {
    bytes: Bytes,
    _charge: Charge,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// What the process holds before any client: the runtime, the allocator, the sources, its
/// metrics (a release build serving a few resources: 15 MiB measured).
pub const BASE_BYTES: usize = 16 << 20;

/// The default budget: three quarters of what the container's memory limit (cgroup v2
/// `memory.max`, or v1 `memory.limit_in_bytes`) leaves above [`BASE_BYTES`], else half the
/// machine's memory (which other processes share); 0 (no limit) when neither can be read. The
/// last quarter is for what is not counted: the allocator's slack, the sources' caches, the
/// short-lived parses of new versions. The charges are close to what is held (a subscriber on a
/// connection of its own is charged 26 KiB and holds 25.9 KiB; over TLS, 34 and 33.9 KiB).
pub fn default_limit() -> usize {
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|path| cgroup_limit(Path::new(path)));
    match cgroup {
        Some(limit) => for_memory_limit(limit),
        None => machine_memory().map_or(0, |bytes| bytes / 2),
    }
}

/// Below this budget the allocator gives freed memory back at once: the last quarter of a
/// limit this small cannot hold what jemalloc's arenas keep of freed pages for reuse (up to
/// 50 MiB measured).
pub const TIGHT_BELOW: usize = 192 << 20;

/// Whether `budget` is set and under [`TIGHT_BELOW`] (a memory limit under about 272 MiB).
pub fn is_tight(budget: usize) -> bool {
    budget != 0 && budget < TIGHT_BELOW
}

/// The default budget in a container limited to `limit` bytes (at least 1 byte, so that a
/// limit below the base still bounds what clients can add).
pub fn for_memory_limit(limit: usize) -> usize {
    (limit.saturating_sub(BASE_BYTES) / 4 * 3).max(1)
}

/// A cgroup memory limit file's value, if it sets one ("max", or v1's huge "no limit", do not).
fn cgroup_limit(path: &Path) -> Option<usize> {
    parse_cgroup_limit(&std::fs::read_to_string(path).ok()?)
}

fn parse_cgroup_limit(text: &str) -> Option<usize> {
    let bytes: u64 = text.trim().parse().ok()?;
    // cgroup v1 writes a page-rounded i64::MAX when no limit is set.
    (bytes < 1 << 60).then(|| usize::try_from(bytes).ok())?
}

/// `MemTotal` from /proc/meminfo, in bytes.
fn machine_memory() -> Option<usize> {
    let kib = crate::introspection::procfs::meminfo()
        .ok()?
        .number("MemTotal")?;
    usize::try_from(kib).ok()?.checked_mul(1024)
}

/// Parses a byte count: digits with an optional binary suffix (`Ki`, `Mi`, `Gi`, `Ti`), as in
/// Kubernetes quantities.
/// The smallest memory budget but 0 (no limit): less cannot hold one client (a connection, its
/// stream and a version), and is most likely a size written without its unit.
pub const MIN_BUDGET: usize = 1 << 20;

/// `--memory-budget`: a byte count ([`parse_bytes`]), 0 or at least [`MIN_BUDGET`].
pub fn parse_budget(text: &str) -> Result<usize, String> {
    let bytes = parse_bytes(text)?;
    if bytes != 0 && bytes < MIN_BUDGET {
        return Err(format!(
            "{bytes} bytes cannot hold one client (a connection is charged {} KiB, a stream {} \
             KiB, a version its size); the least is 1Mi, 0 means no limit. A size takes its \
             unit: {}Mi, for example",
            CONNECTION_BYTES >> 10,
            (STREAM_BYTES + RETAINED_STREAM_BYTES) >> 10,
            text.trim()
        ));
    }
    Ok(bytes)
}

pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: usize = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a byte count (for example 536870912 or 512Mi)"))?;
    let shift = match suffix {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "Ti" => 40,
        other => return Err(format!("unknown unit `{other}`; use Ki, Mi, Gi or Ti")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chart's limits: the node tier's 64Mi leaves 36 MiB for clients, the central's 544Mi
    /// 396 MiB; a limit below the base still bounds them (0 would turn the budget off).
    #[test]
    fn the_default_is_three_quarters_of_what_the_limit_leaves_above_the_base() {
        assert_eq!(for_memory_limit(64 << 20), 36 << 20);
        assert_eq!(for_memory_limit(544 << 20), 396 << 20);
        assert_eq!(for_memory_limit(8 << 20), 1);
    }

    /// The node tier's budget is tight, the central's is not, and no budget is never tight.
    #[test]
    fn the_node_tiers_budget_is_tight_and_the_centrals_is_not() {
        assert!(is_tight(for_memory_limit(64 << 20)));
        assert!(!is_tight(for_memory_limit(544 << 20)));
        assert!(!is_tight(0));
    }

    fn used(metrics: &Metrics, kind: &'static str) -> i64 {
        metrics
            .memory_charged
            .get_or_create(&KindLabels { kind })
            .get()
    }

    #[test]
    fn new_work_is_refused_above_the_budget_and_given_back() {
        let metrics = Arc::new(Metrics::new());
        let budget = MemoryBudget::new(100, metrics.clone());
        let first = budget.try_charge(60, Kind::Streams).expect("fits");
        assert!(budget.try_charge(60, Kind::Streams).is_none(), "over");
        // What must be held is taken even over the limit; new work is then refused.
        let mut version = budget.charge(60, Kind::Versions);
        assert_eq!(budget.used(), 120);
        assert!(budget.try_charge(1, Kind::Connections).is_none());
        // A refusal is told to whoever can let go of something, once.
        assert!(futures::FutureExt::now_or_never(budget.refused()).is_some());
        assert!(futures::FutureExt::now_or_never(budget.refused()).is_none());
        drop(first);
        version.grow(40);
        assert_eq!(used(&metrics, "versions"), 100);
        drop(version);
        assert_eq!(budget.used(), 0);
        assert_eq!(used(&metrics, "streams"), 0);
        assert!(budget.try_charge(100, Kind::Connections).is_some());
        assert!(metrics.encode().contains("reason=\"memory_budget\"} 2"));
    }

    #[test]
    fn a_charge_split_in_two_is_let_go_in_two() {
        let metrics = Arc::new(Metrics::new());
        let budget = MemoryBudget::new(100, metrics.clone());
        let mut stream = budget.try_charge(100, Kind::Streams).expect("fits");
        let request = stream.split_off(40);
        assert_eq!(budget.used(), 100);
        drop(request);
        assert_eq!(budget.used(), 60);
        assert_eq!(used(&metrics, "streams"), 60);
        assert_eq!(stream.split_off(1000).bytes, 60, "at most what is charged");
        drop(stream);
        assert_eq!(budget.used(), 0);
        assert_eq!(used(&metrics, "streams"), 0);
    }

    #[test]
    fn held_bytes_are_charged_once_until_the_last_copy_goes() {
        let metrics = Arc::new(Metrics::new());
        let budget = MemoryBudget::unlimited(metrics.clone());
        let held = budget.hold(Bytes::from(vec![7u8; 1000]));
        let copies: Vec<Bytes> = (0..10).map(|_| held.clone()).collect();
        assert_eq!(budget.used(), 1000);
        assert_eq!(&copies[3][..3], &[7, 7, 7]);
        drop(held);
        assert_eq!(used(&metrics, "versions"), 1000);
        drop(copies);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn byte_counts_and_cgroup_limits_are_read() {
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert!(parse_bytes("12MB").is_err());
        assert!(parse_bytes("lots").is_err());
        assert_eq!(parse_budget("0"), Ok(0));
        assert_eq!(parse_budget("1Mi"), Ok(MIN_BUDGET));
        let error = parse_budget("36").expect_err("36 bytes");
        assert!(error.contains("cannot hold one client"), "{error}");
        assert!(error.contains("36Mi"), "{error}");
        assert_eq!(parse_cgroup_limit("536870912\n"), Some(512 << 20));
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(parse_cgroup_limit("9223372036854771712\n"), None);
    }
}
