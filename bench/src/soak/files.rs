//! The manifest files of the soak: the steady resources, rewritten round-robin by a thread of
//! their own, and the resources that come and go.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use crate::documents::flags;
use crate::sources::NAMESPACE;

/// Stands for the sequence number in a rendered manifest; found once and replaced.
const SEQ_PLACEHOLDER: u64 = 9_876_543_210_123;

/// A manifest rendered once, with the place of its sequence number: rewriting it costs a
/// concatenation, not a YAML serialization.
#[derive(Clone, Debug)]
pub(crate) struct Template {
    before: String,
    after: String,
}

impl Template {
    /// The manifest of FeatureFlag `bench/<name>` with documents of about `payload` bytes.
    pub(crate) fn new(name: &str, payload: usize) -> anyhow::Result<Self> {
        let object = flagd_proxy_testkit::feature_flag(
            NAMESPACE,
            name,
            Value::Object(flags(SEQ_PLACEHOLDER, payload)),
        );
        let text = serde_norway::to_string(&object)?;
        let placeholder = SEQ_PLACEHOLDER.to_string();
        anyhow::ensure!(
            text.matches(&placeholder).count() == 1,
            "the manifest of {name} does not hold its sequence number once"
        );
        let (before, after) = text
            .split_once(&placeholder)
            .context("no sequence number in the manifest")?;
        Ok(Self {
            before: before.to_owned(),
            after: after.to_owned(),
        })
    }

    pub(crate) fn render(&self, seq: u64) -> String {
        format!("{}{seq}{}", self.before, self.after)
    }
}

/// Where the proxy reads manifests, and a directory beside it (same file system) where each
/// version is written before it is renamed into place.
#[derive(Clone, Debug)]
pub(crate) struct Dirs {
    pub(crate) manifests: PathBuf,
    pub(crate) staging: PathBuf,
}

impl Dirs {
    pub(crate) fn new(dir: &Path) -> anyhow::Result<Self> {
        let dirs = Self {
            manifests: dir.join("manifests"),
            staging: dir.join("staging"),
        };
        std::fs::create_dir_all(&dirs.manifests)?;
        std::fs::create_dir_all(&dirs.staging)?;
        Ok(dirs)
    }

    /// The manifest file of resource `name`.
    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.manifests.join(format!("bench-{name}.yaml"))
    }

    /// Writes `content` as resource `name`'s manifest, atomically (renamed into place).
    pub(crate) fn write(&self, name: &str, content: &str) -> std::io::Result<()> {
        let staged = self.staging.join(format!("{name}.tmp"));
        std::fs::write(&staged, content)?;
        std::fs::rename(&staged, self.file(name))
    }

    pub(crate) fn remove(&self, name: &str) -> std::io::Result<()> {
        std::fs::remove_file(self.file(name))
    }
}

/// The steady resources `r0`, `r1`, …: their templates, and the newest version written of each.
pub(crate) struct Steady {
    pub(crate) dirs: Dirs,
    pub(crate) names: Vec<String>,
    templates: Vec<Template>,
    /// Per resource, the newest version made visible (stored just before it is).
    pub(crate) written: Vec<AtomicU64>,
}

impl Steady {
    /// Writes version 0 of `resources` resources.
    pub(crate) fn create(dirs: Dirs, resources: usize, payload: usize) -> anyhow::Result<Self> {
        let names: Vec<String> = (0..resources).map(|i| format!("r{i}")).collect();
        let templates = names
            .iter()
            .map(|name| Template::new(name, payload))
            .collect::<anyhow::Result<Vec<_>>>()?;
        for (name, template) in names.iter().zip(&templates) {
            dirs.write(name, &template.render(0))?;
        }
        Ok(Self {
            written: (0..resources).map(|_| AtomicU64::new(0)).collect(),
            dirs,
            names,
            templates,
        })
    }

    /// The selector of steady resource `i`.
    pub(crate) fn selector(&self, i: usize) -> Arc<str> {
        selector(&self.names[i])
    }

    /// The newest version written of each resource.
    pub(crate) fn finals(&self) -> Vec<u64> {
        self.written
            .iter()
            .map(|w| w.load(Ordering::Acquire))
            .collect()
    }
}

/// How the writer did.
#[derive(Debug, Default, Clone)]
pub(crate) struct Written {
    pub(crate) updates: u64,
    pub(crate) errors: u64,
    pub(crate) last_error: Option<String>,
}

/// Rewrites the steady resources round-robin, `updates` in all, the n-th at `start + n / rate`
/// (or as soon as it can when behind), on a thread of its own; stops early when `stop` is set.
pub(crate) fn spawn_writer(
    steady: Arc<Steady>,
    updates: u64,
    rate: u64,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Written> {
    std::thread::spawn(move || {
        let mut done = Written::default();
        let resources = steady.names.len();
        for n in 0..updates {
            if n % 256 == 0 && stop.load(Ordering::Relaxed) {
                break;
            }
            // Evenly paced, not in bursts: writes that come faster than the proxy reads the
            // directory are taken together, as one version per resource.
            let due = start + Duration::from_secs_f64(n as f64 / rate.max(1) as f64);
            let now = Instant::now();
            if due > now + Duration::from_millis(1) {
                std::thread::sleep(due - now);
            }
            let i = (n % resources as u64) as usize;
            let seq = steady.written[i].load(Ordering::Relaxed) + 1;
            // Stored before the rename: a subscriber can never see a version not counted here.
            steady.written[i].store(seq, Ordering::Release);
            match steady
                .dirs
                .write(&steady.names[i], &steady.templates[i].render(seq))
            {
                Ok(()) => done.updates += 1,
                Err(error) => {
                    done.errors += 1;
                    done.last_error = Some(format!("writing {}: {error}", steady.names[i]));
                }
            }
        }
        done
    })
}

/// The selector of FeatureFlag `bench/<name>`.
pub(crate) fn selector(name: &str) -> Arc<str> {
    Arc::from(format!("core.openfeature.dev/{NAMESPACE}/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_renders_what_serialization_does() {
        let template = Template::new("r3", 1024).expect("template");
        let direct = serde_norway::to_string(&flagd_proxy_testkit::feature_flag(
            NAMESPACE,
            "r3",
            Value::Object(flags(42, 1024)),
        ))
        .expect("yaml");
        assert_eq!(template.render(42), direct);
    }
}
