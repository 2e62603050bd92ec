//! The manifests source: `FeatureFlag` objects from YAML/JSON files in local directories.
//!
//! Every file under the configured directories is read (multi-document YAML, JSON, and `List`
//! objects); `FeatureFlag` objects are served under `core.openfeature.dev/<namespace>/<name>`,
//! the namespace defaulting to `default`. The directories are watched: an edit reaches
//! subscribers without a restart. A file that stops parsing keeps its last good objects.
//!
//! Updates are followed when files are written in place, renamed into place, published
//! ConfigMap-style (a `..data` symlink swapped), or when a configured directory is itself a
//! symlink that is swapped (git-sync) or is deleted and created again (while it is missing, the
//! last good objects stay). Only regular files are read, at most 16 MiB each, and YAML's
//! nesting ([`crate::document::MAX_DEPTH`]) and alias expansion are bounded by a tokenizer before
//! it is deserialized, which keeps parsing linear in the file's size. Symlink loops, FIFOs and devices are skipped.
//!
//! A changed file is parsed off the scanner (see [`parsing`]): a few parses at once, the newest
//! content of each file superseding older content, small files never waiting for large ones.
//! The scan publishes what it found at once; each parse's result is published when it is done.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use notify::Watcher;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::hub::Publisher;
use crate::locks::lock;
use crate::metrics::Metrics;
use crate::selector::ResourceKey;
use crate::source::Source;

mod files;
mod parsing;

use files::{collect_files, parse_objects, read_limited};
use parsing::{Parser, Parses};

/// Events within this time of the previous scan are coalesced into one rescan.
const SETTLE: Duration = Duration::from_millis(50);
/// Every directory is read again this often even without a notification (a backstop for
/// changes notifications miss).
const RESCAN: Duration = Duration::from_secs(30);
/// At start, how long the first catalog waits for parses to make progress (one more finished)
/// before it is published without the files still being parsed.
const PARSE_BUDGET: Duration = Duration::from_millis(500);

type SharedWatcher = Arc<Mutex<Box<dyn Watcher + Send + Sync>>>;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifests directory {path}: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("manifests directory {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("cannot watch {path} for changes: {source}")]
    Watch {
        path: PathBuf,
        source: notify::Error,
    },
}

/// A problem with one file, kept for the status page.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FileProblem {
    pub path: PathBuf,
    pub error: String,
}

/// Everything the directories hold right now.
#[derive(Debug, Default)]
pub struct Catalog {
    resources: HashMap<ResourceKey, Arc<Value>>,
    /// When the change that produced this catalog was noticed.
    changed_at: Option<Instant>,
    pub problems: Vec<FileProblem>,
}

/// The most selectors `status` lists (the first, in order).
const STATUS_SELECTORS: usize = 20;

/// Serves `FeatureFlag` objects from manifest files.
pub struct ManifestSource {
    catalog: watch::Receiver<Arc<Catalog>>,
    // Dropping the watcher stops file notifications; it lives as long as the source.
    _watcher: SharedWatcher,
}

impl ManifestSource {
    /// Reads the directories and starts watching them.
    pub fn start(dirs: Vec<PathBuf>, metrics: Arc<Metrics>) -> Result<Self, ManifestError> {
        let parser: Parser = Arc::new(parse_objects);
        Self::start_with(dirs, metrics, parser, Parses::default_limit())
    }

