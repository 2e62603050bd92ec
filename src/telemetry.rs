//! OpenTelemetry export over OTLP/gRPC, off unless `--otlp-endpoint` is given.
//!
//! Every `--otlp-interval` the exporter sends the proxy's metrics (the Prometheus registry,
//! read as `/metrics` reads it: see [`convert`]) and the spans recorded since the last export:
//! one `flagd_proxy.publish` span per published version (recorded by the hub) and one span per
//! attempt of a watch to reach its backend (`flagd_proxy.upstream.connect`,
//! `flagd_proxy.kubernetes.connect`, recorded by the sources).
//!
//! Written on the OTLP messages and gRPC client of `opentelemetry-proto`, not on the
//! OpenTelemetry SDK: the metrics already live in one registry, which is converted as it is
//! (the SDK would need every metric declared a second time as an observable instrument), and
//! the spans are finished records made once per version, off the fan-out path (the SDK's
//! tracer, or `tracing-opentelemetry`, would add a span context to the code that writes to
//! subscribers). The exporter runs on its own task: a collector that is slow or away never
//! holds up serving. Spans wait in a bounded queue ([`SPAN_QUEUE`]); when it is full, new spans
//! are dropped and counted (`flagd_proxy_otlp_dropped_spans_total`), and a failed export is
//! counted (`flagd_proxy_otlp_export_failures_total{signal}`), logged at most once a minute,
//! and not retried: the next interval sends fresh values.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::hub::{SpanRecord, SpanSink};
use crate::metrics::{Metrics, SignalLabels, data_model};

mod client;
mod convert;

use client::{Client, ExportError};
use convert::Times;

/// Default of [`OtlpSettings::interval`] (and of `--otlp-interval`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// The most spans waiting for export; more are dropped. One export sends at most this many.
pub const SPAN_QUEUE: usize = 4096;
/// How long the last export at shutdown may take.
const FINAL_EXPORT: Duration = Duration::from_secs(2);
/// The shortest time between two warnings about failed exports.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Where and how to export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpSettings {
    /// `http://HOST:PORT` or `https://HOST:PORT` (TLS) of an OTLP/gRPC receiver.
    pub endpoint: String,
    /// Sent with every export (for example an API key).
    pub headers: Vec<(String, String)>,
    /// CA bundle (PEM) for the collector's certificate, besides the system roots.
    pub ca_file: Option<PathBuf>,
    /// How often metrics and spans are sent.
    pub interval: Duration,
    /// Resource attributes added to (or replacing) `service.name`, `service.instance.id` and
    /// `service.version`.
    pub resource_attributes: Vec<(String, String)>,
    /// `service.instance.id`: the pod's name (`--pod-name`); the host name without it.
    pub instance: Option<String>,
}

impl Default for OtlpSettings {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            headers: Vec::new(),
            ca_file: None,
            interval: DEFAULT_INTERVAL,
            resource_attributes: Vec::new(),
            instance: None,
        }
    }
}

/// OTLP settings that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("--otlp-endpoint {0:?} must start with http:// or https:// (TLS)")]
    Scheme(String),
    #[error("--otlp-endpoint {endpoint:?} is not a valid URL: {source}")]
    Endpoint {
        endpoint: String,
        source: tonic::transport::Error,
    },
    #[error("--otlp-ca-file needs an https:// --otlp-endpoint")]
    CaWithoutTls,
    #[error("--otlp-ca-file {path}: {source}")]
    CaFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--otlp-endpoint TLS settings: {0}")]
    Tls(#[source] tonic::transport::Error),
    #[error("--otlp-header {name:?}: {reason}")]
    Header { name: String, reason: String },
    #[error("--otlp-interval must be more than 0")]
    Interval,
}

/// Parses `KEY=VALUE` (`--otlp-header`, `--otlp-resource-attribute`).
pub fn parse_pair(entry: &str) -> Result<(String, String), String> {
    match entry.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.to_owned()))
        }
        Some(_) => Err(format!("the key is empty in {entry:?}")),
        None => Err(format!("expected KEY=VALUE, found {entry:?}")),
    }
}

/// Where the hub and the sources put spans: a bounded queue the exporter empties.
pub struct SpanQueue {
    tx: mpsc::Sender<SpanRecord>,
    metrics: Arc<Metrics>,
}

impl SpanSink for SpanQueue {
    fn record(&self, span: SpanRecord) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(span) {
            self.metrics.otlp_dropped_spans.inc();
        }
    }
}

/// The exporter, configured, not yet running.
pub struct Exporter {
    client: Client,
    spans: mpsc::Receiver<SpanRecord>,
    metrics: Arc<Metrics>,
    interval: Duration,
    resource: Resource,
    /// When counting started (the start of every cumulative value).
    started: SystemTime,
    warnings: Warnings,
}

