//! `--costs`: the unit costs of this proxy that the capacity model (`capacity.rs`,
//! docs/capacity.md) is built from. Each is derived from a few short runs of the fan-out
//! scenario (`scenario.rs`) against this proxy alone, which differ in one thing: the number of
//! subscribers (CPU per delivery, memory per subscriber), streams per connection (memory per
//! stream and per connection), the document (CPU per byte, gzip), TLS (CPU per handshake), or
//! the number of resources (memory per watch, from files and from a kube-apiserver).
//!
//! Every cost is a difference or a slope between two runs, so what the runs share (the
//! process's base memory, the source's work per version) cancels out.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use crate::args::Args;
use crate::documents::Documents;
use crate::kit::header::Clock;
use crate::load;
use crate::options::SourceKind;
use crate::proxy::Kind;
use crate::run::run_one;
use crate::scenario::{RunResult, Scenario};
use crate::sitting::rust_bin;

mod report;

use report::report;

/// One run of the fan-out scenario the costs are derived from.
#[derive(Clone, Debug)]
struct Probe {
    name: &'static str,
    scenario: Scenario,
    streams_per_connection: usize,
    updates: u64,
    realistic_gzip: Option<bool>,
}

/// The sizes of the probes: the full run, or a few seconds with `--smoke`.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    few: usize,
    many: usize,
    large: usize,
    resources: usize,
    updates: u64,
}

impl Sizes {
    fn of(args: &Args) -> Self {
        if args.smoke {
            Sizes {
                few: 200,
                many: 800,
                large: 100,
                resources: 200,
                updates: 4,
            }
        } else {
            Sizes {
                few: 2_000,
                many: 8_000,
                large: 2_000,
                resources: 1_000,
                updates: 20,
            }
        }
    }
}

/// Streams per connection of the shared-connection probes (as in the two-tier benchmark).
const SHARED: usize = 10;

fn probes(sizes: Sizes, kubernetes: bool) -> Vec<Probe> {
    // A probe of `subscribers` over `resources`, each holding a document of `payload` bytes.
    let probe = |name, (subscribers, resources), payload, streams_per_connection, updates| Probe {
        name,
        scenario: Scenario {
            source: SourceKind::Files,
            subscribers,
            resources,
            payload,
            tls: false,
        },
        streams_per_connection,
        updates,
        realistic_gzip: (payload > 1024).then_some(false),
    };
    let (few, many, large, k) = (sizes.few, sizes.many, sizes.large, sizes.updates);
    let fewer = (k / 4).max(2);
    let mut tls = probe("tls", (few, 1), 1024, 1, fewer);
    tls.scenario.tls = true;
    let mut gzip = probe("large-gzip", (large, 1), 102_400, 1, k / 2);
    gzip.realistic_gzip = Some(true);
    let resources = probe(
        "resources",
        (sizes.resources, sizes.resources),
        1024,
        SHARED,
        fewer,
    );
    let mut probes = vec![
        probe("few", (few, 1), 1024, 1, k),
        probe("many", (many, 1), 1024, 1, k),
        probe("shared", (many, 1), 1024, SHARED, k),
        tls,
        probe("large", (large, 1), 102_400, 1, k / 2),
        gzip,
        probe(
            "large-resources",
            (large / 20, large / 20),
            102_400,
            SHARED,
            fewer,
        ),
        resources.clone(),
    ];
    if kubernetes {
        let mut watches = resources;
        watches.name = "watches";
        watches.scenario.source = SourceKind::Kubernetes;
        probes.push(watches);
    }
    probes
}

/// The arguments of one probe's run: the invocation's, with the probe's shape.
fn probe_args(args: &Args, probe: &Probe) -> Args {
    let mut run = args.clone();
    run.streams_per_connection = probe.streams_per_connection;
    run.updates = probe.updates;
    run.burst = 2;
    run.first_snapshot_samples = 10;
    run.cold_resources = 0;
    run.idle = Duration::from_secs(2);
    run.settle = Duration::from_secs(20);
    run.storm = false;
    if let Some(gzip) = probe.realistic_gzip {
        run.documents = Documents::Realistic;
        run.accept_gzip = true;
        run.proxy_arg.push(
            if gzip {
                "--compression=auto"
            } else {
                "--compression=off"
            }
            .to_owned(),
        );
    }
    run
}

/// The runs of one `--costs` invocation, by probe name.
type Runs = BTreeMap<&'static str, RunResult>;