    /// [`ManifestSource::start`] with `parser` for the files, at most `parses` at once.
    fn start_with(
        dirs: Vec<PathBuf>,
        metrics: Arc<Metrics>,
        parser: Parser,
        parses: usize,
    ) -> Result<Self, ManifestError> {
        for dir in &dirs {
            let meta = std::fs::metadata(dir).map_err(|source| ManifestError::Directory {
                path: dir.clone(),
                source,
            })?;
            if !meta.is_dir() {
                return Err(ManifestError::NotADirectory(dir.clone()));
            }
        }
        let (events_tx, events_rx) = mpsc::unbounded_channel::<Instant>();
        let notified = events_tx.clone();
        let on_event = move |event: notify::Result<notify::Event>| {
            if event.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
                let _ = notified.send(Instant::now());
            }
        };
        let mut watcher: Box<dyn Watcher + Send + Sync> = match notify::recommended_watcher(
            on_event.clone(),
        ) {
            Ok(w) => Box::new(w),
            Err(error) => {
                tracing::warn!(%error, "file notifications unavailable; polling manifests every second");
                let config = notify::Config::default().with_poll_interval(Duration::from_secs(1));
                Box::new(
                    notify::PollWatcher::new(on_event, config).map_err(|source| {
                        ManifestError::Watch {
                            path: dirs.first().cloned().unwrap_or_default(),
                            source,
                        }
                    })?,
                )
            }
        };
        let mut roots = Vec::new();
        for dir in &dirs {
            watcher
                .watch(dir, notify::RecursiveMode::Recursive)
                .map_err(|source| ManifestError::Watch {
                    path: dir.clone(),
                    source,
                })?;
            // The parent's events tell when the directory itself is swapped, deleted or
            // created again; the directory is then watched anew (see `Scanner::follow_roots`).
            // (A parent inside a configured directory is watched recursively already.)
            let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
            if let Some(parent) = absolute.parent()
                && !dirs.iter().any(|d| {
                    parent.starts_with(std::path::absolute(d).unwrap_or_else(|_| d.clone()))
                })
                && let Err(error) = watcher.watch(parent, notify::RecursiveMode::NonRecursive)
            {
                tracing::warn!(%error, dir = %parent.display(), "cannot watch the manifests directory's parent; a swap of the directory is noticed within {RESCAN:?}");
            }
            roots.push(Root {
                path: dir.clone(),
                identity: identity(dir),
            });
        }
        let watcher: SharedWatcher = Arc::new(Mutex::new(watcher));
        let (parsed_tx, parsed_rx) = mpsc::unbounded_channel();
        let mut scanner = Scanner {
            roots,
            files: BTreeMap::new(),
            metrics,
            watcher: watcher.clone(),
            parses: Parses::new(parses, parser, parsed_tx),
            missing: Vec::new(),
        };
        let (tx, rx) = watch::channel(Arc::new(scanner.first_catalog()));
        tokio::spawn(scanner.run(events_rx, parsed_rx, tx));
        Ok(Self {
            catalog: rx,
            _watcher: watcher,
        })
    }

    /// The current catalog.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.borrow().clone()
    }
}

impl Source for ManifestSource {
    fn name(&self) -> &'static str {
        "manifests"
    }

    fn status(&self) -> Value {
        let catalog = self.catalog();
        let mut selectors: Vec<String> = catalog.resources.keys().map(|k| k.to_string()).collect();
        selectors.sort_unstable();
        selectors.truncate(STATUS_SELECTORS);
        serde_json::json!({
            "resources": catalog.resources.len(),
            "selectors": selectors,
            "problems": catalog.problems,
        })
    }

    fn watch(&self, key: ResourceKey, publisher: Publisher) -> BoxFuture<'static, ()> {
        let mut catalog = self.catalog.clone();
        Box::pin(async move {
            let mut last: Option<Arc<Value>> = None;
            let mut first = true;
            loop {
                let current = catalog.borrow_and_update().clone();
                match current.resources.get(&key) {
                    Some(object) if last.as_ref().is_some_and(|l| Arc::ptr_eq(l, object)) => {}
                    Some(object) => {
                        publisher.resource(object, current.changed_at.unwrap_or_else(Instant::now));
                        last = Some(object.clone());
                    }
                    None if last.is_some() || first => {
                        publisher.absent();
                        last = None;
                    }
                    None => {}
                }
                first = false;
                if catalog.changed().await.is_err() {
                    return;
                }
            }
        })
    }
}

/// What one file held the last time it parsed.
struct FileState {
    content: Vec<u8>,
    objects: Vec<(ResourceKey, Arc<Value>)>,
    error: Option<String>,
    /// `content` is being parsed; `objects` and `error` are still those of the last parse.
    parsing: bool,
}

/// A configured directory, and which directory it resolved to when last watched.
struct Root {
    path: PathBuf,
    identity: Option<(u64, u64)>,
}

/// The device and inode a path resolves to (following symlinks), if it exists.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

