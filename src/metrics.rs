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
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    /// `metrics` or `traces`.
    pub signal: &'static str,
}

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

    /// Sets the gauges of the watched resources from `resources`: each resource's state (as
    /// `/status` names it; every one of `states` is reported, 0 when no resource is in it) and
    /// subscribers. Called when scraped.
    pub fn observe_resources<'a>(
        &self,
        states: &[&'static str],
        resources: impl IntoIterator<Item = WatchedResource<'a>>,
    ) {
        let mut counts: Vec<(&'static str, i64)> = states.iter().map(|s| (*s, 0)).collect();
        self.watched_resources.clear();
        self.version_rejected.clear();
        self.subscribers.clear();
        for resource in resources {
            match counts.iter_mut().find(|(s, _)| *s == resource.state) {
                Some((_, count)) => *count += 1,
                None => counts.push((resource.state, 1)),
            }
            let labels = ResourceLabels {
                namespace: resource.namespace.to_owned(),
                name: resource.name.to_owned(),
            };
            if resource.state == STATE_INVALID {
                self.version_rejected.get_or_create(&labels).set(1);
            }
            self.subscribers
                .get_or_create(&labels)
                .set(i64::try_from(resource.subscribers).unwrap_or(i64::MAX));
        }
        for (state, count) in counts {
            self.watched_resources
                .get_or_create(&StateLabels { state })
                .set(count);
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
pub const REJECT_REASONS: [&str; 12] = [
    "max_watches",
    "max_waiting_resources",
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

/// One watched resource, as [`Metrics::observe_resources`] reports it.
pub struct WatchedResource<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub state: &'static str,
    pub subscribers: usize,
}

/// The state of a resource whose newest version is refused (see [`Metrics::observe_resources`]).
pub const STATE_INVALID: &str = "invalid";

/// Clock ticks per second of the CPU times in `/proc/self/stat` (`USER_HZ`: 100 on every Linux
/// architecture, whatever the kernel's own tick rate).
const USER_HZ: f64 = 100.0;

/// The process' CPU time and resident memory, read from `/proc/self` when scraped, under the
/// names every Prometheus client uses (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`), so the usual dashboards and alerts work without cAdvisor.
/// Nothing is exported where `/proc` cannot be read.
#[derive(Debug)]
struct ProcessCollector;

impl ProcessCollector {
    /// User plus system CPU seconds, from `/proc/self/stat`.
    fn cpu_seconds() -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) may hold spaces; the fields after it start past its ')'.
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
        let utime: f64 = fields.get(11)?.parse().ok()?;
        let stime: f64 = fields.get(12)?.parse().ok()?;
        Some((utime + stime) / USER_HZ)
    }

    /// Resident memory in bytes, from `VmRSS` in `/proc/self/status`.
    fn resident_bytes() -> Option<i64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        if let Some(seconds) = Self::cpu_seconds() {
            let help = "User and system CPU time of the proxy process, in seconds";
            encode_one(
                &mut encoder,
                "process_cpu_seconds",
                help,
                ConstCounter::new(seconds),
            )?;
        }
        if let Some(bytes) = Self::resident_bytes() {
            let help = "Resident memory of the proxy process, in bytes";
            encode_one(
                &mut encoder,
                "process_resident_memory_bytes",
                help,
                ConstGauge::new(bytes),
            )?;
        }
        Ok(())
    }
}

/// Registers `metric` under `name` and returns it (metrics are handles; the clone is the same
/// metric).
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Encodes one metric without labels under `name`.
fn encode_one(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    name: &str,
    help: &str,
    metric: impl prometheus_client::encoding::EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_reason_is_exported_from_the_start() {
        let text = Metrics::new().encode();
        for reason in REJECT_REASONS {
            let line = format!("flagd_proxy_rejected_requests_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&line), "{line} in {text}");
        }
    }

    #[test]
    fn process_metrics_are_exported() {
        let text = Metrics::new().encode();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {name} in {text}"))
                .parse()
                .expect("a number")
        };
        assert!(value("process_resident_memory_bytes") > 0.0);
        assert!(value("process_cpu_seconds_total") >= 0.0);
    }

    #[test]
    fn resources_are_counted_by_state_and_refused_versions_named() {
        let metrics = Metrics::new();
        let states = ["present", "invalid"];
        let resource = |namespace, name, state, subscribers| WatchedResource {
            namespace,
            name,
            state,
            subscribers,
        };
        metrics.observe_resources(
            &states,
            [
                resource("a", "one", "present", 3),
                resource("b", "two", "invalid", 1),
                resource("c", "three", "absent", 0),
            ],
        );
        let text = metrics.encode();
        for line in [
            "flagd_proxy_watched_resources{state=\"present\"} 1",
            "flagd_proxy_watched_resources{state=\"invalid\"} 1",
            "flagd_proxy_watched_resources{state=\"absent\"} 1",
            "flagd_proxy_version_rejected{namespace=\"b\",name=\"two\"} 1",
            "flagd_proxy_subscribers{namespace=\"a\",name=\"one\"} 3",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // Fixed: the series goes, and the count of a listed state stays, at 0.
        metrics.observe_resources(&states, [resource("b", "two", "present", 2)]);
        let text = metrics.encode();
        assert!(!text.contains("flagd_proxy_version_rejected{"), "{text}");
        assert!(
            text.contains("flagd_proxy_watched_resources{state=\"invalid\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("flagd_proxy_watched_resources{state=\"present\"} 1"),
            "{text}"
        );
        assert!(!text.contains("state=\"absent\""), "{text}");
        assert!(
            !text.contains("flagd_proxy_subscribers{namespace=\"a\""),
            "{text}"
        );
    }
}