/// `--costs`: runs the probes, prints the unit costs and writes them (`--json`); the exit
/// status (1 when a probe failed or this proxy was incorrect in one).
pub(crate) async fn main(args: &Args) -> anyhow::Result<u8> {
    let bin = rust_bin(args)?;
    let workdir =
        std::env::temp_dir().join(format!("flagd-proxy-bench-costs-{}", std::process::id()));
    let clock = Clock::start();
    let kubernetes = args.source.contains(&SourceKind::Kubernetes);
    let mut runs = Runs::new();
    let mut problems = Vec::new();
    for probe in probes(Sizes::of(args), kubernetes) {
        let run_args = probe_args(args, &probe);
        let dir = workdir.join(probe.name);
        std::fs::create_dir_all(&dir)?;
        eprintln!("costs: {} ({})", probe.name, probe.scenario.label());
        load::ACCEPT_GZIP.store(run_args.accept_gzip, Ordering::Relaxed);
        let result = run_one(Kind::Rust, &bin, probe.scenario, &run_args, &dir).await;
        load::ACCEPT_GZIP.store(false, Ordering::Relaxed);
        match result {
            Ok(result) => {
                for problem in result.problems(probe.scenario.subscribers) {
                    problems.push(format!("costs: probe {}: {problem}", probe.name));
                }
                runs.insert(probe.name, result);
            }
            Err(error) => problems.push(format!("costs: probe {}: {error:#}", probe.name)),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let costs = UnitCosts::of(&runs, SHARED);
    let header = clock.stop();
    let markdown = report(&costs, &runs, &header);
    let json = || header.stamp(json!({"costs": costs, "runs": runs}));
    crate::verdict::publish(args, &workdir, &markdown, json, &problems)
}

/// What one unit of each thing costs this proxy; `None` where its probe did not run.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct UnitCosts {
    /// RSS of the process serving one 1 KiB resource and no subscriber (MiB).
    pub(crate) base_mib: f64,
    /// RSS per idle subscriber with a connection of its own (KiB).
    pub(crate) kib_per_subscriber: f64,
    /// RSS per extra stream on a shared connection (KiB).
    pub(crate) kib_per_stream: f64,
    /// RSS per connection, without its streams (KiB).
    pub(crate) kib_per_connection: f64,
    /// RSS per idle subscriber with TLS (KiB).
    pub(crate) kib_per_tls_subscriber: Option<f64>,
    /// RSS per watched resource (a manifest file), its subscriber's stream taken out (KiB).
    pub(crate) kib_per_watch_files: f64,
    /// RSS per watched FeatureFlag (a watch on the API server), its stream taken out (KiB).
    pub(crate) kib_per_watch_kubernetes: Option<f64>,
    /// CPU per version of a resource, whatever its subscribers (ms, 1 KiB, files).
    pub(crate) ms_per_version: f64,
    /// CPU per version of a resource on the API server, per resource (ms, 1 KiB).
    pub(crate) ms_per_version_kubernetes: Option<f64>,
    /// CPU per version of the 100 KiB realistic document (ms, files, gzip off).
    pub(crate) ms_per_large_version: Option<f64>,
    /// CPU per delivery of a 1 KiB version, one stream per connection (µs).
    pub(crate) us_per_delivery: f64,
    /// CPU per delivery of a 1 KiB version, `SHARED` streams per connection (µs).
    pub(crate) us_per_delivery_shared: f64,
    /// CPU per byte delivered, uncompressed, beyond a 1 KiB delivery (ns).
    pub(crate) ns_per_byte: f64,
    /// CPU per delivery of the 100 KiB realistic document, uncompressed and gzipped (µs).
    pub(crate) us_per_large_delivery: f64,
    pub(crate) us_per_large_delivery_gzip: f64,
    /// Bytes written per delivery of that document, uncompressed and gzipped.
    pub(crate) large_document_bytes: f64,
    pub(crate) bytes_per_large_delivery: f64,
    pub(crate) bytes_per_large_delivery_gzip: f64,
    /// CPU per TLS handshake, beyond a plaintext connect (ms).
    pub(crate) ms_per_tls_handshake: Option<f64>,
    /// CPU of the load generator per delivery it takes, 1 KiB, `SHARED` streams per
    /// connection (µs).
    pub(crate) us_load_generator_per_delivery: f64,
    /// Streams per connection of the shared probes.
    pub(crate) streams_per_shared_connection: usize,
}

impl UnitCosts {
    /// The costs, from the probes that ran (a missing probe leaves its costs at 0 or `None`).
    fn of(runs: &Runs, shared: usize) -> Self {
        let get = |name: &str| runs.get(name).cloned().unwrap_or_default();
        let (few, many, shared_run, resources) =
            (get("few"), get("many"), get("shared"), get("resources"));
        let n = subscribers;
        let Split {
            slope,
            shared_delivery,
            per_version,
        } = Split::of(&few, &many, &shared_run, &resources);
        let delivery = |r: &RunResult| (r.cpu_seconds_per_update - per_version) / n(r);
        // Memory: a = connection + stream; b = connection / k + stream.
        let (a, b, k) = (
            many.kib_per_idle_subscriber,
            shared_run.kib_per_idle_subscriber,
            shared as f64,
        );
        let stream = (k * b - a) / (k - 1.0);
        let watch = |r: &RunResult| r.kib_per_resource.map(|kib| kib - b);
        let (large, gzip) = (get("large"), get("large-gzip"));
        let bytes = |r: &RunResult| r.bytes_written_per_update / n(r);
        let watches = runs.get("watches");
        UnitCosts {
            base_mib: many.rss_empty_mib,
            kib_per_subscriber: a,
            kib_per_stream: stream,
            kib_per_connection: a - stream,
            kib_per_tls_subscriber: runs.get("tls").map(|r| r.kib_per_idle_subscriber),
            kib_per_watch_files: watch(&resources).unwrap_or_default(),
            kib_per_watch_kubernetes: watches.and_then(watch),
            ms_per_version: per_version * 1e3,
            ms_per_version_kubernetes: watches
                .map(|w| (w.cpu_seconds_per_update / n(w) - shared_delivery) * 1e3),
            ms_per_large_version: runs
                .get("large-resources")
                .map(|r| (r.cpu_seconds_per_update / n(r) - delivery(&large)) * 1e3),
            us_per_delivery: slope * 1e6,
            us_per_delivery_shared: shared_delivery * 1e6,
            ns_per_byte: (delivery(&large) - slope)
                / (large
                    .document_bytes
                    .saturating_sub(few.document_bytes)
                    .max(1) as f64)
                * 1e9,
            us_per_large_delivery: delivery(&large) * 1e6,
            us_per_large_delivery_gzip: delivery(&gzip) * 1e6,
            large_document_bytes: large.document_bytes as f64,
            bytes_per_large_delivery: bytes(&large),
            bytes_per_large_delivery_gzip: bytes(&gzip),
            ms_per_tls_handshake: runs
                .get("tls")
                .map(|tls| (tls.connect_cpu_seconds - few.connect_cpu_seconds) / n(tls) * 1e3),
            us_load_generator_per_delivery: shared_run.load_generator_cpu_seconds_per_update
                / n(&shared_run)
                * 1e6,
            streams_per_shared_connection: shared,
        }
    }
}

/// Subscribers of a probe, at least one.
fn subscribers(r: &RunResult) -> f64 {
    r.subscribers_connected.max(1) as f64
}

/// The CPU per update split into its parts (s): per delivery on own connections (the slope
/// over subscribers), per delivery on a shared connection, and per version.
struct Split {
    slope: f64,
    shared_delivery: f64,
    per_version: f64,
}

impl Split {
    fn of(few: &RunResult, many: &RunResult, shared: &RunResult, resources: &RunResult) -> Self {
        let n = subscribers;
        // Own connections: the slope of CPU per update over subscribers.
        let slope = (many.cpu_seconds_per_update - few.cpu_seconds_per_update)
            / (n(many) - n(few)).max(1.0);
        // Shared connections: one resource with n subscribers costs a version and n
        // deliveries, R resources with one subscriber each R versions and R deliveries.
        let per_resource = resources.cpu_seconds_per_update / n(resources);
        let shared_delivery =
            (shared.cpu_seconds_per_update - per_resource) / (n(shared) - 1.0).max(1.0);
        Split {
            slope,
            shared_delivery,
            per_version: per_resource - shared_delivery,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(subscribers: usize, cpu: f64, kib: f64) -> RunResult {
        RunResult {
            subscribers_connected: subscribers,
            cpu_seconds_per_update: cpu,
            kib_per_idle_subscriber: kib,
            document_bytes: 1000,
            ..RunResult::default()
        }
    }

    #[test]
    fn costs_are_slopes_and_differences_between_probes() {
        let mut runs = Runs::new();
        // 2 ms per version, 10 µs per delivery; 16 KiB per connection, 8 per stream.
        runs.insert("few", run(1_000, 0.002 + 0.010, 24.0));
        runs.insert("many", run(5_000, 0.002 + 0.050, 24.0));
        runs.insert("shared", run(5_000, 0.002 + 0.025, 8.0 + 1.6));
        // 1,000 resources, one subscriber each on shared connections: 2 ms + 5 µs each.
        let mut resources = run(1_000, 1_000.0 * (0.002 + 0.000_005), 0.0);
        resources.kib_per_resource = Some(20.0 + 9.6);
        runs.insert("resources", resources);
        let costs = UnitCosts::of(&runs, 10);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.abs().max(1.0);
        assert!(close(costs.us_per_delivery, 10.0), "{costs:?}");
        assert!(close(costs.ms_per_version, 2.0), "{costs:?}");
        assert!(close(costs.us_per_delivery_shared, 5.0), "{costs:?}");
        assert!(close(costs.kib_per_stream, 8.0), "{costs:?}");
        assert!(close(costs.kib_per_connection, 16.0), "{costs:?}");
        assert!(close(costs.kib_per_watch_files, 20.0), "{costs:?}");
        assert_eq!(costs.kib_per_watch_kubernetes, None);
    }
}
