//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::documents::Documents;
use crate::options::{AuthzMode, SourceKind};

#[derive(Clone, Debug, Parser)]
#[command(
    name = "flagd-proxy-bench",
    about = "Fan-out benchmark: this flagd-proxy against the Go flagd-proxy, over loopback"
)]
pub(crate) struct Args {
    /// Subscriber streams kept open during the measurements.
    #[arg(short = 'n', long, default_value_t = 10_000)]
    pub(crate) subscribers: usize,

    /// Streams opened on each HTTP/2 connection.
    #[arg(long, default_value_t = 1)]
    pub(crate) streams_per_connection: usize,

    /// Resources the subscribers are spread over (comma-separated list: one scenario each).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub(crate) resources: Vec<usize>,

    /// Where the flags come from (comma-separated list: one scenario each). `files`: this proxy
    /// reads FeatureFlag manifests (`--manifests`), the Go proxy `file:` selectors; updates are
    /// file renames. `kubernetes`: both read FeatureFlag resources from a kube-apiserver and
    /// etcd started for the scenario (built by scripts/build-control-plane.sh); updates are
    /// merge patches of the resource.
    #[arg(long, value_delimiter = ',', default_value = "files")]
    pub(crate) source: Vec<SourceKind>,

    /// Approximate size of the flag configuration document in bytes (comma-separated list: one
    /// scenario each).
    #[arg(long, value_delimiter = ',', default_value = "1024,102400")]
    pub(crate) payload_bytes: Vec<usize>,

    /// Paced updates: each is written once the previous one reached every subscriber.
    #[arg(short = 'k', long, default_value_t = 50)]
    pub(crate) updates: u64,

    /// Pause after an update has reached every subscriber, before the next is written.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub(crate) update_gap: Duration,

    /// What the documents hold: `filler` (one flag repeated) or `realistic` (generated flags
    /// with targeting rules, which gzip shrinks as much as real ones).
    #[arg(long, value_enum, default_value = "filler")]
    pub(crate) documents: Documents,

    /// The subscribers list gzip in grpc-accept-encoding (as grpc-java, grpc-js and gRPC
    /// C-core clients do) and decompress what comes gzipped.
    #[arg(long)]
    pub(crate) accept_gzip: bool,

    /// Every message is decompressed and decoded on its own, all of them on this machine's
    /// cores beside the proxy. Without it, a message of 16 KiB or more whose bytes equal
    /// (compared in full) those of a recent message carries that message's version without
    /// being decoded again, as if each subscriber decoded its copy on a CPU of its own.
    #[arg(long)]
    pub(crate) decode_each: bool,

    /// An argument for this proxy (repeatable), such as `--proxy-arg=--compression=off`.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    pub(crate) proxy_arg: Vec<String>,

    /// How long one paced update may take to reach every subscriber before it is given up.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub(crate) update_timeout: Duration,

    /// Updates written back to back at the end, to see who ends on the final version.
    #[arg(long, default_value_t = 10)]
    pub(crate) burst: u64,

    /// Pause between two burst updates.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    pub(crate) burst_gap: Duration,

    /// How long to wait after the burst before counting subscribers not on the final version.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub(crate) settle: Duration,

    /// New subscribers timed (connect until first snapshot) while the others are connected.
    #[arg(long, default_value_t = 200)]
    pub(crate) first_snapshot_samples: usize,

    /// Idle window for the idle CPU and memory figures.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) idle: Duration,

    /// Connections opened at once while subscribers connect.
    #[arg(long, default_value_t = 64)]
    pub(crate) connect_concurrency: usize,

    /// Spread client connections over source addresses 127.0.0.1..=127.0.0.K (each has its own
    /// ephemeral ports).
    #[arg(long, default_value_t = 1)]
    pub(crate) source_addrs: u8,

    /// How long all subscribers may take to connect and get their first snapshot.
    #[arg(long, default_value = "180s", value_parser = humantime::parse_duration)]
    pub(crate) connect_timeout: Duration,

    /// Worker threads of the load generator's runtime.
    #[arg(long, default_value_t = 2)]
    pub(crate) threads: usize,

    /// This project's proxy binary (default: `flagd-proxy` next to this program).
    #[arg(long, value_name = "PATH")]
    pub(crate) proxy_bin: Option<PathBuf>,

    /// The Go flagd-proxy binary (default: `flagd-proxy-go` in the cache that
    /// scripts/install-go-proxy.sh fills, when present).
    #[arg(long, value_name = "PATH")]
    pub(crate) go_proxy_bin: Option<PathBuf>,

