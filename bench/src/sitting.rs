//! One invocation: which proxies run, which scenarios, and each scenario against each proxy
//! that applies to it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::args::Args;
use crate::proxy::Kind;
use crate::run::run_one;
use crate::scenario::{RunResult, Scenario, ScenarioRuns};

/// The Go flagd-proxy when none is given: `FLAGD_PROXY_GO_BIN`, else `../shared/bin/flagd-proxy-go`
/// beside this repository, else the one scripts/install-go-proxy.sh installs in the cache.
pub(crate) fn default_go_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("FLAGD_PROXY_GO_BIN") {
        return Some(PathBuf::from(bin));
    }
    let beside = flagd_proxy_testkit::repo_root().join("../shared/bin/flagd-proxy-go");
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

/// The proxies to run, each with its binary.
pub(crate) type Proxies = Vec<(Kind, PathBuf)>;

/// This project's proxy binary: `--proxy-bin`, else `flagd-proxy` next to this program.
pub(crate) fn rust_bin(args: &Args) -> anyhow::Result<PathBuf> {
    Ok(match &args.proxy_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory for this program")?
            .join("flagd-proxy"),
    })
}

/// The proxies to run, and why the Go proxy is not among them.
pub(crate) fn proxies(args: &Args) -> anyhow::Result<(Proxies, Option<String>)> {
    let rust_bin = rust_bin(args)?;
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
        if args.only_go {
            // The Go proxy is the proxy under test: a run without it would test nothing.
            bail!("--only-go: {note}");
        }
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
    Ok((kinds, go_note))
}

/// Every combination of the listed sources, payloads and resource counts.
pub(crate) fn scenarios(args: &Args) -> Vec<Scenario> {
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
    scenarios
}

/// What the scenarios of one invocation share.
pub(crate) struct Sitting<'a> {
    pub(crate) args: &'a Args,
    pub(crate) workdir: &'a Path,
    /// The floor's result per payload, reused by the scenarios of other sources.
    pub(crate) floors: &'a mut BTreeMap<usize, RunResult>,
}

impl Sitting<'_> {
    /// One scenario against every proxy that applies to it.
    pub(crate) async fn run(
        &mut self,
        scenario: Scenario,
        kinds: &[(Kind, PathBuf)],
        go_not_run: bool,
    ) -> ScenarioRuns {
        let mut results = BTreeMap::new();
        let mut skipped = BTreeMap::new();
        let mut failed = BTreeMap::new();
        if go_not_run {
            skipped.insert(Kind::Go.key(), "not run".to_owned());
        }
        for (kind, bin) in kinds {
            if let Some(reason) = skip_reason(*kind, scenario) {
                skipped.insert(kind.key(), reason.to_owned());
                continue;
            }
            if *kind == Kind::Floor
                && let Some(floor) = self.floors.get(&scenario.payload)
            {
                results.insert(kind.key(), floor.clone());
                continue;
            }
            match self.run_one(*kind, bin, scenario).await {
                Ok(result) => {
                    results.insert(kind.key(), result);
                }
                Err(error) => {
                    failed.insert(kind.key(), error);
                }
            }
            // Let sockets and the scheduler calm down between runs.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        ScenarioRuns {
            scenario,
            results,
            skipped,
            failed,
        }
    }

    /// One scenario against one proxy; the error when the run failed.
    pub(crate) async fn run_one(
        &mut self,
        kind: Kind,
        bin: &Path,
        scenario: Scenario,
    ) -> Result<RunResult, String> {
        let label = kind.label_in(self.args);
        eprintln!("{label}: {}", scenario.label());
        match run_one(kind, bin, scenario, self.args, self.workdir).await {
            Ok(result) => {
                if kind == Kind::Floor {
                    self.floors.insert(scenario.payload, result.clone());
                }
                Ok(result)
            }
            Err(error) => {
                eprintln!("  {label} failed: {error:#}");
                Err(format!("{error:#}"))
            }
        }
    }
}

/// Why a proxy does not run a scenario (shown in its column), if it does not.
pub(crate) fn skip_reason(kind: Kind, scenario: Scenario) -> Option<&'static str> {
    match kind {
        Kind::Go | Kind::Model if scenario.tls => Some("no TLS"),
        Kind::Floor if scenario.tls => Some("plain only"),
        Kind::Floor if scenario.resources > 1 => Some("–"),
        _ => None,
    }
}