struct Scanner {
    roots: Vec<Root>,
    files: BTreeMap<PathBuf, FileState>,
    metrics: Arc<Metrics>,
    watcher: SharedWatcher,
    /// The parses of files whose content changed.
    parses: Parses,
    /// Configured directories that could not be read at the last scan.
    missing: Vec<PathBuf>,
}

/// What the scanner is woken by.
enum Wake {
    /// Files may have changed (a notification noticed then, or the periodic rescan).
    Files(Instant),
    /// A parse finished (of a change noticed then).
    Parsed(Instant),
}

impl Scanner {
    async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<Instant>,
        mut parsed: mpsc::UnboundedReceiver<Instant>,
        tx: watch::Sender<Arc<Catalog>>,
    ) {
        let mut last_scan: Option<Instant> = None;
        loop {
            let wake = tokio::select! {
                event = events.recv() => match event {
                    Some(at) => Wake::Files(at),
                    None => return,
                },
                Some(at) = parsed.recv() => Wake::Parsed(at),
                () = tokio::time::sleep(RESCAN) => Wake::Files(Instant::now()),
            };
            let catalog = match wake {
                Wake::Files(first) => {
                    // The first event after a quiet spell is handled at once; events that follow
                    // within SETTLE of a scan (an editor's save, a directory copy) are coalesced
                    // into one rescan.
                    if let Some(last) = last_scan {
                        tokio::time::sleep_until((last + SETTLE).into()).await;
                    }
                    while events.try_recv().is_ok() {}
                    let scanner = self;
                    let (back, catalog) = tokio::task::spawn_blocking(move || {
                        let mut scanner = scanner;
                        scanner.scan(first);
                        let catalog = scanner.catalog(Some(first));
                        (scanner, catalog)
                    })
                    .await
                    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
                    self = back;
                    last_scan = Some(Instant::now());
                    catalog
                }
                Wake::Parsed(noticed) => {
                    // Results only: nothing is read again.
                    let mut earliest = noticed;
                    while let Ok(noticed) = parsed.try_recv() {
                        earliest = earliest.min(noticed);
                    }
                    self.apply_parsed();
                    self.catalog(Some(earliest))
                }
            };
            if tx.send(Arc::new(catalog)).is_err() {
                return;
            }
        }
    }

    /// The catalog at start: every file read, and every parse waited for while parses keep
    /// finishing (a parse that makes the wait stall for [`PARSE_BUDGET`] follows when done).
    fn first_catalog(&mut self) -> Catalog {
        self.scan(Instant::now());
        while self.parses.busy() && self.parses.wait_for_one(PARSE_BUDGET) {
            self.apply_parsed();
        }
        self.apply_parsed();
        for (path, state) in &self.files {
            if state.parsing {
                tracing::warn!(path = %path.display(), budget = ?PARSE_BUDGET, "manifest file takes long to parse; the proxy starts without it, and its resources follow when it is done");
            }
        }
        self.catalog(None)
    }

    /// Reads every file again; files whose content changed (noticed at `noticed`) are parsed
    /// anew, off this thread (see [`Scanner::apply_parsed`]).
    fn scan(&mut self, noticed: Instant) {
        self.follow_roots();
        let mut paths = Vec::new();
        let mut missing = Vec::new();
        for root in &self.roots {
            let mut visited = HashSet::new();
            if !collect_files(&root.path, 0, &mut visited, &mut paths) {
                missing.push(root.path.clone());
            }
        }
        paths.sort();
        paths.dedup();
        let mut next = BTreeMap::new();
        for path in paths {
            let previous = self.files.remove(&path);
            let state = self.read(&path, previous, noticed);
            next.insert(path, state);
        }
        // A directory that cannot be read right now (deleted, about to be created again) keeps
        // the objects of its files.
        let (kept, gone): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut self.files)
            .into_iter()
            .partition(|(path, _)| missing.iter().any(|dir| path.starts_with(dir)));
        for gone in gone.keys() {
            tracing::info!(path = %gone.display(), "manifest file removed");
            self.parses.forget(gone);
        }
        next.extend(kept);
        self.files = next;
        for dir in &missing {
            tracing::error!(dir = %dir.display(), "cannot read the manifests directory; keeping its last good resources");
        }
        self.missing = missing;
        self.apply_parsed();
    }

    /// Takes the results of finished parses of the files' current content.
    fn apply_parsed(&mut self) {
        for (path, state) in &mut self.files {
            if !state.parsing {
                continue;
            }
            let Some(parsed) = self.parses.take(path, &state.content) else {
                continue;
            };
            state.parsing = false;
            match parsed.result {
                Ok(objects) => {
                    tracing::debug!(path = %path.display(), resources = objects.len(), "manifest file read");
                    state.objects = objects;
                    state.error = None;
                }
                Err(error) => {
                    self.metrics.source_error("manifests", "parse");
                    tracing::error!(path = %path.display(), %error, "invalid manifest file; keeping its last good resources");
                    state.error = Some(error);
                }
            }
        }
    }

    /// The catalog of what the files hold now; `changed_at` is when the change was noticed.
    fn catalog(&self, changed_at: Option<Instant>) -> Catalog {
        let mut catalog = Catalog {
            changed_at,
            ..Catalog::default()
        };
        for dir in &self.missing {
            catalog.problems.push(FileProblem {
                path: dir.clone(),
                error: "the directory cannot be read; its last good resources are served"
                    .to_owned(),
            });
        }
        let mut origin: HashMap<ResourceKey, &Path> = HashMap::new();
        for (path, state) in &self.files {
            if let Some(error) = &state.error {
                catalog.problems.push(FileProblem {
                    path: path.clone(),
                    error: error.clone(),
                });
            }
            for (key, object) in &state.objects {
                if let Some(first) = origin.get(key) {
                    let error = format!(
                        "{key} is also defined in {}; that one is served",
                        first.display()
                    );
                    tracing::error!(path = %path.display(), %error, "duplicate resource");
                    catalog.problems.push(FileProblem {
                        path: path.clone(),
                        error,
                    });
                    continue;
                }
                origin.insert(key.clone(), path);
                catalog.resources.insert(key.clone(), object.clone());
            }
        }
        catalog
    }

    /// Watches a configured directory anew when it now resolves to another directory (a
    /// symlink swapped, the directory deleted and created again): the old watch saw the old one.
    fn follow_roots(&mut self) {
        for root in &mut self.roots {
            let now = identity(&root.path);
            if now == root.identity {
                continue;
            }
            root.identity = now;
            if now.is_none() {
                continue;
            }
            tracing::info!(dir = %root.path.display(), "the manifests directory was replaced; watching the new one");
            let mut watcher = lock(&self.watcher);
            let _ = watcher.unwatch(&root.path);
            if let Err(error) = watcher.watch(&root.path, notify::RecursiveMode::Recursive) {
                tracing::warn!(%error, dir = %root.path.display(), "cannot watch the manifests directory; it is read again every {RESCAN:?}");
            }
        }
    }

    /// The state of `path` now: unchanged, unreadable (its last good objects kept), or changed
    /// and being parsed (its last good objects kept until the parse is done).
    fn read(&self, path: &Path, previous: Option<FileState>, noticed: Instant) -> FileState {
        let content = match read_limited(path) {
            Ok(content) => content,
            Err(error) => {
                self.metrics.source_error("manifests", "read");
                self.parses.forget(path);
                let repeated = previous
                    .as_ref()
                    .is_some_and(|p| p.error.as_ref() == Some(&error));
                if !repeated {
                    tracing::error!(path = %path.display(), %error, "cannot read manifest file");
                }
                let objects = previous.map(|p| p.objects).unwrap_or_default();
                return FileState {
                    content: Vec::new(),
                    objects,
                    error: Some(error),
                    parsing: false,
                };
            }
        };
        // Unchanged: parsed already, or its parse is under way.
        let previous = match previous {
            Some(previous) if previous.content == content => return previous,
            previous => previous,
        };
        self.parses.request(path, &content, noticed);
        let (objects, error) = previous.map_or_else(Default::default, |p| (p.objects, p.error));
        FileState {
            content,
            objects,
            error,
            parsing: true,
        }
    }
}

type ParseResult = Result<Vec<(ResourceKey, Arc<Value>)>, String>;

#[cfg(test)]
mod tests;