    /// How the report names the Go binary's column.
    #[arg(long, default_value = "Go flagd-proxy")]
    pub(crate) go_label: String,

    /// bench/go-fanout-model, built: run it too, as an extra column labelled as a model (it is
    /// not the Go flagd-proxy).
    #[arg(long, value_name = "PATH")]
    pub(crate) go_model_bin: Option<PathBuf>,

    /// Do not run the floor (the minimal writing server of floor.rs) beside the fan-out
    /// scenarios with one connection per subscriber and one resource.
    #[arg(long)]
    pub(crate) no_floor: bool,

    /// Serve the sync port over TLS (this project's proxy only: the Go flagd-proxy has no TLS;
    /// the floor writes plain HTTP/2).
    #[arg(long)]
    pub(crate) tls: bool,

    /// After the burst, drop every subscriber at once and reconnect them all within
    /// `--storm-spread`: time until every one has its snapshot again, RSS, CPU, and whether
    /// /readyz and the streams that stayed connected kept answering.
    #[arg(long)]
    pub(crate) storm: bool,

    /// Over how long the reconnects of the storm are spread (uniformly).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub(crate) storm_spread: Duration,

    /// How long every subscriber may take to be served again after a storm.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub(crate) storm_timeout: Duration,

    /// Steady reconnects after the burst (see docs/benchmarks.md, "Churn"): two windows of
    /// `--churn-seconds` with an update every `--churn-update-every`, the first without
    /// reconnects, the second with the subscribers' streams reaching their deadline one by one in
    /// a random order, at `--churn-per-second` (N / 600 by default: a 600 s stream deadline),
    /// each reopened on its connection. Fan-out and `--tiers` only; not on the floor.
    #[arg(long)]
    pub(crate) churn: bool,

    /// Churn: streams reopened a second (implies `--churn`). A subscriber reopens at most once
    /// per window: beyond N / `--churn-seconds` a second, the window's reopens stop at N.
    #[arg(long, value_name = "RATE")]
    pub(crate) churn_per_second: Option<f64>,

    /// Churn: how long each of the two windows lasts.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) churn_seconds: Duration,

    /// Churn: an update is written this often in both windows.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) churn_update_every: Duration,

    /// Kubernetes: FeatureFlag resources created but watched by nobody, each asked for once
    /// while the subscribers are connected (time to first snapshot of a new resource).
    #[arg(long, default_value_t = 50)]
    pub(crate) cold_resources: usize,

    /// A proxy whose RSS goes over this many MiB is killed (SIGKILL) and the run reported as
    /// failed, to protect the machine.
    #[arg(long, default_value_t = 6144)]
    pub(crate) max_rss_mib: u64,

    /// Run only this project's proxy.
    #[arg(long)]
    pub(crate) no_go: bool,

    /// Run only the Go flagd-proxy.
    #[arg(long, conflicts_with = "no_go")]
    pub(crate) only_go: bool,

    /// Write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,

    /// Also write the Markdown report to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) markdown: Option<PathBuf>,

    /// Keep the working directory (manifests, proxy logs) instead of deleting it.
    #[arg(long)]
    pub(crate) keep_workdir: bool,

    /// Soak instead of the fan-out scenarios (see docs/benchmarks.md, "Soak"): this proxy on
    /// manifest files, steady subscribers on `--soak-resources` resources, then hours of churn
    /// compressed (updates, short-lived connections, resources that appear and disappear) while
    /// RSS, open files, threads, streams, connections and watches are sampled; they must return
    /// to their baseline and every steady subscriber must end on the final version.
    #[arg(long)]
    pub(crate) soak: bool,

    /// Soak: manifest rewrites of the steady resources, written round-robin.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) soak_updates: u64,

    /// Soak: rewrites per second; the churn lasts `--soak-updates` / this, and the connects and
    /// the resource lifecycles are spread over the same time.
    #[arg(long, default_value_t = 2_000)]
    pub(crate) soak_update_rate: u64,

    /// Soak: short-lived connections, each opening a stream, taking the first version and
    /// closing: half at once, half after holding the stream for up to 250 ms; half of each
    /// abruptly (the socket cut under the open stream, no HTTP/2 goodbye, a TCP reset).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) soak_connects: u64,

    /// Soak: resource lifecycles. Three in four: a subscriber asks for a resource that does not
    /// exist, the file is created, a second subscriber comes, the file is rewritten and deleted
    /// (every other time created and deleted again), and both leave. One in four: a subscriber
    /// asks for a resource that never appears and leaves.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) soak_lifecycles: u64,

    /// Soak: steady resources (one manifest file each).
    #[arg(long, default_value_t = 200)]
    pub(crate) soak_resources: usize,

