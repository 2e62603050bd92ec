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
//! last good objects stay; so do those of a directory below it that cannot be read). Only
//! regular files are read, at most 16 MiB each, and YAML's nesting
//! ([`crate::document::MAX_DEPTH`]) and alias expansion are bounded by a tokenizer before it is
//! deserialized, which keeps parsing linear in the file's size. Symlink loops, FIFOs and devices
//! are skipped.
//!
//! A changed file is parsed off the scanner (see [`parsing`]): a few parses at once, the newest
//! content of each file superseding older content, small files never waiting for large ones.
//! The scan publishes what it found at once; each parse's result is published when it is done.
//! The scanner is in `scanner.rs`, the reading of files in `files.rs`.
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use notify::Watcher;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::hub::Publisher;
use crate::introspection::{ManifestsStatus, SourceStatus};
use crate::metrics::Metrics;
use crate::selector::ResourceKey;
use crate::source::Source;

mod files;
mod parsing;
mod scanner;

use files::parse_objects;
use parsing::{Parser, Parses};
use scanner::{Root, Scanner};

/// Every directory is read again this often even without a notification (a backstop for
/// changes notifications miss).
const RESCAN: Duration = Duration::from_secs(30);
/// What one watch of a manifest resource holds: its task and what it keeps of the catalogue
/// (4.7 KiB measured per watched resource with its stream taken out, `docs/capacity.md`, of
/// which its version is charged apart).
const WATCH_BYTES: usize = 4 * 1024;

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProblem {
    pub path: PathBuf,
    pub error: String,
}

impl FileProblem {
    /// The problem as `/status` shows it (the path's characters that are not UTF-8 replaced).
    fn reported(&self) -> crate::introspection::FileProblem {
        crate::introspection::FileProblem {
            error: self.error.clone(),
            path: self.path.to_string_lossy().into_owned(),
        }
    }
}

/// A `FeatureFlag` object as the files hold it, kept as compact JSON text: parsed, an object
/// takes many times its text (about 20 times for flag sets with targeting rules: 24 objects of
/// 259 KiB held 120 MiB), and it is parsed again only when it is delivered to a watch.
pub(super) type Object = Arc<str>;

/// Everything the directories hold right now.
#[derive(Debug, Default)]
pub struct Catalog {
    resources: HashMap<ResourceKey, Object>,
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
        let roots = Roots::of(&dirs);
        let on_event = move |event: notify::Result<notify::Event>| {
            if event.is_ok_and(|e| roots.concern(&e)) {
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
            unreadable: Vec::new(),
            duplicates: Default::default(),
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

    fn watch_bytes(&self) -> usize {
        WATCH_BYTES
    }

    fn status(&self) -> SourceStatus {
        let catalog = self.catalog();
        let mut selectors: Vec<String> = catalog.resources.keys().map(|k| k.to_string()).collect();
        selectors.sort_unstable();
        selectors.truncate(STATUS_SELECTORS);
        SourceStatus::Manifests(ManifestsStatus {
            problems: catalog.problems.iter().map(FileProblem::reported).collect(),
            resources: catalog.resources.len() as u64,
            selectors,
        })
    }

    fn watch(&self, key: ResourceKey, publisher: Publisher) -> BoxFuture<'static, ()> {
        let mut catalog = self.catalog.clone();
        Box::pin(async move {
            let mut last: Option<Object> = None;
            let mut first = true;
            loop {
                let current = catalog.borrow_and_update().clone();
                match current.resources.get(&key) {
                    Some(object) if last.as_ref().is_some_and(|l| Arc::ptr_eq(l, object)) => {}
                    Some(object) => {
                        let changed_at = current.changed_at.unwrap_or_else(Instant::now);
                        match serde_json::from_str::<Value>(object) {
                            Ok(value) => publisher.resource(&value, changed_at),
                            // The text was written from a parsed object: this cannot happen.
                            Err(error) => {
                                tracing::error!(resource = %key, %error, "a kept object does not parse again; not delivered");
                            }
                        }
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

/// The configured directories as file notifications name them (as given, and absolute).
#[derive(Clone, Debug)]
struct Roots(Vec<PathBuf>);

impl Roots {
    fn of(dirs: &[PathBuf]) -> Self {
        let mut paths = Vec::new();
        for dir in dirs {
            paths.push(dir.clone());
            if let Ok(absolute) = std::path::absolute(dir) {
                paths.push(absolute);
            }
        }
        Self(paths)
    }

    /// Whether a notification may change what the directories hold: a change inside one of
    /// them or of one of them itself, not a read (the scanner's own opens are notified too),
    /// and not a change of another entry of a parent watched for swaps (its neighbours, such as
    /// log files written beside the directory, would otherwise make every write a rescan).
    /// Notifications that name no path (the watcher lost events) count.
    fn concern(&self, event: &notify::Event) -> bool {
        if matches!(event.kind, notify::EventKind::Access(_)) {
            return false;
        }
        event.paths.is_empty()
            || event
                .paths
                .iter()
                .any(|path| self.0.iter().any(|root| path.starts_with(root)))
    }
}

/// The device and inode a path resolves to (following symlinks), if it exists.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

type ParseResult = Result<Vec<(ResourceKey, Object)>, String>;

#[cfg(test)]
mod tests;
