//! The manifests source: `FeatureFlag` objects from YAML/JSON files in local directories.
//!
//! Every file under the configured directories is read (multi-document YAML, JSON, and `List`
//! objects); `FeatureFlag` objects are served under `core.openfeature.dev/<namespace>/<name>`,
//! the namespace defaulting to `default`. The directories are watched: an edit reaches
//! subscribers without a restart. A file that stops parsing keeps its last good objects, so a
//! half-saved edit never takes flags away from clients.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use notify::Watcher;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::hub::Publisher;
use crate::metrics::Metrics;
use crate::selector::{self, GROUP, ResourceKey};
use crate::source::Source;

/// Files larger than this are not read.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Events within this time of the previous scan are coalesced into one rescan.
const SETTLE: Duration = Duration::from_millis(50);

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

/// Serves `FeatureFlag` objects from manifest files.
pub struct ManifestSource {
    catalog: watch::Receiver<Arc<Catalog>>,
    // Dropping the watcher stops file notifications; it lives as long as the source.
    _watcher: Box<dyn Watcher + Send + Sync>,
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
        let on_event = move |event: notify::Result<notify::Event>| {
            if event.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
                let _ = events_tx.send(Instant::now());
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
        for dir in &dirs {
            watcher
                .watch(dir, notify::RecursiveMode::Recursive)
                .map_err(|source| ManifestError::Watch {
                    path: dir.clone(),
                    source,
                })?;
        }
        let mut scanner = Scanner {
            dirs,
            files: BTreeMap::new(),
            metrics,
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
        serde_json::json!({"resources": catalog.resources.len(), "problems": catalog.problems})
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
}

struct Scanner {
    dirs: Vec<PathBuf>,
    files: BTreeMap<PathBuf, FileState>,
    metrics: Arc<Metrics>,
}

impl Scanner {
    async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<Instant>,
        tx: watch::Sender<Arc<Catalog>>,
    ) {
        let mut last_scan: Option<Instant> = None;
        while let Some(first) = events.recv().await {
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
        let mut paths = Vec::new();
        for dir in &self.dirs {
            collect_files(dir, &mut paths);
        }
        paths.sort();
        paths.dedup();
        let mut next = BTreeMap::new();
        for path in paths {
            let previous = self.files.remove(&path);
            let state = self.read(&path, previous);
            next.insert(path, state);
        }
        for gone in self.files.keys() {
            tracing::info!(path = %gone.display(), "manifest file removed");
        }
        self.files = next;

        let mut catalog = Catalog {
            changed_at,
            ..Catalog::default()
        };
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

    fn read(&self, path: &Path, previous: Option<FileState>) -> FileState {
        let content = match read_limited(path) {
            Ok(content) => content,
            Err(error) => {
                self.metrics.source_error("manifests", "read");
                tracing::error!(path = %path.display(), %error, "cannot read manifest file");
                let objects = previous.map(|p| p.objects).unwrap_or_default();
                return FileState {
                    content: Vec::new(),
                    objects,
                    error: Some(error),
                };
            }
        };
        if let Some(previous) = previous {
            if previous.content == content {
                return previous;
            }
            return self.parse(path, content, previous.objects);
        }
        self.parse(path, content, Vec::new())
    }

    fn parse(
        &self,
        path: &Path,
        content: Vec<u8>,
        last_good: Vec<(ResourceKey, Arc<Value>)>,
    ) -> FileState {
        match parse_objects(path, &content) {
            Ok(objects) => {
                tracing::debug!(path = %path.display(), resources = objects.len(), "manifest file read");
                FileState {
                    content,
                    objects,
                    error: None,
                }
            }
            Err(error) => {
                self.metrics.source_error("manifests", "parse");
                tracing::error!(path = %path.display(), %error, "invalid manifest file; keeping its last good resources");
                FileState {
                    content,
                    objects: last_good,
                    error: Some(error),
                }
            }
        }
    }
}

fn read_limited(path: &Path) -> Result<Vec<u8>, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "the file is {} bytes, over the limit of {MAX_FILE_BYTES}",
            meta.len()
        ));
    }
    std::fs::read(path).map_err(|e| e.to_string())
}