    /// Soak: steady subscriber streams, connected before the churn and kept to the end.
    #[arg(long, default_value_t = 400)]
    pub(crate) soak_subscribers: usize,

    /// Soak: HTTP/2 connections the steady subscribers share.
    #[arg(long, default_value_t = 8)]
    pub(crate) soak_connections: usize,

    /// Soak: short-lived connections in flight at once (and 8 resource lifecycles).
    #[arg(long, default_value_t = 16)]
    pub(crate) soak_concurrency: usize,

    /// Soak: the proxy's `--idle-timeout` (how long a watch outlives its last subscriber). Short,
    /// so that the watches of the resources that come and go stop and start again many times.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub(crate) soak_idle_timeout: Duration,

    /// Soak: how often the proxy is sampled.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub(crate) soak_sample_every: Duration,

    /// Soak: how long one expected event (a first version, an update reaching a subscriber) may
    /// take, and how long the cool-down waits for the subscribers and the counts to settle.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) soak_timeout: Duration,

    /// Soak: once the counts have settled, wait this long before sampling the end (idle blocking
    /// threads of the proxy's runtime exit after 10 s).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub(crate) soak_quiet: Duration,

    /// Soak: the approximate size of each flag document.
    #[arg(long, default_value_t = 1024)]
    pub(crate) soak_payload_bytes: usize,

    /// The two tiers as a system instead of the fan-out scenarios (see docs/benchmarks.md, "Two
    /// tiers"): one central proxy feeding `--tier-nodes` node proxies over `--upstream`, the
    /// `--subscribers` spread evenly over the node proxies and over the first of `--resources`;
    /// then the faults (the central killed and started again, one node proxy killed, a rollout of
    /// the central). Beside it: the same subscribers flat on one proxy (this one and the Go
    /// flagd-proxy), one node proxy's share flat, and one node proxy chained alone.
    #[arg(long, conflicts_with = "soak")]
    pub(crate) tiers: bool,

    /// Measure the unit costs the capacity model is built from (docs/capacity.md): short runs
    /// of this proxy alone on manifest files that differ in one thing (subscribers, streams per
    /// connection, document, gzip, TLS, resources); with `--source kubernetes` among the
    /// sources, also the memory and CPU of watches on a kube-apiserver. Prints the costs; writes
    /// them with `--json` for `--capacity`.
    #[arg(long, conflicts_with_all = ["soak", "tiers"])]
    pub(crate) costs: bool,

    /// Print the capacity model's tables (docs/capacity.md) from the unit costs in FILE (the
    /// JSON of `--costs --json FILE`), and its check against the measured two-tier run.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["soak", "tiers", "costs"])]
    pub(crate) capacity: Option<PathBuf>,

    /// Tiers: node proxies.
    #[arg(long, default_value_t = 50)]
    pub(crate) tier_nodes: usize,

    /// Tiers: only the two tiers and their faults, no flat runs beside them.
    #[arg(long)]
    pub(crate) no_flat: bool,

    /// Tiers: how long the central stays down when it is killed, before it is started again.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) tier_outage: Duration,

    /// Authorization in a reconnect storm instead of the fan-out scenarios (see
    /// docs/benchmarks.md, "Authorization in a reconnect storm"): on the test control plane,
    /// `--subscribers` clients of `--authz-identities` identities connect to this proxy, then
    /// all drop and reconnect within `--storm-spread`, once per mode of `--authz-modes` (a fresh
    /// proxy each); the API requests the API server counted in each phase, against the target
    /// of 2 per identity plus 10.
    #[arg(long, conflicts_with_all = ["soak", "tiers"])]
    pub(crate) authz_storm: bool,

    /// Authz storm: client identities, each a ServiceAccount with a token and a running pod
    /// whose address is 127.0.0.(10 + i); they live in up to 4 namespaces with a FeatureFlag
    /// each, and read their own namespace's.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u8).range(1..=240))]
    pub(crate) authz_identities: u8,

