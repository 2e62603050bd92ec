//! The verdict: which proxies a run found incorrect, and the exit status that follows.
//!
//! A proxy is incorrect in a scenario when its run failed, or when it broke what
//! [`RunResult::problems`] checks: a subscriber missed a paced update, ended the burst on an old
//! version, lost its stream or never got its first snapshot.
//!
//! Only the proxy under test decides the exit status: this project's proxy, or with `--only-go`
//! the Go flagd-proxy. The proxies measured beside it (the Go flagd-proxy, its model, the floor)
//! are peers: their failures are shown in the tables and listed in the verdict, but they are
//! findings about someone else's program, not a regression here (the Go proxy is known to crash
//! in some scenarios, see docs/benchmarks.md), so they leave the exit status alone.

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use crate::args::Args;
use crate::proxy::Kind;
use crate::scenario::ScenarioRuns;

/// The exit status of a run that found the proxy under test incorrect.
pub(crate) const EXIT_INCORRECT: u8 = 1;

/// Prints the report, writes it (`--markdown`) and its JSON (`--json`), removes the working
/// directory unless it is kept, and names each problem on standard error; the exit status (1
/// when there is a problem).
pub(crate) fn publish(
    args: &Args,
    workdir: &Path,
    markdown: &str,
    json: impl FnOnce() -> Value,
    problems: &[String],
) -> anyhow::Result<u8> {
    println!("{markdown}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, markdown).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&json())?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !args.keep_workdir {
        let _ = std::fs::remove_dir_all(workdir);
    }
    for problem in problems {
        eprintln!("flagd-proxy-bench: FAILED: {problem}");
    }
    Ok(if problems.is_empty() {
        0
    } else {
        EXIT_INCORRECT
    })
}

/// One proxy found incorrect in one scenario.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Failure {
    pub(crate) scenario: String,
    pub(crate) proxy: String,
    /// What was wrong.
    pub(crate) problems: Vec<String>,
    /// Whether this is the proxy under test, whose failures decide the exit status.
    pub(crate) decides_exit_status: bool,
}

impl Failure {
    fn describe(&self) -> String {
        format!(
            "{} was incorrect in the scenario \"{}\": {}",
            self.proxy,
            self.scenario,
            self.problems.join("; ")
        )
    }
}

/// What a run found about the correctness of each proxy.
#[derive(Debug)]
pub(crate) struct Verdict {
    /// How the report names the proxy under test.
    pub(crate) under_test: String,
    pub(crate) failures: Vec<Failure>,
}

/// The proxy whose correctness decides the exit status.
pub(crate) fn under_test(args: &Args) -> Kind {
    if args.only_go { Kind::Go } else { Kind::Rust }
}

impl Verdict {
    /// The failures of every proxy in every scenario of `runs`.
    pub(crate) fn of(runs: &[ScenarioRuns], args: &Args) -> Self {
        let deciding = under_test(args);
        let mut failures = Vec::new();
        for run in runs {
            for kind in [Kind::Rust, Kind::Go, Kind::Model, Kind::Floor] {
                let problems = match (run.results.get(kind.key()), run.failed.get(kind.key())) {
                    (Some(result), _) => result.problems(run.scenario.subscribers),
                    (None, Some(error)) => vec![format!("the run failed: {error}")],
                    (None, None) => continue,
                };
                if problems.is_empty() {
                    continue;
                }
                failures.push(Failure {
                    scenario: run.scenario.label(),
                    proxy: kind.label_in(args).to_owned(),
                    problems,
                    decides_exit_status: kind == deciding,
                });
            }
        }
        let under_test = match deciding {
            Kind::Rust => "this project's proxy",
            other => other.label_in(args),
        };
        Verdict {
            under_test: under_test.to_owned(),
            failures,
        }
    }

    /// Whether the proxy under test was correct in every scenario.
    pub(crate) fn ok(&self) -> bool {
        !self.failures.iter().any(|f| f.decides_exit_status)
    }

    /// 0 when the proxy under test was correct, else [`EXIT_INCORRECT`].
    pub(crate) fn exit_code(&self) -> u8 {
        if self.ok() { 0 } else { EXIT_INCORRECT }
    }

    /// The end of the Markdown report: the verdict on the proxy under test, then what the peers
    /// got wrong.
    pub(crate) fn markdown(&self) -> String {
        let mut out = format!("Correctness ({}): ", self.under_test);
        if self.ok() {
            out.push_str(
                "every subscriber got every paced update and ended on the final version.\n",
            );
        } else {
            out.push_str(&format!(
                "**FAILED** (the run exits with status {EXIT_INCORRECT}):\n\n"
            ));
            for failure in self.failures.iter().filter(|f| f.decides_exit_status) {
                out.push_str(&format!(
                    "- {}: {}\n",
                    failure.scenario,
                    failure.problems.join("; ")
                ));
            }
        }
        let peers: Vec<&Failure> = self
            .failures
            .iter()
            .filter(|f| !f.decides_exit_status)
            .collect();
        if !peers.is_empty() {
            out.push_str("\nFound incorrect beside it (reported only; the exit status does not depend on them):\n\n");
            for failure in peers {
                out.push_str(&format!(
                    "- {}, {}: {}\n",
                    failure.proxy,
                    failure.scenario,
                    failure.problems.join("; ")
                ));
            }
        }
        out
    }

