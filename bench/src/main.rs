//! `flagd-proxy-bench`: fan-out benchmark for flagd sync proxies.
//!
//! Starts a proxy (this project's, the Go flagd-proxy when its binary is available, and the
//! floor: a minimal server that only writes, see `floor.rs`), opens many `flagd.sync.v1`
//! `SyncFlags` streams against it, rewrites the flag source files and measures how long each
//! version takes to reach every subscriber, whether every subscriber ends on the final version,
//! how long a new subscriber waits for its first snapshot, what the proxy process costs in memory
//! and CPU time, and, with `--storm`, how it takes every subscriber reconnecting at once (see
//! `storm.rs`). Prints a Markdown table and can write JSON.
//!
//! The load generator shares the machine with the proxy, so it is kept cheap: one tokio runtime,
//! one task per stream, and responses are not decoded: the sequence number every version carries
//! is found by searching the raw message bytes.
use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Buf, BufMut};
use clap::Parser;
use futures::StreamExt;
use serde_json::{Value, json};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Request, Status};

use flagd_proxy::wire::proto::client::flagd_sync_v1::SyncFlagsRequest;

mod floor;
mod storm;

// The same control plane the integration tests use: etcd and kube-apiserver on loopback.
use flagd_proxy_testkit::control_plane::{self, ControlPlane, free_port};

const SYNC_PATH: &str = "/flagd.sync.v1.FlagSyncService/SyncFlags";
/// Every version carries its sequence number as `"benchSeq":<n>` in a flag's metadata.
const SEQ_MARKER: &[u8] = b"\"benchSeq\":";
/// The flag carrying the sequence number; its key sorts first so the marker is found early.
const SEQ_FLAG: &str = "aaa-bench-seq";
/// A message whose sequence number could not be found.
const NO_SEQ: u64 = u64::MAX;
/// A phase (first-snapshot samples, paced updates) stops after this many failures in a row, so a
/// proxy that has stopped serving does not hold the run for every timeout.
const GIVE_UP_AFTER: u64 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "flagd-proxy-bench",
    about = "Fan-out benchmark: this flagd-proxy against the Go flagd-proxy, over loopback"
)]
struct Args {
    /// Subscriber streams kept open during the measurements.
    #[arg(short = 'n', long, default_value_t = 10_000)]
    subscribers: usize,

    /// Streams opened on each HTTP/2 connection.
    #[arg(long, default_value_t = 1)]
    streams_per_connection: usize,

    /// Resources the subscribers are spread over (comma-separated list: one scenario each).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    resources: Vec<usize>,

    /// Where the flags come from (comma-separated list: one scenario each). `files`: this proxy
    /// reads FeatureFlag manifests (`--manifests`), the Go proxy `file:` selectors; updates are
    /// file renames. `kubernetes`: both read FeatureFlag resources from a kube-apiserver and
    /// etcd started for the scenario (built by scripts/build-control-plane.sh); updates are
    /// merge patches of the resource.
    #[arg(long, value_delimiter = ',', default_value = "files")]
    source: Vec<SourceKind>,

    /// Approximate size of the flag configuration document in bytes (comma-separated list: one
    /// scenario each).
    #[arg(long, value_delimiter = ',', default_value = "1024,102400")]
    payload_bytes: Vec<usize>,

    /// Paced updates: each is written once the previous one reached every subscriber.
    #[arg(short = 'k', long, default_value_t = 50)]
    updates: u64,

    /// Pause after an update has reached every subscriber, before the next is written.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    update_gap: Duration,

    /// How long one paced update may take to reach every subscriber before it is given up.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    update_timeout: Duration,

    /// Updates written back to back at the end, to see who ends on the final version.
    #[arg(long, default_value_t = 10)]
    burst: u64,

    /// Pause between two burst updates.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    burst_gap: Duration,

    /// How long to wait after the burst before counting subscribers not on the final version.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    settle: Duration,

    /// New subscribers timed (connect until first snapshot) while the others are connected.
    #[arg(long, default_value_t = 200)]
    first_snapshot_samples: usize,

    /// Idle window for the idle CPU and memory figures.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    idle: Duration,

    /// Connections opened at once while subscribers connect.
    #[arg(long, default_value_t = 64)]
    connect_concurrency: usize,

    /// Spread client connections over source addresses 127.0.0.1..=127.0.0.K (each has its own
    /// ephemeral ports).
    #[arg(long, default_value_t = 1)]
    source_addrs: u8,

    /// How long all subscribers may take to connect and get their first snapshot.
    #[arg(long, default_value = "180s", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,

    /// Worker threads of the load generator's runtime.
    #[arg(long, default_value_t = 2)]
    threads: usize,

    /// This project's proxy binary (default: `flagd-proxy` next to this program).
    #[arg(long, value_name = "PATH")]
    proxy_bin: Option<PathBuf>,

    /// The Go flagd-proxy binary (default: `flagd-proxy-go` in the cache that
    /// scripts/install-go-proxy.sh fills, when present).
    #[arg(long, value_name = "PATH")]
    go_proxy_bin: Option<PathBuf>,

    /// How the report names the Go binary's column.
    #[arg(long, default_value = "Go flagd-proxy")]
    go_label: String,

    /// bench/go-fanout-model, built: run it too, as an extra column labelled as a model (it is
    /// not the Go flagd-proxy).
    #[arg(long, value_name = "PATH")]
    go_model_bin: Option<PathBuf>,

    /// Do not run the floor (the minimal writing server of floor.rs) beside the fan-out
    /// scenarios with one connection per subscriber and one resource.
    #[arg(long)]
    no_floor: bool,

    /// Serve the sync port over TLS (this project's proxy only: the Go flagd-proxy has no TLS;
    /// the floor writes plain HTTP/2).
    #[arg(long)]
    tls: bool,

    /// After the burst, drop every subscriber at once and reconnect them all within
    /// `--storm-spread`: time until every one has its snapshot again, RSS, CPU, and whether
    /// /readyz and the streams that stayed connected kept answering.
    #[arg(long)]
    storm: bool,

    /// Over how long the reconnects of the storm are spread (uniformly).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    storm_spread: Duration,

    /// How long every subscriber may take to be served again after a storm.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    storm_timeout: Duration,

    /// Kubernetes: FeatureFlag resources created but watched by nobody, each asked for once
    /// while the subscribers are connected (time to first snapshot of a new resource).
    #[arg(long, default_value_t = 50)]
    cold_resources: usize,

    /// A proxy whose RSS goes over this many MiB is killed (SIGKILL) and the run reported as
    /// failed, to protect the machine.
    #[arg(long, default_value_t = 6144)]
    max_rss_mib: u64,

    /// Run only this project's proxy.
    #[arg(long)]
    no_go: bool,

    /// Run only the Go flagd-proxy.
    #[arg(long, conflicts_with = "no_go")]
    only_go: bool,

    /// Write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,

    /// Also write the Markdown report to this file.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,

    /// Keep the working directory (manifests, proxy logs) instead of deleting it.
    #[arg(long)]
    keep_workdir: bool,

    /// A quick correctness run: 50 subscribers, 3 paced updates, a 3-update burst, 1 KiB, this
    /// project's proxy only (unless --go-proxy-bin is given). Exits non-zero if a subscriber
    /// missed an update, ended stale or lost its stream.
    #[arg(long)]
    smoke: bool,
}

impl Args {
    fn apply_smoke(&mut self) {
        if !self.smoke {
            return;
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
        if self.go_proxy_bin.is_none() {
            self.no_go = true;
        }
    }
}

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(floor::FLOOR_COMMAND) {
        let number = |i: usize| -> anyhow::Result<usize> {
            Ok(argv
                .get(i)
                .context("floor server: missing argument")?
                .parse()?)
        };
        floor::serve(u16::try_from(number(2)?)?, number(3)?)?;
        return Ok(());
    }
    let mut args = Args::parse();
    args.apply_smoke();
    if args.subscribers == 0 || args.streams_per_connection == 0 || args.source_addrs == 0 {
        bail!("--subscribers, --streams-per-connection and --source-addrs must be positive");
    }
    if args.resources.contains(&0) {
        bail!("--resources must be positive");
    }
    raise_fd_limit(args.subscribers + args.first_snapshot_samples + 1024)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    let ok = runtime.block_on(run(args))?;
    // Subscriber tasks may still be parked; do not wait for them.
    runtime.shutdown_background();
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Proxies under test

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum SourceKind {
    Files,
    Kubernetes,
}

impl SourceKind {
    fn label(self) -> &'static str {
        match self {
            SourceKind::Files => "files",
            SourceKind::Kubernetes => "kubernetes",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Rust,
    /// The Go flagd-proxy.
    Go,
    /// bench/go-fanout-model: a model of the Go proxy's fan-out, not the proxy.
    Model,
    /// The minimal writing server of floor.rs.
    Floor,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Rust => "flagd-proxy (Rust)",
            Kind::Go => "Go flagd-proxy",
            Kind::Model => "Go fan-out model (not the Go proxy)",
            Kind::Floor => "floor",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Kind::Rust => "rust",
            Kind::Go => "go",
            Kind::Model => "model",
            Kind::Floor => "floor",
        }
    }

