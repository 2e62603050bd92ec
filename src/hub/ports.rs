//! The ports the hub owns: what a source of resources is, where the outcome of each version is
//! reported, where spans go, and where versions are kept across restarts. Adapters
//! (`crate::source`, `crate::telemetry`, `crate::state`) implement them; the hub knows none of
//! them.
use std::sync::Arc;
use std::time::{Instant, SystemTime};

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

    /// What one watch of this source holds while it runs, waiting or delivering (its task, its
    /// requests and buffers, its share of a connection; not the versions it delivers, which are
    /// charged apart), as measured. The hub charges it to the memory budget for as long as the
    /// watch runs, and refuses a new watch that does not fit.
    fn watch_bytes(&self) -> usize;

    /// Watches one resource until the returned future is dropped, reporting every state it
    /// observes (the resource as JSON, its absence, or an error) to `publisher`. The future
    /// should not return; if it does, the hub starts it again after a pause.
    fn watch(&self, key: ResourceKey, publisher: Publisher) -> BoxFuture<'static, ()>;

    /// Source-wide state for the status page (for example files that do not parse).
    fn status(&self) -> crate::introspection::SourceStatus {
        crate::introspection::SourceStatus::Unreported
    }
}

/// Where the hub tells the people who edit resources what became of each version (for
/// Kubernetes, Events on the object).
pub trait EventSink: Send + Sync + 'static {
    /// Starts reporting for one watched resource; reporting stops when the handle is dropped.
    fn reporter_for(&self, key: ResourceKey) -> Box<dyn ResourceEventSink>;
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

/// Where the newest version of each resource the source delivered is kept across restarts
/// (`--state-dir`). When a watch starts and its source has not delivered a version (it is
/// unreachable, or has not answered within [`crate::hub::STALE_GRACE`]), the hub serves the
/// kept one, marked stale, until the source delivers one.
pub trait VersionStore: Send + Sync + 'static {
    /// The kept flag configuration of `key`, if there is one that reads back intact. May block
    /// (it reads a file): the hub calls it on a blocking thread.
    fn load(&self, key: &ResourceKey) -> Option<String>;
    /// `document` is the newest version the source delivered for `key`. Must not block.
    fn keep(&self, key: &ResourceKey, document: Arc<str>);
    /// The source reports that `key` does not exist: nothing is to be served of it from an
    /// earlier run. Must not block.
    fn forget(&self, key: &ResourceKey);
}

/// Where spans go: one per published version (see [`PUBLISH_SPAN`]) and, from sources that
/// connect to a backend, one per connection attempt. An exporter implements it (OpenTelemetry
/// traces); it must not block: a span it cannot keep is dropped.
pub trait SpanSink: Send + Sync + 'static {
    fn record(&self, span: SpanRecord);
}

/// The span of one published version: from the change seen at the source until the last
/// subscriber counted at its publication was written, left, or was passed by a newer version.
pub const PUBLISH_SPAN: &str = "flagd_proxy.publish";

/// A finished span, as sources and the hub report it.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanRecord {
    pub name: &'static str,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(&'static str, SpanValue)>,
    /// Why what the span covers failed (`None`: it did not).
    pub error: Option<String>,
}

/// The value of a span attribute.
#[derive(Clone, Debug, PartialEq)]
pub enum SpanValue {
    Text(String),
    Int(i64),
    Bool(bool),
}

impl From<String> for SpanValue {
    fn from(text: String) -> Self {
        SpanValue::Text(text)
    }
}

impl From<&str> for SpanValue {
    fn from(text: &str) -> Self {
        SpanValue::Text(text.to_owned())
    }
}

impl From<bool> for SpanValue {
    fn from(value: bool) -> Self {
        SpanValue::Bool(value)
    }
}

impl From<usize> for SpanValue {
    fn from(value: usize) -> Self {
        SpanValue::Int(i64::try_from(value).unwrap_or(i64::MAX))
    }
}

impl From<u64> for SpanValue {
    fn from(value: u64) -> Self {
        SpanValue::Int(i64::try_from(value).unwrap_or(i64::MAX))
    }
}

/// The attribute naming the resource a span is about: `flagd_proxy.resource`, `namespace/name`.
pub fn resource_attribute(key: &ResourceKey) -> (&'static str, SpanValue) {
    (
        "flagd_proxy.resource",
        SpanValue::Text(format!("{}/{}", key.namespace, key.name)),
    )
}

/// The wall-clock time of `instant` (an instant in the past, as sources note when they saw a
/// change).
pub fn wall_clock(instant: Instant) -> SystemTime {
    let now = SystemTime::now();
    now.checked_sub(instant.elapsed()).unwrap_or(now)
}
