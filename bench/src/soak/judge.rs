//! The soak's verdict: every sampled quantity back to its baseline (within its tolerance), and
//! every subscriber correct.
//!
//! Tolerances. What the proxy holds per client or per resource must be back exactly:
//! streams, connections, watches and resources waited on. Open file descriptors and threads may
//! differ by a few for reasons that are not leaks (a blocking thread of the runtime that has not
//! yet reached its 10 s keep-alive, a descriptor opened once and kept). The metric series may
//! gain a few label sets that appear on first use (an error counter of a new kind) but not one
//! per resource or client. RSS may grow by what an allocator keeps after a peak without leaking:
//! baseline + the larger of [`RSS_PLUS_MIB`] and [`RSS_FRACTION`] (twice the most a churn's
//! working set stayed above the baseline in trial runs); over the default soak's 1,000,000
//! updates and about 117,500 connections that bound is crossed by a leak of about 34 bytes per
//! update or 290 bytes per connection.

use super::probe::Sample;
use crate::kit::table::{Table, fmt_opt};

/// RSS: allowed growth in MiB (or [`RSS_FRACTION`] of the baseline, if more).
pub(crate) const RSS_PLUS_MIB: f64 = 32.0;
pub(crate) const RSS_FRACTION: f64 = 0.25;
/// Open file descriptors: allowed growth.
pub(crate) const FDS_PLUS: f64 = 4.0;
/// Threads: allowed growth.
pub(crate) const THREADS_PLUS: f64 = 2.0;
/// Metric series: allowed growth.
pub(crate) const SERIES_PLUS: f64 = 4.0;

/// How far a quantity's end may be from its baseline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Tolerance {
    /// The end must equal the baseline.
    Exact,
    /// The end may exceed the baseline by this much.
    Plus(f64),
    /// The end may exceed the baseline by the larger of `plus` and `fraction` of it.
    PlusOrFraction { plus: f64, fraction: f64 },
}

impl Tolerance {
    pub(crate) fn allows(self, baseline: f64, end: f64) -> bool {
        match self {
            Tolerance::Exact => end == baseline,
            Tolerance::Plus(plus) => end <= baseline + plus,
            Tolerance::PlusOrFraction { plus, fraction } => {
                end <= baseline + plus.max(fraction * baseline)
            }
        }
    }

    pub(crate) fn describe(self, unit: &str) -> String {
        match self {
            Tolerance::Exact => "= baseline".to_owned(),
            Tolerance::Plus(plus) => format!("≤ baseline + {plus}{unit}"),
            Tolerance::PlusOrFraction { plus, fraction } => {
                format!("≤ baseline + max({plus}{unit}, {:.0} %)", fraction * 100.0)
            }
        }
    }
}

/// A sampled quantity and its tolerance.
pub(crate) struct Quantity {
    pub(crate) name: &'static str,
    pub(crate) get: fn(&Sample) -> Option<f64>,
    pub(crate) digits: usize,
    pub(crate) unit: &'static str,
    pub(crate) tolerance: Tolerance,
}

/// Every quantity the soak judges, in the order of the table.
pub(crate) fn quantities() -> Vec<Quantity> {
    let rss = Quantity {
        name: "RSS (MiB)",
        get: |s| s.rss_kib.map(|k| k / 1024.0),
        digits: 1,
        unit: " MiB",
        tolerance: Tolerance::PlusOrFraction {
            plus: RSS_PLUS_MIB,
            fraction: RSS_FRACTION,
        },
    };
    vec![
        rss,
        count(
            "open file descriptors",
            |s| s.fds,
            Tolerance::Plus(FDS_PLUS),
        ),
        count("threads", |s| s.threads, Tolerance::Plus(THREADS_PLUS)),
        count(
            "sync streams (`sync_active_streams`)",
            |s| s.streams,
            Tolerance::Exact,
        ),
        count(
            "sync connections (`flagd_proxy_open_connections{port=\"sync\"}`)",
            |s| s.connections,
            Tolerance::Exact,
        ),
        count(
            "watches (`flagd_proxy_upstream_watches`)",
            |s| s.watches,
            Tolerance::Exact,
        ),
        count(
            "resources waited on (`flagd_proxy_waiting_resources`)",
            |s| s.waiting,
            Tolerance::Exact,
        ),
        count(
            "metric series (sample lines of `/metrics`)",
            |s| s.series,
            Tolerance::Plus(SERIES_PLUS),
        ),
    ]
}

/// A quantity that counts things: no decimals, no unit.
fn count(name: &'static str, get: fn(&Sample) -> Option<f64>, tolerance: Tolerance) -> Quantity {
    Quantity {
        name,
        get,
        digits: 0,
        unit: "",
        tolerance,
    }
}