    /// Reads the Go proxy's sources (`file:` selectors, `KUBECONFIG`).
    fn go_like(self) -> bool {
        matches!(self, Kind::Go | Kind::Model)
    }
}

/// A running proxy process, killed on drop.
struct ProxyProcess {
    child: Option<Child>,
    pid: u32,
    port: u16,
    management_port: u16,
    log: PathBuf,
    /// The floor server's standard input: the sequence numbers of new versions.
    control: Option<std::process::ChildStdin>,
}

impl ProxyProcess {
    /// Starts `bin` on free loopback ports, reading the manifests in `dir` (this proxy) or the
    /// `file:` selectors' files, or, with `cluster`, FeatureFlag resources on that API server
    /// (this proxy through its `--kube-*` flags, the Go proxy through `KUBECONFIG`).
    fn start(
        kind: Kind,
        bin: &Path,
        dir: &Path,
        cluster: Option<&ControlPlane>,
        tls: Option<&BenchTls>,
        payload: usize,
        watches: usize,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let management_port = free_port()?;
        let log = dir.join("proxy.log");
        let out = std::fs::File::create(&log)?;
        let mut command = Command::new(bin);
        if kind == Kind::Floor {
            command.args(floor::args(port, payload));
        } else {
            command
                .arg("start")
                .args(["--port", &port.to_string()])
                .args(["--management-port", &management_port.to_string()]);
        }
        match (kind, cluster) {
            (Kind::Rust, source) => {
                command.args(["--bind-address", "127.0.0.1"]);
                match source {
                    Some(cluster) => command.args(cluster.proxy_args(&[])),
                    None => command.arg("--manifests").arg(dir.join("manifests")),
                };
                // Every subscriber connects from 127.0.0.1; lift the per-address cap (a
                // production proxy sees one address per pod).
                command.args(["--max-connections-per-address", "0"]);
                // Room for every resource of the scenario, the new ones included.
                command.args(["--max-watches", &watches.max(10_000).to_string()]);
                if let Some(tls) = tls {
                    command
                        .arg("--server-cert-path")
                        .arg(&tls.cert)
                        .arg("--server-key-path")
                        .arg(&tls.key);
                }
            }
            (Kind::Go | Kind::Model, Some(cluster)) => {
                command.env("KUBECONFIG", cluster.proxy_kubeconfig());
            }
            (Kind::Go | Kind::Model | Kind::Floor, _) => {}
        }
        command
            .stdin(if kind == Kind::Floor {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(out.try_clone()?)
            .stderr(out);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            pid: child.id(),
            control: child.stdin.take(),
            child: Some(child),
            port,
            management_port,
            log,
        })
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for ProxyProcess {
    /// Asks the proxy to stop (SIGTERM, so profilers and the like can write their output) and
    /// kills it if it has not exited within ten seconds.
    fn drop(&mut self) {
        // The floor server ends when its input closes.
        drop(self.control.take());
        let Some(mut child) = self.child.take() else {
            return;
        };
        let asked = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if asked {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// CPU time and memory of a process, from /proc.
#[derive(Clone, Copy, Debug, Default)]
struct ProcSample {
    cpu_seconds: f64,
    rss_kib: u64,
    hwm_kib: u64,
}

fn proc_sample(pid: u32) -> ProcSample {
    let mut sample = ProcSample::default();
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks: u64 = fields
                .get(11..13)
                .map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum())
                .unwrap_or(0);
            sample.cpu_seconds = ticks as f64 / clock_ticks();
        }
    }
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        for line in status.lines() {
            let value = |l: &str| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("VmRSS:") {
                sample.rss_kib = value(line);
            } else if line.starts_with("VmHWM:") {
                sample.hwm_kib = value(line);
            }
        }
    }
    sample
}

fn clock_ticks() -> f64 {
    let ticks = rustix::param::clock_ticks_per_second();
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Raises the open-file limit (inherited by the proxies started later) to at least `want`.
fn raise_fd_limit(want: usize) -> anyhow::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let want = want as u64;
    // `None` is RLIM_INFINITY.
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    let max = limit.maximum.unwrap_or(u64::MAX);
    if current >= want {
        return Ok(());
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let raised = Rlimit {
        current: Some(want.min(nr_open)),
        maximum: Some(max.max(want.min(nr_open))),
    };
    if setrlimit(Resource::Nofile, raised).is_ok() {
        return Ok(());
    }
    // Not allowed to raise the hard limit: take what there is.
    let capped = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    let _ = setrlimit(Resource::Nofile, capped);
    if max < want {
        eprintln!("warning: open-file limit is {max} (hard), below the {want} this run needs");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Flag documents

/// The flags of version `seq`, padded with filler flags to about `payload` bytes.
fn flags(seq: u64, payload: usize) -> serde_json::Map<String, Value> {
    let mut flags = serde_json::Map::new();
    flags.insert(
        SEQ_FLAG.to_owned(),
        json!({
            "state": "ENABLED",
            "variants": {"on": true, "off": false},
            "defaultVariant": "on",
            "metadata": {"benchSeq": seq}
        }),
    );
    let base = json!({"flags": flags}).to_string().len();
    let filler = |i: usize| {
        json!({
            "state": "ENABLED",
            "variants": {
                "blue": format!("blue-{i:05}-0123456789abcdef0123456789abcdef"),
                "green": format!("green-{i:05}-0123456789abcdef0123456789abcdef")
            },
            "defaultVariant": "blue",
            "targeting": {"if": [{"ends_with": [{"var": "email"}, "@example.com"]}, "green", null]}
        })
    };
    let one = format!("\"flag-00000\":{},", filler(0)).len();
    let count = payload.saturating_sub(base) / one;
    for i in 0..count {
        flags.insert(format!("flag-{i:05}"), filler(i));
    }
    flags
}

/// Where one proxy's flags live and how subscribers name them.
struct Sources {
    kind: Kind,
    selectors: Vec<Arc<str>>,
    payload: usize,
    backend: Backend,
}

enum Backend {
    Files {
        /// Files the proxy reads, one per resource.
        files: Vec<PathBuf>,
        /// A directory on the same file system for writing the next version before renaming
        /// it.
        staging: PathBuf,
    },
    Kubernetes {
        api: Box<kube::Api<kube::api::DynamicObject>>,
        names: Vec<String>,
    },
    /// The floor server's standard input, once it runs.
    Floor(std::sync::Mutex<Option<std::process::ChildStdin>>),
}

/// The namespace of the benchmark's FeatureFlag resources and manifests.
const NAMESPACE: &str = "bench";

impl Sources {
    fn new(
        kind: Kind,
        dir: &Path,
        resources: usize,
        payload: usize,
        cluster: Option<&ControlPlane>,
    ) -> anyhow::Result<Self> {
        let resource_selector =
            |i: usize| Arc::from(format!("core.openfeature.dev/{NAMESPACE}/r{i}"));
        let (backend, selectors) = match (kind, cluster) {
            (Kind::Floor, _) => (
                Backend::Floor(std::sync::Mutex::new(None)),
                vec![Arc::from("floor")],
            ),
            (_, Some(cluster)) => (
                Backend::Kubernetes {
                    api: Box::new(kube::Api::namespaced_with(
                        cluster.admin_client(),
                        NAMESPACE,
                        &control_plane::feature_flag_resource(),
                    )),
                    names: (0..resources).map(|i| format!("r{i}")).collect(),
                },
                (0..resources).map(resource_selector).collect(),
            ),
            (Kind::Rust, None) => {
                let manifests = dir.join("manifests");
                std::fs::create_dir_all(&manifests)?;
                let files = (0..resources)
                    .map(|i| manifests.join(format!("bench-r{i}.yaml")))
                    .collect();
                (
                    Backend::Files {
                        files,
                        staging: staging_dir(dir)?,
                    },
                    (0..resources).map(resource_selector).collect(),
                )
            }
            (Kind::Go | Kind::Model, None) => {
                let flags = dir.join("flags");
                std::fs::create_dir_all(&flags)?;
                let (files, selectors) = (0..resources)
                    .map(|i| {
                        let file = flags.join(format!("r{i}.json"));
                        let selector = Arc::from(format!("file:{}", file.display()));
                        (file, selector)
                    })
                    .unzip();
                (
                    Backend::Files {
                        files,
                        staging: staging_dir(dir)?,
                    },
                    selectors,
                )
            }
        };
        Ok(Self {
            kind,
            selectors,
            payload,
            backend,
        })
    }

    /// A FeatureFlag object, as the operator's CRD defines it.
    fn feature_flag(&self, resource: usize, seq: u64) -> Value {
        json!({
            "apiVersion": "core.openfeature.dev/v1beta1",
            "kind": "FeatureFlag",
            "metadata": {"name": format!("r{resource}"), "namespace": NAMESPACE},
            "spec": {"flagSpec": {"flags": flags(seq, self.payload)}}
        })
    }

    fn file_content(&self, resource: usize, seq: u64) -> anyhow::Result<String> {
        Ok(if self.kind.go_like() {
            // The flagd flag configuration the Go proxy's file sync reads.
            document(seq, self.payload)
        } else {
            serde_norway::to_string(&self.feature_flag(resource, seq))?
        })
    }

    /// Makes version `seq` of every resource visible to the proxy, calling `visible` (to take
    /// the time) just before: files are written beside the proxy's files, then `visible`, then
    /// renamed into place; resources are created (version 0) or, after `visible`, merge-patched
    /// (only the sequence number changes; the API server sends the whole object).
    async fn write(&self, seq: u64, visible: impl FnOnce()) -> anyhow::Result<()> {
        match &self.backend {
            Backend::Floor(control) => {
                if seq > 0 {
                    use std::io::Write as _;
                    let mut control = control.lock().unwrap_or_else(|p| p.into_inner());
                    let control = control
                        .as_mut()
                        .context("the floor server is not running")?;
                    visible();
                    writeln!(control, "{seq}")?;
                    control.flush()?;
                }
            }
            Backend::Files { files, staging } => {
                let mut staged = Vec::with_capacity(files.len());
                for (i, file) in files.iter().enumerate() {
                    let tmp = staging.join(format!("r{i}.tmp"));
                    std::fs::write(&tmp, self.file_content(i, seq)?)?;
                    staged.push((tmp, file));
                }
                visible();
                for (tmp, file) in staged {
                    std::fs::rename(&tmp, file)?;
                }
            }
            Backend::Kubernetes { api, names } if seq == 0 => {
                let creates = names.iter().enumerate().map(|(i, name)| async move {
                    let object = serde_json::from_value(self.feature_flag(i, 0))?;
                    api.create(&kube::api::PostParams::default(), &object)
                        .await
                        .with_context(|| format!("creating FeatureFlag {name}"))?;
                    Ok::<(), anyhow::Error>(())
                });
                let mut creates = futures::stream::iter(creates).buffer_unordered(16);
                while let Some(created) = creates.next().await {
                    created?;
                }
                visible();
            }
            Backend::Kubernetes { api, names } => {
                let patch = kube::api::Patch::Merge(json!({
                    "spec": {"flagSpec": {"flags": {SEQ_FLAG: {"metadata": {"benchSeq": seq}}}}}
                }));
                let params = kube::api::PatchParams::default();
                visible();
                let (params, patch) = (&params, &patch);
                let patches = names.iter().map(|name| async move {
                    api.patch(name, params, patch)
                        .await
                        .with_context(|| format!("patching FeatureFlag {name}"))
                });
                let mut patches = futures::stream::iter(patches).buffer_unordered(64);
                while let Some(patched) = patches.next().await {
                    patched?;
                }
            }
        }
        Ok(())
    }

    /// The size of the flag configuration a subscriber receives, approximately.
    fn document_bytes(&self) -> usize {
        document(0, self.payload).len()
    }

    /// Creates `count` resources nobody subscribes to yet (Kubernetes only) and returns their
    /// selectors.
    async fn create_cold(&self, count: usize) -> anyhow::Result<Vec<Arc<str>>> {
        let Backend::Kubernetes { api, .. } = &self.backend else {
            return Ok(Vec::new());
        };
        let mut selectors = Vec::with_capacity(count);
        for i in 0..count {
            let name = format!("cold{i}");
            let mut object = self.feature_flag(0, 0);
            object["metadata"]["name"] = json!(name);
            let object = serde_json::from_value(object)?;
            api.create(&kube::api::PostParams::default(), &object)
                .await
                .with_context(|| format!("creating FeatureFlag {name}"))?;
            selectors.push(Arc::from(format!(
                "core.openfeature.dev/{NAMESPACE}/{name}"
            )));
        }
        Ok(selectors)
    }

    /// Gives the floor backend the floor server's input.
    fn attach(&self, control: Option<std::process::ChildStdin>) {
        if let Backend::Floor(slot) = &self.backend {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = control;
        }
    }
}

/// Version `seq` as a flagd flag configuration document of about `payload` bytes.
fn document(seq: u64, payload: usize) -> String {
    json!({"flags": flags(seq, payload)}).to_string()
}

fn staging_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let staging = dir.join("staging");
    std::fs::create_dir_all(&staging)?;
    Ok(staging)
}

// ---------------------------------------------------------------------------------------------
// The client side: a codec that finds the sequence number without decoding.

#[derive(Clone, Copy, Default)]
struct SeqCodec;

struct RequestEncoder;
struct SeqDecoder;

impl Codec for SeqCodec {
    type Encode = SyncFlagsRequest;
    type Decode = u64;
    type Encoder = RequestEncoder;
    type Decoder = SeqDecoder;

    fn encoder(&mut self) -> RequestEncoder {
        RequestEncoder
    }

    fn decoder(&mut self) -> SeqDecoder {
        SeqDecoder
    }
}

impl Encoder for RequestEncoder {
    type Item = SyncFlagsRequest;
    type Error = Status;

    fn encode(&mut self, item: SyncFlagsRequest, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let mut bytes = Vec::with_capacity(prost::Message::encoded_len(&item));
        prost::Message::encode(&item, &mut bytes).map_err(|e| Status::internal(e.to_string()))?;
        dst.put_slice(&bytes);
        Ok(())
    }
}

impl Decoder for SeqDecoder {
    type Item = u64;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<u64>, Status> {
        let len = src.remaining();
        // The whole message is one contiguous buffer; search it in place.
        let seq = find_seq(src.chunk()).unwrap_or(NO_SEQ);
        src.advance(len);
        Ok(Some(seq))
    }
}

fn find_seq(bytes: &[u8]) -> Option<u64> {
    let at = bytes
        .windows(SEQ_MARKER.len())
        .position(|w| w == SEQ_MARKER)?;
    let digits = &bytes[at + SEQ_MARKER.len()..];
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// A certificate authority and a server certificate for 127.0.0.1, for `--tls`.
struct BenchTls {
    cert: PathBuf,
    key: PathBuf,
    client: tonic::transport::ClientTlsConfig,
}

impl BenchTls {
    fn new(dir: &Path) -> anyhow::Result<Self> {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "flagd-proxy-bench CA");
        let ca_key = rcgen::KeyPair::generate()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = rcgen::Issuer::new(ca_params, ca_key);
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])?;
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca)?;
        let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server-key.pem"));
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        let client = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca_cert.pem()))
            .domain_name("127.0.0.1");
        Ok(Self {
            cert: cert_path,
            key: key_path,
            client,
        })
    }
}

