//! The state directory (`--state-dir`): the newest version the source delivered of each
//! resource served, kept on disk so that a restarted proxy whose source is away serves it at
//! once, marked stale. It implements the hub's [`VersionStore`] port.
//!
//! One file a resource, named after the SHA-256 of its selector (`<32 hex digits>.json`): a
//! JSON record of the format, the resource, its flag configuration and the SHA-256 of both.
//! Each file is written whole to a temporary file beside it, synced and renamed into place, so
//! an interrupted write leaves the old file or the new one, never half of one. A file that does
//! not read back (not JSON of this format, another format version, a checksum that does not
//! match, a resource that belongs in another file, larger than the bound) is ignored with a
//! warning naming it. Writes run on a task of their own, the newest version of each resource
//! only, on a blocking thread: never on the path that publishes versions ([`StateDir::flush`]
//! writes what is pending when the proxy stops). Files are the proxy user's only (`0600`). All
//! files together take at most `max_bytes`: a version that would go over is not kept, and the
//! older file of its resource is removed, as it is when a write fails or the source reports the
//! resource absent, so an older version is never served in place of a newer one after a restart.
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::hub::VersionStore;
use crate::selector::ResourceKey;

/// Default of [`StateSettings::max_bytes`] (and of `--state-dir-max-bytes`).
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The format version of the files; a file of another one is ignored.
const FORMAT: u32 = 1;

/// The suffix of a file being written, before it is renamed into place.
const TEMPORARY_SUFFIX: &str = ".tmp";

/// Where versions are kept across restarts, and how much room they may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateSettings {
    pub dir: PathBuf,
    /// The most bytes all files together may take.
    pub max_bytes: usize,
}

