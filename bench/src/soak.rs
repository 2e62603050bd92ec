//! `--soak`: hours of churn compressed, against this proxy reading manifest files, with the
//! proxy's memory, open files, threads, streams, connections and watches sampled throughout.
//!
//! 1. **Warm-up**: `--soak-resources` manifests (version 0), the proxy started on them, and
//!    `--soak-subscribers` steady streams over `--soak-connections` connections, each on
//!    version 0. Then the **baseline** sample.
//! 2. **Churn**, all at once and each spread evenly over `--soak-updates` /
//!    `--soak-update-rate` seconds: the steady manifests rewritten round-robin (a thread of its
//!    own, `files.rs`); `--soak-connects` short-lived connections that open a stream, take the
//!    first version and close, gracefully or abruptly, at once or after holding the stream; and
//!    `--soak-lifecycles` resources that appear and disappear with subscribers asking for them
//!    before and while they exist, or that never appear (`clients.rs`). The proxy is sampled
//!    every `--soak-sample-every` (`probe.rs`).
//! 3. **Cool-down**: the churn stops; every steady subscriber must reach the final version of
//!    its resource; once streams, connections, watches and resources waited on are back (or
//!    `--soak-idle-timeout` + `--soak-timeout` have passed) and `--soak-quiet` more, the **end**
//!    sample. Each quantity must be within its tolerance of the baseline (`judge.rs`).
//!
//! A run that finds a quantity beyond its tolerance, or a subscriber wrong, prints and writes
//! its report, names each problem on standard error and exits with status 1.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::args::Args;
use crate::documents::document;
use crate::kit::header::{Clock, Header};
use crate::kit::table::Table;
use crate::load::{Dial, open_channel, open_stream};
use crate::proxy::{Kind, ProxyProcess};
use crate::sampling::RssGuard;
use crate::sitting::rust_bin;
use crate::verdict::EXIT_INCORRECT;

mod clients;
mod files;
mod judge;
pub(crate) mod probe;

use clients::{Churn, ChurnCounts, LIFECYCLE_LOOPS, Pace, SteadyTracker, connect_steady};
use files::{Dirs, Steady, Written};
use judge::{Correctness, Judged};
use probe::{Phase, Sample, Sampler};

/// The soak's settings, as the report gives them.
#[derive(Debug, Clone, serde::Serialize)]
struct Settings {
    updates: u64,
    update_rate: u64,
    connects: u64,
    lifecycles: u64,
    resources: usize,
    subscribers: usize,
    connections: usize,
    concurrency: usize,
    idle_timeout: String,
    sample_every: String,
    timeout: String,
    quiet: String,
    payload_bytes: usize,
    document_bytes: usize,
}

/// Everything a soak found.
#[derive(Debug, serde::Serialize)]
struct SoakReport {
    settings: Settings,
    #[serde(flatten)]
    header: Header,
    seconds_warm_up: f64,
    seconds_churn: f64,
    seconds_cool_down: f64,
    updates_written: u64,
    /// `flagd_proxy_versions_published_total` at the end less at the baseline.
    versions_published: Option<f64>,
    /// `flagd_proxy_updates_sent_total` at the end less at the baseline.
    messages_sent: Option<f64>,
    /// CPU time of the proxy and of this load generator during the churn.
    churn_cpu_seconds: f64,
    churn_load_generator_cpu_seconds: f64,
    /// Versions each steady subscriber received during the soak: fewest, median, most.
    steady_received: (u64, u64, u64),
    steady_repeats: u64,
    churn: ChurnCounts,
    quantities: Vec<Judged>,
    correctness: Correctness,
    churn_errors: Vec<String>,
    last_steady_error: Option<String>,
    problems: Vec<String>,
    samples: Vec<Sample>,
}

/// Runs the soak, prints and writes its report; the exit status.
pub(crate) async fn main(args: &Args) -> anyhow::Result<u8> {
    if args.soak_resources == 0
        || args.soak_subscribers == 0
        || args.soak_connections == 0
        || args.soak_update_rate == 0
    {
        bail!(
            "--soak-resources, --soak-subscribers, --soak-connections and --soak-update-rate must be positive"
        );
    }
    let workdir =
        std::env::temp_dir().join(format!("flagd-proxy-bench-soak-{}", std::process::id()));
    std::fs::create_dir_all(&workdir)?;
    let outcome = soak(args, &workdir).await;
    if args.keep_workdir {
        eprintln!("working directory kept: {}", workdir.display());
    } else {
        let _ = std::fs::remove_dir_all(&workdir);
    }
    let report = match outcome {
        Ok(report) => report,
        Err(error) => {
            eprintln!("flagd-proxy-bench: FAILED: soak: the run failed: {error:#}");
            return Ok(EXIT_INCORRECT);
        }
    };
    let markdown = markdown(&report);
    println!("{markdown}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &markdown).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    for problem in &report.problems {
        eprintln!("flagd-proxy-bench: FAILED: soak: {problem}");
    }
    Ok(if report.problems.is_empty() {
        0
    } else {
        EXIT_INCORRECT
    })
}

