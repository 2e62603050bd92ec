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
use crate::metrics::Metrics;
use crate::selector::ResourceKey;
use crate::source::Source;

mod files;

use files::{collect_files, parse_objects, read_limited};

/// Events within this time of the previous scan are coalesced into one rescan.
const SETTLE: Duration = Duration::from_millis(50);
/// Every directory is read again this often even without a notification (a backstop for
/// changes notifications miss).
const RESCAN: Duration = Duration::from_secs(30);
/// How long a scan waits for one file to parse before it goes on without it.
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
        let mut scanner = Scanner {
            roots,
            files: BTreeMap::new(),
            metrics,
            watcher: watcher.clone(),
            finished: Arc::default(),
            rescan: events_tx,
        };
        let (tx, rx) = watch::channel(Arc::new(scanner.scan(None)));
        tokio::spawn(scanner.run(events_rx, tx));
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
    /// `content` is still being parsed (it took longer than [`PARSE_BUDGET`]).
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
    /// Parses that outlasted their budget, with the content they parsed.
    finished: Arc<Mutex<HashMap<PathBuf, Parsed>>>,
    /// Asks for a scan (when such a parse is done).
    rescan: mpsc::UnboundedSender<Instant>,
}

impl Scanner {
    async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<Instant>,
        tx: watch::Sender<Arc<Catalog>>,
    ) {
        let mut last_scan: Option<Instant> = None;
        loop {
            let first = tokio::select! {
                event = events.recv() => match event {
                    Some(at) => at,
                    None => return,
                },
                () = tokio::time::sleep(RESCAN) => Instant::now(),
            };
            // The first event after a quiet spell is handled at once; events that follow within
            // SETTLE of a scan (an editor's save, a directory copy) are coalesced into one rescan.
            if let Some(last) = last_scan {
                tokio::time::sleep_until((last + SETTLE).into()).await;
            }
            while events.try_recv().is_ok() {}
            let scanner = self;
            let (back, catalog) = tokio::task::spawn_blocking(move || {
                let mut scanner = scanner;
                let catalog = scanner.scan(Some(first));
                (scanner, catalog)
            })
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
            self = back;
            last_scan = Some(Instant::now());
            if tx.send(Arc::new(catalog)).is_err() {
                return;
            }
        }
    }

    /// Reads every file again (unchanged files are not parsed again) and builds a catalog.
    fn scan(&mut self, changed_at: Option<Instant>) -> Catalog {
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
            let state = self.read(&path, previous);
            next.insert(path, state);
        }
        // A directory that cannot be read right now (deleted, about to be created again) keeps
        // the objects of its files.
        let (kept, gone): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut self.files)
            .into_iter()
            .partition(|(path, _)| missing.iter().any(|dir| path.starts_with(dir)));
        for gone in gone.keys() {
            tracing::info!(path = %gone.display(), "manifest file removed");
        }
        next.extend(kept);
        self.files = next;

        let mut catalog = Catalog {
            changed_at,
            ..Catalog::default()
        };
        for dir in &missing {
            tracing::error!(dir = %dir.display(), "cannot read the manifests directory; keeping its last good resources");
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

    fn read(&self, path: &Path, previous: Option<FileState>) -> FileState {
        let content = match read_limited(path) {
            Ok(content) => content,
            Err(error) => {
                self.metrics.source_error("manifests", "read");
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
        let (last_good, parsing) = match previous {
            Some(previous) if previous.content == content && !previous.parsing => return previous,
            Some(previous) if previous.parsing && previous.content == content => {
                (previous.objects.clone(), Some(previous))
            }
            Some(previous) => (previous.objects, None),
            None => (Vec::new(), None),
        };
        let finished = lock(&self.finished).remove(path);
        let result = match (finished, parsing) {
            (Some((parsed, result)), _) if parsed == content => result,
            // Still being parsed: the last good objects stay until it is done.
            (_, Some(still)) => return still,
            _ => match self.parse_within_budget(path, &content) {
                Some(result) => result,
                None => {
                    tracing::warn!(path = %path.display(), budget = ?PARSE_BUDGET, "manifest file takes long to parse; other files go ahead, and its last good resources stay until it is done");
                    return FileState {
                        content,
                        objects: last_good,
                        error: Some("still being parsed".to_owned()),
                        parsing: true,
                    };
                }
            },
        };
        match result {
            Ok(objects) => {
                tracing::debug!(path = %path.display(), resources = objects.len(), "manifest file read");
                FileState {
                    content,
                    objects,
                    error: None,
                    parsing: false,
                }
            }
            Err(error) => {
                self.metrics.source_error("manifests", "parse");
                tracing::error!(path = %path.display(), %error, "invalid manifest file; keeping its last good resources");
                FileState {
                    content,
                    objects: last_good,
                    error: Some(error),
                    parsing: false,
                }
            }
        }
    }

    /// Parses `content` on a thread of its own and waits at most [`PARSE_BUDGET`]. A parse
    /// that takes longer goes on; its result is kept for the scan it triggers when done.
    fn parse_within_budget(&self, path: &Path, content: &[u8]) -> Option<ParseResult> {
        #[derive(Default)]
        struct Handoff {
            result: Option<ParseResult>,
            abandoned: bool,
        }
        let handoff = Arc::new((Mutex::new(Handoff::default()), std::sync::Condvar::new()));
        let theirs = handoff.clone();
        let finished = self.finished.clone();
        let rescan = self.rescan.clone();
        let path = path.to_owned();
        let content = content.to_vec();
        let spawned = std::thread::Builder::new()
            .name("manifest-parse".to_owned())
            .spawn(move || {
                let result = parse_objects(&path, &content);
                let (slot, ready) = &*theirs;
                let mut slot = lock(slot);
                if slot.abandoned {
                    lock(&finished).insert(path, (content, result));
                    let _ = rescan.send(Instant::now());
                } else {
                    slot.result = Some(result);
                    ready.notify_one();
                }
            });
        if let Err(error) = spawned {
            return Some(Err(format!("cannot start a parser thread: {error}")));
        }
        let (slot, ready) = &*handoff;
        let (mut slot, _) = ready
            .wait_timeout_while(lock(slot), PARSE_BUDGET, |h| h.result.is_none())
            .unwrap_or_else(|p| p.into_inner());
        let result = slot.result.take();
        if result.is_none() {
            slot.abandoned = true;
        }
        result
    }
}

type ParseResult = Result<Vec<(ResourceKey, Arc<Value>)>, String>;
/// A parse that outlasted its budget: the content it parsed, and the result.
type Parsed = (Vec<u8>, ParseResult);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
