//! `--attacks`: the hostile attacks of docs/security.md ("The attacks, one by one"), each
//! against a fresh proxy on manifest files, measured the same way against this build and, with
//! `--baseline-bin`, an earlier one.
//!
//! For each attack: the proxy's RSS once it is ready, its peak during the attack (VmHWM: the
//! process is fresh, so its high-water mark is the attack's), its RSS `--attacks-quiet` after
//! the attacker has gone, and what the attack achieved, in a few words and numbers. Only flags
//! both builds accept are passed, and only where the attack names one; everything else is at
//! its default (the memory budget too: half the machine's memory when no cgroup limit is set).
//!
//! The attacks themselves live in `attacks/`: memory (rows 1 to 4, 15), connections (5, 6, 10,
//! 11), files (7, 8) and start-up (9, 12, 13). Row 14 (memory given back) is read from the
//! others.
//!
//! With `--attacks-tiers`, each attack runs in a memory cgroup of its own at a tier's limit,
//! with the tier's budget, and the kernel judges it (`attacks/kernel.rs`); honest subscribers
//! then fill the budget in the same cgroups (`attacks/honest.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flagd_proxy_testkit::attacks::{self as catalogue, ROWS};

use crate::args::Args;
use crate::report::loadavg;
use crate::sitting::rust_bin;

mod connections;
mod files;
mod honest;
pub(crate) mod kernel;
mod memory;
mod scene;
mod startup;
mod table;

use kernel::Kernel;
use scene::{Ctx, Measured};

/// How large each attack is: the full sitting, or a smoke run's tiny one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    /// Row 1: bytes of flag-set metadata.
    pub(crate) metadata_bytes: usize,
    /// Row 2: versions written, one every 100 ms, and the size of each.
    pub(crate) pinned_versions: usize,
    pub(crate) pinned_bytes: usize,
    /// Row 3: connections from each of 4 addresses, and requests on each.
    pub(crate) burst_connections: usize,
    pub(crate) burst_requests: u32,
    /// Row 4: addresses, and unfinished streams from each.
    pub(crate) unfinished_addresses: u8,
    pub(crate) unfinished_streams: u32,
    /// Row 6: `--max-connections`, filled by idle connections, and as many new clients.
    pub(crate) max_connections: usize,
    /// Row 7: the anchor's bytes and its references.
    pub(crate) anchor_bytes: usize,
    pub(crate) anchor_refs: usize,
    /// Row 15: connections (at the node tier, and elsewhere) from one address, and the
    /// requests of each one's burst.
    pub(crate) hold_connections_node: usize,
    pub(crate) hold_connections: usize,
    pub(crate) hold_requests: u32,
    /// Row 8: bytes of nested flow mappings.
    pub(crate) quoted_bytes: usize,
    /// Rows 9 and 12: starts.
    pub(crate) starts: usize,
}

impl Sizes {
    fn of(args: &Args) -> Self {
        if args.smoke {
            return Self {
                metadata_bytes: flagd_proxy_testkit::attacks::metadata::NOTES_BYTES,
                pinned_versions: 4,
                pinned_bytes: 256 * 1024,
                burst_connections: 2,
                burst_requests: 50,
                unfinished_addresses: 2,
                unfinished_streams: 50,
                max_connections: 8,
                anchor_bytes: 10 * 1024,
                anchor_refs: 2_000,
                quoted_bytes: 8 * 1024,
                hold_connections_node: 2,
                hold_connections: 3,
                hold_requests: 50,
                starts: 2,
            };
        }
        Self {
            metadata_bytes: flagd_proxy_testkit::attacks::metadata::NOTES_BYTES,
            pinned_versions: 60,
            pinned_bytes: 1024 * 1024,
            burst_connections: 16,
            burst_requests: 1_000,
            unfinished_addresses: 16,
            unfinished_streams: 1_000,
            max_connections: 100,
            anchor_bytes: 100 * 1024,
            anchor_refs: 20_000,
            quoted_bytes: 200 * 1024,
            hold_connections_node: 40,
            hold_connections: 240,
            hold_requests: 1_200,
            starts: 20,
        }
    }
}

/// One build under attack.
#[derive(Clone, Debug)]
pub(crate) struct Build {
    pub(crate) label: &'static str,
    pub(crate) bin: PathBuf,
}

