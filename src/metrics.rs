//! Prometheus metrics, registered once and shared by every part of the proxy.
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EncodingLabels {
    pub encoding: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AcceptLabels {
    /// `yes` when the client listed gzip in `grpc-accept-encoding`, `no` otherwise.
    pub accepts_gzip: &'static str,
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
    pub versions_skipped: Counter,
    pub updates_sent: Family<ProtocolLabels, Counter>,
    /// `SyncFlags` and `FetchAllFlags` requests, by whether the client accepts gzip.
    pub sync_requests: Family<AcceptLabels, Counter>,
    /// Bytes of sync messages written to streams, by the encoding they went out in.
    pub sent_bytes: Family<EncodingLabels, Counter>,
    /// Messages compressed: at most one per version, protocol and encoding.
    pub messages_compressed: Family<EncodingLabels, Counter>,
    /// How many times smaller gzip made the newest compressed version of each watched resource.
    /// Removed when the resource's watch stops.
    pub compression_ratio: Family<ResourceLabels, Gauge<f64, AtomicU64>>,
    pub invalid_documents: Family<ResourceLabels, Counter>,
    /// Warnings in the version of each watched resource that clients get now (problems clients
    /// report per flag; the version is served). Removed when the resource's watch stops.
    pub document_warnings: Family<ResourceLabels, Gauge>,
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
        let sync_active_streams = registered(
            &mut registry,
            "sync_active_streams",
            "Open SyncFlags streams over all protocols (same name as the Go flagd-proxy)",
            Gauge::default(),
        );
        let proxy = registry.sub_registry_with_prefix("flagd_proxy");
        let active_streams = registered(
            proxy,
            "active_streams",
            "Open SyncFlags streams by protocol",
            Family::default(),
        );
        let upstream_watches = registered(
            proxy,
            "upstream_watches",
            "Resources currently watched at the source (one watch per resource in use)",
            Gauge::default(),
        );
        let waiting_resources = registered(
            proxy,
            "waiting_resources",
            "Watched resources that do not exist yet and never had a version (at most --max-waiting-resources)",
            Gauge::default(),
        );
        let versions_published = registered(
            proxy,
            "versions_published",
            "New flag configuration versions taken from the source and offered to subscribers",
            Counter::default(),
        );
        let updates_sent = registered(
            proxy,
            "updates_sent",
            "Snapshots written to sync streams",
            Family::default(),
        );
        let (sent_bytes, messages_compressed, compression_ratio) = Self::compression_metrics(proxy);
        let sync_requests = registered(
            proxy,
            "sync_requests",
            "SyncFlags and FetchAllFlags requests, by whether the client listed gzip in grpc-accept-encoding (whether or not --compression lets it have gzip)",
            Family::default(),
        );
        let invalid_documents = registered(
            proxy,
            "invalid_documents",
            "Resource versions rejected as invalid flag configurations (not pushed; the last good version stays)",
            Family::default(),
        );
        let document_warnings = registered(
            proxy,
            "document_warnings",
            "Warnings in the flag configuration clients get now, per watched resource: flags (or shared evaluators) with problems that clients report for those flags only, when they evaluate them (for example an operator this proxy does not know); the version is served",
            Family::default(),
        );
        let versions_skipped = registered(
            proxy,
            "versions_skipped",
            "Versions a subscriber connected when they were published was never sent, because a newer one came first (a slow subscriber skips to the newest); one per subscriber and version, so a stuck subscriber adds one with every version",
            Counter::default(),
        );
        let (source_errors, rejected_requests) = Self::error_metrics(proxy);
        let propagation_seconds = registered(
            proxy,
            "propagation_seconds",
            "Time from a change seen at the source until the last subscriber connected at that moment was sent it (subscribers that left, or that a newer version reached first, are not waited for: see versions_skipped)",
            Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
        );
        let open_connections = registered(
            proxy,
            "open_connections",
            "Open client connections by port (at most --max-connections on the sync port, --max-management-connections on the management port)",
            Family::default(),
        );
        let tls_certificate_expiry = registered(
            proxy,
            "tls_certificate_expiry_timestamp_seconds",
            "When the serving certificate expires (notAfter), in seconds since the Unix epoch; 0 without TLS",
            Gauge::default(),
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
            versions_skipped,
            updates_sent,
            sync_requests,
            sent_bytes,
            messages_compressed,
            compression_ratio,
            invalid_documents,
            document_warnings,
            source_errors,
            rejected_requests,
            propagation_seconds,
        }
    }

    /// What compression sends and saves.
    #[allow(clippy::type_complexity)]
    fn compression_metrics(
        proxy: &mut Registry,
    ) -> (
        Family<EncodingLabels, Counter>,
        Family<EncodingLabels, Counter>,
        Family<ResourceLabels, Gauge<f64, AtomicU64>>,
    ) {
        let sent_bytes = registered(
            proxy,
            "sent_bytes",
            "Bytes of sync messages written to streams (gRPC message prefix included), by the encoding they went out in: gzip for compressed messages, identity for the others",
            Family::default(),
        );
        let messages_compressed = registered(
            proxy,
            "messages_compressed",
            "Messages compressed, by encoding (the message and its compression): at most once per version and encoding, however many streams are sent it",
            Family::default(),
        );
        let compression_ratio = registered(
            proxy,
            "compression_ratio",
            "Uncompressed size over gzip size of the newest compressed version of each watched resource (1 when gzip did not make it smaller; absent until a version is compressed)",
            Family::default(),
        );
        (sent_bytes, messages_compressed, compression_ratio)
    }

    /// Source errors and refused requests.
    fn error_metrics(
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
        let rejected_requests = registered(
            proxy,
            "rejected_requests",
            "Requests refused, by reason",
            Family::default(),
        );
        (source_errors, rejected_requests)
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Records how long a version took to reach its subscribers.
    pub fn observe_propagation(&self, elapsed: std::time::Duration) {
        self.propagation_seconds.observe(elapsed.as_secs_f64());
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

/// Registers `metric` under `name` and returns it (metrics are handles; the clone is the same
/// metric).
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}
