//! Sources: where resources come from (Kubernetes, manifest files).
//!
//! A source watches one resource at a time, on demand: the hub calls [`Source::watch`] when the
//! first client asks for a resource and drops the returned future when the last one has gone.
//! The source reports what it sees through the [`Publisher`]; it never talks to clients.
use futures::future::BoxFuture;

use crate::hub::Publisher;
use crate::selector::ResourceKey;

pub mod events;
pub mod kube_http2;
pub mod kubernetes;
pub mod manifests;
pub mod upstream;

/// A provider of `FeatureFlag` resources.
pub trait Source: Send + Sync + 'static {
    /// A short name for logs and metrics (`kubernetes`, `manifests`).
    fn name(&self) -> &'static str;

    /// Watches one resource until the returned future is dropped, reporting every state it
    /// observes (the resource as JSON, its absence, or an error) to `publisher`. The future
    /// should not return; if it does, the hub starts it again after a pause.
    fn watch(&self, key: ResourceKey, publisher: Publisher) -> BoxFuture<'static, ()>;

    /// Source-wide state for the status page (for example files that do not parse).
    fn status(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}