/// Runs the attacks against every build; 1 when a row of this build has no figure.
pub(crate) async fn main(args: &Args) -> anyhow::Result<u8> {
    let builds = builds(args)?;
    let workdir = std::env::temp_dir().join(format!("flagd-proxy-attacks-{}", std::process::id()));
    std::fs::create_dir_all(&workdir)?;
    let status = if args.attacks_tiers.is_empty() {
        side_by_side(args, &builds, &workdir).await
    } else {
        in_tiers(args, &builds, &workdir).await
    };
    if !args.keep_workdir {
        let _ = std::fs::remove_dir_all(&workdir);
    }
    status
}

/// The context of one run of `bin` in `dir`, with the proxy arguments `extra`.
fn context(args: &Args, bin: &Path, dir: PathBuf, extra: &[String]) -> Ctx {
    Ctx {
        bin: bin.to_owned(),
        dir,
        sizes: Sizes::of(args),
        quiet: args.attacks_quiet,
        max_rss_mib: args.max_rss_mib,
        extra: extra.to_vec(),
        tier: None,
    }
}

/// The exit status of a run: 1, and the runs named on stderr, when some have no figure.
fn status(missing: &[String], what: &str) -> u8 {
    if missing.is_empty() {
        return 0;
    }
    eprintln!("flagd-proxy-bench: {what} without a figure: {missing:?}");
    1
}

