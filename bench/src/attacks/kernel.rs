//! `--attacks-tiers`: each attack in a memory cgroup of its own at a tier's chart limit, the
//! proxy given the budget the chart derives from it, and what the kernel and the clients saw:
//! the cgroup's peak, its OOM kills, the budget's refusals, whether an established subscriber
//! got the next edit and whether a new client got in.

use std::sync::Arc;

use flagd_proxy_testkit::memory_cgroup::MemoryCgroup;
use serde::Serialize;

use super::scene::Measured;
use crate::options::Tier;

/// A fresh memory cgroup at `tier`'s limit, for one run.
pub(crate) fn cgroup(tier: Tier, what: &str) -> anyhow::Result<Arc<MemoryCgroup>> {
    let prefix = format!("flagd-proxy-bench-{}-{what}", tier.label());
    Ok(Arc::new(MemoryCgroup::create(&prefix, tier.limit_bytes())?))
}

/// The sample counting the budget's refusals.
pub(crate) const BUDGET_REFUSALS: &str =
    "flagd_proxy_rejected_requests_total{reason=\"memory_budget\"}";

/// What the kernel and the clients saw of one run in a tier's cgroup.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Kernel {
    /// The cgroup's peak (bytes).
    pub(crate) peak_bytes: Option<u64>,
    pub(crate) oom_kills: Option<u64>,
    /// The budget's refusals, read from `/metrics` before the proxy was stopped, or why they
    /// could not be.
    pub(crate) budget_refusals: Option<String>,
    /// Whether the subscriber established before the attack got the edit written after it.
    pub(crate) subscriber: Option<String>,
    /// Whether a new client got a stream and its first version after the attack.
    pub(crate) new_client: Option<String>,
}

impl Kernel {
    /// Reads the cgroup's figures into `measured` (whatever became of the attack).
    pub(crate) fn read(cgroup: &MemoryCgroup, measured: &mut Measured) {
        let kernel = measured.kernel.get_or_insert_with(Kernel::default);
        kernel.peak_bytes = cgroup.peak_bytes().ok();
        kernel.oom_kills = cgroup.oom_kills().ok();
    }
}

/// One tier's table: a row per attack (and per honest load), what the kernel saw of it.
pub(crate) fn markdown(tier: Tier, rows: &[(String, String, Measured)]) -> String {
    let mut out = format!(
        "## {} tier: {} MiB cgroup, `--memory-budget {}`\n\n",
        tier.label(),
        tier.limit_bytes() >> 20,
        tier.budget()
    );
    out.push_str(
        "| # | Attack | cgroup peak | OOM kills | budget refusals | subscriber got next edit | \
         new client got in | outcome |\n|---|---|---|---|---|---|---|---|\n",
    );
    let dash = || "–".to_owned();
    for (row, attack, m) in rows {
        let k = m.kernel.clone().unwrap_or_default();
        let peak = k
            .peak_bytes
            .map_or_else(dash, |b| format!("{:.1} MiB", b as f64 / 1048576.0));
        let ooms = k.oom_kills.map_or_else(dash, |n| n.to_string());
        let outcome = match &m.failed {
            Some(why) => format!("failed: {}", why.replace('\n', " ")),
            None => m.outcome.clone(),
        };
        out.push_str(&format!(
            "| {row} | {attack} | {peak} | {ooms} | {} | {} | {} | {outcome} |\n",
            k.budget_refusals.unwrap_or_else(dash),
            k.subscriber.unwrap_or_else(dash),
            k.new_client.unwrap_or_else(dash),
        ));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_row_shows_what_the_kernel_and_the_clients_saw() {
        let judged = Measured {
            outcome: "held".to_owned(),
            kernel: Some(Kernel {
                peak_bytes: Some(50 << 20),
                oom_kills: Some(1),
                budget_refusals: Some("unread: the proxy is gone".to_owned()),
                subscriber: Some("no: nothing within 10 s".to_owned()),
                new_client: Some("yes".to_owned()),
            }),
            ..Measured::default()
        };
        let started = Measured::outcome("0600 in 20 of 20".to_owned());
        let rows = [
            ("2".to_owned(), "pinned".to_owned(), judged),
            ("9".to_owned(), "socket".to_owned(), started),
        ];
        let table = markdown(Tier::Node, &rows);
        assert!(table.starts_with("## node tier: 64 MiB cgroup, `--memory-budget 36Mi`"));
        assert!(table.contains(
            "| 50.0 MiB | 1 | unread: the proxy is gone | no: nothing within 10 s | yes | held |"
        ));
        assert!(
            table.contains("| – | – | – | – | – | 0600 in 20 of 20 |"),
            "{table}"
        );
    }
}
