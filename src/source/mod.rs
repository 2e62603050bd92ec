//! Sources: the adapters that fetch resources from a backend (manifest files, another proxy;
//! the Kubernetes one lives with the rest of the Kubernetes adapter in [`crate::kubernetes`]) and
//! report them to the hub through its [`Source`] port.
//!
//! Sources depend on the hub; the hub knows none of them. Those that connect to a backend
//! record each attempt as a span ([`ConnectAttempt`]) when the hub's owner gives them a
//! [`SpanSink`].
use std::sync::Arc;
use std::time::SystemTime;

pub use crate::hub::Source;
use crate::hub::ports::resource_attribute;
use crate::hub::{SpanRecord, SpanSink, SpanValue};
use crate::selector::ResourceKey;

pub mod manifests;
pub mod upstream;

/// One attempt of a resource's watch to reach its backend (a stream to the upstream proxy, a
/// list or watch request to the Kubernetes API), recorded as a span once it worked or failed.
pub(crate) struct ConnectAttempt {
    spans: Arc<dyn SpanSink>,
    name: &'static str,
    started: SystemTime,
    attributes: Vec<(&'static str, SpanValue)>,
}

impl ConnectAttempt {
    /// Starts attempt number `attempt` (1 for the watch's first) of the watch of `key`, with
    /// `extra` attributes besides the resource and the attempt.
    pub(crate) fn start(
        spans: Arc<dyn SpanSink>,
        name: &'static str,
        key: &ResourceKey,
        attempt: u64,
        extra: impl IntoIterator<Item = (&'static str, SpanValue)>,
    ) -> Self {
        let mut attributes = vec![
            resource_attribute(key),
            ("flagd_proxy.attempt", attempt.into()),
        ];
        attributes.extend(extra);
        Self {
            spans,
            name,
            started: SystemTime::now(),
            attributes,
        }
    }

    /// Records the span: the attempt worked (`None`) or failed with `error`.
    pub(crate) fn done(self, error: Option<String>) {
        self.spans.record(SpanRecord {
            name: self.name,
            start: self.started,
            end: SystemTime::now(),
            attributes: self.attributes,
            error,
        });
    }
}