/// Where and how subscribers connect.
#[derive(Clone)]
struct Dial {
    port: u16,
    tls: Option<tonic::transport::ClientTlsConfig>,
}

async fn open_channel(dial: &Dial, source: Option<Ipv4Addr>) -> anyhow::Result<Channel> {
    let port = dial.port;
    let scheme = if dial.tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://127.0.0.1:{port}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10));
    if let Some(tls) = &dial.tls {
        endpoint = endpoint.tls_config(tls.clone())?;
    }
    let channel = match source {
        None => endpoint.connect().await?,
        Some(ip) => {
            let connector = tower::service_fn(move |_: Uri| async move {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.bind(SocketAddr::from((ip, 0)))?;
                let stream = socket
                    .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                    .await?;
                stream.set_nodelay(true)?;
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
            });
            endpoint.connect_with_connector(connector).await?
        }
    };
    Ok(channel)
}

/// Opens a `SyncFlags` stream for `selector` (in the request body, which both proxies read).
async fn open_stream(channel: Channel, selector: &str) -> Result<tonic::Streaming<u64>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let request = Request::new(SyncFlagsRequest {
        provider_id: "flagd-proxy-bench".into(),
        selector: selector.to_owned(),
    });
    let path = http::uri::PathAndQuery::from_static(SYNC_PATH);
    Ok(grpc
        .server_streaming(request, path, SeqCodec)
        .await?
        .into_inner())
}

// ---------------------------------------------------------------------------------------------
// What the subscribers saw

