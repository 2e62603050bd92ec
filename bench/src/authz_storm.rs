//! Authorization in a reconnect storm (`--authz-storm`): what this proxy's authorization costs
//! the API server when thousands of clients of a few identities connect, and then all reconnect
//! at once, measured with the API server's own count of the requests it answered
//! (`apiserver_request_total`, and `apiserver_longrunning_requests` for the watches still open).
//!
//! One control plane for the sitting (`cluster.rs`): namespaces with a FeatureFlag each, and
//! the identities: a ServiceAccount with a token and a running pod at 127.0.0.(10 + i) each.
//! Then per mode, a fresh proxy: every client connects (`clients.rs`; from its identity's
//! address, with its token where the mode uses tokens) until each has its snapshot — the cold
//! phase, where the proxy decides for the first time — then every connection is dropped and
//! every client reconnects within `--storm-spread`: the storm, where decisions made less than
//! `--authz-cache-ttl` ago are still cached. The requests of each phase are set against the
//! target: at most 2 per identity plus 10 (`report.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::bail;
use flagd_proxy_testkit::control_plane::RequestCounts;

use crate::args::Args;
use crate::kit::header::Clock;
use crate::load::Dial;
use crate::options::AuthzMode;
use crate::proxy::{Kind, ProxyProcess};
use crate::sampling::{RssGuard, mib, proc_sample};
use crate::sitting::rust_bin;
use crate::storm;
use crate::verdict::publish;

mod clients;
mod cluster;
mod report;

use clients::{Client, Crowd, Start};
use cluster::Cluster;
use report::{ModeRun, PhaseResult, Summary};

/// How long a proxy may take to answer `/readyz`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// `--authz-storm`: every mode of `--authz-modes`, printed and written; the exit status (1 when
/// a client was not served or a phase missed its target).
pub(crate) async fn main(args: &Args) -> anyhow::Result<u8> {
    let bin = rust_bin(args)?;
    if !bin.exists() {
        bail!(
            "{} not found: build it (cargo build --release --bin flagd-proxy) or pass --proxy-bin",
            bin.display()
        );
    }
    let workdir =
        std::env::temp_dir().join(format!("flagd-proxy-bench-authz-{}", std::process::id()));
    std::fs::create_dir_all(&workdir)?;
    let clock = Clock::start();
    eprintln!(
        "authorization storm: {} clients of {} identities",
        args.subscribers, args.authz_identities
    );
    let cluster = Cluster::start(usize::from(args.authz_identities)).await?;
    let mut runs = Vec::new();
    for &mode in &args.authz_modes {
        eprintln!("  mode: {}", mode.label());
        let dir = workdir.join(format!("{mode:?}").to_lowercase());
        std::fs::create_dir_all(&dir)?;
        let outcome = run_mode(args, &cluster, &bin, &dir, mode).await;
        if let Err(error) = &outcome {
            eprintln!("  {} failed: {error:#}", mode.label());
        }
        runs.push(ModeRun {
            mode,
            outcome: outcome.map_err(|e| format!("{e:#}")),
        });
    }
    let summary = Summary {
        args,
        identities: cluster.identities.len(),
        namespaces: cluster.namespaces,
        header: clock.stop(),
    };
    drop(cluster);
    let problems = summary.problems(&runs);
    let markdown = summary.markdown(&runs, &problems);
    publish(
        args,
        &workdir,
        &markdown,
        || summary.json(&runs, &problems),
        &problems,
    )
}

/// The clients: `--subscribers` of them, dealt round-robin to the identities.
fn clients(args: &Args, cluster: &Cluster, mode: AuthzMode) -> Vec<Client> {
    let identities = &cluster.identities;
    (0..args.subscribers)
        .map(|slot| {
            let identity = &identities[slot % identities.len()];
            Client {
                address: identity.address,
                authorization: mode.tokens().then(|| identity.authorization.clone()),
                selector: identity.selector.clone(),
            }
        })
        .collect()
}

/// One mode: a fresh proxy, every client connected (cold), then the storm (warm).
async fn run_mode(
    args: &Args,
    cluster: &Cluster,
    bin: &Path,
    dir: &Path,
    mode: AuthzMode,
) -> anyhow::Result<[PhaseResult; 2]> {
    let mut extra: Vec<String> = mode.proxy_args().iter().map(|a| (*a).to_owned()).collect();
    // Each identity's clients share one address: more than the per-address default of pending
    // requests arrive at once in the storm (in production, one address is one pod).
    extra.push("--max-pending-requests-per-address=0".to_owned());
    extra.extend(args.proxy_arg.iter().cloned());
    let clients = clients(args, cluster, mode);
    let pod_watches = match mode.pod_ip() {
        true => Some(cluster.pod_watches().await),
        false => None,
    };
    let mut proxy = ProxyProcess::start(
        Kind::Rust,
        bin,
        dir,
        Some(&cluster.cp),
        None,
        1024,
        cluster.namespaces,
        &extra,
    )?;
    let guard = RssGuard::spawn(proxy.pid, args.max_rss_mib);
    let phases = phases(args, cluster, &mut proxy, pod_watches, &clients).await;
    let killed = guard.killed();
    drop(guard);
    drop(proxy);
    if let Some(before) = pod_watches {
        // Until the API server has ended this proxy's watch, it would count it in the next run.
        let what = "the stopped proxy's pod watch did not end";
        cluster
            .wait_for_pod_watches(what, |open| open <= before)
            .await?;
    }
    if killed {
        bail!("the proxy's RSS went over {} MiB", args.max_rss_mib);
    }
    phases
}

