//! The families of what went wrong: errors reading from a source, and requests refused, by
//! reason (every reason in [`REJECT_REASONS`] is exported from the start, at 0).
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{Metrics, ReasonLabels, SourceErrorLabels, registered};

impl Metrics {
    /// Source errors and refused requests.
    pub(super) fn error_metrics(
        proxy: &mut Registry,
    ) -> (
        Family<SourceErrorLabels, Counter>,
        Family<ReasonLabels, Counter>,
    ) {
        let source_errors = registered(
            proxy,
            "source_errors",
            "Errors reading from a source",
            Family::default(),
        );
        let rejected_requests: Family<ReasonLabels, Counter> = registered(
            proxy,
            "rejected_requests",
            "Requests refused, by reason",
            Family::default(),
        );
        // Every reason from the start, at 0: a first refusal is then an increase that rate()
        // and increase() see, not the start of a series.
        for reason in REJECT_REASONS {
            drop(rejected_requests.get_or_create(&ReasonLabels { reason }));
        }
        (source_errors, rejected_requests)
    }

    pub fn reject(&self, reason: &'static str) {
        debug_assert!(
            REJECT_REASONS.contains(&reason),
            "{reason} is not in REJECT_REASONS"
        );
        self.rejected_requests
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn source_error(&self, source: &'static str, kind: &'static str) {
        self.source_errors
            .get_or_create(&SourceErrorLabels { source, kind })
            .inc();
    }
}

/// Every `reason` of `flagd_proxy_rejected_requests_total`: the limits (named after their flags)
/// and the refusals that are not limits (a client not allowed to read, a selector that is not
/// one).
pub const REJECT_REASONS: [&str; 13] = [
    "max_watches",
    "max_waiting_resources",
    "max_resources_per_address",
    "max_connections",
    "max_connections_per_address",
    "max_pending_requests_per_address",
    "max_management_connections",
    "max_management_connections_per_address",
    "max_header_bytes",
    "max_request_bytes",
    "memory_budget",
    "unauthorized",
    "invalid_selector",
];
