//! Where the flag documents live: files beside the proxy, or FeatureFlag resources on the
//! control plane, rewritten once per version.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flagd_proxy_testkit::control_plane;
use flagd_proxy_testkit::control_plane::ControlPlane;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::SEQ_FLAG;
use crate::documents::{Documents, flags_of};
use crate::load::Tracker;
use crate::proxy::Kind;

/// Where one proxy's flags live and how subscribers name them.
pub(crate) struct Sources {
    pub(crate) kind: Kind,
    pub(crate) selectors: Vec<Arc<str>>,
    pub(crate) payload: usize,
    pub(crate) documents: Documents,
    pub(crate) backend: Backend,
}

pub(crate) enum Backend {
    Files {
        /// Files the proxy reads, one per resource.
        files: Vec<PathBuf>,
        /// A directory on the same file system for writing the next version before renaming
        /// it.
        staging: PathBuf,
    },
    Kubernetes {
        api: Box<kube::Api<kube::api::DynamicObject>>,
        names: Vec<String>,
    },
    /// The floor server's standard input, once it runs.
    Floor(std::sync::Mutex<Option<std::process::ChildStdin>>),
}

/// The namespace of the benchmark's FeatureFlag resources and manifests.
pub(crate) const NAMESPACE: &str = "bench";

/// Flag files written through a staging directory next to them.
fn file_backend(dir: &Path, files: Vec<PathBuf>) -> anyhow::Result<Backend> {
    Ok(Backend::Files {
        files,
        staging: staging_dir(dir)?,
    })
}

impl Sources {
    pub(crate) fn new(
        kind: Kind,
        dir: &Path,
        resources: usize,
        (payload, documents): (usize, Documents),
        cluster: Option<&ControlPlane>,
    ) -> anyhow::Result<Self> {
        let resource_selector =
            |i: usize| Arc::from(format!("core.openfeature.dev/{NAMESPACE}/r{i}"));
        let (backend, selectors) = match (kind, cluster) {
            (Kind::Floor, _) => (
                Backend::Floor(std::sync::Mutex::new(None)),
                vec![Arc::from("floor")],
            ),
            (_, Some(cluster)) => (
                Backend::Kubernetes {
                    api: Box::new(kube::Api::namespaced_with(
                        cluster.admin_client(),
                        NAMESPACE,
                        &control_plane::feature_flag_resource(),
                    )),
                    names: (0..resources).map(|i| format!("r{i}")).collect(),
                },
                (0..resources).map(resource_selector).collect(),
            ),
            (Kind::Rust, None) => {
                let manifests = dir.join("manifests");
                std::fs::create_dir_all(&manifests)?;
                let files = (0..resources)
                    .map(|i| manifests.join(format!("bench-r{i}.yaml")))
                    .collect();
                let selectors = (0..resources).map(resource_selector).collect();
                (file_backend(dir, files)?, selectors)
            }
            (Kind::Go | Kind::Model, None) => {
                let flags = dir.join("flags");
                std::fs::create_dir_all(&flags)?;
                let (files, selectors) = (0..resources)
                    .map(|i| {
                        let file = flags.join(format!("r{i}.json"));
                        let selector = Arc::from(format!("file:{}", file.display()));
                        (file, selector)
                    })
                    .unzip();
                (file_backend(dir, files)?, selectors)
            }
        };
        Ok(Self {
            kind,
            selectors,
            payload,
            documents,
            backend,
        })
    }

    /// A FeatureFlag object, as the operator's CRD defines it.
    pub(crate) fn feature_flag(&self, resource: usize, seq: u64) -> Value {
        flagd_proxy_testkit::feature_flag(
            NAMESPACE,
            &format!("r{resource}"),
            Value::Object(flags_of(self.documents, seq, self.payload)),
        )
    }

    pub(crate) fn file_content(&self, resource: usize, seq: u64) -> anyhow::Result<String> {
        Ok(if self.kind.go_like() {
            // The flagd flag configuration the Go proxy's file sync reads.
            json!({"flags": flags_of(self.documents, seq, self.payload)}).to_string()
        } else {
            serde_norway::to_string(&self.feature_flag(resource, seq))?
        })
    }