/// Why the state directory cannot be used (reported at start, before anything listens).
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("--state-dir {}: cannot create it: {source}", dir.display())]
    Create {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("--state-dir {}: cannot list it: {source}", dir.display())]
    List {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Why a file of the state directory is not read back.
#[derive(Debug, thiserror::Error)]
enum FileError {
    #[error("cannot read it: {0}")]
    Read(#[source] std::io::Error),
    #[error("it is {size} bytes, more than --state-dir-max-bytes ({limit})")]
    TooLarge { size: u64, limit: u64 },
    #[error("it is not a state file of flagd-proxy: {0}")]
    Format(#[source] serde_json::Error),
    #[error("it is of format {found}; this proxy reads format {FORMAT}")]
    Version { found: u32 },
    #[error("its checksum does not match its content")]
    Checksum,
    #[error("it holds {found}, which belongs in another file")]
    Misplaced { found: ResourceKey },
}

/// One file: a resource's flag configuration and the checksum of both.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record<'a> {
    format: u32,
    namespace: Cow<'a, str>,
    name: Cow<'a, str>,
    /// SHA-256 (hex) of the selector, a line feed and the flag configuration.
    sha256: String,
    flag_configuration: Cow<'a, str>,
}

impl Record<'_> {
    fn key(&self) -> ResourceKey {
        ResourceKey::new(self.namespace.as_ref(), self.name.as_ref())
    }
}

/// The versions kept in the state directory. Cheap to clone.
#[derive(Clone)]
pub struct StateDir {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    max_bytes: u64,
    /// The files kept, and their total size. Changed only by the writer (and at open).
    files: Mutex<Files>,
    /// What to write next, the newest version of each resource (`None`: remove its file).
    pending: Mutex<HashMap<ResourceKey, Option<Arc<str>>>>,
    /// Held while what was pending is written, so that one write of a file ends before the
    /// next begins (the writer task's, or a flush at shutdown).
    writing: Mutex<()>,
    /// Told when something is pending.
    wake: Notify,
}

#[derive(Default)]
struct Files {
    sizes: HashMap<String, u64>,
    total: u64,
}

impl Files {
    fn set(&mut self, name: &str, size: Option<u64>) {
        let old = match size {
            Some(size) => self.sizes.insert(name.to_owned(), size),
            None => self.sizes.remove(name),
        };
        self.total = self.total - old.unwrap_or(0) + size.unwrap_or(0);
    }
}

impl StateDir {
    /// Opens the directory (creating it when missing), checks every file in it (warning about
    /// those that do not read back) and starts the task that writes versions. Must be called
    /// within a Tokio runtime.
    pub fn open(settings: StateSettings) -> Result<Self, StateError> {
        let StateSettings { dir, max_bytes } = settings;
        let max_bytes = u64::try_from(max_bytes).unwrap_or(u64::MAX);
        std::fs::create_dir_all(&dir).map_err(|source| StateError::Create {
            dir: dir.clone(),
            source,
        })?;
        let list_error = |source| StateError::List {
            dir: dir.clone(),
            source,
        };
        let mut files = Files::default();
        for entry in std::fs::read_dir(&dir).map_err(list_error)? {
            let entry = entry.map_err(list_error)?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                // Not one of the proxy's (a volume's lost+found, say).
                continue;
            }
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name
                .strip_suffix(TEMPORARY_SUFFIX)
                .is_some_and(is_state_file_name)
            {
                // A write that was interrupted; the file it was to replace is still there.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            match read(&path, max_bytes) {
                Ok(record) if file_name(&record.key()) == name => {
                    let size = entry.metadata().map_or(0, |m| m.len());
                    files.set(&name, Some(size));
                }
                Ok(record) => ignored(
                    &path,
                    &FileError::Misplaced {
                        found: record.key(),
                    },
                ),
                Err(error) => ignored(&path, &error),
            }
        }
        tracing::info!(
            dir = %dir.display(),
            versions = files.sizes.len(),
            bytes = files.total,
            "state directory opened: versions kept there are served, marked stale, while the source has not delivered them"
        );
        let shared = Arc::new(Shared {
            dir,
            max_bytes,
            files: Mutex::new(files),
            pending: Mutex::new(HashMap::new()),
            writing: Mutex::new(()),
            wake: Notify::new(),
        });
        tokio::spawn(write_when_pending(shared.clone()));
        Ok(Self { shared })
    }

    /// Writes what is pending now (at shutdown: the newest versions are not left to the task).
    pub async fn flush(&self) {
        flush(self.shared.clone()).await;
    }

    /// How many versions are kept, and their total size in bytes.
    pub fn kept(&self) -> (usize, u64) {
        let files = crate::locks::lock(&self.shared.files);
        (files.sizes.len(), files.total)
    }

    fn queue(&self, key: &ResourceKey, document: Option<Arc<str>>) {
        crate::locks::lock(&self.shared.pending).insert(key.clone(), document);
        self.shared.wake.notify_one();
    }
}

impl VersionStore for StateDir {
    fn load(&self, key: &ResourceKey) -> Option<String> {
        let path = self.shared.dir.join(file_name(key));
        match read(&path, self.shared.max_bytes) {
            Ok(record) if record.key() == *key => Some(record.flag_configuration.into_owned()),
            Ok(record) => {
                ignored(
                    &path,
                    &FileError::Misplaced {
                        found: record.key(),
                    },
                );
                None
            }
            Err(FileError::Read(error)) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                ignored(&path, &error);
                None
            }
        }
    }

    fn keep(&self, key: &ResourceKey, document: Arc<str>) {
        self.queue(key, Some(document));
    }

    /// Always queued, even when no file is counted for `key`: a write of it may be under way,
    /// and its file must not outlive the resource.
    fn forget(&self, key: &ResourceKey) {
        self.queue(key, None);
    }
}

/// Writes what is pending whenever there is some, for as long as the process runs.
async fn write_when_pending(shared: Arc<Shared>) {
    loop {
        shared.wake.notified().await;
        flush(shared.clone()).await;
    }
}

/// Writes what is pending, on a blocking thread.
async fn flush(shared: Arc<Shared>) {
    if let Err(error) = tokio::task::spawn_blocking(move || shared.write_pending()).await {
        tracing::error!(%error, "writing to the state directory failed");
    }
}

