//! Prometheus metrics, registered once and shared by every part of the proxy.
//!
//! This file holds [`Metrics`], the registration of its families and the scrape (text and
//! protobuf); the label sets are in `labels.rs`, the families of errors and refusals in
//! `errors.rs`, the gauges of the watched resources in `resources.rs` and the process metrics
//! in `process.rs`.
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

mod errors;
mod labels;
mod process;
mod resources;

pub use errors::REJECT_REASONS;
pub use labels::{
    AcceptLabels, EncodingLabels, KindLabels, PortLabels, ProtocolLabels, ReasonLabels,
    ResourceLabels, SignalLabels, SourceErrorLabels, StateLabels,
};
use process::ProcessCollector;
pub use resources::{STATE_INVALID, WatchedResource};

/// The metrics in Prometheus' protobuf data model, as the OTLP exporter reads them.
pub use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model as data_model;

/// Every metric the proxy exports.
pub struct Metrics {
    registry: Registry,
    /// Held while a scrape sets its gauges and encodes ([`Metrics::encode_observed`]).
    scrape: std::sync::Mutex<()>,
    /// Open sync streams, all protocols (the name the Go flagd-proxy exports).
    pub sync_active_streams: Gauge,
    pub active_streams: Family<ProtocolLabels, Gauge>,
    pub upstream_watches: Gauge,
    /// HTTP/2 connections to the upstream proxy (`--upstream`), opened as its streams need.
    pub upstream_connections: Gauge,
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
    /// The process's memory budget (`--memory-budget`; 0: none) and what is charged to it.
    pub memory_budget: Gauge,
    pub memory_charged: Family<KindLabels, Gauge>,
    /// The most open connections allowed by port (0: no limit), set once at start.
    pub connection_limit: Family<PortLabels, Gauge>,
    /// 1 while the proxy is serving (readiness), set when scraped.
    pub ready: Gauge,
    /// Watched resources by state, set when scraped ([`Metrics::observe_resources`]).
    pub watched_resources: Family<StateLabels, Gauge>,
    /// 1 for each watched resource whose newest version is refused, set when scraped.
    pub version_rejected: Family<ResourceLabels, Gauge>,
    /// Open streams of each watched resource, set when scraped.
    pub subscribers: Family<ResourceLabels, Gauge>,
    /// Watched resources served a version kept from an earlier run (`--state-dir`) because their
    /// source has not delivered one, set when scraped.
    pub stale_resources: Gauge,
    /// OTLP exports that failed, by signal (only with `--otlp-endpoint`).
    pub otlp_export_failures: Family<SignalLabels, Counter>,
    /// Spans dropped because the export queue was full.
    pub otlp_dropped_spans: Counter,
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
        let upstream_connections = registered(
            proxy,
            "upstream_connections",
            "HTTP/2 connections to the upstream proxy (--upstream): one more is opened when every one carries --upstream-streams-per-connection streams, and one is closed when its last stream ends",
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
        // The connection limits (set at start), readiness and the watched resources (set when
        // scraped).
        let connection_limit = registered(
            proxy,
            "connection_limit",
            "The most open client connections allowed by port (--max-connections on the sync port, --max-management-connections on the management port; 0: no limit)",
            Family::default(),
        );
        let ready = registered(
            proxy,
            "ready",
            "1 while the proxy is serving (what /readyz answers), 0 while it starts or shuts down",
            Gauge::default(),
        );
        let watched_resources = registered(
            proxy,
            "watched_resources",
            "Watched resources by state: pending, present, absent, invalid (the newest version is refused; clients keep the last good one), forbidden, unreachable, refused (over --max-waiting-resources)",
            Family::default(),
        );
        let version_rejected = registered(
            proxy,
            "version_rejected",
            "1 for each watched resource whose newest version is refused as invalid (clients keep the last good version, or get FAILED_PRECONDITION when there is none); the series goes when the resource is valid again or no longer watched",
            Family::default(),
        );
        let subscribers = registered(
            proxy,
            "subscribers",
            "Open SyncFlags streams of each watched resource (all protocols); the series goes when the resource is no longer watched",
            Family::default(),
        );
        let stale_resources = registered(
            proxy,
            "stale_resources",
            "Watched resources whose clients get the version kept in --state-dir from an earlier run, because the source (the upstream or the Kubernetes API) has not delivered one since the proxy started watching them; 0 once every source has delivered",
            Gauge::default(),
        );
        let (otlp_export_failures, otlp_dropped_spans) = Self::otlp_metrics(proxy);
        registry.register_collector(Box::new(ProcessCollector));
        Self {
            otlp_export_failures,
            otlp_dropped_spans,
            registry,
            memory_budget,
            memory_charged,
            scrape: std::sync::Mutex::default(),
            connection_limit,
            ready,
            watched_resources,
            version_rejected,
            subscribers,
            stale_resources,
            open_connections,
            tls_certificate_expiry,
            sync_active_streams,
            active_streams,
            upstream_watches,
            upstream_connections,
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

    /// What the OTLP exporter could not send.
    fn otlp_metrics(proxy: &mut Registry) -> (Family<SignalLabels, Counter>, Counter) {
        let failures = registered(
            proxy,
            "otlp_export_failures",
            "OTLP exports (--otlp-endpoint) that failed, by signal (metrics, traces); what they carried is dropped",
            Family::default(),
        );
        let dropped = registered(
            proxy,
            "otlp_dropped_spans",
            "Spans dropped before export because the export queue was full (the collector is slower than the spans come, or away)",
            Counter::default(),
        );
        (failures, dropped)
    }

    /// The Prometheus text exposition of every metric after `observe` has set the gauges that
    /// are set when scraped; one scrape at a time, so none sees another's half-set gauges.
    pub fn encode_observed(&self, observe: impl FnOnce(&Self)) -> String {
        self.observed(observe, Self::encode)
    }

    /// Every metric in Prometheus' protobuf data model after `observe` has set the gauges that
    /// are set when scraped (one collection at a time, as [`Metrics::encode_observed`]).
    pub fn collect_observed(&self, observe: impl FnOnce(&Self)) -> Vec<data_model::MetricFamily> {
        self.observed(observe, |metrics| {
            // Every metric here has a protobuf encoding (the encoder fails only on native-only
            // histograms, which the proxy has none of).
            prometheus_client::encoding::prometheus_protobuf::encode(&metrics.registry)
                .unwrap_or_default()
        })
    }

    /// `read` after `observe`, with no other scrape in between.
    fn observed<T>(&self, observe: impl FnOnce(&Self), read: impl FnOnce(&Self) -> T) -> T {
        let _scrape = crate::locks::lock(&self.scrape);
        observe(self);
        read(self)
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
}

/// Registers `metric` under `name` and returns it (metrics are handles; the clone is the same
/// metric).
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

#[cfg(test)]
mod tests;
