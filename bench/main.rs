//! `flagd-proxy-bench`: fan-out benchmark for flagd sync proxies.
//!
//! Starts a proxy (this project's, and the Go flagd-proxy when its binary is available), opens
//! many `flagd.sync.v1` `SyncFlags` streams against it, rewrites the flag source files and
//! measures how long each version takes to reach every subscriber, whether every subscriber ends
//! on the final version, how long a new subscriber waits for its first snapshot, and what the
//! proxy process costs in memory and CPU time. Prints a Markdown table and can write JSON.
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

// The same control plane the integration tests use: etcd and kube-apiserver on loopback.
#[path = "../tests/support/control_plane.rs"]
mod control_plane;

use control_plane::ControlPlane;

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
const RLIMIT_NOFILE: i32 = 7;
const SC_CLK_TCK: i32 = 2;

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

    /// How the report names the Go binary's column (e.g. for bench/go-fanout-model, which models
    /// the Go proxy's fan-out when the real binary cannot be installed).
    #[arg(long, default_value = "Go flagd-proxy")]
    go_label: String,

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
        if self.go_proxy_bin.is_none() {
            self.no_go = true;
        }
    }
}

fn main() -> anyhow::Result<()> {
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
    Go,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Rust => "flagd-proxy (Rust)",
            Kind::Go => "Go flagd-proxy",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Kind::Rust => "rust",
            Kind::Go => "go",
        }
    }
}

/// A running proxy process, killed on drop.
struct ProxyProcess {
    child: Option<Child>,
    pid: u32,
    port: u16,
    log: PathBuf,
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
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let management_port = free_port()?;
        let log = dir.join("proxy.log");
        let out = std::fs::File::create(&log)?;
        let mut command = Command::new(bin);
        command
            .arg("start")
            .args(["--port", &port.to_string()])
            .args(["--management-port", &management_port.to_string()]);
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
            }
            (Kind::Go, Some(cluster)) => {
                command.env("KUBECONFIG", cluster.proxy_kubeconfig());
            }
            (Kind::Go, None) => {}
        }
        command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            pid: child.id(),
            child: Some(child),
            port,
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

fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
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

#[repr(C)]
struct RLimit {
    current: u64,
    max: u64,
}