/// One row of the table: a quantity at the baseline, at its peak during the churn, at the end.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Judged {
    pub(crate) name: &'static str,
    pub(crate) baseline: Option<f64>,
    pub(crate) peak: Option<f64>,
    pub(crate) end: Option<f64>,
    pub(crate) tolerance: String,
    pub(crate) pass: bool,
    #[serde(skip)]
    pub(crate) digits: usize,
}

/// Each quantity: its baseline, its peak over `during`, its end, and whether the end is within
/// its tolerance of the baseline (a quantity not measured at either is not).
pub(crate) fn judge(
    quantities: &[Quantity],
    baseline: &Sample,
    during: &[Sample],
    end: &Sample,
) -> Vec<Judged> {
    quantities
        .iter()
        .map(|q| {
            let (b, e) = ((q.get)(baseline), (q.get)(end));
            let peak = during.iter().filter_map(q.get).reduce(f64::max);
            Judged {
                name: q.name,
                baseline: b,
                peak,
                end: e,
                tolerance: q.tolerance.describe(q.unit),
                pass: matches!((b, e), (Some(b), Some(e)) if q.tolerance.allows(b, e)),
                digits: q.digits,
            }
        })
        .collect()
}

/// The quantities not back to their baseline, in words.
pub(crate) fn leaks(judged: &[Judged]) -> Vec<String> {
    judged
        .iter()
        .filter(|j| !j.pass)
        .map(|j| match (j.baseline, j.end) {
            (Some(b), Some(e)) => format!(
                "{}: {} at the end against {} at the baseline (allowed: {})",
                j.name,
                fmt(e, j.digits),
                fmt(b, j.digits),
                j.tolerance
            ),
            _ => format!("{}: not measured at the baseline or the end", j.name),
        })
        .collect()
}

/// The table of the report.
pub(crate) fn table(judged: &[Judged]) -> String {
    let header = "quantity | baseline | peak during churn | end | tolerance | result";
    let mut table = Table::of(header, "lrrrl");
    for j in judged {
        let cell = |v: Option<f64>| fmt_opt(v, j.digits);
        table.row([
            j.name.to_string(),
            cell(j.baseline),
            cell(j.peak),
            cell(j.end),
            j.tolerance.to_string(),
            (if j.pass { "pass" } else { "**FAIL**" }).to_owned(),
        ]);
    }
    table.markdown()
}

fn fmt(v: f64, digits: usize) -> String {
    format!("{v:.digits$}")
}

/// What the subscribers and the churn saw, for the correctness half of the verdict.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub(crate) struct Correctness {
    pub(crate) steady_subscribers: usize,
    /// Steady subscribers not on the final version of their resource after the cool-down wait.
    pub(crate) stale: usize,
    pub(crate) steady_stream_errors: u64,
    pub(crate) steady_backwards: u64,
    pub(crate) steady_unparsed: u64,
    pub(crate) connect_failures: u64,
    pub(crate) lifecycle_failures: u64,
    /// Updates, connects or lifecycles not done (the churn stopped early), and why.
    pub(crate) not_done: Vec<String>,
    pub(crate) write_errors: u64,
    pub(crate) proxy_exited: Option<String>,
}

