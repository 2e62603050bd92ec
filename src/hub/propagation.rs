//! The end of each version's propagation, reported once: the histogram and the skipped count in
//! the metrics, and a [`PUBLISH_SPAN`] span when spans are recorded.
use std::sync::Arc;
use std::time::SystemTime;

use crate::hub::ports::{PUBLISH_SPAN, SpanRecord, SpanSink, resource_attribute, wall_clock};
use crate::hub::snapshot::{Settled, Snapshot};
use crate::metrics::Metrics;
use crate::selector::ResourceKey;

/// Reports how versions propagated. One per hub, shared by its publishers and subscriptions.
pub(super) struct Propagation {
    pub(super) metrics: Arc<Metrics>,
    pub(super) spans: Option<Arc<dyn SpanSink>>,
}

impl Propagation {
    /// `snapshot` of `key` has settled: the last subscriber counted at its publication was sent
    /// it, left, or was passed by a newer version.
    pub(super) fn settled(&self, key: &ResourceKey, snapshot: &Snapshot, settled: Settled) {
        if let Some(elapsed) = settled.propagation {
            self.metrics.observe_propagation(elapsed);
        }
        if settled.skipped > 0 {
            self.metrics.versions_skipped.inc_by(settled.skipped as u64);
        }
        self.span(key, snapshot, settled.skipped > 0);
    }

    /// `snapshot` of `key` was published with no subscriber: it has nobody to wait for.
    pub(super) fn unwatched(&self, key: &ResourceKey, snapshot: &Snapshot) {
        self.span(key, snapshot, false);
    }

    /// The version's span, ending now.
    fn span(&self, key: &ResourceKey, snapshot: &Snapshot, superseded: bool) {
        let Some(spans) = &self.spans else {
            return;
        };
        spans.record(SpanRecord {
            name: PUBLISH_SPAN,
            start: wall_clock(snapshot.changed_at),
            end: SystemTime::now(),
            attributes: vec![
                resource_attribute(key),
                ("flagd_proxy.version", snapshot.version.into()),
                ("flagd_proxy.subscribers", snapshot.subscribers.into()),
                (
                    "flagd_proxy.bytes",
                    snapshot.flag_configuration.len().into(),
                ),
                ("flagd_proxy.superseded", superseded.into()),
            ],
            error: None,
        });
    }
}
