//! The attacks' table: one row per attack, for each build the RSS during and after and what
//! the attack achieved; and row 14, the memory given back, read from the others.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::Build;
use super::scene::Measured;
use crate::report::machine;
use crate::sampling::mib;

/// The proxy's RSS from ready to its peak during the attack.
pub(crate) fn during(m: &Measured) -> String {
    match (m.start_kib, m.peak_kib) {
        (Some(start), Some(peak)) => format!("{} → {} MiB", mib_text(start), mib_text(peak)),
        _ => "–".to_owned(),
    }
}

/// The proxy's RSS after the attacker had gone and the quiet time had passed.
pub(crate) fn after(m: &Measured) -> String {
    m.after_kib
        .map_or_else(|| "–".to_owned(), |kib| format!("{} MiB", mib_text(kib)))
}

fn mib_text(kib: u64) -> String {
    let mib = mib(kib);
    if mib < 100.0 {
        format!("{mib:.1}")
    } else {
        format!("{mib:.0}")
    }
}

/// Row 14: of what the attacks on a running proxy took (peak above the RSS at ready), how
/// much was still held after the quiet time, summed over the rows that have both figures.
pub(crate) fn given_back(
    results: &BTreeMap<(u8, &'static str), Measured>,
    build: &str,
) -> Measured {
    let (mut taken, mut kept, mut rows) = (0u64, 0u64, 0);
    for ((_, label), m) in results {
        if *label != build {
            continue;
        }
        if let (Some(start), Some(peak), Some(after)) = (m.start_kib, m.peak_kib, m.after_kib) {
            taken += peak.saturating_sub(start);
            kept += after.saturating_sub(start);
            rows += 1;
        }
    }
    if rows == 0 {
        return Measured::failed("no attack with memory figures".to_owned());
    }
    Measured::outcome(format!(
        "{} of {} MiB taken still held after the quiet time ({:.0} %), over {rows} attacks",
        mib_text(kept),
        mib_text(taken),
        100.0 * kept as f64 / taken.max(1) as f64
    ))
}

/// What the attacks' report shows.
pub(crate) struct Report<'a> {
    pub(crate) builds: &'a [Build],
    pub(crate) rows: &'a [u8],
    pub(crate) results: &'a BTreeMap<(u8, &'static str), Measured>,
    pub(crate) seconds: f64,
    pub(crate) load: (String, String),
    pub(crate) quiet: Duration,
}

impl Report<'_> {
    pub(crate) fn markdown(&self) -> String {
        let mut out = String::from("# Attacks\n\n");
        for build in self.builds {
            out.push_str(&format!("- {}: `{}`\n", build.label, build.bin.display()));
        }
        out.push_str(&format!(
            "- machine: {}; load average {} before, {} after; {:.0} s in all\n",
            machine(),
            self.load.0,
            self.load.1,
            self.seconds
        ));
        out.push_str(&format!(
            "- during: RSS once ready → peak (VmHWM) during the attack; after: RSS {} s after \
             the attacker left\n\n",
            self.quiet.as_secs_f64()
        ));
        out.push_str("| # | Attack |");
        for build in self.builds {
            let l = build.label;
            out.push_str(&format!(" {l}: during | {l}: after | {l}: outcome |"));
        }
        out.push_str("\n|---|---|");
        out.push_str(&"---|---|---|".repeat(self.builds.len()));
        out.push('\n');
        for &row in self.rows {
            let attack = flagd_proxy_testkit::attacks::name(row);
            out.push_str(&format!("| {row} | {attack} |"));
            for build in self.builds {
                out.push_str(&match self.results.get(&(row, build.label)) {
                    Some(m) => match &m.failed {
                        Some(why) => format!(" – | – | failed: {} |", why.replace('\n', " ")),
                        None => format!(" {} | {} | {} |", during(m), after(m), m.outcome),
                    },
                    None => " – | – | not run |".to_owned(),
                });
            }
            out.push('\n');
        }
        out
    }

    pub(crate) fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|&row| {
                let builds: serde_json::Map<String, Value> = self
                    .builds
                    .iter()
                    .filter_map(|b| {
                        let m = self.results.get(&(row, b.label))?;
                        Some((b.label.to_owned(), serde_json::to_value(m).ok()?))
                    })
                    .collect();
                json!({"attack": row, "builds": builds})
            })
            .collect();
        json!({
            "machine": machine(),
            "seconds": self.seconds,
            "quiet_seconds": self.quiet.as_secs_f64(),
            "builds": self.builds.iter().map(|b| json!({"label": b.label, "bin": b.bin})).collect::<Vec<_>>(),
            "rows": rows,
        })
    }
}