unsafe extern "C" {
    fn getrlimit(resource: i32, limit: *mut RLimit) -> i32;
    fn setrlimit(resource: i32, limit: *const RLimit) -> i32;
    fn sysconf(name: i32) -> i64;
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { sysconf(SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Raises the open-file limit (inherited by the proxies started later) to at least `want`.
fn raise_fd_limit(want: usize) -> anyhow::Result<()> {
    let want = want as u64;
    let mut limit = RLimit { current: 0, max: 0 };
    // SAFETY: `limit` is a valid, writable rlimit structure.
    if unsafe { getrlimit(RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error()).context("getrlimit");
    }
    if limit.current >= want {
        return Ok(());
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let raised = RLimit {
        current: want.min(nr_open),
        max: limit.max.max(want.min(nr_open)),
    };
    // SAFETY: `raised` is a valid rlimit structure.
    if unsafe { setrlimit(RLIMIT_NOFILE, &raised) } == 0 {
        return Ok(());
    }
    // Not allowed to raise the hard limit: take what there is.
    let capped = RLimit {
        current: limit.max,
        max: limit.max,
    };
    // SAFETY: as above.
    unsafe { setrlimit(RLIMIT_NOFILE, &capped) };
    if limit.max < want {
        eprintln!(
            "warning: open-file limit is {} (hard), below the {} this run needs",
            limit.max, want
        );
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
            (Kind::Go, None) => {
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
        Ok(match self.kind {
            Kind::Rust => serde_norway::to_string(&self.feature_flag(resource, seq))?,
            // The flagd flag configuration the Go proxy's file sync reads.
            Kind::Go => json!({"flags": flags(seq, self.payload)}).to_string(),
        })
    }

    /// Makes version `seq` of every resource visible to the proxy, calling `visible` (to take
    /// the time) just before: files are written beside the proxy's files, then `visible`, then
    /// renamed into place; resources are created (version 0) or, after `visible`, merge-patched
    /// (only the sequence number changes; the API server sends the whole object).
    async fn write(&self, seq: u64, visible: impl FnOnce()) -> anyhow::Result<()> {
        match &self.backend {
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
                for (i, name) in names.iter().enumerate() {
                    let object = serde_json::from_value(self.feature_flag(i, 0))?;
                    api.create(&kube::api::PostParams::default(), &object)
                        .await
                        .with_context(|| format!("creating FeatureFlag {name}"))?;
                }
                visible();
            }
            Backend::Kubernetes { api, names } => {
                let patch = kube::api::Patch::Merge(json!({
                    "spec": {"flagSpec": {"flags": {SEQ_FLAG: {"metadata": {"benchSeq": seq}}}}}
                }));
                let params = kube::api::PatchParams::default();
                visible();
                let patches = names.iter().map(|name| api.patch(name, &params, &patch));
                for (result, name) in futures::future::join_all(patches)
                    .await
                    .into_iter()
                    .zip(names)
                {
                    result.with_context(|| format!("patching FeatureFlag {name}"))?;
                }
            }
        }
        Ok(())
    }

    /// The size of the flag configuration a subscriber receives, approximately.
    fn document_bytes(&self) -> usize {
        json!({"flags": flags(0, self.payload)}).to_string().len()
    }
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

async fn open_channel(port: u16, source: Option<Ipv4Addr>) -> anyhow::Result<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10));
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
        "{}-{}-n{}-m{}-p{}",
        kind.key(),
        scenario.source.label(),
        scenario.subscribers,
        scenario.resources,
        scenario.payload
    ));
    std::fs::create_dir_all(&dir)?;
    // A control plane of its own for each run, so no run sees another's watches or objects.
    let cluster = match scenario.source {
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
    let mut proxy = ProxyProcess::start(kind, bin, &dir, cluster.as_ref())?;
    let port = proxy.port;
    let pid = proxy.pid;
    let mut result = RunResult {
        proxy: match kind {
            Kind::Rust => kind.label().to_owned(),
            Kind::Go => args.go_label.clone(),
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
            let channel = open_channel(port, None).await?;
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

    // Connect every subscriber and wait for their first snapshots.
    let versions = (1 + args.updates + args.burst) as usize;
    let n = scenario.subscribers;
    let tracker = Arc::new(Tracker::new(n, versions));
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    let connections = n.div_ceil(args.streams_per_connection);
    let mut opened = futures::stream::iter(0..connections)
        .map(|c| async move { (c, open_channel(port, source_addr(c)).await) })
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
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    result.connect_seconds = started.elapsed().as_secs_f64();
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
            let channel = open_channel(port, source_addr(i)).await?;
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

fn markdown_table(
    scenario: &Scenario,
    results: &BTreeMap<&'static str, RunResult>,
    go_label: &str,
) -> String {
    let rust = results.get("rust");
    let go = results.get("go");
    let doc = rust.or(go).map(|r| r.document_bytes).unwrap_or_default();
    let mut out = format!(
        "### {} subscribers, {} resource(s), {} B document, {} source\n\n",
        scenario.subscribers,
        scenario.resources,
        doc,
        scenario.source.label()
    );
    out.push_str(&format!(
        "| metric | flagd-proxy (Rust) | {go_label} | Go / Rust |\n|---|---:|---:|---:|\n"
    ));
    type Getter = fn(&RunResult) -> Option<f64>;
    let rows: [(&str, Getter, usize); 23] = [
        (
            "subscribers connected",
            |r| Some(r.subscribers_connected as f64),
            0,
        ),
        (
            "connect all subscribers (s)",
            |r| Some(r.connect_seconds),
            1,
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
    for (name, get, digits) in rows {
        let r = rust.and_then(get);
        let g = go.and_then(get);
        let ratio = match (r, g) {
            (Some(r), Some(g)) if r > 0.0 => format!("{:.2}", g / r),
            _ => "–".to_owned(),
        };
        let cell = |run: Option<&RunResult>, v: Option<f64>| match run {
            None => "not run".to_owned(),
            Some(_) => fmt_opt(v, digits),
        };
        out.push_str(&format!(
            "| {name} | {} | {} | {ratio} |\n",
            cell(rust, r),
            cell(go, g)
        ));
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

/// The targets, checked against the Rust proxy's runs with at least 10,000 subscribers on one
/// resource and a document of about 1 KiB.
fn targets(runs: &[(Scenario, BTreeMap<&'static str, RunResult>)]) -> String {
    let mut out =
        String::from("### Targets\n\n| target | source | measured | met |\n|---|---|---|---|\n");
    let mut any = false;
    for (scenario, results) in runs {
        if scenario.subscribers < 10_000 || scenario.resources != 1 || scenario.payload > 2048 {
            continue;
        }
        let Some(r) = results.get("rust") else {
            continue;
        };
        any = true;
        let yes = |ok: bool| if ok { "yes" } else { "**no**" };
        let mut row = |name: &str, measured: String, ok: bool| {
            out.push_str(&format!(
                "| {name} | {} | {measured} | {} |\n",
                scenario.source.label(),
                yes(ok)
            ));
        };
        let p99 = r.propagation.p99_ms;
        row(
            "propagation p99 < 100 ms",
            format!("{} ms", fmt_opt(p99, 1)),
            p99.is_some_and(|v| v < 100.0) && r.updates_incomplete == 0,
        );
        row(
            "0 stale subscribers",
            r.stale_after_settle.to_string(),
            r.stale_after_settle == 0,
        );
        row(
            "RSS < 100 MiB",
            format!("{:.1} MiB (peak {:.1})", r.rss_idle_mib, r.rss_peak_mib),
            r.rss_peak_mib < 100.0,
        );
        row(
            "< 10 KiB per idle subscriber",
            format!("{:.2} KiB", r.kib_per_idle_subscriber),
            r.kib_per_idle_subscriber < 10.0,
        );
        let ttfs = r.first_snapshot.p99_ms;
        row(
            "time to first snapshot p99 < 5 ms",
            format!("{} ms", fmt_opt(ttfs, 2)),
            ttfs.is_some_and(|v| v < 5.0),
        );
        if let Some(g) = results.get("go") {
            row(
                "lower propagation p99 than Go",
                format!(
                    "{} vs {} ms",
                    fmt_opt(p99, 1),
                    fmt_opt(g.propagation.p99_ms, 1)
                ),
                match (p99, g.propagation.p99_ms) {
                    (Some(r), Some(g)) => r < g,
                    (Some(_), None) => true,
                    _ => false,
                },
            );
            row(
                "lower CPU per update than Go",
                format!(
                    "{:.3} vs {:.3} s",
                    r.cpu_seconds_per_update, g.cpu_seconds_per_update
                ),
                r.cpu_seconds_per_update < g.cpu_seconds_per_update,
            );
            row(
                "lower RSS than Go",
                format!("{:.1} vs {:.1} MiB", r.rss_peak_mib, g.rss_peak_mib),
                r.rss_peak_mib < g.rss_peak_mib,
            );
            row(
                "no lost final versions (Go loses some)",
                format!("{} vs {} stale", r.stale_after_settle, g.stale_after_settle),
                r.stale_after_settle == 0,
            );
        }
    }
    if !any {
        out.push_str("| (no run with ≥ 10,000 subscribers, 1 resource, 1 KiB) | | | |\n");
    }
    out.push('\n');
    out
}

fn default_go_bin() -> Option<PathBuf> {
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
                });
            }
        }
    }
    for scenario in scenarios {
        {
            let mut results = BTreeMap::new();
            for (kind, bin) in &kinds {
                let label = match kind {
                    Kind::Rust => kind.label(),
                    Kind::Go => args.go_label.as_str(),
                };
                eprintln!(
                    "{label}: {} subscribers, {} resource(s), {} B payload, {} source",
                    scenario.subscribers,
                    scenario.resources,
                    scenario.payload,
                    scenario.source.label()
                );
                match run_one(*kind, bin, scenario, &args, &workdir).await {
                    Ok(result) => {
                        if *kind == Kind::Rust && !result.correct(scenario.subscribers) {
                            ok = false;
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
            runs.push((scenario, results));
        }
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
    for (scenario, results) in &runs {
        report.push_str(&markdown_table(scenario, results, &args.go_label));
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
            .map(|(s, results)| {
                json!({
                    "source": s.source,
                    "subscribers": s.subscribers,
                    "resources": s.resources,
                    "payload_bytes": s.payload,
                    "streams_per_connection": args.streams_per_connection,
                    "results": results,
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
