//! The Kubernetes source: one watch per requested FeatureFlag.
use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::hub::Publisher;
use crate::metrics::Metrics;
use crate::selector::ResourceKey;
use crate::source::Source;

/// How to reach the API server.
#[derive(Clone, Debug, Default)]
pub struct KubeSettings {
    pub api_server: Option<String>,
    pub ca_path: Option<PathBuf>,
    pub token_path: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("the Kubernetes source is not available yet; use --manifests DIR")]
    Unavailable,
}

pub struct KubernetesSource {
    _metrics: Arc<Metrics>,
}

impl KubernetesSource {
    pub async fn connect(
        _settings: KubeSettings,
        _metrics: Arc<Metrics>,
    ) -> Result<Self, KubeError> {
        Err(KubeError::Unavailable)
    }
}

impl Source for KubernetesSource {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn watch(&self, _key: ResourceKey, _publisher: Publisher) -> BoxFuture<'static, ()> {
        Box::pin(futures::future::pending())
    }
}
