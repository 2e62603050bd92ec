//! The scanner of the manifests source: it reads every file under the configured directories
//! when woken (by a file notification, or every [`RESCAN`]), hands changed content to the
//! parses, takes their results, follows a configured directory that was replaced, and builds
//! the [`Catalog`] of what the files hold now.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::files::{Found, Unreadable, collect_files, read_limited};
use super::parsing::Parses;
use super::{Catalog, FileProblem, Object, RESCAN, SharedWatcher, identity};
use crate::locks::lock;
use crate::metrics::Metrics;
use crate::selector::ResourceKey;

/// Events within this time of the previous scan are coalesced into one rescan.
const SETTLE: Duration = Duration::from_millis(50);
/// At start, how long the first catalog waits for parses to make progress (one more finished)
/// before it is published without the files still being parsed.
const PARSE_BUDGET: Duration = Duration::from_millis(500);

/// What one file held the last time it parsed.
pub(super) struct FileState {
    content: Vec<u8>,
    objects: Vec<(ResourceKey, Object)>,
    error: Option<String>,
    /// `content` is being parsed; `objects` and `error` are still those of the last parse.
    parsing: bool,
}

/// A configured directory, and which directory it resolved to when last watched.
pub(super) struct Root {
    pub(super) path: PathBuf,
    pub(super) identity: Option<(u64, u64)>,
}

pub(super) struct Scanner {
    pub(super) roots: Vec<Root>,
    pub(super) files: BTreeMap<PathBuf, FileState>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) watcher: SharedWatcher,
    /// The parses of files whose content changed.
    pub(super) parses: Parses,
    /// Directories that could not be read at the last scan (a configured one missing, one below
    /// it without permission), and why.
    pub(super) unreadable: Vec<Unreadable>,
    /// The resources defined again in another file at the last catalog: the file, and what it
    /// was told.
    pub(super) duplicates: HashSet<(PathBuf, String)>,
}

/// What the scanner is woken by.
enum Wake {
    /// Files may have changed (a notification noticed then, or the periodic rescan).
    Files(Instant),
    /// A parse finished (of a change noticed then).
    Parsed(Instant),
}

impl Scanner {
    pub(super) async fn run(
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
    pub(super) fn first_catalog(&mut self) -> Catalog {
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
        let mut found = Found::default();
        for root in &self.roots {
            let mut visited = HashSet::new();
            collect_files(&root.path, 0, &mut visited, &mut found);
        }
        let Found {
            files: mut paths,
            unreadable,
        } = found;
        paths.sort();
        paths.dedup();
        let mut next = BTreeMap::new();
        for path in paths {
            let previous = self.files.remove(&path);
            let state = self.read(&path, previous, noticed);
            next.insert(path, state);
        }
        // A directory that cannot be read right now (deleted, about to be created again; its
        // permissions being changed) keeps the objects of its files.
        let (kept, gone): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut self.files)
            .into_iter()
            .partition(|(path, _)| unreadable.iter().any(|u| path.starts_with(&u.dir)));
        for gone in gone.keys() {
            tracing::info!(path = %gone.display(), "manifest file removed");
            self.parses.forget(gone);
        }
        next.extend(kept);
        self.files = next;
        for now in &unreadable {
            // Counted at every scan, as a file that cannot be read is: an error that lasts keeps
            // the count rising (FlagdProxyWatchesFailing).
            self.metrics.source_error("manifests", "read");
            if !self.unreadable.contains(now) {
                tracing::error!(dir = %now.dir.display(), error = %now.error, "cannot read a manifests directory; keeping the last good resources of its files");
            }
        }
        for before in &self.unreadable {
            // (One that is gone took its files with it: each is logged removed.)
            if !unreadable.iter().any(|now| now.dir == before.dir) && before.dir.is_dir() {
                tracing::info!(dir = %before.dir.display(), "the manifests directory can be read again");
            }
        }
        self.unreadable = unreadable;
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

    /// The catalog of what the files hold now; `changed_at` is when the change was noticed. A
    /// resource defined twice is logged when it starts to be, as other file problems are; it
    /// stays among the catalog's problems while it lasts.
    fn catalog(&mut self, changed_at: Option<Instant>) -> Catalog {
        let mut catalog = Catalog {
            changed_at,
            ..Catalog::default()
        };
        for unreadable in &self.unreadable {
            catalog.problems.push(FileProblem {
                path: unreadable.dir.clone(),
                error: format!(
                    "the directory cannot be read ({}); the last good resources of its files are served",
                    unreadable.error
                ),
            });
        }
        let mut origin: HashMap<ResourceKey, &Path> = HashMap::new();
        let mut duplicates = HashSet::new();
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
                    if !self.duplicates.contains(&(path.clone(), error.clone())) {
                        tracing::error!(path = %path.display(), %error, "duplicate resource");
                    }
                    duplicates.insert((path.clone(), error.clone()));
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
        self.duplicates = duplicates;
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