/// The soak itself: warm-up, churn, cool-down.
async fn soak(args: &Args, workdir: &Path) -> anyhow::Result<SoakReport> {
    let clock = Clock::start();
    let steady = Arc::new(Steady::create(
        Dirs::new(workdir)?,
        args.soak_resources,
        args.soak_payload_bytes,
    )?);
    let mut proxy = start_proxy(args, workdir)?;
    let probe = Probe::of(&proxy, clock.began());
    let guard = RssGuard::spawn(probe.pid, args.max_rss_mib);
    let dial = Dial::plain(proxy.port);
    let warm = warm_up(args, &probe, &mut proxy, &dial, &steady).await?;
    let (tracker, mut steady_tasks) = (warm.tracker, warm.tasks);
    let (sampler, baseline) = (warm.sampler, warm.baseline);
    let seconds_warm_up = probe.began.elapsed().as_secs_f64();
    let churned = churn_phase(args, &probe, &sampler, &steady, &mut proxy, dial.port).await;

    let cool_began = Instant::now();
    sampler.set_phase(Phase::CoolDown);
    let stale = tracker.wait_on(&steady.finals(), args.soak_timeout).await;
    let end = cool_down(args, &probe, &baseline).await;
    sampler.push(end.clone());
    let seconds_cool_down = cool_began.elapsed().as_secs_f64();
    steady_tasks.abort_all();
    while steady_tasks.join_next().await.is_some() {}
    let samples = sampler.stop();
    let ending = Ending::of(stale, proxy, guard);
    let quantities = judge::judge(&judge::quantities(), &baseline, &during(&samples), &end);
    let correctness = correctness(args, ending, &tracker, &churned);
    let problems = [judge::leaks(&quantities), correctness.problems()].concat();
    let (written, churn_end) = (&churned.written, &churned.end);
    let churn_errors = churned.errors();
    let delta = |get: fn(&Sample) -> Option<f64>| Some(get(&end)? - get(&baseline)?);
    let Ok(churn) = Arc::try_unwrap(churned.churn) else {
        bail!("a churn task outlived the churn");
    };
    Ok(SoakReport {
        settings: settings(args),
        header: clock.stop(),
        seconds_warm_up,
        seconds_churn: churned.seconds,
        seconds_cool_down,
        updates_written: written.updates,
        versions_published: delta(|s| s.published),
        messages_sent: delta(|s| s.updates_sent),
        churn_cpu_seconds: churn_end.cpu_seconds - baseline.cpu_seconds,
        churn_load_generator_cpu_seconds: churn_end.load_generator_cpu_seconds
            - baseline.load_generator_cpu_seconds,
        steady_received: tracker.received_spread(),
        steady_repeats: get(&tracker.repeats),
        churn: churn.counts,
        quantities,
        correctness,
        churn_errors,
        last_steady_error: tracker.failures.last(),
        problems,
        samples,
    })
}

/// How the soak ended: the steady subscribers not on their final version, how the proxy exited
/// if it did, and whether it was killed for its memory.
struct Ending {
    stale: usize,
    proxy_exited: Option<String>,
    killed_for_rss: bool,
}

impl Ending {
    /// Stops the proxy and its guard; how they ended.
    fn of(stale: usize, mut proxy: ProxyProcess, guard: RssGuard) -> Self {
        let ending = Ending {
            stale,
            proxy_exited: exit_note(&mut proxy),
            killed_for_rss: guard.killed(),
        };
        drop(guard);
        drop(proxy);
        ending
    }
}