/// The two phases against a started proxy. Each phase's requests are those counted from just
/// before its clients start until its clients are gone and the proxy has closed their
/// connections (so that the API server has counted whatever it answered last).
async fn phases(
    args: &Args,
    cluster: &Cluster,
    proxy: &mut ProxyProcess,
    pod_watches: Option<u64>,
    clients: &[Client],
) -> anyhow::Result<[PhaseResult; 2]> {
    wait_ready(proxy).await?;
    if let Some(before) = pod_watches {
        // Until its pod watch has listed every pod, the proxy looks addresses up one by one.
        let what = "the proxy's pod watch did not open";
        cluster
            .wait_for_pod_watches(what, |open| open > before)
            .await?;
    }
    let dial = Dial::plain(proxy.port);
    let (pid, n) = (proxy.pid, clients.len());
    let fds_before = storm::open_fds(pid);
    let before = cluster.cp.request_counts().await;
    let in_flight = args.connect_concurrency;
    let (mut cold, crowd) = measure(pid, n, || {
        let deadline = Instant::now() + args.connect_timeout;
        Crowd::start(&dial, clients, Start::Paced { in_flight }, deadline)
    })
    .await;
    drop_all(crowd, pid, fds_before).await;
    let between = cluster.cp.request_counts().await;
    let (mut warm, crowd) = measure(pid, n, || {
        let deadline = Instant::now() + args.storm_timeout;
        Crowd::start(&dial, clients, Start::Spread(args.storm_spread), deadline)
    })
    .await;
    drop_all(crowd, pid, fds_before).await;
    let after = cluster.cp.request_counts().await;
    cold.requests = requests(&between, &before);
    warm.requests = requests(&after, &between);
    if let Some(status) = proxy.exited() {
        bail!("the proxy exited with {status}:\n{}", proxy.log_tail());
    }
    Ok([cold, warm])
}

/// Drops every client's connection at once and waits (up to 20 s) until the proxy has let go
/// of them: back to `fds_before` open files, give or take a few.
async fn drop_all(crowd: Crowd, pid: u32, fds_before: usize) {
    crowd.drop_all().await;
    let settle = Instant::now() + Duration::from_secs(20);
    while storm::open_fds(pid) > fds_before + 16 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The requests made between two readings, by `VERB resource`.
fn requests(after: &RequestCounts, before: &RequestCounts) -> BTreeMap<String, u64> {
    after
        .since(before)
        .into_iter()
        .map(|((verb, resource), count)| match resource.as_str() {
            "" => (format!("{verb} (non-resource)"), count),
            _ => (format!("{verb} {resource}"), count),
        })
        .collect()
}

/// Waits until the proxy answers `/readyz` (without asking it anything that needs an
/// identity, which would warm its caches).
async fn wait_ready(proxy: &mut ProxyProcess) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = proxy.exited() {
            bail!("the proxy exited with {status}:\n{}", proxy.log_tail());
        }
        let port = proxy.management_port;
        let ready = tokio::task::spawn_blocking(move || storm::readyz(port)).await?;
        if matches!(ready, Ok(true)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the proxy was not ready:\n{}", proxy.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One phase: starts the clients (`start`) and waits until every one is served or has given
/// up; the time, the proxy's CPU time and RSS peak, and what the clients met.
async fn measure(pid: u32, n: usize, start: impl FnOnce() -> Crowd) -> (PhaseResult, Crowd) {
    let cpu_before = proc_sample(pid).cpu_seconds;
    let began = Instant::now();
    let crowd = start();
    let peak_kib = crowd.wait(n, || proc_sample(pid).rss_kib).await;
    let seconds = began.elapsed().as_secs_f64();
    let cpu_seconds = proc_sample(pid).cpu_seconds - cpu_before;
    let counters = &crowd.counters;
    let served = counters.served.load(Ordering::Relaxed);
    let result = PhaseResult {
        clients: n,
        served,
        seconds: (served == n).then_some(seconds),
        refusals: counters.refusals(),
        connect_failures: counters.connect_failures.load(Ordering::Relaxed),
        streams_ended: counters.streams_ended.load(Ordering::Relaxed),
        cpu_seconds,
        rss_peak_mib: mib(peak_kib),
        requests: BTreeMap::new(),
    };
    (result, crowd)
}