/// Every chosen attack on every build, one table with a column per build.
async fn side_by_side(args: &Args, builds: &[Build], workdir: &Path) -> anyhow::Result<u8> {
    let started = Instant::now();
    let load_before = loadavg();
    let chosen = chosen(args);
    let mut results: BTreeMap<(u8, &'static str), Measured> = BTreeMap::new();
    for build in builds {
        // `--proxy-arg`s are for the build under test only.
        let extra: &[String] = if build.label == "now" {
            &args.proxy_arg
        } else {
            &[]
        };
        for &row in chosen.iter().filter(|&&n| n != 14) {
            let dir = workdir.join(format!("{}-{row}", build.label));
            eprintln!("{}: attack {row}", build.label);
            let measured = run(row, context(args, &build.bin, dir, extra)).await;
            eprintln!("  {}", measured.summary());
            results.insert((row, build.label), measured);
        }
        if chosen.contains(&14) {
            let kept = table::given_back(&results, build.label);
            results.insert((14, build.label), kept);
        }
    }
    let report = table::Report {
        builds,
        rows: &chosen,
        results: &results,
        seconds: started.elapsed().as_secs_f64(),
        load: (load_before, loadavg()),
        quiet: args.attacks_quiet,
    };
    publish(args, &report.markdown(), &report.json())?;
    let missing: Vec<String> = chosen
        .iter()
        .filter(|&&n| results.get(&(n, "now")).is_none_or(|m| m.failed.is_some()))
        .map(u8::to_string)
        .collect();
    Ok(status(&missing, "attacks of this build"))
}

/// The runs of `--attacks-tiers`: each chosen attack (its row and name), then the honest
/// subscribers, plaintext and TLS, unless `--attacks-no-honest`.
fn tier_runs(args: &Args, chosen: &[u8]) -> Vec<(String, String)> {
    let attacks = chosen
        .iter()
        .map(|&n| (n.to_string(), catalogue::name(n).to_owned()));
    let honest = ["plaintext", "TLS"]
        .into_iter()
        .filter(|_| !args.attacks_no_honest)
        .map(|kind| {
            let what = format!("honest {kind} subscribers until the budget refuses");
            ("–".to_owned(), what)
        });
    attacks.chain(honest).collect()
}

/// `--attacks-tiers`: every chosen attack, then honest subscribers (plaintext, TLS), each in a
/// cgroup of its own at each tier's limit; a table per tier. 1 when a row has no figure.
async fn in_tiers(args: &Args, builds: &[Build], workdir: &Path) -> anyhow::Result<u8> {
    let build = builds.last().context("no build to attack")?;
    crate::sampling::raise_fd_limit(honest::FILES)?;
    let started = Instant::now();
    let load_before = loadavg();
    // Row 14 reads RSS from the others; in cgroups, each attack has its own peak.
    let chosen: Vec<u8> = chosen(args).into_iter().filter(|&n| n != 14).collect();
    let runs = tier_runs(args, &chosen);
    let mut markdown = format!(
        "# Attacks in memory cgroups\n\n- `{}`\n- machine: {}; load average {load_before} \
         before\n\n",
        build.bin.display(),
        crate::report::machine(),
    );
    let mut json = Vec::new();
    let mut missing = Vec::new();
    for &tier in &args.attacks_tiers {
        let mut rows = Vec::new();
        for (i, (row, attack)) in runs.iter().enumerate() {
            let cgroup = kernel::cgroup(tier, &format!("run{i}"))?;
            let dir = workdir.join(format!("{}-{i}", tier.label()));
            let ctx = Ctx {
                tier: Some((tier, cgroup.clone())),
                ..context(args, &build.bin, dir, &args.proxy_arg)
            };
            eprintln!("{} tier: {attack}", tier.label());
            let mut measured = match chosen.get(i) {
                Some(&n) => run(n, ctx).await,
                None => honest_run(i - chosen.len() == 1, ctx).await,
            };
            Kernel::read(&cgroup, &mut measured);
            drop(cgroup);
            eprintln!("  {}", measured.summary());
            if measured.failed.is_some() {
                missing.push(format!("{} {row}", tier.label()));
            }
            json.push(serde_json::json!({"tier": tier, "row": row, "attack": attack, "measured": measured}));
            rows.push((row.clone(), attack.clone(), measured));
        }
        markdown.push_str(&kernel::markdown(tier, &rows));
    }
    markdown.push_str(&format!(
        "{:.0} s in all; load average {} after\n",
        started.elapsed().as_secs_f64(),
        loadavg()
    ));
    publish(args, &markdown, &serde_json::Value::from(json))?;
    Ok(status(&missing, "runs"))
}

/// Honest subscribers in a task of their own, as [`run`] runs an attack.
async fn honest_run(tls: bool, ctx: Ctx) -> Measured {
    std::fs::create_dir_all(&ctx.dir).ok();
    let task = tokio::spawn(async move { honest::subscribers(&ctx, tls).await });
    supervise(task, Duration::from_secs(1200)).await
}

/// The attacks `--attacks-rows` chooses (all when it names none).
fn chosen(args: &Args) -> Vec<u8> {
    ROWS.iter()
        .map(|row| row.number)
        .filter(|n| args.attacks_rows.is_empty() || args.attacks_rows.contains(n))
        .collect()
}

/// Prints the report, and writes it where `--markdown` and `--json` say.
fn publish(args: &Args, markdown: &str, json: &serde_json::Value) -> anyhow::Result<()> {
    println!("{markdown}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, markdown).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The builds to attack: `--baseline-bin` first, if given, then `--proxy-bin`.
fn builds(args: &Args) -> anyhow::Result<Vec<Build>> {
    let mut builds = Vec::new();
    if let Some(bin) = &args.baseline_bin {
        builds.push(Build {
            label: "before",
            bin: bin.clone(),
        });
    }
    builds.push(Build {
        label: "now",
        bin: rust_bin(args)?,
    });
    for build in &builds {
        if !build.bin.is_file() {
            bail!("{} not found", build.bin.display());
        }
    }
    Ok(builds)
}

/// Runs attack `row` in a task of its own, so that an attack that fails (or a helper that
/// panics on a connection the proxy refused) is reported in its row and the others still run.
async fn run(row: u8, ctx: Ctx) -> Measured {
    std::fs::create_dir_all(&ctx.dir).ok();
    let task = tokio::spawn(async move {
        match row {
            1 => memory::metadata(&ctx).await,
            2 => memory::pinned_versions(&ctx).await,
            3 => memory::burst(&ctx).await,
            4 => memory::unfinished(&ctx).await,
            5 => connections::management(&ctx).await,
            6 => connections::idle_reconnects(&ctx).await,
            7 => files::aliases(&ctx).await,
            8 => files::quoted_brackets(&ctx).await,
            9 => startup::socket_mode(&ctx).await,
            10 => connections::c_core_authority(&ctx).await,
            11 => connections::late_tls(&ctx).await,
            12 => startup::early_signals(&ctx).await,
            13 => startup::context_values(&ctx).await,
            15 => memory::burst_then_hold(&ctx).await,
            _ => Err(anyhow::anyhow!("no attack {row}")),
        }
    });
    // A generous bound: no attack takes more than a few tens of seconds.
    supervise(task, Duration::from_secs(300)).await
}

/// What `task` measured, or why it did not: an error, a panic (a helper that panics on a
/// connection the proxy refused), or no result within `bound` (the task is then stopped, so
/// what it holds, a cgroup among them, goes).
async fn supervise(
    mut task: tokio::task::JoinHandle<anyhow::Result<Measured>>,
    bound: Duration,
) -> Measured {
    match tokio::time::timeout(bound, &mut task).await {
        Ok(Ok(Ok(measured))) => measured,
        Ok(Ok(Err(error))) => Measured::failed(format!("{error:#}")),
        Ok(Err(panic)) => Measured::failed(format!("the attack failed: {panic}")),
        Err(_) => {
            task.abort();
            let _ = task.await;
            Measured::failed(format!("no result within {} s", bound.as_secs()))
        }
    }
}
