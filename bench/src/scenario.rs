//! A scenario (its subscribers, resources, payload, source and TLS) and what one run of it
//! against one proxy found: first snapshots, paced updates and the burst, the process sampled.

use std::collections::BTreeMap;

use crate::kit::latency::Stats;
use crate::options::SourceKind;
use crate::proxy::Kind;
use crate::{churn, storm};

#[derive(Clone, Copy, Debug)]
pub(crate) struct Scenario {
    pub(crate) source: SourceKind,
    pub(crate) subscribers: usize,
    pub(crate) resources: usize,
    pub(crate) payload: usize,
    pub(crate) tls: bool,
}

impl Scenario {
    /// How the progress lines and the verdict name the scenario.
    pub(crate) fn label(&self) -> String {
        self.named(["subscribers", "resource(s)", "B payload", " source"])
    }

    /// The name of the working directory of `kind`'s run.
    pub(crate) fn dir_name(&self, kind: Kind) -> String {
        format!(
            "{}-{}-n{}-m{}-p{}{}",
            kind.key(),
            self.source.label(),
            self.subscribers,
            self.resources,
            self.payload,
            if self.tls { "-tls" } else { "" }
        )
    }

    /// How the table of targets names the scenario.
    pub(crate) fn short_label(&self) -> String {
        self.named(["subs", "res", "B", ""])
    }