    /// Lines for standard error, after the report: each failure, the deciding ones first.
    pub(crate) fn messages(&self) -> Vec<String> {
        let deciding = self.failures.iter().filter(|f| f.decides_exit_status);
        let peers = self.failures.iter().filter(|f| !f.decides_exit_status);
        deciding
            .map(|f| format!("FAILED: {}", f.describe()))
            .chain(peers.map(|f| {
                format!(
                    "note: {} (a peer: reported only, not failing the run)",
                    f.describe()
                )
            }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::Parser;

    use super::*;
    use crate::options::SourceKind;
    use crate::scenario::{RunResult, Scenario};

    const SUBSCRIBERS: usize = 50;

    fn args(extra: &[&str]) -> Args {
        Args::parse_from(["flagd-proxy-bench"].iter().chain(extra))
    }

    fn scenario() -> Scenario {
        Scenario {
            source: SourceKind::Files,
            subscribers: SUBSCRIBERS,
            resources: 1,
            payload: 1024,
            tls: false,
        }
    }

    /// A run in which every subscriber got everything.
    fn correct() -> RunResult {
        RunResult {
            subscribers_connected: SUBSCRIBERS,
            ..RunResult::default()
        }
    }

    /// A run in which 3 subscribers ended the burst on an old version.
    fn stale() -> RunResult {
        RunResult {
            stale_after_settle: 3,
            ..correct()
        }
    }

    fn runs(results: &[(Kind, RunResult)], failed: &[(Kind, &str)]) -> Vec<ScenarioRuns> {
        vec![ScenarioRuns {
            scenario: scenario(),
            results: results.iter().map(|(k, r)| (k.key(), r.clone())).collect(),
            skipped: BTreeMap::new(),
            failed: failed
                .iter()
                .map(|(k, e)| (k.key(), (*e).to_owned()))
                .collect(),
        }]
    }

    #[test]
    fn a_correct_run_exits_zero() {
        let verdict = Verdict::of(
            &runs(&[(Kind::Rust, correct()), (Kind::Go, correct())], &[]),
            &args(&[]),
        );
        assert_eq!(verdict.exit_code(), 0);
        assert!(verdict.failures.is_empty(), "{verdict:?}");
        assert!(
            verdict
                .markdown()
                .contains("every subscriber got every paced update")
        );
    }

    #[test]
    fn stale_subscribers_of_this_proxy_fail_the_run_and_say_where() {
        let verdict = Verdict::of(&runs(&[(Kind::Rust, stale())], &[]), &args(&[]));
        assert_eq!(verdict.exit_code(), EXIT_INCORRECT);
        let messages = verdict.messages().join("\n");
        for needle in [
            "FAILED: flagd-proxy (Rust)",
            "50 subscribers, 1 resource(s), 1024 B payload, files source",
            "3 subscriber(s) not on the final version after the burst",
        ] {
            assert!(messages.contains(needle), "{needle:?} not in {messages}");
        }
        assert!(verdict.markdown().contains("**FAILED**"));
    }

    #[test]
    fn missed_updates_of_this_proxy_fail_the_run() {
        let missed = RunResult {
            updates_incomplete: 2,
            subscriber_versions_missed: 7,
            ..correct()
        };
        let verdict = Verdict::of(&runs(&[(Kind::Rust, missed)], &[]), &args(&[]));
        assert_eq!(verdict.exit_code(), EXIT_INCORRECT);
        assert!(
            verdict.messages()[0].contains(
                "2 paced update(s) did not reach every subscriber (7 subscriber-versions missed)"
            ),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_failed_run_of_this_proxy_fails_the_run() {
        let verdict = Verdict::of(
            &runs(&[], &[(Kind::Rust, "did not serve a snapshot")]),
            &args(&[]),
        );
        assert_eq!(verdict.exit_code(), EXIT_INCORRECT);
        assert!(
            verdict.messages()[0].contains("the run failed: did not serve a snapshot"),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_peer_found_incorrect_is_reported_without_failing_the_run() {
        let verdict = Verdict::of(
            &runs(
                &[(Kind::Rust, correct()), (Kind::Go, stale())],
                &[(Kind::Model, "exited")],
            ),
            &args(&["--go-label", "Go X"]),
        );
        assert_eq!(verdict.exit_code(), 0);
        assert_eq!(verdict.failures.len(), 2, "{verdict:?}");
        let markdown = verdict.markdown();
        assert!(
            markdown.contains("every subscriber got every paced update")
                && markdown.contains("- Go X, 50 subscribers")
                && markdown.contains("- Go fan-out model (not the Go proxy), 50 subscribers"),
            "{markdown}"
        );
        assert!(
            verdict.messages().iter().all(|m| m.starts_with("note: ")),
            "{verdict:?}"
        );
    }

    #[test]
    fn with_only_go_the_go_proxy_decides() {
        let verdict = Verdict::of(&runs(&[(Kind::Go, stale())], &[]), &args(&["--only-go"]));
        assert_eq!(verdict.exit_code(), EXIT_INCORRECT);
        assert!(
            verdict
                .markdown()
                .starts_with("Correctness (Go flagd-proxy): **FAILED**"),
            "{}",
            verdict.markdown()
        );
    }
}