/// The correctness half of the verdict: what the steady subscribers saw, what the churn failed
/// or left undone, and how the soak ended.
fn correctness(
    args: &Args,
    ending: Ending,
    tracker: &SteadyTracker,
    churned: &Churned,
) -> Correctness {
    let counts = &churned.churn.counts;
    let mut not_done = not_done(args, counts, &churned.written);
    if let Some(why) = &churned.stopped_why {
        not_done.push(format!("the churn stopped early: {why}"));
    }
    if ending.killed_for_rss {
        not_done.push(format!(
            "the proxy was killed for going over --max-rss-mib ({} MiB)",
            args.max_rss_mib
        ));
    }
    Correctness {
        steady_subscribers: args.soak_subscribers,
        stale: ending.stale,
        steady_stream_errors: tracker.failures.errors(),
        steady_backwards: get(&tracker.backwards),
        steady_unparsed: tracker.failures.unparsed(),
        connect_failures: get(&counts.connect_failures),
        lifecycle_failures: get(&counts.lifecycle_failures),
        not_done,
        write_errors: churned.written.errors,
        proxy_exited: ending.proxy_exited,
    }
}

/// This proxy on the steady manifests, with the soak's idle timeout.
fn start_proxy(args: &Args, workdir: &Path) -> anyhow::Result<ProxyProcess> {
    let bin = rust_bin(args)?;
    anyhow::ensure!(
        bin.exists(),
        "{} not found: build it (cargo build --release --bin flagd-proxy) or pass --proxy-bin",
        bin.display()
    );
    let idle_timeout = humantime::format_duration(args.soak_idle_timeout).to_string();
    ProxyProcess::start(
        Kind::Rust,
        &bin,
        workdir,
        None,
        None,
        args.soak_payload_bytes,
        args.soak_resources + 2 * LIFECYCLE_LOOPS * 8 + 16,
        &["--idle-timeout".to_owned(), idle_timeout],
    )
}

/// Where the proxy is sampled: its process, its management port, and the soak's start.
struct Probe {
    pid: u32,
    port: u16,
    began: Instant,
}

impl Probe {
    fn of(proxy: &ProxyProcess, began: Instant) -> Self {
        Probe {
            pid: proxy.pid,
            port: proxy.management_port,
            began,
        }
    }

    async fn sample(&self, phase: Phase) -> Sample {
        sample(self.pid, self.port, self.began, phase).await
    }

    /// Waits until `done` holds for a sample, or `timeout`.
    async fn settle(&self, timeout: Duration, done: impl Fn(&Sample) -> bool) {
        settle(self.pid, self.port, self.began, timeout, done).await;
    }
}

/// What the warm-up leaves: the steady subscribers on the first version, the sampler running,
/// and the baseline.
struct Warm {
    tracker: Arc<SteadyTracker>,
    tasks: tokio::task::JoinSet<()>,
    sampler: Sampler,
    baseline: Sample,
}

/// The warm-up: the proxy ready, every steady subscriber on version 0 and its streams and
/// connections counted by the proxy; then the baseline sample.
async fn warm_up(
    args: &Args,
    probe: &Probe,
    proxy: &mut ProxyProcess,
    dial: &Dial,
    steady: &Steady,
) -> anyhow::Result<Warm> {
    wait_ready(proxy, dial, &steady.selector(0)).await?;
    let tracker = Arc::new(SteadyTracker::new(args.soak_subscribers));
    let (subscribers, connections) = (args.soak_subscribers, args.soak_connections);
    let tasks = connect_steady(dial, steady, subscribers, connections, &tracker).await?;
    let zeros = vec![0; args.soak_resources];
    let waiting = tracker.wait_on(&zeros, args.soak_timeout).await;
    anyhow::ensure!(
        waiting == 0,
        "{waiting} steady subscriber(s) did not get the first version within {:?}",
        args.soak_timeout
    );
    let sampler = Sampler::spawn(probe.pid, probe.port, probe.began, args.soak_sample_every);
    let steady_counts = |s: &Sample| {
        s.streams == Some(subscribers as f64) && s.connections == Some(connections as f64)
    };
    probe.settle(args.soak_timeout, steady_counts).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline = probe.sample(Phase::WarmUp).await;
    sampler.push(baseline.clone());
    eprintln!(
        "soak: baseline after {:.1} s: RSS {:.1} MiB, {} fds, {} threads, {} streams, {} watches",
        probe.began.elapsed().as_secs_f64(),
        baseline.rss_kib.unwrap_or(0.0) / 1024.0,
        baseline.fds.unwrap_or(0.0),
        baseline.threads.unwrap_or(0.0),
        baseline.streams.unwrap_or(0.0),
        baseline.watches.unwrap_or(0.0)
    );
    Ok(Warm {
        tracker,
        tasks,
        sampler,
        baseline,
    })
}

