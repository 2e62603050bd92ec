//! The ports the hub owns: what a source of resources is, and where the outcome of each
//! version is reported. Adapters (`crate::source`) implement them; the hub knows none of them.
use futures::future::BoxFuture;
use serde_json::Value;

use crate::hub::Publisher;
use crate::selector::ResourceKey;

/// A provider of `FeatureFlag` resources.
///
/// A source watches one resource at a time, on demand: the hub calls [`Source::watch`] when the
/// first client asks for a resource and drops the returned future when the last one has gone.
/// The source reports what it sees through the [`Publisher`]; it never talks to clients.
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

/// Where the hub tells the people who edit resources what became of each version (for
/// Kubernetes, Events on the object).
pub trait EventSink: Send + Sync + 'static {
    /// Starts reporting for one watched resource; reporting stops when the handle is dropped.
    fn watch(&self, key: ResourceKey) -> Box<dyn ResourceEventSink>;
}

/// One watched resource's reporting.
pub trait ResourceEventSink: Send + Sync {
    /// The version in `resource` was accepted and is what clients get.
    fn accepted(&self, resource: &Value);
    /// The version in `resource` was accepted and is what clients get, but clients will report
    /// `problems` (the warnings, joined by `; `) for some of its flags when they evaluate them.
    fn warned(&self, resource: &Value, problems: &str);
    /// The version in `resource` was rejected for `problem`; clients keep the last accepted one.
    fn rejected(&self, resource: &Value, problem: &str);
}