    /// Makes version `seq` of every resource visible to the proxy, calling `visible` (to take
    /// the time) just before: files are written beside the proxy's files, then `visible`, then
    /// renamed into place; resources are created (version 0) or, after `visible`, merge-patched
    /// (only the sequence number changes; the API server sends the whole object).
    pub(crate) async fn write(&self, seq: u64, visible: impl FnOnce()) -> anyhow::Result<()> {
        match &self.backend {
            Backend::Floor(control) => {
                if seq > 0 {
                    use std::io::Write as _;
                    let mut control = control.lock().unwrap_or_else(|p| p.into_inner());
                    let control = control
                        .as_mut()
                        .context("the floor server is not running")?;
                    visible();
                    writeln!(control, "{seq}")?;
                    control.flush()?;
                }
            }
            Backend::Files { files, staging } => {
                let mut staged = Vec::with_capacity(files.len());
                for (i, file) in files.iter().enumerate() {
                    let tmp = staging.join(format!("r{i}.tmp"));
                    std::fs::write(&tmp, self.file_content(i, seq)?)?;
                    staged.push((tmp, file));
                }
                visible();
                for (tmp, file) in staged {
                    std::fs::rename(&tmp, file)?;
                }
            }
            Backend::Kubernetes { api, names } if seq == 0 => {
                let creates = names.iter().enumerate().map(|(i, name)| async move {
                    let object = serde_json::from_value(self.feature_flag(i, 0))?;
                    api.create(&kube::api::PostParams::default(), &object)
                        .await
                        .with_context(|| format!("creating FeatureFlag {name}"))?;
                    Ok::<(), anyhow::Error>(())
                });
                let mut creates = futures::stream::iter(creates).buffer_unordered(16);
                while let Some(created) = creates.next().await {
                    created?;
                }
                visible();
            }
            Backend::Kubernetes { api, names } => {
                let patch = kube::api::Patch::Merge(json!({
                    "spec": {"flagSpec": {"flags": {SEQ_FLAG: {"metadata": {"benchSeq": seq}}}}}
                }));
                let params = kube::api::PatchParams::default();
                visible();
                let (params, patch) = (&params, &patch);
                let patches = names.iter().map(|name| async move {
                    api.patch(name, params, patch)
                        .await
                        .with_context(|| format!("patching FeatureFlag {name}"))
                });
                let mut patches = futures::stream::iter(patches).buffer_unordered(64);
                while let Some(patched) = patches.next().await {
                    patched?;
                }
            }
        }
        Ok(())
    }

    /// Writes version `seq` and waits up to `timeout` until every subscriber of `tracker` has
    /// it: when it was written, and when the last subscriber got it (on the tracker's clock).
    pub(crate) async fn deliver(
        &self,
        seq: u64,
        tracker: &Tracker,
        timeout: Duration,
    ) -> anyhow::Result<(u64, Option<u64>)> {
        let mut written = 0;
        self.write(seq, || written = tracker.now()).await?;
        Ok((written, tracker.wait_all(seq, timeout).await))
    }

    /// The size of the flag configuration a subscriber receives, approximately.
    pub(crate) fn document_bytes(&self) -> usize {
        json!({"flags": flags_of(self.documents, 0, self.payload)})
            .to_string()
            .len()
    }

    /// Creates `count` resources nobody subscribes to yet (Kubernetes only) and returns their
    /// selectors.
    pub(crate) async fn create_cold(&self, count: usize) -> anyhow::Result<Vec<Arc<str>>> {
        let Backend::Kubernetes { api, .. } = &self.backend else {
            return Ok(Vec::new());
        };
        let mut selectors = Vec::with_capacity(count);
        for i in 0..count {
            let name = format!("cold{i}");
            let mut object = self.feature_flag(0, 0);
            object["metadata"]["name"] = json!(name);
            let object = serde_json::from_value(object)?;
            api.create(&kube::api::PostParams::default(), &object)
                .await
                .with_context(|| format!("creating FeatureFlag {name}"))?;
            selectors.push(Arc::from(format!(
                "core.openfeature.dev/{NAMESPACE}/{name}"
            )));
        }
        Ok(selectors)
    }

    /// Gives the floor backend the floor server's input.
    pub(crate) fn attach(&self, control: Option<std::process::ChildStdin>) {
        if let Backend::Floor(slot) = &self.backend {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = control;
        }
    }
}

pub(crate) fn staging_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let staging = dir.join("staging");
    std::fs::create_dir_all(&staging)?;
    Ok(staging)
}

/// LIST, WATCH and GET requests on FeatureFlags the API server has answered.
pub(crate) async fn api_requests(cluster: Option<&ControlPlane>) -> Option<u64> {
    let cluster = cluster?;
    let mut total = 0;
    for verb in ["LIST", "WATCH", "GET"] {
        total += cluster.requests(verb, "featureflags").await;
    }
    Some(total)
}