/// The cool-down: waits until the counts are back at the baseline (or the idle timeout and
/// `--soak-timeout` passed), then `--soak-quiet`; the end sample.
async fn cool_down(args: &Args, probe: &Probe, baseline: &Sample) -> Sample {
    // Back: the counts at their baseline, and the threads within their tolerance (the proxy's
    // idle blocking threads go a while after the churn's last parse, not at once).
    let back = |s: &Sample| {
        let threads_back = match (s.threads, baseline.threads) {
            (Some(now), Some(then)) => now <= then + judge::THREADS_PLUS,
            _ => true,
        };
        threads_back
            && [
                (s.streams, baseline.streams),
                (s.connections, baseline.connections),
                (s.watches, baseline.watches),
                (s.waiting, baseline.waiting),
            ]
            .iter()
            .all(|(now, then)| now.is_some() && now == then)
    };
    probe
        .settle(args.soak_idle_timeout + args.soak_timeout, back)
        .await;
    tokio::time::sleep(args.soak_quiet).await;
    probe.sample(Phase::CoolDown).await
}

/// How the proxy exited, with the end of its log, if it did.
fn exit_note(proxy: &mut ProxyProcess) -> Option<String> {
    proxy.exited().map(|status| {
        let tail = proxy.log_tail();
        let tail: Vec<&str> = tail.lines().rev().take(4).collect();
        format!("{status}; its log ended: {}", tail.join(" / "))
    })
}

/// What the churn phase leaves: the churn's counts and errors, the steady updates written, why
/// it stopped early, the sample at its end, and how long it took.
struct Churned {
    churn: Arc<Churn>,
    written: Written,
    stopped_why: Option<String>,
    end: Sample,
    seconds: f64,
}

impl Churned {
    /// The errors of the churn's tasks, and the writer's last.
    fn errors(&self) -> Vec<String> {
        let mut errors = probe::lock(&self.churn.errors).clone();
        errors.extend(self.written.last_error.clone());
        errors
    }
}

/// The churn: updates, short-lived connections and resource lifecycles at once.
async fn churn_phase(
    args: &Args,
    probe: &Probe,
    sampler: &Sampler,
    steady: &Arc<Steady>,
    proxy: &mut ProxyProcess,
    port: u16,
) -> Churned {
    sampler.set_phase(Phase::Churn);
    let began = Instant::now();
    let (churn, written, stopped_why) = run_churn(args, steady, proxy, port, began).await;
    let end = probe.sample(Phase::Churn).await;
    sampler.push(end.clone());
    let seconds = began.elapsed().as_secs_f64();
    let counts = &churn.counts;
    eprintln!(
        "soak: churn done in {seconds:.1} s: {} updates, {} connects, {} lifecycles",
        written.updates,
        get(&counts.connects),
        get(&counts.lifecycles_appearing) + get(&counts.lifecycles_never)
    );
    Churned {
        churn,
        written,
        stopped_why,
        end,
        seconds,
    }
}

/// The samples taken during the churn.
fn during(samples: &[Sample]) -> Vec<Sample> {
    samples
        .iter()
        .filter(|s| s.phase == Phase::Churn)
        .cloned()
        .collect()
}

/// The updates, short-lived connections and lifecycles the churn did not do, in words.
fn not_done(args: &Args, counts: &ChurnCounts, written: &Written) -> Vec<String> {
    let connects = get(&counts.connects) + get(&counts.connect_failures);
    let lifecycles = get(&counts.lifecycles_appearing)
        + get(&counts.lifecycles_never)
        + get(&counts.lifecycle_failures);
    [
        (written.updates, args.soak_updates, "updates"),
        (connects, args.soak_connects, "short-lived connections"),
        (lifecycles, args.soak_lifecycles, "resource lifecycles"),
    ]
    .into_iter()
    .filter(|(done, wanted, _)| done < wanted)
    .map(|(done, wanted, what)| format!("{} of {wanted} {what} not done", wanted - done))
    .collect()
}

