//! The client compatibility matrix: every real flagd sync client we can install, against the
//! proxy, in every mode that matters, written into `docs/compatibility.md`.
//!
//! Rows: flagd itself as the sidecar (v0.16.x, `flagd.sync.v1`), an old flagd that speaks only
//! the legacy `sync.v1`, and the in-process providers for JS, Python, Rust, Java and Go.
//! Columns: plain, TLS, header selector, body selector, update, reconnect, advertises gzip,
//! decodes compressed versions (see [`Column`]).
//! A second table covers what current flagd speaks besides (see [`Feature`]): flagd's
//! `source=` selector and `--context-value` entries in evaluations, and what clients see of
//! flag configurations with problems. A third covers the proxy's unix socket (see
//! [`SocketClient`]): every client that can dial one, and gRPC C-core (`grpcio`) used
//! directly.
//!
//! The JS, Python and Rust clients (under `interop/`) come from `scripts/install-interop.sh`;
//! flagd, the old flagd, Java and Go from `scripts/install-compat.sh`.
//! Every stdout client speaks one protocol: `READY` once its provider has synced, then
//! `VALUE <v>` whenever the evaluated flag changes. flagd is asked through its HTTP evaluation
//! API instead.
//!
//! The test fails on any `fail` cell, and when the committed `docs/compatibility.md` differs
//! from what the run produced (`FLAGD_PROXY_UPDATE_DOCS=1` rewrites it). A client that is not
//! installed fails the test when `CI` is set; otherwise it is skipped with a notice and the
//! document is neither checked nor rewritten.

use flagd_proxy_testkit as support;

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::control_plane::{cache_dir, java_class_path};
use support::{Proxy, TestCa};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Semaphore;
use tokio::time::{Instant, timeout};

mod cells;
mod clients;
mod document;
mod runs;
mod session;
mod socket;
mod versions;

use cells::*;
use clients::*;
use document::*;
use runs::*;
use session::*;
use socket::*;
use versions::*;

/// Hang guard for one expected event; never a performance expectation.
const EVENT_TIMEOUT: Duration = Duration::from_secs(60);
/// Hang guard for a client to come back after a proxy restart. flagd's sync client waits
/// 4 s, then 16 s, then 60 s between attempts.
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(150);
/// How long the Go client stays connected without traffic before the update: more than two of
/// its 30 s keepalive pings.
const GO_IDLE: Duration = Duration::from_secs(70);
/// Sessions (proxy + client) run at once; the machine has two cores.
const PARALLEL_SESSIONS: usize = 4;

const NAMESPACE: &str = "default";
const NAME: &str = "demo";
const DECOY: &str = "decoy";
const SELECTOR: &str = "core.openfeature.dev/default/demo";
/// The same resource in flagd's `key=value` selector grammar (flagd v0.13 and later).
const SOURCE_SELECTOR: &str = "source=core.openfeature.dev/default/demo";
/// The `--context-value` entry the targeting rule of the context-value run looks at.
const CONTEXT_KEY: &str = "region";
const CONTEXT_VALUE: &str = "eu-west";
const FLAG_KEY: &str = "color";
/// A flag whose targeting uses [`UNKNOWN_OPERATOR`] (the unknown-operator feature).
const BAD_FLAG_KEY: &str = "bad-targeting";
const UNKNOWN_OPERATOR: &str = "no_such_operator";
/// What the stdout clients print when an evaluation fails: the caller's default.
const CALLER_DEFAULT: &str = "<default>";
/// The start of the proxy's status message for a resource without a valid version.
const INVALID_MESSAGE: &str = "core.openfeature.dev/default/demo is invalid";
const INITIAL: &str = "red";
const UPDATED: &str = "blue";
const DECOY_VALUE: &str = "green";
/// Size of the flag set of the gzip run: well above the proxy's --compression-min-bytes.
const GZIP_DOCUMENT_BYTES: usize = 200 * 1024;
/// The proxy's count of sync requests that list gzip in `grpc-accept-encoding`, and of those
/// that do not.
const ACCEPTS_GZIP: &str = "flagd_proxy_sync_requests_total{accepts_gzip=\"yes\"}";
const DOES_NOT_ACCEPT_GZIP: &str = "flagd_proxy_sync_requests_total{accepts_gzip=\"no\"}";
/// The providers' deadline for their first sync in the gzip run: the Go provider's default,
/// 500 ms, is too short on a busy machine to receive and parse a 200 KiB flag set, and it does
/// not report ready when it syncs after missing it.
const GZIP_DEADLINE_MS: u32 = 10_000;
const COMPRESSION_MIN_BYTES: usize = flagd_proxy::wire::compression::DEFAULT_MIN_BYTES;
/// Bytes the proxy sent gzipped.
const SENT_GZIP: &str = "flagd_proxy_sent_bytes_total{encoding=\"gzip\"}";

