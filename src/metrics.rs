//! Prometheus metrics, registered once and shared by every part of the proxy.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceErrorLabels {
    pub source: &'static str,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabels {
    pub port: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// Every metric the proxy exports.
pub struct Metrics {
    registry: Registry,
    /// Open sync streams, all protocols (the name the Go flagd-proxy exports).
    pub sync_active_streams: Gauge,
    pub active_streams: Family<ProtocolLabels, Gauge>,
    pub upstream_watches: Gauge,
    /// Watched resources that do not exist and never had a version (bounded by
    /// `--max-waiting-resources`).
    pub waiting_resources: Gauge,
    pub versions_published: Counter,
    pub updates_sent: Family<ProtocolLabels, Counter>,
    pub invalid_documents: Family<ResourceLabels, Counter>,
    pub source_errors: Family<SourceErrorLabels, Counter>,
    pub rejected_requests: Family<ReasonLabels, Counter>,
    pub propagation_seconds: Histogram,
    /// Open client connections by port (`sync`, `management`).
    pub open_connections: Family<PortLabels, Gauge>,
    /// The serving certificate's notAfter, in seconds since the Unix epoch (0 without TLS).
    pub tls_certificate_expiry: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let sync_active_streams = Gauge::default();
        registry.register(
            "sync_active_streams",
            "Open SyncFlags streams over all protocols (same name as the Go flagd-proxy)",
            sync_active_streams.clone(),
        );
        let proxy = registry.sub_registry_with_prefix("flagd_proxy");
        let active_streams = Family::<ProtocolLabels, Gauge>::default();
        proxy.register(
            "active_streams",
            "Open SyncFlags streams by protocol",
            active_streams.clone(),
        );
        let upstream_watches = Gauge::default();
        proxy.register(
            "upstream_watches",
            "Resources currently watched at the source (one watch per resource in use)",
            upstream_watches.clone(),
        );
        let waiting_resources = Gauge::default();
        proxy.register(
            "waiting_resources",
            "Watched resources that do not exist yet and never had a version (at most --max-waiting-resources)",
            waiting_resources.clone(),
        );
        let versions_published = Counter::default();
        proxy.register(
            "versions_published",
            "New flag configuration versions taken from the source and offered to subscribers",
            versions_published.clone(),
        );
        let updates_sent = Family::<ProtocolLabels, Counter>::default();
        proxy.register(
            "updates_sent",
            "Snapshots written to sync streams",
            updates_sent.clone(),
        );
        let invalid_documents = Family::<ResourceLabels, Counter>::default();
        proxy.register(
            "invalid_documents",
            "Resource versions rejected as invalid flag configurations (not pushed; the last good version stays)",
            invalid_documents.clone(),
        );
        let source_errors = Family::<SourceErrorLabels, Counter>::default();
        proxy.register(
            "source_errors",
            "Errors reading from a source",
            source_errors.clone(),
        );
        let rejected_requests = Family::<ReasonLabels, Counter>::default();
        proxy.register(
            "rejected_requests",
            "Requests refused, by reason",
            rejected_requests.clone(),
        );
        let propagation_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        proxy.register(
            "propagation_seconds",
            "Time from a change seen at the source until the last subscriber connected at that moment was sent it",
            propagation_seconds.clone(),
        );
        let open_connections = Family::<PortLabels, Gauge>::default();
        proxy.register(
            "open_connections",
            "Open client connections by port (at most --max-connections on the sync port, --max-management-connections on the management port)",
            open_connections.clone(),
        );
        let tls_certificate_expiry = Gauge::default();
        proxy.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the serving certificate expires (notAfter), in seconds since the Unix epoch; 0 without TLS",
            tls_certificate_expiry.clone(),
        );
        Self {
            registry,
            open_connections,
            tls_certificate_expiry,
            sync_active_streams,
            active_streams,
            upstream_watches,
            waiting_resources,
            versions_published,
            updates_sent,
            invalid_documents,
            source_errors,
            rejected_requests,
            propagation_seconds,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn reject(&self, reason: &'static str) {
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