/// Waits until a probe stream for `selector` gets version 0.
async fn wait_ready(proxy: &mut ProxyProcess, dial: &Dial, selector: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = proxy.exited() {
            bail!("the proxy exited with {status}:\n{}", proxy.log_tail());
        }
        let probe = async {
            let channel = open_channel(dial, None).await?;
            let mut stream = open_stream(channel, selector).await?;
            stream.message().await?.context("stream ended")
        };
        match tokio::time::timeout(Duration::from_secs(5), probe).await {
            Ok(Ok(0)) => return Ok(()),
            Ok(Ok(seq)) => bail!("the probe got version {seq}, expected 0"),
            _ if Instant::now() > deadline => {
                bail!("the proxy did not serve a snapshot:\n{}", proxy.log_tail())
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A sample, taken on a blocking thread.
async fn sample(pid: u32, management_port: u16, began: Instant, phase: Phase) -> Sample {
    tokio::task::spawn_blocking(move || probe::take(pid, management_port, began, phase))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Samples every 250 ms until `done` holds for a sample, or `timeout`.
async fn settle(
    pid: u32,
    management_port: u16,
    began: Instant,
    timeout: Duration,
    done: impl Fn(&Sample) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done(&sample(pid, management_port, began, Phase::CoolDown).await) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The churn: the writer, the short-lived connections and the lifecycles, until all are done
/// or the proxy exits. Why it stopped early, if it did.
async fn run_churn(
    args: &Args,
    steady: &Arc<Steady>,
    proxy: &mut ProxyProcess,
    port: u16,
    start: Instant,
) -> (Arc<Churn>, Written, Option<String>) {
    let stop = Arc::new(AtomicBool::new(false));
    let over = Duration::from_secs_f64(args.soak_updates as f64 / args.soak_update_rate as f64);
    let writer = files::spawn_writer(
        steady.clone(),
        args.soak_updates,
        args.soak_update_rate,
        start,
        stop.clone(),
    );
    let churn = Arc::new(Churn::new(
        port,
        steady.clone(),
        args.soak_payload_bytes,
        args.soak_timeout,
        stop.clone(),
    ));
    let mut tasks = tokio::task::JoinSet::new();
    let (connects, lifecycles) = (args.soak_connects, args.soak_lifecycles);
    let concurrency = args.soak_concurrency;
    let pace = |count: u64| Pace::new(start, count, over);
    churn.spawn_connects(&mut tasks, concurrency, connects, pace(connects));
    churn.spawn_lifecycles(&mut tasks, lifecycles, pace(lifecycles));
    let mut stopped_why = None;
    let mut last_progress = Instant::now();
    loop {
        if stopped_why.is_none() {
            if let Some(status) = proxy.exited() {
                stopped_why = Some(format!("the proxy exited ({status})"));
                stop.store(true, Ordering::Relaxed);
            } else if stop.load(Ordering::Relaxed) {
                stopped_why = Some("too many short-lived connections or lifecycles failed".into());
            }
        }
        if tasks.is_empty() && writer.is_finished() {
            break;
        }
        while tasks.try_join_next().is_some() {}
        if last_progress.elapsed() >= Duration::from_secs(30) {
            last_progress = Instant::now();
            progress(start, steady, &churn.counts);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let written = writer.join().unwrap_or_else(|_| Written {
        last_error: Some("the writer panicked".into()),
        errors: 1,
        ..Written::default()
    });
    (churn, written, stopped_why)
}

/// A progress line of the churn.
fn progress(start: Instant, steady: &Steady, counts: &ChurnCounts) {
    eprintln!(
        "soak: {:.0} s into the churn: {} updates written, {} connects, {} lifecycles",
        start.elapsed().as_secs_f64(),
        steady.written.iter().map(get).sum::<u64>(),
        get(&counts.connects),
        get(&counts.lifecycles_appearing) + get(&counts.lifecycles_never)
    );
}

fn settings(args: &Args) -> Settings {
    let text = |d: Duration| humantime::format_duration(d).to_string();
    Settings {
        updates: args.soak_updates,
        update_rate: args.soak_update_rate,
        connects: args.soak_connects,
        lifecycles: args.soak_lifecycles,
        resources: args.soak_resources,
        subscribers: args.soak_subscribers,
        connections: args.soak_connections,
        concurrency: args.soak_concurrency,
        idle_timeout: text(args.soak_idle_timeout),
        sample_every: text(args.soak_sample_every),
        timeout: text(args.soak_timeout),
        quiet: text(args.soak_quiet),
        payload_bytes: args.soak_payload_bytes,
        // The flag configuration the subscribers get.
        document_bytes: document(0, args.soak_payload_bytes).len(),
    }
}

/// The Markdown report.
fn markdown(report: &SoakReport) -> String {
    let s = &report.settings;
    let mut out = String::from("## flagd-proxy soak\n\n");
    out.push_str(&format!(
        "{} (warm-up {:.0} s, churn {:.0} s, cool-down {:.0} s).\n\n",
        report.header.sentence(),
        report.seconds_warm_up,
        report.seconds_churn,
        report.seconds_cool_down,
    ));
    out.push_str(&settings_line(s));
    out.push_str(&judge::table(&report.quantities));
    out.push_str("\nTokio tasks: not observable (the proxy exports no count of them); its tasks are per connection, per stream and per watch, counted above, and threads.\n\n");
    let mut table = Table::new(["churn", "count"], "lr");
    for (name, value) in churn_rows(report) {
        table.row([name.to_owned(), value]);
    }
    out.push_str(&table.markdown());
    for error in &report.churn_errors {
        out.push_str(&format!("\nchurn error: {error}\n"));
    }
    if let Some(error) = &report.last_steady_error {
        out.push_str(&format!("\nlast steady subscriber error: {error}\n"));
    }
    out.push('\n');
    if report.problems.is_empty() {
        out.push_str(&format!(
            "Soak: every quantity back within its tolerance of the baseline, and every one of the {} steady subscribers on the final version of its resource.\n",
            s.subscribers
        ));
    } else {
        out.push_str(&format!(
            "Soak: **FAILED** (the run exits with status {EXIT_INCORRECT}):\n\n"
        ));
        for problem in &report.problems {
            out.push_str(&format!("- {problem}\n"));
        }
    }
    out
}

/// The settings of the soak in a paragraph.
fn settings_line(s: &Settings) -> String {
    format!(
        "Settings: this proxy on manifest files (`--manifests`, `--idle-timeout {}`); {} steady resources ({} B documents); {} steady subscribers over {} connections; {} updates at {}/s; {} short-lived connections ({} at a time); {} resource lifecycles ({} at a time); a sample every {}; cool-down: {} to settle, then {} quiet.\n\n",
        s.idle_timeout,
        s.resources,
        s.document_bytes,
        s.subscribers,
        s.connections,
        s.updates,
        s.update_rate,
        s.connects,
        s.concurrency,
        s.lifecycles,
        LIFECYCLE_LOOPS,
        s.sample_every,
        s.timeout,
        s.quiet,
    )
}

/// The rows of the churn table: what the churn wrote, published and sent, and its connections
/// and lifecycles.
fn churn_rows(report: &SoakReport) -> Vec<(&'static str, String)> {
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "–".into());
    let (min, median, max) = report.steady_received;
    let mut rows = vec![
        (
            "steady-resource updates written (renames)",
            report.updates_written.to_string(),
        ),
        (
            "versions published (`flagd_proxy_versions_published_total`, end − baseline, every resource)",
            opt(report.versions_published),
        ),
        (
            "messages sent (`flagd_proxy_updates_sent_total`, end − baseline)",
            opt(report.messages_sent),
        ),
        (
            "versions received per steady subscriber: fewest / median / most",
            format!("{min} / {median} / {max}"),
        ),
    ];
    rows.extend(count_rows(&report.churn));
    rows.push((
        "CPU time during the churn: proxy / load generator (s)",
        format!(
            "{:.1} / {:.1}",
            report.churn_cpu_seconds, report.churn_load_generator_cpu_seconds
        ),
    ));
    let c = &report.churn;
    let failed = |a: &AtomicU64, b: &AtomicU64| format!("{} / {}", get(a), get(b));
    rows.push((
        "failed: short-lived connections / lifecycles",
        failed(&c.connect_failures, &c.lifecycle_failures),
    ));
    rows
}

/// The short-lived connections and the resource lifecycles the churn did.
fn count_rows(c: &ChurnCounts) -> Vec<(&'static str, String)> {
    let pair = |a: &AtomicU64, b: &AtomicU64| format!("{} / {}", get(a), get(b));
    vec![
        (
            "short-lived connections (first version, then closed)",
            get(&c.connects).to_string(),
        ),
        (
            "… closed abruptly (socket cut, TCP reset)",
            get(&c.connects_abrupt).to_string(),
        ),
        (
            "… stream held up to 250 ms first",
            format!(
                "{} ({} versions received meanwhile)",
                get(&c.connects_held),
                get(&c.held_messages)
            ),
        ),
        (
            "resource lifecycles: appeared and removed / never appeared",
            pair(&c.lifecycles_appearing, &c.lifecycles_never),
        ),
        (
            "manifest files created / deleted by the lifecycles",
            pair(&c.files_created, &c.files_deleted),
        ),
        (
            "connections of their subscribers",
            get(&c.lifecycle_connects).to_string(),
        ),
    ]
}

/// A count of the churn.
fn get(count: &AtomicU64) -> u64 {
    count.load(Ordering::Relaxed)
}