impl Exporter {
    /// The exporter for `settings` and the queue spans go to. Fails only on settings that
    /// cannot work; the collector is not contacted yet.
    pub fn new(
        settings: &OtlpSettings,
        metrics: Arc<Metrics>,
    ) -> Result<(Self, Arc<SpanQueue>), OtlpError> {
        if settings.interval.is_zero() {
            return Err(OtlpError::Interval);
        }
        let client = Client::new(settings)?;
        let (tx, rx) = mpsc::channel(SPAN_QUEUE);
        for signal in [METRICS, TRACES] {
            drop(
                metrics
                    .otlp_export_failures
                    .get_or_create(&SignalLabels { signal }),
            );
        }
        let queue = Arc::new(SpanQueue {
            tx,
            metrics: metrics.clone(),
        });
        let exporter = Self {
            client,
            spans: rx,
            metrics,
            interval: settings.interval,
            resource: resource(&settings.resource_attributes, settings.instance.as_deref()),
            started: SystemTime::now(),
            warnings: Warnings::default(),
        };
        Ok((exporter, queue))
    }

    /// Exports every interval until `shutdown`, then once more (for at most
    /// [`FINAL_EXPORT`]). `collect` reads the metrics.
    pub async fn run(
        mut self,
        collect: impl Fn() -> Vec<data_model::MetricFamily> + Send,
        shutdown: CancellationToken,
    ) {
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + self.interval, self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => self.export(&collect).await,
                () = shutdown.cancelled() => break,
            }
        }
        if tokio::time::timeout(FINAL_EXPORT, self.export(&collect))
            .await
            .is_err()
        {
            tracing::debug!("the last OTLP export at shutdown did not finish in time");
        }
    }

    /// Sends the spans waiting, then the metrics.
    async fn export(&mut self, collect: &impl Fn() -> Vec<data_model::MetricFamily>) {
        let mut spans = Vec::new();
        while spans.len() < SPAN_QUEUE {
            match self.spans.try_recv() {
                Ok(span) => spans.push(span),
                Err(_) => break,
            }
        }
        if !spans.is_empty() {
            let count = spans.len();
            let request = convert::spans_request(spans, &self.resource, &mut random_id);
            let result = self.client.export_traces(request).await;
            self.outcome(TRACES, count, result);
        }
        let times = Times {
            start: convert::unix_nanos(self.started),
            now: convert::unix_nanos(SystemTime::now()),
        };
        let request = convert::metrics_request(collect(), &self.resource, times);
        let result = self.client.export_metrics(request).await;
        self.outcome(METRICS, 1, result);
    }

    fn outcome(&mut self, signal: &'static str, items: usize, result: Result<(), ExportError>) {
        match result {
            Ok(()) => {
                if self.warnings.failing.remove(signal) {
                    tracing::info!(signal, "OTLP export works again");
                }
            }
            Err(error) => {
                self.metrics
                    .otlp_export_failures
                    .get_or_create(&SignalLabels { signal })
                    .inc();
                self.warnings.failing.insert(signal);
                if self.warnings.due() {
                    tracing::warn!(
                        signal,
                        items,
                        %error,
                        "OTLP export failed; what it carried is dropped (warned about at most once a minute; counted in flagd_proxy_otlp_export_failures_total)"
                    );
                } else {
                    tracing::debug!(signal, items, %error, "OTLP export failed");
                }
            }
        }
    }
}

const METRICS: &str = "metrics";
const TRACES: &str = "traces";

/// When failures were last warned about, and the signals whose last export failed.
#[derive(Default)]
struct Warnings {
    last: Option<Instant>,
    failing: std::collections::BTreeSet<&'static str>,
}

impl Warnings {
    /// Whether a warning may be logged now (and notes that it is).
    fn due(&mut self) -> bool {
        let due = self.last.is_none_or(|last| last.elapsed() >= WARN_EVERY);
        if due {
            self.last = Some(Instant::now());
        }
        due
    }
}

/// The proxy as an OpenTelemetry resource: `service.name` flagd-proxy, `service.instance.id`
/// the pod (`instance`) or host name, `service.version`; `extra` adds or replaces attributes.
fn resource(extra: &[(String, String)], instance: Option<&str>) -> Resource {
    let instance = instance
        .map(str::to_owned)
        .or_else(host_name)
        .unwrap_or_else(|| "unknown".to_owned());
    let mut attributes: Vec<(String, String)> = vec![
        ("service.name".into(), "flagd-proxy".into()),
        ("service.instance.id".into(), instance),
        ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
    ];
    for (key, value) in extra {
        match attributes.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.clone(),
            None => attributes.push((key.clone(), value.clone())),
        }
    }
    Resource {
        attributes: attributes
            .iter()
            .map(|(key, value)| convert::text(key, value))
            .collect(),
        ..Default::default()
    }
}

/// The kernel's host name (the pod name in Kubernetes).
fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

/// A random, non-zero 64-bit value for trace and span IDs (they need to be unique, not secret).
fn random_id() -> u64 {
    loop {
        let id = crate::random::next_u64();
        if id != 0 {
            return id;
        }
    }
}

#[cfg(test)]
mod tests;