impl Shared {
    /// Writes every version pending, one write at a time.
    fn write_pending(&self) {
        let _writing = crate::locks::lock(&self.writing);
        let batch: Vec<_> = crate::locks::lock(&self.pending).drain().collect();
        for (key, document) in batch {
            self.write(&key, document.as_deref());
        }
    }

    /// Replaces the file of `key` with `document`, or removes it (`None`).
    fn write(&self, key: &ResourceKey, document: Option<&str>) {
        let name = file_name(key);
        let Some(document) = document else {
            return self.remove(&name);
        };
        let bytes = encode(key, document);
        let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        let total = {
            let files = crate::locks::lock(&self.files);
            files.total - files.sizes.get(&name).copied().unwrap_or(0)
        };
        if total.saturating_add(size) > self.max_bytes {
            tracing::warn!(
                resource = %key,
                bytes = size,
                limit = self.max_bytes,
                "version not kept in the state directory: it would take more than --state-dir-max-bytes; the older one is removed"
            );
            return self.remove(&name);
        }
        match write_atomically(&self.dir, &name, &bytes) {
            Ok(()) => crate::locks::lock(&self.files).set(&name, Some(size)),
            Err(error) => {
                tracing::warn!(
                    resource = %key,
                    file = %self.dir.join(&name).display(),
                    %error,
                    "version not kept in the state directory; the older one is removed"
                );
                self.remove(&name);
            }
        }
    }

    fn remove(&self, name: &str) {
        let path = self.dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(file = %path.display(), %error, "cannot remove a file of the state directory");
            }
        }
        crate::locks::lock(&self.files).set(name, None);
    }
}

/// Writes `bytes` to a temporary file in `dir`, syncs it and renames it to `name`, then syncs
/// the directory, so the file is either the old one or all of the new one.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;

    let temporary = dir.join(format!("{name}{TEMPORARY_SUFFIX}"));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        });
    let renamed = written.and_then(|()| std::fs::rename(&temporary, dir.join(name)));
    if let Err(error) = renamed {
        let _ = std::fs::remove_file(&temporary);
        return Err(error);
    }
    File::open(dir).and_then(|dir| dir.sync_all())
}

/// Reads and checks one file.
fn read(path: &Path, limit: u64) -> Result<Record<'static>, FileError> {
    let file = File::open(path).map_err(FileError::Read)?;
    let size = file.metadata().map_err(FileError::Read)?.len();
    if size > limit {
        return Err(FileError::TooLarge { size, limit });
    }
    let mut bytes = Vec::new();
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(FileError::Read)?;
    let record: Record<'static> = serde_json::from_slice(&bytes).map_err(FileError::Format)?;
    if record.format != FORMAT {
        return Err(FileError::Version {
            found: record.format,
        });
    }
    if record.sha256 != checksum(&record.key(), &record.flag_configuration) {
        return Err(FileError::Checksum);
    }
    Ok(record)
}

/// A file's content: the record of `document` as the version of `key`.
fn encode(key: &ResourceKey, document: &str) -> Vec<u8> {
    let record = Record {
        format: FORMAT,
        namespace: Cow::Borrowed(&key.namespace),
        name: Cow::Borrowed(&key.name),
        sha256: checksum(key, document),
        flag_configuration: Cow::Borrowed(document),
    };
    // A record of strings always serializes.
    serde_json::to_vec(&record).unwrap_or_default()
}

fn checksum(key: &ResourceKey, document: &str) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(key.to_string().as_bytes());
    context.update(b"\n");
    context.update(document.as_bytes());
    hex(context.finish().as_ref())
}

/// The file of `key`: the first 128 bits of the SHA-256 of its selector, in hex.
fn file_name(key: &ResourceKey) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.to_string().as_bytes());
    format!("{}.json", hex(&digest.as_ref()[..16]))
}

/// Whether `name` is what [`file_name`] makes.
fn is_state_file_name(name: &str) -> bool {
    name.strip_suffix(".json")
        .is_some_and(|stem| stem.len() == 32 && stem.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn ignored(path: &Path, error: &FileError) {
    tracing::warn!(file = %path.display(), %error, "state file ignored");
}

#[cfg(test)]
mod tests;
