//! Prometheus metrics, registered once and shared by every part of the proxy.
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
pub struct KindLabels {
    pub kind: &'static str,
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
    /// The process's memory budget (`--memory-budget`; 0: none) and what is charged to it.
    pub memory_budget: Gauge,
    pub memory_charged: Family<KindLabels, Gauge>,
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
        let memory_budget = registered(
            proxy,
            "memory_budget_bytes",
            "The memory budget (--memory-budget; 0: no limit): above it new connections and streams are refused (rejected_requests_total{reason=\"memory_budget\"})",
            Gauge::default(),
        );
        let memory_charged = registered(
            proxy,
            "memory_charged_bytes",
            "Memory charged to the budget, by kind: versions (documents and their encodings, once each, while any stream holds them), connections and streams (at their measured size)",
            Family::default(),
        );
        Self {
            registry,
            memory_budget,
            memory_charged,
            open_connections,
            tls_certificate_expiry,
            sync_active_streams,
            active_streams,
            upstream_watches,
            waiting_resources,
            versions_published,
            versions_skipped,
            updates_sent,
            invalid_documents,
            document_warnings,
            source_errors,
            rejected_requests,
            propagation_seconds,
        }
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
