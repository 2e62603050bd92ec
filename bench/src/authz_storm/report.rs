//! The authorization storm's report: a table per phase (cold connect, storm), one row per
//! mode, the requests the API server counted against the target, and what went wrong.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::Args;
use crate::kit::header::Header;
use crate::kit::table::{Table, fmt_opt, met_cell};
use crate::options::AuthzMode;

/// The requests authorization makes, as the API server counts them (verb, resource).
const AUTHZ_REQUESTS: [&str; 5] = [
    "POST tokenreviews",
    "POST subjectaccessreviews",
    "LIST pods",
    "WATCH pods",
    "GET pods",
];
/// The target's constant: at most 2 requests per identity plus this.
const TARGET_SLACK: u64 = 10;

/// What one phase of one mode measured.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct PhaseResult {
    pub(crate) clients: usize,
    /// Clients that had their snapshot by the end of the phase.
    pub(crate) served: usize,
    /// Until every client had its snapshot (none when some never did).
    pub(crate) seconds: Option<f64>,
    /// Attempts that ended with an error status, by status and message.
    pub(crate) refusals: BTreeMap<String, u64>,
    /// Attempts that got no answer (connect failed, timed out) and were tried again.
    pub(crate) connect_failures: u64,
    /// Streams that ended after their client was served.
    pub(crate) streams_ended: u64,
    pub(crate) cpu_seconds: f64,
    pub(crate) rss_peak_mib: f64,
    /// Requests the API server counted, by `VERB resource`.
    pub(crate) requests: BTreeMap<String, u64>,
}

impl PhaseResult {
    fn count(&self, key: &str) -> u64 {
        self.requests.get(key).copied().unwrap_or(0)
    }

    /// The requests authorization made.
    pub(crate) fn authz(&self) -> u64 {
        AUTHZ_REQUESTS.iter().map(|key| self.count(key)).sum()
    }

    fn feature_flags(&self) -> u64 {
        self.requests
            .iter()
            .filter(|(key, _)| key.ends_with(" featureflags"))
            .map(|(_, count)| count)
            .sum()
    }

    /// Requests on other resources (the API server's own upkeep); the bench's reads of
    /// `/metrics` are not on a resource and are left out.
    fn others(&self) -> Vec<(&str, u64)> {
        self.requests
            .iter()
            .filter(|(key, _)| {
                !AUTHZ_REQUESTS.contains(&key.as_str())
                    && !key.ends_with(" featureflags")
                    && !key.ends_with(" (non-resource)")
            })
            .map(|(key, count)| (key.as_str(), *count))
            .collect()
    }

    fn refused(&self) -> u64 {
        self.refusals.values().sum()
    }
}

/// One mode: its two phases (cold, storm), or why its run failed.
pub(crate) struct ModeRun {
    pub(crate) mode: AuthzMode,
    pub(crate) outcome: Result<[PhaseResult; 2], String>,
}

const PHASES: [&str; 2] = ["cold connect", "storm"];

/// What the report says besides the runs.
pub(crate) struct Summary<'a> {
    pub(crate) args: &'a Args,
    pub(crate) identities: usize,
    pub(crate) namespaces: usize,
    pub(crate) header: Header,
}