    /// Authz storm: the authorization modes (comma-separated list: a fresh proxy each).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "none,namespace-token,rbac-token,namespace-pod-ip,rbac-pod-ip"
    )]
    pub(crate) authz_modes: Vec<AuthzMode>,

    /// The hostile attacks of docs/security.md ("The attacks, one by one") instead of the
    /// fan-out scenarios (see docs/benchmarks.md, "Attacks"): each against a fresh proxy on
    /// manifest files, with its flags at their defaults unless the attack names one; for each,
    /// the proxy's RSS before, its peak during the attack, its RSS after `--attacks-quiet`, and
    /// what the attack achieved. With `--baseline-bin`, the same attacks run against that build
    /// too, for a before/after table.
    #[arg(long, conflicts_with_all = ["soak", "tiers"])]
    pub(crate) attacks: bool,

    /// Attacks: an earlier build of this proxy, attacked the same way beside `--proxy-bin`
    /// (only flags both builds accept are passed; `--proxy-arg` goes to `--proxy-bin` only, in
    /// the attacks on a running proxy).
    #[arg(long, value_name = "PATH")]
    pub(crate) baseline_bin: Option<PathBuf>,

    /// Attacks: how long the proxy is left alone once the attacker has gone before its RSS
    /// "after" is read (its allocator gives memory back after a decay time of 10 s).
    #[arg(long, default_value = "12s", value_parser = humantime::parse_duration)]
    pub(crate) attacks_quiet: Duration,

    /// Attacks: only these rows (comma-separated numbers, 1 to 14).
    #[arg(long, value_delimiter = ',')]
    pub(crate) attacks_rows: Vec<u8>,

    /// Attacks: run each attack in a memory cgroup of its own at each of these tiers' chart
    /// limits (comma-separated: node, 64 MiB; central, 544 MiB), the proxy started inside it
    /// with the tier's `--memory-budget` (36Mi, 396Mi) unless the attack sets one; then honest
    /// subscribers, plaintext and TLS, until the budget refuses. Reports per tier the cgroup's
    /// peak, its OOM kills, the budget's refusals, and whether a subscriber and a new client
    /// were served after each attack. Needs root and cgroup v1 or v2 with the memory controller.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        conflicts_with = "baseline_bin"
    )]
    pub(crate) attacks_tiers: Vec<crate::options::Tier>,

    /// Attacks in tiers: without the honest subscribers.
    #[arg(long, requires = "attacks_tiers")]
    pub(crate) attacks_no_honest: bool,

    /// A quick correctness run: 50 subscribers, 3 paced updates, a 3-update burst, 1 KiB, this
    /// project's proxy only (unless --go-proxy-bin is given). Exits non-zero if a subscriber
    /// missed an update, ended stale or lost its stream. With `--soak`: a soak of a few seconds
    /// (2,000 updates, 200 connects, 24 lifecycles, 40 steady subscribers on 8 resources). With
    /// `--tiers`: 2 node proxies × 10 subscribers over 2 resources, with the faults. With
    /// `--costs`: every probe at a few hundred subscribers. With `--authz-storm`: 2 identities ×
    /// 20 clients. With `--attacks`: every attack at a tiny size, 1 s of quiet. With `--churn`:
    /// two windows of 2 s, every subscriber's stream reopened once.
    #[arg(long)]
    pub(crate) smoke: bool,
}

impl Args {
    pub(crate) fn apply_smoke(&mut self) {
        if !self.smoke {
            return;
        }
        if self.soak {
            self.soak_updates = 2_000;
            self.soak_update_rate = 1_000;
            self.soak_connects = 200;
            self.soak_lifecycles = 24;
            self.soak_resources = 8;
            self.soak_subscribers = 40;
            self.soak_connections = 4;
            self.soak_idle_timeout = Duration::from_secs(1);
            self.soak_sample_every = Duration::from_millis(500);
            self.soak_timeout = Duration::from_secs(10);
            self.soak_quiet = Duration::from_secs(1);
        }
        if self.attacks {
            self.attacks_quiet = Duration::from_secs(1);
        }
        self.subscribers = 50;
        self.updates = 3;
        self.burst = 3;
        self.resources = vec![1];
        self.payload_bytes = vec![1024];
        self.first_snapshot_samples = 10;
        self.idle = Duration::from_millis(300);
        self.settle = Duration::from_secs(5);
        self.update_gap = Duration::from_millis(60);
        self.connect_timeout = Duration::from_secs(60);
        self.cold_resources = self.cold_resources.min(5);
        self.storm_timeout = Duration::from_secs(30);
        if self.churn || self.churn_per_second.is_some() {
            // Every subscriber's stream reaches its deadline once in the window.
            self.churn_seconds = Duration::from_secs(2);
            self.churn_update_every = Duration::from_millis(500);
            self.churn_per_second = self.churn_per_second.or(Some(30.0));
        }
        if self.go_proxy_bin.is_none() {
            self.no_go = true;
        }
        if self.authz_storm {
            self.subscribers = 40;
            self.authz_identities = 2;
        }
        if self.tiers {
            self.subscribers = 20;
            self.tier_nodes = 2;
            self.resources = vec![2];
            self.settle = Duration::from_secs(10);
            self.tier_outage = Duration::from_millis(500);
        }
    }
}