/// Manifest files under `dir`: `.yaml`, `.yml` and `.json`, skipping hidden entries.
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if hidden {
            continue;
        }
        if path.is_dir() {
            collect_files(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(path);
        }
    }
}

/// The `FeatureFlag` objects in one file.
fn parse_objects(path: &Path, content: &[u8]) -> Result<Vec<(ResourceKey, Arc<Value>)>, String> {
    let text = std::str::from_utf8(content).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut documents = Vec::new();
    if path.extension().is_some_and(|e| e == "json") {
        documents
            .push(serde_json::from_str::<Value>(text).map_err(|e| format!("invalid JSON: {e}"))?);
    } else {
        for (index, document) in serde_norway::Deserializer::from_str(text).enumerate() {
            let value = Value::deserialize(document)
                .map_err(|e| format!("invalid YAML in document {}: {e}", index + 1))?;
            documents.push(value);
        }
    }
    let mut objects = Vec::new();
    for document in documents {
        collect_objects(document, &mut objects)?;
    }
    Ok(objects)
}

fn collect_objects(
    document: Value,
    out: &mut Vec<(ResourceKey, Arc<Value>)>,
) -> Result<(), String> {
    let kind = document
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match kind {
        "" if document.is_null() => Ok(()),
        "List" | "FeatureFlagList" => {
            if let Some(Value::Array(items)) = document.get("items") {
                for item in items {
                    collect_objects(item.clone(), out)?;
                }
            }
            Ok(())
        }
        "FeatureFlag" if is_our_api(&document) => {
            let name = document
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .ok_or("a FeatureFlag has no metadata.name")?;
            let namespace = document
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default");
            let key = selector::parse(&format!("{GROUP}/{namespace}/{name}"))
                .map_err(|e| e.to_string())?;
            out.push((key, Arc::new(document)));
            Ok(())
        }
        _ => Ok(()),
    }
}

fn is_our_api(document: &Value) -> bool {
    document
        .get("apiVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| {
            v.strip_prefix(GROUP)
                .is_some_and(|rest| rest.starts_with('/'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<ResourceKey>, String> {
        parse_objects(Path::new("x.yaml"), text.as_bytes())
            .map(|v| v.into_iter().map(|(k, _)| k).collect())
    }

    #[test]
    fn reads_multi_document_yaml_with_default_namespace() {
        let keys = parse(
            "apiVersion: core.openfeature.dev/v1beta1\nkind: FeatureFlag\nmetadata: {name: a}\nspec: {}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n\
             apiVersion: core.openfeature.dev/v1beta1\nkind: FeatureFlag\nmetadata: {name: b, namespace: team}\n---\n",
        )
        .expect("parses");
        assert_eq!(
            keys,
            vec![
                ResourceKey::new("default", "a"),
                ResourceKey::new("team", "b")
            ]
        );
    }

    #[test]
    fn reads_lists_and_json() {
        let keys = parse_objects(
            Path::new("x.json"),
            br#"{"kind":"List","items":[{"apiVersion":"core.openfeature.dev/v1beta1","kind":"FeatureFlag","metadata":{"name":"j"}}]}"#,
        )
        .expect("parses");
        assert_eq!(keys[0].0, ResourceKey::new("default", "j"));
    }

    #[test]
    fn reports_what_is_wrong() {
        assert!(
            parse("kind: [")
                .expect_err("bad yaml")
                .contains("invalid YAML")
        );
        let err = parse("apiVersion: core.openfeature.dev/v1beta1\nkind: FeatureFlag\nmetadata: {name: Bad_Name}\n").expect_err("bad name");
        assert!(err.contains("not a valid Kubernetes object name"), "{err}");
        let err =
            parse("apiVersion: core.openfeature.dev/v1beta1\nkind: FeatureFlag\nmetadata: {}\n")
                .expect_err("no name");
        assert!(err.contains("metadata.name"), "{err}");
    }
}