impl Summary<'_> {
    /// At most 2 authorization requests per identity, plus 10, in each phase.
    pub(crate) fn target(&self) -> u64 {
        self.identities as u64 * 2 + TARGET_SLACK
    }

    /// What was wrong: a run that failed, a client not served, an error status, a stream that
    /// ended, a phase over its target.
    pub(crate) fn problems(&self, runs: &[ModeRun]) -> Vec<String> {
        let mut problems = Vec::new();
        for run in runs {
            let mode = run.mode.label();
            let phases = match &run.outcome {
                Ok(phases) => phases,
                Err(error) => {
                    problems.push(format!(
                        "authorization storm, {mode}: the run failed: {error}"
                    ));
                    continue;
                }
            };
            for (phase, r) in PHASES.iter().zip(phases) {
                let at = format!("authorization storm, {mode}, {phase}");
                if r.served < r.clients {
                    let missing = r.clients - r.served;
                    problems.push(format!(
                        "{at}: {missing} of {} clients never served",
                        r.clients
                    ));
                }
                if let Some((first, _)) = r.refusals.iter().next() {
                    problems.push(format!("{at}: {} attempts refused ({first})", r.refused()));
                }
                if r.streams_ended > 0 {
                    problems.push(format!("{at}: {} served streams ended", r.streams_ended));
                }
                if r.authz() > self.target() {
                    let (made, target) = (r.authz(), self.target());
                    problems.push(format!(
                        "{at}: {made} authorization requests, over the target of {target}"
                    ));
                }
            }
        }
        problems
    }

    pub(crate) fn markdown(&self, runs: &[ModeRun], problems: &[String]) -> String {
        let mut out = self.preamble();
        let spread = humantime::format_duration(self.args.storm_spread);
        let titles = [
            format!(
                "Cold: every client connects ({} at a time), the proxy's first decisions",
                self.args.connect_concurrency
            ),
            format!("Storm: every connection dropped, every client reconnecting within {spread}"),
        ];
        for (i, title) in titles.iter().enumerate() {
            let _ = write!(out, "### {title}\n\n{}", self.table(runs, i));
        }
        out.push_str(&others(runs));
        if problems.is_empty() {
            out.push_str(
                "Verdict: every client served in every phase, no error, and every phase within \
                 the target.\n",
            );
        } else {
            let _ = writeln!(out, "Verdict: **FAILED**:\n");
            for problem in problems {
                let _ = writeln!(out, "- {problem}");
            }
        }
        out
    }

    fn preamble(&self) -> String {
        let args = self.args;
        let last = 10 + self.identities - 1;
        let extra: Vec<String> = std::iter::once("--max-pending-requests-per-address=0".to_owned())
            .chain(args.proxy_arg.iter().cloned())
            .map(|a| format!("`{a}`"))
            .collect();
        format!(
            "## Authorization in a reconnect storm\n\n\
             {} clients of {} identities (dealt round-robin), in {} namespace(s) with one \
             FeatureFlag each (about 1 KiB); each identity is a ServiceAccount with a token and a \
             running pod at 127.0.0.10–127.0.0.{last}, and its clients connect from that address \
             and read their namespace's FeatureFlag. A fresh proxy per mode, with {}. API \
             requests: the API server's own `apiserver_request_total` (and, for watches still \
             open, `apiserver_longrunning_requests`), from just before a phase's clients start \
             until they have gone and the proxy has closed their connections. Target: authorization requests (TokenReviews, \
             SubjectAccessReviews, pod lists, watches and gets) ≤ identities × 2 + {TARGET_SLACK} \
             = {} in each phase.\n\n\
             {}.\n\n",
            args.subscribers,
            self.identities,
            self.namespaces,
            extra.join(" "),
            self.target(),
            self.header.sentence(),
        )
    }

    /// The table of phase `phase`, a row per mode.
    fn table(&self, runs: &[ModeRun], phase: usize) -> String {
        let mut table = Table::of(COLUMNS, "lrrrrrrrlr");
        let target = self.target();
        for run in runs {
            let mode = run.mode.label().to_owned();
            match &run.outcome {
                Ok(phases) => table.row(phase_cells(mode, &phases[phase], target)),
                Err(_) => table.row([mode, "failed (see below)".to_owned()]),
            }
        }
        table.markdown() + "\n"
    }

    pub(crate) fn json(&self, runs: &[ModeRun], problems: &[String]) -> Value {
        let modes: Vec<Value> = runs
            .iter()
            .map(|run| match &run.outcome {
                Ok([cold, storm]) => json!({"mode": run.mode, "cold": cold, "storm": storm}),
                Err(error) => json!({"mode": run.mode, "error": error}),
            })
            .collect();
        self.header.stamp(json!({
            "scenario": "authz-storm",
            "clients": self.args.subscribers,
            "identities": self.identities,
            "namespaces": self.namespaces,
            "target": self.target(),
            "storm_spread_seconds": self.args.storm_spread.as_secs_f64(),
            "proxy_args": self.args.proxy_arg,
            "modes": modes,
            "problems": problems,
        }))
    }
}

/// The header of a phase's table.
const COLUMNS: &str = "mode | clients served | time (s) | TokenReviews | SubjectAccessReviews \
     | pods LIST / WATCH / GET | authorization requests | target | met | FeatureFlag requests \
     | other API requests | attempts refused | connects retried | proxy CPU (s) \
     | proxy RSS peak (MiB)";

/// The cells of one mode's row in a phase's table.
fn phase_cells(mode: String, r: &PhaseResult, target: u64) -> Vec<String> {
    let others: u64 = r.others().iter().map(|(_, c)| c).sum();
    vec![
        mode,
        format!("{} of {}", r.served, r.clients),
        fmt_opt(r.seconds, 2),
        r.count("POST tokenreviews").to_string(),
        r.count("POST subjectaccessreviews").to_string(),
        format!(
            "{} / {} / {}",
            r.count("LIST pods"),
            r.count("WATCH pods"),
            r.count("GET pods")
        ),
        r.authz().to_string(),
        target.to_string(),
        met_cell(Some(r.authz() <= target)).to_owned(),
        r.feature_flags().to_string(),
        others.to_string(),
        r.refused().to_string(),
        r.connect_failures.to_string(),
        format!("{:.2}", r.cpu_seconds),
        format!("{:.1}", r.rss_peak_mib),
    ]
}

/// The other API requests, named, where there were any.
fn others(runs: &[ModeRun]) -> String {
    let mut lines = String::new();
    for run in runs {
        let Ok(phases) = &run.outcome else {
            continue;
        };
        for (phase, r) in PHASES.iter().zip(phases) {
            let named: Vec<String> = r.others().iter().map(|(k, c)| format!("{k} {c}")).collect();
            if !named.is_empty() {
                let _ = writeln!(
                    lines,
                    "- {}, {phase}: {}",
                    run.mode.label(),
                    named.join(", ")
                );
            }
        }
    }
    if lines.is_empty() {
        return String::new();
    }
    format!(
        "Other API requests (not the proxy's authorization or its FeatureFlag watches):\n\n{lines}\n"
    )
}