const DOC: &str = "docs/compatibility.md";
const UPDATE_ENV: &str = "FLAGD_PROXY_UPDATE_DOCS";
/// The old flagd's complaint when the proxy refuses its selector-less request.
const NO_SELECTOR: &str = "no selector given";
/// Stderr of the Go client that would mean its connection was dropped while idle.
const GO_DISCONNECT_SIGNS: [&str; 5] = [
    "too_many_pings",
    "GoAway",
    "GOAWAY",
    "event PROVIDER_ERROR",
    "event PROVIDER_STALE",
];
/// Lines of a client's output kept for failure messages and searches.
const LOG_LINES: usize = 4000;

/// Fills `row` for a client that could not run at all: `reason` in the first column, a pointer
/// to it in the others.
fn one_reason_row(row: &mut BTreeMap<Column, Cell>, reason: &str, cell: fn(String) -> Cell) {
    for column in COLUMNS {
        let text = if column == Column::Plain {
            reason.to_owned()
        } else {
            "see plain".into()
        };
        row.insert(column, cell(text));
    }
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_repo_file(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs flagd and its providers (root for some rows): scripts/test installs them"]
async fn client_compatibility_matrix() {
    let versions = Versions::read();

    let mut matrix: BTreeMap<Kind, BTreeMap<Column, Cell>> = BTreeMap::new();
    let mut not_installed = Vec::new();
    let semaphore = Arc::new(Semaphore::new(PARALLEL_SESSIONS));
    let mut tasks = Vec::new();
    for kind in KINDS {
        match kind.launch(&versions) {
            Ok(launch) => {
                for &run in runs_for(kind) {
                    let launch = launch.clone();
                    let semaphore = semaphore.clone();
                    tasks.push(tokio::spawn(async move {
                        let _permit = semaphore.acquire_owned().await.expect("semaphore");
                        let cells = match run {
                            Run::Plain => live_run(kind, launch, false).await,
                            Run::Tls => live_run(kind, launch, true).await,
                            Run::Reconnect => reconnect_run(kind, launch).await,
                            Run::Gzip => gzip_run(kind, launch).await,
                        };
                        (kind, cells)
                    }));
                }
            }
            // The whole row shares one reason: give it once, in the first column.
            Err(Missing::NotInstallable(error)) => {
                one_reason_row(
                    matrix.entry(kind).or_default(),
                    &error,
                    Cell::NotInstallable,
                );
            }
            Err(Missing::NotInstalled(why)) => {
                one_reason_row(matrix.entry(kind).or_default(), &why, Cell::NotInstalled);
                not_installed.push(format!(
                    "{}: {why} (run {})",
                    kind.name(),
                    kind.install_hint()
                ));
            }
        }
    }
    let mut features: FeatureMatrix = BTreeMap::new();
    let mut feature_tasks = Vec::new();
    for kind in FEATURE_KINDS {
        let launch = kind.launch(&versions);
        for feature in FEATURES {
            let row = features.entry(feature).or_default();
            if let Some(why) = feature.not_applicable(kind) {
                row.insert(kind, Cell::NotApplicable(why.into()));
                continue;
            }
            match &launch {
                Ok(launch) => {
                    let launch = launch.clone();
                    let semaphore = semaphore.clone();
                    feature_tasks.push(tokio::spawn(async move {
                        let _permit = semaphore.acquire_owned().await.expect("semaphore");
                        (feature, kind, feature_run(kind, launch, feature).await)
                    }));
                }
                Err(Missing::NotInstallable(_)) => {
                    row.insert(kind, Cell::NotInstallable("see the main table".into()));
                }
                Err(Missing::NotInstalled(_)) => {
                    row.insert(kind, Cell::NotInstalled("see the main table".into()));
                }
            }
        }
    }
    let mut sockets: SocketTable = BTreeMap::new();
    let mut socket_tasks = Vec::new();
    for client in SOCKET_CLIENTS {
        if let Some(why) = client.not_applicable() {
            sockets.insert(client, Cell::NotApplicable(why.into()));
            continue;
        }
        match client.launch(&versions) {
            Ok((kind, launch)) => {
                let semaphore = semaphore.clone();
                socket_tasks.push(tokio::spawn(async move {
                    let _permit = semaphore.acquire_owned().await.expect("semaphore");
                    (client, socket_run(client, kind, launch).await)
                }));
            }
            Err(Missing::NotInstallable(_)) => {
                sockets.insert(client, Cell::NotInstallable("see the main table".into()));
            }
            Err(Missing::NotInstalled(_)) => {
                sockets.insert(client, Cell::NotInstalled("see the main table".into()));
            }
        }
    }
    if !not_installed.is_empty() {
        support::skip::skip(format_args!(
            "clients are not installed, the others run and {DOC} is not checked:\n  {}",
            not_installed.join("\n  ")
        ));
    }

    for task in tasks {
        let (kind, cells) = task.await.expect("a client run panicked");
        matrix.entry(kind).or_default().extend(cells);
    }
    for task in feature_tasks {
        let (feature, kind, cell) = task.await.expect("a feature run panicked");
        features.entry(feature).or_default().insert(kind, cell);
    }
    for task in socket_tasks {
        let (client, cell) = task.await.expect("a unix-socket run panicked");
        sockets.insert(client, cell);
    }
    for (kind, row) in matrix.iter_mut() {
        if !row
            .values()
            .any(|c| matches!(c, Cell::NotInstalled(_) | Cell::NotInstallable(_)))
        {
            derive_cells(*kind, row);
        }
    }

    let doc = render_doc(&matrix, &features, &sockets, &versions);
    eprintln!("{doc}");

    let failures: Vec<String> = matrix
        .iter()
        .flat_map(|(kind, row)| {
            row.iter().filter_map(move |(column, cell)| match cell {
                Cell::Fail(why) => Some(format!("{} / {}: {why}", kind.name(), column.title())),
                _ => None,
            })
        })
        .chain(features.iter().flat_map(|(feature, row)| {
            row.iter().filter_map(move |(kind, cell)| match cell {
                Cell::Fail(why) => Some(format!("{} / {}: {why}", kind.name(), feature.title())),
                _ => None,
            })
        }))
        .chain(sockets.iter().filter_map(|(client, cell)| match cell {
            Cell::Fail(why) => Some(format!("{} / unix socket: {why}", client.name())),
            _ => None,
        }))
        .collect();
    assert!(
        failures.is_empty(),
        "compatibility failures (details above):\n  {}",
        failures.join("\n  ")
    );

    if !not_installed.is_empty() {
        eprintln!(
            "NOTICE: not checking {DOC}: some clients are not installed:\n  {}",
            not_installed.join("\n  ")
        );
        return;
    }
    let path = repo_root().join(DOC);
    if std::env::var(UPDATE_ENV).is_ok_and(|v| v == "1") {
        std::fs::write(&path, &doc).expect("writing the compatibility document");
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == doc,
        "{DOC} is not what this run produced; regenerate it with \
         `{UPDATE_ENV}=1 scripts/test --test compatibility` and commit it"
    );
}