/// Shared by all subscriber tasks: each one's newest version, and per version how many
/// subscribers have it (or a newer one) and when the first and the last got it.
struct Tracker {
    base: Instant,
    /// Subscribers that must reach a version for it to count as delivered.
    target: AtomicUsize,
    latest: Vec<AtomicU64>,
    reached: Vec<AtomicU32>,
    first_at: Vec<AtomicU64>,
    all_at: Vec<AtomicU64>,
    connected: AtomicUsize,
    messages: AtomicU64,
    duplicates: AtomicU64,
    unparsed: AtomicU64,
    errors: AtomicU64,
    last_error: std::sync::Mutex<Option<String>>,
}

impl Tracker {
    fn new(subscribers: usize, versions: usize) -> Self {
        let vec64 = |n: usize, v: u64| (0..n).map(|_| AtomicU64::new(v)).collect::<Vec<_>>();
        Self {
            base: Instant::now(),
            target: AtomicUsize::new(subscribers),
            latest: vec64(subscribers, NO_SEQ),
            reached: (0..versions).map(|_| AtomicU32::new(0)).collect(),
            first_at: vec64(versions, 0),
            all_at: vec64(versions, 0),
            connected: AtomicUsize::new(0),
            messages: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            unparsed: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            last_error: std::sync::Mutex::new(None),
        }
    }