    /// The subscribers, resources, payload and source, each followed by its word of `words`
    /// (the source's word stands right after it), and TLS where it is on.
    fn named(&self, [subscribers, resources, payload, source]: [&str; 4]) -> String {
        format!(
            "{} {subscribers}, {} {resources}, {} {payload}, {}{source}{}",
            self.subscribers,
            self.resources,
            self.payload,
            self.source.label(),
            if self.tls { ", TLS" } else { "" }
        )
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct RunResult {
    pub(crate) proxy: String,
    pub(crate) document_bytes: usize,
    pub(crate) subscribers_connected: usize,
    pub(crate) connect_seconds: f64,
    /// CPU time of the proxy and of this load generator while the subscribers connected.
    pub(crate) connect_cpu_seconds: f64,
    pub(crate) connect_load_generator_cpu_seconds: f64,
    pub(crate) first_snapshot: Stats,
    pub(crate) first_snapshot_failures: usize,
    /// Write until every subscriber has the version.
    pub(crate) propagation: Stats,
    /// Write until the first subscriber has the version.
    pub(crate) first_receiver: Stats,
    /// Paced updates that did not reach every subscriber within the timeout.
    pub(crate) updates_incomplete: u64,
    /// Subscriber-versions missing when an update timed out.
    pub(crate) subscriber_versions_missed: u64,
    pub(crate) messages_per_subscriber_per_update: f64,
    pub(crate) duplicate_messages: u64,
    pub(crate) burst_updates: u64,
    /// Final burst write until every subscriber has it (None: never).
    pub(crate) burst_convergence_ms: Option<f64>,
    /// Subscribers not on the final version after the settle wait.
    pub(crate) stale_after_settle: usize,
    pub(crate) rss_empty_mib: f64,
    pub(crate) rss_idle_mib: f64,
    pub(crate) rss_after_updates_mib: f64,
    pub(crate) rss_peak_mib: f64,
    pub(crate) kib_per_idle_subscriber: f64,
    pub(crate) cpu_idle_percent: f64,
    pub(crate) cpu_seconds_per_update: f64,
    pub(crate) cpu_seconds_total: f64,
    /// CPU time of this load generator per paced update (it shares the machine).
    pub(crate) load_generator_cpu_seconds_per_update: f64,
    /// Large messages the load generator decoded in full per paced update (one equal to a
    /// message decoded before is not, unless `--decode-each`; see `messages.rs`).
    pub(crate) decoded_per_update: f64,
    /// Bytes the proxy wrote (`wchar` of /proc/PID/io: sockets, logs) per paced update.
    pub(crate) bytes_written_per_update: f64,
    pub(crate) stream_errors: u64,
    pub(crate) unparsed_messages: u64,
    pub(crate) last_error: Option<String>,
    /// Phases cut short because the proxy kept failing them, and how.
    pub(crate) gave_up: Vec<String>,
    /// Kubernetes: watch requests on FeatureFlags open at the API server while idle.
    pub(crate) apiserver_watches: Option<u64>,
    /// Kubernetes: the proxy's TCP connections to the API server while idle.
    pub(crate) apiserver_connections: Option<usize>,
    /// Kubernetes: time to first snapshot for a resource nobody watched yet.
    pub(crate) cold_first_snapshot: Stats,
    pub(crate) cold_first_snapshot_failures: usize,
    /// (RSS idle − RSS with no subscribers) / resources, when there is more than one.
    pub(crate) kib_per_resource: Option<f64>,
    pub(crate) storm: Option<storm::StormResult>,
    /// Steady reconnects (`--churn`).
    pub(crate) churn: Option<churn::ChurnResult>,
    /// The proxy was killed for going over `--max-rss-mib`.
    pub(crate) killed_for_rss: bool,
}

impl RunResult {
    /// What this proxy promises: every subscriber gets every paced update and ends on the final
    /// version, and no stream breaks. Each way this run broke the promise, in words; none when
    /// it kept it.
    pub(crate) fn problems(&self, subscribers: usize) -> Vec<String> {
        let mut problems = Vec::new();
        if self.subscribers_connected != subscribers {
            problems.push(format!(
                "{} of {subscribers} subscribers connected",
                self.subscribers_connected
            ));
        }
        problems.extend(nonzero(self.failures()));
        if let Some(storm) = &self.storm {
            problems.extend(nonzero(storm_failures(storm)));
        }
        if let Some(churn) = &self.churn {
            problems.extend(churn.problems());
        }
        if self.killed_for_rss {
            problems.push("killed for going over --max-rss-mib".to_owned());
        }
        problems
    }

    /// What went wrong in the phases, each with its count.
    fn failures(&self) -> Vec<(u64, String)> {
        let missed = self.subscriber_versions_missed;
        vec![
            (
                self.updates_incomplete,
                format!(
                    "{} paced update(s) did not reach every subscriber ({missed} subscriber-versions missed)",
                    self.updates_incomplete
                ),
            ),
            (
                self.stale_after_settle as u64,
                format!(
                    "{} subscriber(s) not on the final version after the burst",
                    self.stale_after_settle
                ),
            ),
            (
                self.stream_errors,
                format!("{} stream error(s)", self.stream_errors),
            ),
            (
                self.unparsed_messages,
                format!(
                    "{} message(s) without a version number",
                    self.unparsed_messages
                ),
            ),
            (
                self.first_snapshot_failures as u64,
                format!(
                    "{} new subscriber(s) got no first snapshot",
                    self.first_snapshot_failures
                ),
            ),
            (
                self.cold_first_snapshot_failures as u64,
                format!(
                    "{} new resource(s) got no first snapshot",
                    self.cold_first_snapshot_failures
                ),
            ),
        ]
    }
}

/// What went wrong in the reconnect storm, each with its count.
fn storm_failures(storm: &storm::StormResult) -> Vec<(u64, String)> {
    vec![
        (
            storm.gave_up as u64,
            format!("storm: {} subscriber(s) never served again", storm.gave_up),
        ),
        (
            storm.witness_stream_errors,
            format!(
                "storm: {} connected stream(s) broken",
                storm.witness_stream_errors
            ),
        ),
    ]
}

/// The failures that happened: those counted more than zero times.
fn nonzero(failures: Vec<(u64, String)>) -> impl Iterator<Item = String> {
    failures
        .into_iter()
        .filter(|(count, _)| *count > 0)
        .map(|(_, what)| what)
}

/// One scenario's results, by proxy key, and why a proxy has none.
pub(crate) struct ScenarioRuns {
    pub(crate) scenario: Scenario,
    pub(crate) results: BTreeMap<&'static str, RunResult>,
    pub(crate) skipped: BTreeMap<&'static str, String>,
    /// Why a proxy's run failed, by proxy key.
    pub(crate) failed: BTreeMap<&'static str, String>,
}