impl Correctness {
    /// Each way the run was incorrect, in words.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut count = |n: u64, what: &str| {
            if n > 0 {
                problems.push(format!("{n} {what}"));
            }
        };
        count(
            self.stale as u64,
            &format!(
                "of {} steady subscriber(s) not on the final version of their resource",
                self.steady_subscribers
            ),
        );
        count(self.steady_stream_errors, "steady stream(s) broken");
        count(
            self.steady_backwards,
            "message(s) to steady subscribers older than one they had",
        );
        count(
            self.steady_unparsed,
            "message(s) to steady subscribers without a version number",
        );
        count(self.connect_failures, "short-lived connection(s) failed");
        count(
            self.lifecycle_failures,
            "lifecycle(s) of resources that come and go failed",
        );
        count(self.write_errors, "manifest write(s) failed");
        problems.extend(self.not_done.iter().cloned());
        if let Some(exited) = &self.proxy_exited {
            problems.push(format!("the proxy exited: {exited}"));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::probe::Phase;

    fn sample(phase: Phase) -> Sample {
        Sample {
            at_seconds: 0.0,
            phase,
            rss_kib: Some(40.0 * 1024.0),
            fds: Some(30.0),
            threads: Some(5.0),
            streams: Some(400.0),
            connections: Some(8.0),
            watches: Some(100.0),
            waiting: Some(0.0),
            series: Some(60.0),
            published: Some(100.0),
            updates_sent: Some(400.0),
            cpu_seconds: 1.0,
            load_generator_cpu_seconds: 1.0,
        }
    }

    /// The baseline, a peak, and `end` judged; the failures in words.
    fn verdict(end: Sample) -> (Vec<Judged>, Vec<String>) {
        let baseline = sample(Phase::WarmUp);
        let mut peak = sample(Phase::Churn);
        peak.rss_kib = Some(90.0 * 1024.0);
        peak.watches = Some(160.0);
        let judged = judge(&quantities(), &baseline, &[peak], &end);
        let leaks = leaks(&judged);
        (judged, leaks)
    }

    #[test]
    fn an_end_back_at_the_baseline_passes() {
        let mut end = sample(Phase::CoolDown);
        // Within tolerance: an allocator's leftovers, a blocking thread, a few descriptors.
        end.rss_kib = Some((40.0 + RSS_PLUS_MIB - 0.5) * 1024.0);
        end.threads = Some(5.0 + THREADS_PLUS);
        end.fds = Some(30.0 + FDS_PLUS);
        end.series = Some(60.0 + SERIES_PLUS);
        let (judged, leaks) = verdict(end);
        assert!(leaks.is_empty(), "{leaks:?}");
        assert!(judged.iter().all(|j| j.pass));
        let watches = judged.iter().find(|j| j.name.starts_with("watches"));
        assert_eq!(watches.and_then(|j| j.peak), Some(160.0));
        let table = table(&judged);
        assert!(
            table.contains(
                "| RSS (MiB) | 40.0 | 90.0 | 71.5 | ≤ baseline + max(32 MiB, 25 %) | pass |"
            ),
            "{table}"
        );
    }

    #[test]
    fn a_watch_left_behind_fails_and_is_named() {
        let mut end = sample(Phase::CoolDown);
        end.watches = Some(101.0);
        let (judged, leaks) = verdict(end);
        assert_eq!(
            leaks,
            [
                "watches (`flagd_proxy_upstream_watches`): 101 at the end against 100 at the baseline (allowed: = baseline)"
            ]
        );
        assert!(table(&judged).contains("| 101 | = baseline | **FAIL** |"));
    }

    #[test]
    fn a_leak_beyond_each_tolerance_fails() {
        type Leak = fn(&mut Sample);
        let leaking: [(&str, Leak); 7] = [
            ("RSS", |s| {
                s.rss_kib = Some((40.0 + RSS_PLUS_MIB + 0.5) * 1024.0)
            }),
            ("open file descriptors", |s| {
                s.fds = Some(30.0 + FDS_PLUS + 1.0)
            }),
            ("threads", |s| s.threads = Some(5.0 + THREADS_PLUS + 1.0)),
            ("sync streams", |s| s.streams = Some(401.0)),
            ("sync connections", |s| s.connections = Some(9.0)),
            ("resources waited on", |s| s.waiting = Some(1.0)),
            ("metric series", |s| {
                s.series = Some(60.0 + SERIES_PLUS + 1.0)
            }),
        ];
        for (name, leak) in leaking {
            let mut end = sample(Phase::CoolDown);
            leak(&mut end);
            let (_, leaks) = verdict(end);
            assert_eq!(leaks.len(), 1, "{name}: {leaks:?}");
            assert!(leaks[0].starts_with(name), "{name}: {leaks:?}");
        }
    }

    #[test]
    fn the_rss_tolerance_is_a_fraction_of_a_large_baseline() {
        let tolerance = Tolerance::PlusOrFraction {
            plus: 32.0,
            fraction: 0.25,
        };
        assert!(tolerance.allows(200.0, 249.0));
        assert!(!tolerance.allows(200.0, 251.0));
        assert!(tolerance.allows(40.0, 72.0));
        assert!(!tolerance.allows(40.0, 72.5));
    }

    #[test]
    fn fewer_streams_than_at_the_baseline_fail_too() {
        let mut end = sample(Phase::CoolDown);
        end.streams = Some(399.0);
        assert_eq!(verdict(end).1.len(), 1);
    }

    #[test]
    fn a_quantity_not_measured_fails() {
        let mut end = sample(Phase::CoolDown);
        end.watches = None;
        let (_, leaks) = verdict(end);
        assert_eq!(
            leaks,
            ["watches (`flagd_proxy_upstream_watches`): not measured at the baseline or the end"]
        );
    }

    #[test]
    fn a_stale_subscriber_or_a_failed_connect_is_a_problem() {
        assert!(Correctness::default().problems().is_empty());
        let wrong = Correctness {
            steady_subscribers: 400,
            stale: 3,
            connect_failures: 2,
            ..Correctness::default()
        };
        assert_eq!(
            wrong.problems(),
            [
                "3 of 400 steady subscriber(s) not on the final version of their resource",
                "2 short-lived connection(s) failed"
            ]
        );
    }
}