    /// Nanoseconds since the tracker was made; never 0.
    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64 + 1
    }

    fn record(&self, slot: usize, seq: u64) {
        self.messages.fetch_add(1, Ordering::Relaxed);
        if seq == NO_SEQ {
            self.unparsed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let previous = self.latest[slot].load(Ordering::Relaxed);
        let from = if previous == NO_SEQ {
            self.connected.fetch_add(1, Ordering::Relaxed);
            0
        } else if seq <= previous {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
            return;
        } else {
            previous + 1
        };
        self.latest[slot].store(seq, Ordering::Relaxed);
        let target = self.target.load(Ordering::Relaxed) as u32;
        let last = (seq as usize).min(self.reached.len().saturating_sub(1)) as u64;
        for version in from..=last {
            let v = version as usize;
            let count = self.reached[v].fetch_add(1, Ordering::AcqRel) + 1;
            if count == 1 {
                self.first_at[v].store(self.now(), Ordering::Release);
            }
            if count == target {
                self.all_at[v].store(self.now(), Ordering::Release);
            }
        }
    }

    fn failed(&self, error: &Status) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(format!("{:?}: {}", error.code(), error.message()));
        }
    }

    fn all_at(&self, version: u64) -> Option<u64> {
        match self.all_at[version as usize].load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    fn first_at(&self, version: u64) -> Option<u64> {
        match self.first_at[version as usize].load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    /// Subscribers (among the first `n`) whose newest version is not `version`.
    fn not_on(&self, version: u64, n: usize) -> usize {
        self.latest[..n]
            .iter()
            .filter(|v| v.load(Ordering::Relaxed) != version)
            .count()
    }

    /// Waits until every subscriber has `version` or `timeout` has passed.
    async fn wait_all(&self, version: u64, timeout: Duration) -> Option<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = self.all_at(version) {
                return Some(at);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

async fn subscriber(channel: Channel, selector: Arc<str>, slot: usize, tracker: Arc<Tracker>) {
    let result = async {
        let mut stream = open_stream(channel, &selector).await?;
        while let Some(seq) = stream.message().await? {
            tracker.record(slot, seq);
        }
        Ok::<(), Status>(())
    }
    .await;
    let error = result
        .err()
        .unwrap_or_else(|| Status::unknown("stream ended"));
    {
        tracker.failed(&error);
    }
}

// ---------------------------------------------------------------------------------------------
// One scenario against one proxy

#[derive(Clone, Copy, Debug)]
struct Scenario {
    source: SourceKind,
    subscribers: usize,
    resources: usize,
    payload: usize,
    tls: bool,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
struct Stats {
    samples: usize,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
}

impl Stats {
    fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        let pick = |p: f64| {
            if values.is_empty() {
                None
            } else {
                let rank = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
                Some(values[rank - 1])
            }
        };
        Stats {
            samples: values.len(),
            p50_ms: pick(0.50),
            p99_ms: pick(0.99),
            max_ms: values.last().copied(),
        }
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
struct RunResult {
    proxy: String,
    document_bytes: usize,
    subscribers_connected: usize,
    connect_seconds: f64,
    /// CPU time of the proxy and of this load generator while the subscribers connected.
    connect_cpu_seconds: f64,
    connect_load_generator_cpu_seconds: f64,
    first_snapshot: Stats,
    first_snapshot_failures: usize,
    /// Write until every subscriber has the version.
    propagation: Stats,
    /// Write until the first subscriber has the version.
    first_receiver: Stats,
    /// Paced updates that did not reach every subscriber within the timeout.
    updates_incomplete: u64,
    /// Subscriber-versions missing when an update timed out.
    subscriber_versions_missed: u64,
    messages_per_subscriber_per_update: f64,
    duplicate_messages: u64,
    burst_updates: u64,
    /// Final burst write until every subscriber has it (None: never).
    burst_convergence_ms: Option<f64>,
    /// Subscribers not on the final version after the settle wait.
    stale_after_settle: usize,
    rss_empty_mib: f64,
    rss_idle_mib: f64,
    rss_after_updates_mib: f64,
    rss_peak_mib: f64,
    kib_per_idle_subscriber: f64,
    cpu_idle_percent: f64,
    cpu_seconds_per_update: f64,
    cpu_seconds_total: f64,
    /// CPU time of this load generator per paced update (it shares the machine).
    load_generator_cpu_seconds_per_update: f64,
    stream_errors: u64,
    unparsed_messages: u64,
    last_error: Option<String>,
    /// Phases cut short because the proxy kept failing them, and how.
    gave_up: Vec<String>,
    /// Kubernetes: watch requests on FeatureFlags open at the API server while idle.
    apiserver_watches: Option<u64>,
    /// Kubernetes: the proxy's TCP connections to the API server while idle.
    apiserver_connections: Option<usize>,
    /// Kubernetes: time to first snapshot for a resource nobody watched yet.
    cold_first_snapshot: Stats,
    cold_first_snapshot_failures: usize,
    /// (RSS idle − RSS with no subscribers) / resources, when there is more than one.
    kib_per_resource: Option<f64>,
    storm: Option<storm::StormResult>,
    /// The proxy was killed for going over `--max-rss-mib`.
    killed_for_rss: bool,
}

impl RunResult {
    /// What this proxy promises: every subscriber gets every paced update and ends on the final
    /// version, and no stream breaks.
    fn correct(&self, subscribers: usize) -> bool {
        self.subscribers_connected == subscribers
            && self.updates_incomplete == 0
            && self.stale_after_settle == 0
            && self.stream_errors == 0
            && self.unparsed_messages == 0
            && self.first_snapshot_failures == 0
            && self.cold_first_snapshot_failures == 0
            && !self.killed_for_rss
            && self
                .storm
                .as_ref()
                .is_none_or(|s| s.gave_up == 0 && s.witness_stream_errors == 0)
    }
}

/// Kills a process whose RSS goes over a limit, so a proxy that cannot cope does not take the
/// machine down with it.
struct RssGuard {
    task: tokio::task::JoinHandle<()>,
    killed: Arc<std::sync::atomic::AtomicBool>,
}

impl RssGuard {
    fn spawn(pid: u32, limit_mib: u64) -> Self {
        let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = killed.clone();
        let task = tokio::spawn(async move {
            loop {
                if proc_sample(pid).rss_kib > limit_mib * 1024 {
                    eprintln!("  RSS over {limit_mib} MiB: killing process {pid}");
                    let _ = Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                    flag.store(true, Ordering::Relaxed);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { task, killed }
    }

    fn killed(&self) -> bool {
        self.killed.load(Ordering::Relaxed)
    }
}

impl Drop for RssGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

async fn run_one(
    kind: Kind,
    bin: &Path,
    scenario: Scenario,
    args: &Args,
    workdir: &Path,
) -> anyhow::Result<RunResult> {
    let dir = workdir.join(format!(
        "{}-{}-n{}-m{}-p{}{}",
        kind.key(),
        scenario.source.label(),
        scenario.subscribers,
        scenario.resources,
        scenario.payload,
        if scenario.tls { "-tls" } else { "" }
    ));
    std::fs::create_dir_all(&dir)?;
    // A control plane of its own for each run, so no run sees another's watches or objects.
    let cluster = match scenario.source {
        _ if kind == Kind::Floor => None,
        SourceKind::Files => None,
        SourceKind::Kubernetes => {
            let cluster = ControlPlane::start().await.map_err(|error| {
                anyhow::anyhow!("starting the test control plane: {error} (scripts/build-control-plane.sh builds it)")
            })?;
            cluster.grant_proxy_cluster_wide().await;
            cluster.create_namespace(NAMESPACE).await;
            Some(cluster)
        }
    };
    let sources = Sources::new(
        kind,
        &dir,
        scenario.resources,
        scenario.payload,
        cluster.as_ref(),
    )?;
    sources.write(0, || {}).await?;
    let cold = match &cluster {
        Some(_) => sources.create_cold(args.cold_resources).await?,
        None => Vec::new(),
    };
    let tls = if scenario.tls {
        Some(BenchTls::new(&dir)?)
    } else {
        None
    };
    let mut proxy = ProxyProcess::start(
        kind,
        bin,
        &dir,
        cluster.as_ref(),
        tls.as_ref(),
        scenario.payload,
        scenario.resources + cold.len() + 16,
    )?;
    sources.attach(proxy.control.take());
    let dial = Dial {
        port: proxy.port,
        tls: tls.as_ref().map(|t| t.client.clone()),
    };
    let dial = &dial;
    let pid = proxy.pid;
    let guard = RssGuard::spawn(pid, args.max_rss_mib);
    let mut result = RunResult {
        proxy: match kind {
            Kind::Go => args.go_label.clone(),
            _ => kind.label().to_owned(),
        },
        document_bytes: sources.document_bytes(),
        ..RunResult::default()
    };
    let source_addr = |i: usize| -> Option<Ipv4Addr> {
        (args.source_addrs > 1)
            .then(|| Ipv4Addr::new(127, 0, 0, 1 + (i % args.source_addrs as usize) as u8))
    };

    // Ready: a probe stream gets the first snapshot.
    let ready_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = proxy.exited() {
            bail!(
                "{} exited with {status}:\n{}",
                kind.label(),
                proxy.log_tail()
            );
        }
        let probe = async {
            let channel = open_channel(dial, None).await?;
            let mut stream = open_stream(channel, &sources.selectors[0]).await?;
            stream.message().await?.context("stream ended")
        };
        match tokio::time::timeout(Duration::from_secs(5), probe).await {
            Ok(Ok(0)) => break,
            Ok(Ok(seq)) => bail!("probe got version {seq}, expected 0"),
            _ if Instant::now() > ready_deadline => {
                bail!(
                    "{} did not serve a snapshot:\n{}",
                    kind.label(),
                    proxy.log_tail()
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    tokio::time::sleep(args.idle.min(Duration::from_secs(1))).await;
    result.rss_empty_mib = mib(proc_sample(pid).rss_kib);
    let fds_before = storm::open_fds(pid);

    // Connect every subscriber and wait for their first snapshots.
    let versions = (2 + args.updates + args.burst) as usize;
    let n = scenario.subscribers;
    let tracker = Arc::new(Tracker::new(n, versions));
    let mut tasks = tokio::task::JoinSet::new();
    let connect_cpu = proc_sample(pid).cpu_seconds;
    let connect_own_cpu = proc_sample(std::process::id()).cpu_seconds;
    let started = Instant::now();
    let connections = n.div_ceil(args.streams_per_connection);
    let mut opened = futures::stream::iter(0..connections)
        .map(|c| async move { (c, open_channel(dial, source_addr(c)).await) })
        .buffer_unordered(args.connect_concurrency.max(1));
    let mut connect_errors = 0usize;
    let mut spawned = 0usize;
    while let Some((c, channel)) = opened.next().await {
        let channel = match channel {
            Ok(channel) => channel,
            Err(error) => {
                connect_errors += 1;
                if connect_errors == 1 {
                    eprintln!("connect failed: {error:#}");
                }
                continue;
            }
        };
        let first = c * args.streams_per_connection;
        for slot in first..(first + args.streams_per_connection).min(n) {
            let selector = sources.selectors[slot % scenario.resources].clone();
            tasks.spawn(subscriber(channel.clone(), selector, slot, tracker.clone()));
            spawned += 1;
        }
    }
    drop(opened);
    let deadline = started + args.connect_timeout;
    while tracker.connected.load(Ordering::Relaxed)
        + (tracker.errors.load(Ordering::Relaxed) as usize)
        < spawned
        && Instant::now() < deadline
        && proxy.exited().is_none()
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    result.connect_seconds = started.elapsed().as_secs_f64();
    result.connect_cpu_seconds = proc_sample(pid).cpu_seconds - connect_cpu;
    result.connect_load_generator_cpu_seconds =
        proc_sample(std::process::id()).cpu_seconds - connect_own_cpu;
    result.subscribers_connected = tracker.connected.load(Ordering::Relaxed);
    // Versions count as delivered once every connected subscriber has them.
    tracker
        .target
        .store(result.subscribers_connected, Ordering::Relaxed);
    eprintln!(
        "  {} subscribers connected in {:.1} s ({} connect errors, {} stream errors)",
        result.subscribers_connected,
        result.connect_seconds,
        connect_errors,
        tracker.errors.load(Ordering::Relaxed)
    );

    // Idle: memory and CPU with every subscriber connected.
    tokio::time::sleep(args.idle / 2).await;
    let idle_start = proc_sample(pid);
    let idle_clock = Instant::now();
    tokio::time::sleep(args.idle).await;
    let idle_end = proc_sample(pid);
    result.rss_idle_mib = mib(idle_end.rss_kib);
    result.cpu_idle_percent = 100.0 * (idle_end.cpu_seconds - idle_start.cpu_seconds)
        / idle_clock.elapsed().as_secs_f64();
    if result.subscribers_connected > 0 {
        result.kib_per_idle_subscriber = (idle_end.rss_kib as f64 - result.rss_empty_mib * 1024.0)
            / result.subscribers_connected as f64;
    }
    if scenario.resources > 1 {
        result.kib_per_resource = Some(
            (idle_end.rss_kib as f64 - result.rss_empty_mib * 1024.0) / scenario.resources as f64,
        );
    }
    if let Some(cluster) = &cluster {
        result.apiserver_watches = Some(cluster.open_watches("featureflags").await);
        let port = cluster.port();
        result.apiserver_connections = Some(control_plane::connections_to(pid, port));
    }

    // Time to first snapshot for a new subscriber, on a new connection.
    let mut first_snapshot = Vec::with_capacity(args.first_snapshot_samples);
    let mut failed_in_a_row = 0;
    for i in 0..args.first_snapshot_samples {
        if failed_in_a_row == GIVE_UP_AFTER {
            let left = args.first_snapshot_samples - i;
            result.first_snapshot_failures += left;
            result.gave_up.push(format!(
                "time to first snapshot: {GIVE_UP_AFTER} samples in a row failed; the other {left} were not tried and count as failures"
            ));
            break;
        }
        let selector = sources.selectors[i % scenario.resources].clone();
        let begin = Instant::now();
        let sample = async {
            let channel = open_channel(dial, source_addr(i)).await?;
            let mut stream = open_stream(channel, &selector).await?;
            stream.message().await?.context("stream ended")
        };
        match tokio::time::timeout(Duration::from_secs(10), sample).await {
            Ok(Ok(_)) => {
                failed_in_a_row = 0;
                first_snapshot.push(begin.elapsed().as_secs_f64() * 1e3);
            }
            _ => {
                failed_in_a_row += 1;
                result.first_snapshot_failures += 1;
            }
        }
    }
    result.first_snapshot = Stats::of(first_snapshot);

    // Time to first snapshot for resources nobody watched yet (Kubernetes).
    let mut cold_samples = Vec::with_capacity(cold.len());
    for (i, selector) in cold.iter().enumerate() {
        let begin = Instant::now();
        let sample = async {
            let channel = open_channel(dial, source_addr(i)).await?;
            let mut stream = open_stream(channel, selector).await?;
            stream.message().await?.context("stream ended")
        };
        match tokio::time::timeout(Duration::from_secs(10), sample).await {
            Ok(Ok(_)) => cold_samples.push(begin.elapsed().as_secs_f64() * 1e3),
            _ => result.cold_first_snapshot_failures += 1,
        }
        if result.cold_first_snapshot_failures >= GIVE_UP_AFTER as usize {
            break;
        }
    }
    result.cold_first_snapshot = Stats::of(cold_samples);

    // Paced updates.
    let messages_before = tracker.messages.load(Ordering::Relaxed);
    let cpu_before = proc_sample(pid).cpu_seconds;
    let own_cpu_before = proc_sample(std::process::id()).cpu_seconds;
    let mut propagation = Vec::new();
    let mut first_receiver = Vec::new();
    let mut peak_rss = 0u64;
    let mut applied = 0;
    let mut incomplete_in_a_row = 0;
    for seq in 1..=args.updates {
        if let Some(status) = proxy.exited() {
            let left = args.updates - seq + 1;
            result.updates_incomplete += left;
            let tail = proxy.log_tail();
            let tail: Vec<&str> = tail.lines().rev().take(4).collect();
            result.gave_up.push(format!(
                "paced updates: the process exited ({status}); the other {left} were not written. Its log ended: `{}`",
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            ));
            break;
        }
        if incomplete_in_a_row == GIVE_UP_AFTER {
            let left = args.updates - seq + 1;
            result.updates_incomplete += left;
            result.gave_up.push(format!(
                "paced updates: {GIVE_UP_AFTER} in a row did not reach every subscriber; the other {left} were not written and count as not delivered"
            ));
            break;
        }
        let mut written = 0;
        sources.write(seq, || written = tracker.now()).await?;
        applied += 1;
        match tracker.wait_all(seq, args.update_timeout).await {
            Some(at) => {
                incomplete_in_a_row = 0;
                propagation.push(ms(at - written));
            }
            None => {
                incomplete_in_a_row += 1;
                result.updates_incomplete += 1;
                let reached = tracker.reached[seq as usize].load(Ordering::Relaxed) as u64;
                result.subscriber_versions_missed +=
                    (result.subscribers_connected as u64).saturating_sub(reached);
            }
        }
        if let Some(at) = tracker.first_at(seq) {
            first_receiver.push(ms(at.saturating_sub(written)));
        }
        peak_rss = peak_rss.max(proc_sample(pid).rss_kib);
        tokio::time::sleep(args.update_gap).await;
    }
    let after = proc_sample(pid);
    result.propagation = Stats::of(propagation);
    result.first_receiver = Stats::of(first_receiver);
    if applied > 0 {
        result.cpu_seconds_per_update = (after.cpu_seconds - cpu_before) / applied as f64;
        result.load_generator_cpu_seconds_per_update =
            (proc_sample(std::process::id()).cpu_seconds - own_cpu_before) / applied as f64;
        if result.subscribers_connected > 0 {
            result.messages_per_subscriber_per_update = (tracker.messages.load(Ordering::Relaxed)
                - messages_before) as f64
                / (applied as f64 * result.subscribers_connected as f64);
        }
    }
    result.rss_after_updates_mib = mib(after.rss_kib.max(peak_rss));

    // Burst: updates back to back; then everyone must end on the final one.
    result.burst_updates = args.burst;
    let final_seq = args.updates + args.burst;
    let mut burst_end = 0;
    for seq in args.updates + 1..=final_seq {
        sources.write(seq, || burst_end = tracker.now()).await?;
        if seq < final_seq {
            tokio::time::sleep(args.burst_gap).await;
        }
    }
    let converged = tracker.wait_all(final_seq, args.settle).await;
    result.burst_convergence_ms = converged.map(|at| ms(at.saturating_sub(burst_end)));
    result.stale_after_settle = tracker
        .not_on(final_seq, n)
        .saturating_sub(n - result.subscribers_connected);
    let end = proc_sample(pid);
    result.rss_peak_mib = mib(end.hwm_kib);
    result.cpu_seconds_total = end.cpu_seconds;
    result.duplicate_messages = tracker.duplicates.load(Ordering::Relaxed);
    result.stream_errors = tracker.errors.load(Ordering::Relaxed) + connect_errors as u64;
    result.unparsed_messages = tracker.unparsed.load(Ordering::Relaxed);
    result.last_error = tracker.last_error.lock().ok().and_then(|e| e.clone());

    if args.storm && kind != Kind::Floor && proxy.exited().is_none() {
        eprintln!("  reconnect storm: {n} subscribers");
        let setup = storm::StormSetup {
            dial,
            management_port: proxy.management_port,
            pid,
            sources: &sources,
            subscribers: n,
            spread: args.storm_spread,
            timeout: args.storm_timeout,
            seq: final_seq + 1,
            versions,
            fds_before,
        };
        let drop_all = async {
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        };
        match storm::run(setup, drop_all).await {
            Ok(storm) => {
                eprintln!(
                    "  served again: {} of {} in {} s",
                    storm.served_again,
                    n,
                    fmt_opt(storm.seconds_to_all, 2)
                );
                result.storm = Some(storm);
            }
            Err(error) => result.gave_up.push(format!("reconnect storm: {error:#}")),
        }
        result.rss_peak_mib = mib(proc_sample(pid).hwm_kib);
    }
    result.killed_for_rss = guard.killed();
    drop(guard);

    // Close the clients before the proxy goes, so no stream counts as broken.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    drop(proxy);
    drop(cluster);
    Ok(result)
}

// ---------------------------------------------------------------------------------------------
// Reporting

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned());
    let memory_kib = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| {
            v.split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        });
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": model,
        "memory_gib": memory_kib.map(|k| (k as f64 / 1048576.0 * 10.0).round() / 10.0),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "–".to_owned())
}

/// One scenario's results, by proxy key, and why a proxy has none.
struct ScenarioRuns {
    scenario: Scenario,
    results: BTreeMap<&'static str, RunResult>,
    skipped: BTreeMap<&'static str, String>,
}

type Getter = fn(&RunResult) -> Option<f64>;

/// The rows of a scenario's table: name, value, digits.
fn rows(runs: &ScenarioRuns) -> Vec<(&'static str, Getter, usize)> {
    let mut rows: Vec<(&'static str, Getter, usize)> = vec![
        (
            "subscribers connected",
            |r| Some(r.subscribers_connected as f64),
            0,
        ),
        (
            "connect all subscribers (s)",
            |r| Some(r.connect_seconds),
            2,
        ),
        ("connect: CPU (s)", |r| Some(r.connect_cpu_seconds), 2),
        (
            "connect: load generator CPU (s)",
            |r| Some(r.connect_load_generator_cpu_seconds),
            2,
        ),
        (
            "time to first snapshot p50 (ms)",
            |r| r.first_snapshot.p50_ms,
            2,
        ),
        (
            "time to first snapshot p99 (ms)",
            |r| r.first_snapshot.p99_ms,
            2,
        ),
        ("propagation to all p50 (ms)", |r| r.propagation.p50_ms, 1),
        ("propagation to all p99 (ms)", |r| r.propagation.p99_ms, 1),
        ("propagation to all max (ms)", |r| r.propagation.max_ms, 1),
        ("first subscriber p50 (ms)", |r| r.first_receiver.p50_ms, 1),
        (
            "paced updates not delivered to all",
            |r| Some(r.updates_incomplete as f64),
            0,
        ),
        (
            "messages per subscriber per update",
            |r| Some(r.messages_per_subscriber_per_update),
            2,
        ),
        ("burst: convergence (ms)", |r| r.burst_convergence_ms, 1),
        (
            "burst: subscribers not on final version",
            |r| Some(r.stale_after_settle as f64),
            0,
        ),
        ("RSS, no subscribers (MiB)", |r| Some(r.rss_empty_mib), 1),
        ("RSS, subscribers idle (MiB)", |r| Some(r.rss_idle_mib), 1),
        (
            "RSS, during updates (MiB)",
            |r| Some(r.rss_after_updates_mib),
            1,
        ),
        ("RSS peak (VmHWM, MiB)", |r| Some(r.rss_peak_mib), 1),
        (
            "memory per idle subscriber (KiB)",
            |r| Some(r.kib_per_idle_subscriber),
            2,
        ),
        (
            "CPU while idle (% of a core)",
            |r| Some(r.cpu_idle_percent),
            2,
        ),
        ("CPU per update (s)", |r| Some(r.cpu_seconds_per_update), 3),
        ("CPU total (s)", |r| Some(r.cpu_seconds_total), 2),
        (
            "load generator CPU per update (s)",
            |r| Some(r.load_generator_cpu_seconds_per_update),
            3,
        ),
        ("stream errors", |r| Some(r.stream_errors as f64), 0),
        (
            "first-snapshot failures",
            |r| Some(r.first_snapshot_failures as f64),
            0,
        ),
    ];
    let any = |f: fn(&RunResult) -> bool| runs.results.values().any(f);
    if any(|r| r.kib_per_resource.is_some()) {
        rows.push((
            "RSS per watched resource, with its subscribers (KiB)",
            |r| r.kib_per_resource,
            2,
        ));
    }
    if any(|r| r.apiserver_watches.is_some()) {
        rows.extend([
            (
                "API server: FeatureFlag watches open",
                (|r| r.apiserver_watches.map(|v| v as f64)) as Getter,
                0,
            ),
            (
                "API server: connections from the proxy",
                |r| r.apiserver_connections.map(|v| v as f64),
                0,
            ),
            (
                "new resource: time to first snapshot p50 (ms)",
                |r| r.cold_first_snapshot.p50_ms,
                1,
            ),
            (
                "new resource: time to first snapshot p99 (ms)",
                |r| r.cold_first_snapshot.p99_ms,
                1,
            ),
            (
                "new resource: failures",
                |r| Some(r.cold_first_snapshot_failures as f64),
                0,
            ),
        ]);
    }
    if any(|r| r.storm.is_some()) {
        rows.extend([
            (
                "storm: subscribers served again",
                (|r| r.storm.as_ref().map(|s| s.served_again as f64)) as Getter,
                0,
            ),
            (
                "storm: all served again after (s)",
                |r| r.storm.as_ref().and_then(|s| s.seconds_to_all),
                2,
            ),
            (
                "storm: reconnect to snapshot p50 (ms)",
                |r| {
                    r.storm
                        .as_ref()
                        .and_then(|s| s.reconnect_to_snapshot.p50_ms)
                },
                1,
            ),
            (
                "storm: reconnect to snapshot p99 (ms)",
                |r| {
                    r.storm
                        .as_ref()
                        .and_then(|s| s.reconnect_to_snapshot.p99_ms)
                },
                1,
            ),
            (
                "storm: attempts retried",
                |r| r.storm.as_ref().map(|s| s.retries as f64),
                0,
            ),
            (
                "storm: clients never served",
                |r| r.storm.as_ref().map(|s| s.gave_up as f64),
                0,
            ),
            (
                "storm: CPU (s)",
                |r| r.storm.as_ref().map(|s| s.cpu_seconds),
                2,
            ),
            (
                "storm: RSS peak (MiB)",
                |r| r.storm.as_ref().map(|s| s.rss_peak_mib),
                1,
            ),
            (
                "storm: /readyz slowest (ms)",
                |r| r.storm.as_ref().and_then(|s| s.readyz_max_ms),
                1,
            ),
            (
                "storm: /readyz failed",
                |r| r.storm.as_ref().map(|s| s.readyz_failures as f64),
                0,
            ),
            (
                "storm: /readyz probes",
                |r| r.storm.as_ref().map(|s| s.readyz_probes as f64),
                0,
            ),
            (
                "storm: update to the connected streams (ms)",
                |r| r.storm.as_ref().and_then(|s| s.witness_update_ms),
                1,
            ),
            (
                "storm: connected streams broken",
                |r| r.storm.as_ref().map(|s| s.witness_stream_errors as f64),
                0,
            ),
        ]);
    }
    if any(|r| r.killed_for_rss) {
        rows.push((
            "killed for RSS over --max-rss-mib",
            |r| Some(f64::from(u8::from(r.killed_for_rss))),
            0,
        ));
    }
    rows
}

fn markdown_table(runs: &ScenarioRuns, go_label: &str, streams_per_connection: usize) -> String {
    let scenario = &runs.scenario;
    let results = &runs.results;
    let doc = results
        .values()
        .next()
        .map(|r| r.document_bytes)
        .unwrap_or_default();
    let mut out = format!(
        "### {} subscribers, {} resource(s), {} B document, {} source{}{}\n\n",
        scenario.subscribers,
        scenario.resources,
        doc,
        scenario.source.label(),
        if scenario.tls { ", TLS" } else { "" },
        if streams_per_connection > 1 {
            format!(", {streams_per_connection} streams per connection")
        } else {
            String::new()
        }
    );
    let model = results.contains_key("model") || runs.skipped.contains_key("model");
    let floor = results.contains_key("floor") || runs.skipped.contains_key("floor");
    let mut header = format!("| metric | flagd-proxy (Rust) | {go_label} | Go / Rust |");
    let mut rule = String::from("|---|---:|---:|---:|");
    if model {
        header.push_str(&format!(" {} |", Kind::Model.label()));
        rule.push_str("---:|");
    }
    if floor {
        header.push_str(" floor | Rust / floor |");
        rule.push_str("---:|---:|");
    }
    out.push_str(&format!("{header}\n{rule}\n"));
    let cell = |key: &str, v: Option<f64>, digits: usize| match results.get(key) {
        Some(_) => fmt_opt(v, digits),
        None => runs
            .skipped
            .get(key)
            .cloned()
            .unwrap_or_else(|| "failed".to_owned()),
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:.2}", b / a),
        _ => "–".to_owned(),
    };
    for (name, get, digits) in rows(runs) {
        let value = |key: &str| results.get(key).and_then(get);
        let (r, g) = (value("rust"), value("go"));
        let mut line = format!(
            "| {name} | {} | {} | {} |",
            cell("rust", r, digits),
            cell("go", g, digits),
            ratio(r, g)
        );
        if model {
            line.push_str(&format!(" {} |", cell("model", value("model"), digits)));
        }
        if floor {
            let f = value("floor");
            let fc = if results.contains_key("floor") && f.is_none() {
                "–".to_owned()
            } else {
                cell("floor", f, digits)
            };
            line.push_str(&format!(" {fc} | {} |", ratio(f, r)));
        }
        out.push_str(&line);
        out.push('\n');
    }
    for (key, run) in results {
        if let Some(error) = &run.last_error {
            out.push_str(&format!("\n{key}: last stream error: {error}\n"));
        }
        for note in &run.gave_up {
            out.push_str(&format!("\n{key}: {note}\n"));
        }
    }
    out.push('\n');
    out
}

/// The targets, checked against this run's scenarios.
fn targets(runs: &[ScenarioRuns]) -> String {
    let mut out =
        String::from("### Targets\n\n| scenario | target | measured | met |\n|---|---|---|---|\n");
    let yes = |ok: bool| if ok { "yes" } else { "**no**" };
    for run in runs {
        let s = &run.scenario;
        let Some(r) = run.results.get("rust") else {
            continue;
        };
        let name = format!(
            "{} subs, {} res, {} B, {}{}",
            s.subscribers,
            s.resources,
            s.payload,
            s.source.label(),
            if s.tls { ", TLS" } else { "" }
        );
        let mut row = |target: &str, measured: String, ok: bool| {
            out.push_str(&format!(
                "| {name} | {target} | {measured} | {} |\n",
                yes(ok)
            ));
        };
        if let Some(f) = run.results.get("floor")
            && s.payload <= 2048
        {
            if let (Some(rp), Some(fp)) = (r.propagation.p99_ms, f.propagation.p99_ms) {
                row(
                    "propagation p99 ≤ 1.25 × floor",
                    format!("{rp:.1} vs {fp:.1} ms ({:.2}×)", rp / fp),
                    rp <= 1.25 * fp,
                );
            }
            let (rc, fc) = (r.cpu_seconds_per_update, f.cpu_seconds_per_update);
            if fc > 0.0 {
                row(
                    "CPU per update ≤ 1.5 × floor",
                    format!("{rc:.3} vs {fc:.3} s ({:.2}×)", rc / fc),
                    rc <= 1.5 * fc,
                );
            }
        }
        if let Some(g) = run.results.get("go") {
            let lower = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) => a < b,
                (Some(_), None) => true,
                _ => false,
            };
            for (label, get, digits) in rows(run) {
                let better_is_lower = !matches!(
                    label,
                    "subscribers connected"
                        | "storm: subscribers served again"
                        | "storm: /readyz probes"
                ) && !label.contains("messages per subscriber")
                    && !label.contains("watches open")
                    && !label.contains("CPU while idle");
                let (rv, gv) = (get(r), get(g));
                if !better_is_lower || (rv == Some(0.0) && gv == Some(0.0)) {
                    continue;
                }
                if rv.is_none() && gv.is_none() {
                    continue;
                }
                row(
                    &format!("better than Go: {label}"),
                    format!("{} vs {}", fmt_opt(rv, digits), fmt_opt(gv, digits)),
                    lower(rv, gv) || rv == gv,
                );
            }
        }
        if let Some(storm) = &r.storm {
            let limit = if s.tls { 12.0 } else { 3.0 };
            row(
                &format!("storm: all served again within {limit:.0} s"),
                format!("{} s", fmt_opt(storm.seconds_to_all, 2)),
                storm.seconds_to_all.is_some_and(|t| t <= limit),
            );
            row(
                "storm: /readyz and connected streams answering, no client giving up",
                format!(
                    "/readyz {} of {} failed, slowest {} ms; {} streams broken; {} never served",
                    storm.readyz_failures,
                    storm.readyz_probes,
                    fmt_opt(storm.readyz_max_ms, 1),
                    storm.witness_stream_errors,
                    storm.gave_up
                ),
                storm.readyz_failures == 0
                    && storm.witness_stream_errors == 0
                    && storm.gave_up == 0,
            );
        }
        if let (Some(watches), Some(connections)) = (r.apiserver_watches, r.apiserver_connections) {
            row(
                "API-server connections ≤ watches / 100",
                format!("{connections} connections, {watches} watches"),
                connections as f64 <= (watches as f64 / 100.0).max(1.0),
            );
            let p99 = r.cold_first_snapshot.p99_ms;
            row(
                "new resource: time to first snapshot p99 < 50 ms",
                format!("{} ms", fmt_opt(p99, 1)),
                p99.is_some_and(|v| v < 50.0) && r.cold_first_snapshot_failures == 0,
            );
        }
        if s.resources == 1 && !s.tls {
            row(
                "memory per idle subscriber ≤ 24 KiB",
                format!("{:.2} KiB", r.kib_per_idle_subscriber),
                r.kib_per_idle_subscriber <= 24.0,
            );
        }
    }
    out.push('\n');
    out
}

/// The Go flagd-proxy when none is given: `FLAGD_PROXY_GO_BIN`, else `../shared/bin/flagd-proxy-go`
/// beside this repository, else the one scripts/install-go-proxy.sh installs in the cache.
fn default_go_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("FLAGD_PROXY_GO_BIN") {
        return Some(PathBuf::from(bin));
    }
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bin/flagd-proxy-go");
    if beside.exists() {
        return Some(beside);
    }
    let cache = std::env::var_os("FLAGD_PROXY_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/flagd-proxy"))
        })?;
    let bin = cache.join("bin/flagd-proxy-go");
    bin.exists().then_some(bin)
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let rust_bin = match &args.proxy_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory for this program")?
            .join("flagd-proxy"),
    };
    let mut kinds = Vec::new();
    if !args.only_go {
        if !rust_bin.exists() {
            bail!(
                "{} not found: build it (cargo build --release --bin flagd-proxy) or pass --proxy-bin",
                rust_bin.display()
            );
        }
        kinds.push((Kind::Rust, rust_bin.clone()));
    }
    let go_note = if args.no_go {
        Some("the Go flagd-proxy was not run (--no-go)".to_owned())
    } else {
        match args.go_proxy_bin.clone().or_else(default_go_bin) {
            Some(bin) if bin.exists() => {
                kinds.push((Kind::Go, bin));
                None
            }
            _ => Some(
                "the Go flagd-proxy was not run: no binary (run scripts/install-go-proxy.sh or pass --go-proxy-bin)"
                    .to_owned(),
            ),
        }
    };
    if let Some(note) = &go_note {
        eprintln!("note: {note}");
    }
    if let Some(model) = &args.go_model_bin {
        kinds.push((Kind::Model, model.clone()));
    }
    if !args.no_floor && args.streams_per_connection == 1 {
        kinds.push((Kind::Floor, std::env::current_exe()?));
    }
    if kinds.is_empty() {
        bail!("nothing to run");
    }

    let workdir = std::env::temp_dir().join(format!("flagd-proxy-bench-{}", std::process::id()));
    std::fs::create_dir_all(&workdir)?;
    let load_before = loadavg();
    let started = Instant::now();
    let mut runs = Vec::new();
    let mut ok = true;
    let mut scenarios = Vec::new();
    for &source in &args.source {
        for &payload in &args.payload_bytes {
            for &resources in &args.resources {
                scenarios.push(Scenario {
                    source,
                    subscribers: args.subscribers,
                    resources,
                    payload,
                    tls: args.tls,
                });
            }
        }
    }
    // The floor does not depend on the source: one run per payload serves every source.
    let mut floors: BTreeMap<usize, RunResult> = BTreeMap::new();
    for scenario in scenarios {
        let mut results = BTreeMap::new();
        let mut skipped = BTreeMap::new();
        if go_note.is_some() {
            skipped.insert(Kind::Go.key(), "not run".to_owned());
        }
        for (kind, bin) in &kinds {
            let label = match kind {
                Kind::Go => args.go_label.as_str(),
                _ => kind.label(),
            };
            match kind {
                Kind::Go | Kind::Model if scenario.tls => {
                    skipped.insert(kind.key(), "no TLS".to_owned());
                    continue;
                }
                Kind::Floor if scenario.tls => {
                    skipped.insert(kind.key(), "plain only".to_owned());
                    continue;
                }
                Kind::Floor if scenario.resources > 1 => {
                    skipped.insert(kind.key(), "–".to_owned());
                    continue;
                }
                Kind::Floor => {
                    if let Some(floor) = floors.get(&scenario.payload) {
                        results.insert(kind.key(), floor.clone());
                        continue;
                    }
                }
                _ => {}
            }
            eprintln!(
                "{label}: {} subscribers, {} resource(s), {} B payload, {} source{}",
                scenario.subscribers,
                scenario.resources,
                scenario.payload,
                scenario.source.label(),
                if scenario.tls { ", TLS" } else { "" }
            );
            match run_one(*kind, bin, scenario, &args, &workdir).await {
                Ok(result) => {
                    if *kind == Kind::Rust && !result.correct(scenario.subscribers) {
                        ok = false;
                    }
                    if *kind == Kind::Floor {
                        floors.insert(scenario.payload, result.clone());
                    }
                    results.insert(kind.key(), result);
                }
                Err(error) => {
                    eprintln!("  {label} failed: {error:#}");
                    if *kind == Kind::Rust {
                        ok = false;
                    }
                }
            }
            // Let sockets and the scheduler calm down between runs.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        runs.push(ScenarioRuns {
            scenario,
            results,
            skipped,
        });
    }
    let load_after = loadavg();

    let mut report = String::from("## flagd-proxy fan-out benchmark\n\n");
    let machine = machine();
    report.push_str(&format!(
        "Machine: {} CPUs ({}), {} GiB, Linux {}. Load average before: {load_before}; after: {load_after}. Duration: {:.0} s.\n\n",
        machine["cpus"],
        machine["cpu_model"].as_str().unwrap_or("?"),
        machine["memory_gib"],
        machine["kernel"].as_str().unwrap_or("?"),
        started.elapsed().as_secs_f64()
    ));
    report.push_str(&format!(
        "Settings: {} streams per connection, {} paced updates ({} gap), burst of {} ({} apart, settle {}), {} first-snapshot samples, {} load-generator threads.\n\n",
        args.streams_per_connection,
        args.updates,
        humantime::format_duration(args.update_gap),
        args.burst,
        humantime::format_duration(args.burst_gap),
        humantime::format_duration(args.settle),
        args.first_snapshot_samples,
        args.threads
    ));
    if let Some(note) = &go_note {
        report.push_str(&format!("Note: {note}.\n\n"));
    }
    for run in &runs {
        report.push_str(&markdown_table(
            run,
            &args.go_label,
            args.streams_per_connection,
        ));
    }
    report.push_str(&targets(&runs));
    report.push_str(if ok {
        "Correctness (this project's proxy): every subscriber got every paced update and ended on the final version.\n"
    } else {
        "Correctness (this project's proxy): **FAILED** (see the table: missed updates, stale subscribers or broken streams).\n"
    });
    println!("{report}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let scenarios: Vec<Value> = runs
            .iter()
            .map(|run| {
                let s = &run.scenario;
                json!({
                    "source": s.source,
                    "subscribers": s.subscribers,
                    "resources": s.resources,
                    "payload_bytes": s.payload,
                    "tls": s.tls,
                    "streams_per_connection": args.streams_per_connection,
                    "results": run.results,
                    "skipped": run.skipped,
                })
            })
            .collect();
        let out = json!({
            "machine": machine,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "settings": {
                "updates": args.updates,
                "update_gap_ms": args.update_gap.as_millis() as u64,
                "burst": args.burst,
                "burst_gap_ms": args.burst_gap.as_millis() as u64,
                "settle_ms": args.settle.as_millis() as u64,
                "first_snapshot_samples": args.first_snapshot_samples,
                "threads": args.threads,
                "smoke": args.smoke,
            },
            "go_note": go_note,
            "correct": ok,
            "scenarios": scenarios,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.keep_workdir {
        eprintln!("working directory kept: {}", workdir.display());
    } else {
        let _ = std::fs::remove_dir_all(&workdir);
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_sequence_number() {
        let doc = json!({"flags": flags(1234, 2048)}).to_string();
        assert_eq!(find_seq(doc.as_bytes()), Some(1234));
        assert_eq!(find_seq(b"{\"flags\":{}}"), None);
    }

    #[test]
    fn documents_have_about_the_asked_size() {
        for payload in [1024, 102_400] {
            let len = json!({"flags": flags(1, payload)}).to_string().len();
            assert!(
                len <= payload && len > payload * 3 / 4,
                "{len} for {payload}"
            );
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let stats = Stats::of((1..=100).map(f64::from).collect());
        assert_eq!(
            (stats.p50_ms, stats.p99_ms, stats.max_ms),
            (Some(50.0), Some(99.0), Some(100.0))
        );
    }
}
