//! The proxy's metrics and spans as OTLP messages.
//!
//! Metrics are read from the Prometheus registry in Prometheus' protobuf data model
//! ([`Metrics::collect_observed`](crate::metrics::Metrics::collect_observed)), so OTLP carries
//! exactly what `/metrics` shows, under the same names: a counter becomes a monotonic,
//! cumulative Sum named without the `_total` suffix (`flagd_proxy_versions_published`, as
//! OpenTelemetry's Prometheus compatibility rules have it; a collector's Prometheus exporter
//! adds it back), a gauge a Gauge, a histogram a cumulative Histogram with the same bucket
//! bounds. Values are doubles, as Prometheus keeps them.
use std::time::SystemTime;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, status};

use crate::hub::{SpanRecord, SpanValue};
use crate::metrics::data_model::{self, MetricType};

/// Nanoseconds since the Unix epoch (0 before it).
pub(super) fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A string attribute.
pub(super) fn text(key: &str, value: &str) -> KeyValue {
    attribute(key, any_value::Value::StringValue(value.to_owned()))
}

fn attribute(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// Who reports: the proxy and its version.
fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "flagd-proxy".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        ..Default::default()
    }
}

/// The times of every point of one collection: cumulative values count from `start` (when the
/// process started counting), read at `now`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Times {
    pub(super) start: u64,
    pub(super) now: u64,
}

/// Every metric of `families`, as one export request for `resource`.
pub(super) fn metrics_request(
    families: Vec<data_model::MetricFamily>,
    resource: &Resource,
    times: Times,
) -> ExportMetricsServiceRequest {
    let metrics = families
        .into_iter()
        .filter_map(|family| metric(family, times))
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(scope()),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// One metric family as an OTLP metric; `None` for kinds the proxy does not have (it has
/// counters, gauges and histograms only).
fn metric(family: data_model::MetricFamily, times: Times) -> Option<Metric> {
    let kind = MetricType::try_from(family.r#type).ok()?;
    let points = family.metric.into_iter().map(|m| {
        let attributes: Vec<KeyValue> = m.label.iter().map(|l| text(&l.name, &l.value)).collect();
        (attributes, m)
    });
    let (name, data) = match kind {
        MetricType::Counter => {
            // The Prometheus name carries `_total`; the OTLP name is the counter's own.
            let name = match family.name.strip_suffix("_total") {
                Some(name) => name.to_owned(),
                None => family.name,
            };
            let data_points = points
                .filter_map(|(attributes, m)| Some(number(attributes, m.counter?.value, times)))
                .collect();
            let sum = Sum {
                data_points,
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            };
            (name, metric::Data::Sum(sum))
        }
        MetricType::Gauge => {
            let data_points = points
                .filter_map(|(attributes, m)| Some(number(attributes, m.gauge?.value, times)))
                .collect();
            (family.name, metric::Data::Gauge(Gauge { data_points }))
        }
        MetricType::Histogram => {
            let data_points = points
                .filter_map(|(attributes, m)| Some(histogram(attributes, m.histogram?, times)))
                .collect();
            let histogram = Histogram {
                data_points,
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
            };
            (family.name, metric::Data::Histogram(histogram))
        }
        _ => return None,
    };
    Some(Metric {
        name,
        description: family.help,
        unit: family.unit,
        data: Some(data),
        ..Default::default()
    })
}

fn number(attributes: Vec<KeyValue>, value: f64, times: Times) -> NumberDataPoint {
    NumberDataPoint {
        attributes,
        start_time_unix_nano: times.start,
        time_unix_nano: times.now,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    }
}

/// A histogram point. Prometheus counts each bucket with all those below it and may leave out
/// the unbounded one; OTLP counts each bucket on its own, the unbounded one last, with every
/// upper bound but that one's.
fn histogram(
    attributes: Vec<KeyValue>,
    value: data_model::Histogram,
    times: Times,
) -> HistogramDataPoint {
    let mut bucket_counts = Vec::with_capacity(value.bucket.len() + 1);
    let mut explicit_bounds = Vec::with_capacity(value.bucket.len());
    let mut below = 0;
    for bucket in &value.bucket {
        bucket_counts.push(bucket.cumulative_count.saturating_sub(below));
        explicit_bounds.push(bucket.upper_bound);
        below = bucket.cumulative_count;
    }
    match explicit_bounds.last() {
        // The last bucket is the unbounded one.
        Some(last) if *last >= f64::MAX => {
            explicit_bounds.pop();
        }
        _ => bucket_counts.push(value.sample_count.saturating_sub(below)),
    }
    HistogramDataPoint {
        attributes,
        start_time_unix_nano: times.start,
        time_unix_nano: times.now,
        count: value.sample_count,
        sum: Some(value.sample_sum),
        bucket_counts,
        explicit_bounds,
        ..Default::default()
    }
}

/// Spans as one export request for `resource`; each span is the root of a trace of its own.
pub(super) fn spans_request(
    records: Vec<SpanRecord>,
    resource: &Resource,
    ids: &mut impl FnMut() -> u64,
) -> ExportTraceServiceRequest {
    let spans = records
        .into_iter()
        .map(|record| {
            let trace_id = [ids().to_be_bytes(), ids().to_be_bytes()].concat();
            let status = record.error.map(|message| Status {
                message,
                code: status::StatusCode::Error as i32,
            });
            Span {
                trace_id,
                span_id: ids().to_be_bytes().to_vec(),
                name: record.name.to_owned(),
                kind: opentelemetry_proto::tonic::trace::v1::span::SpanKind::Internal as i32,
                start_time_unix_nano: unix_nanos(record.start),
                end_time_unix_nano: unix_nanos(record.end),
                attributes: record
                    .attributes
                    .into_iter()
                    .map(|(key, value)| {
                        let value = match value {
                            SpanValue::Text(v) => any_value::Value::StringValue(v),
                            SpanValue::Int(v) => any_value::Value::IntValue(v),
                            SpanValue::Bool(v) => any_value::Value::BoolValue(v),
                        };
                        attribute(key, value)
                    })
                    .collect(),
                status,
                ..Default::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope()),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge as PromGauge;
    use prometheus_client::metrics::histogram::Histogram as PromHistogram;
    use prometheus_client::registry::Registry;

    use super::*;

    const TIMES: Times = Times { start: 1, now: 2 };

    fn converted(registry: &Registry) -> Vec<Metric> {
        let families =
            prometheus_client::encoding::prometheus_protobuf::encode(registry).expect("encodes");
        let request = metrics_request(families, &Resource::default(), TIMES);
        request.resource_metrics[0].scope_metrics[0].metrics.clone()
    }

    fn find<'a>(metrics: &'a [Metric], name: &str) -> &'a metric::Data {
        metrics
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.data.as_ref())
            .unwrap_or_else(|| panic!("no {name} in {metrics:?}"))
    }

    #[test]
    fn counters_gauges_and_histograms_keep_names_labels_values_and_buckets() {
        let mut registry = Registry::default();
        let counter: Family<Vec<(String, String)>, Counter> = Family::default();
        registry.register("sent", "Sent", counter.clone());
        counter
            .get_or_create(&vec![("protocol".into(), "v1".into())])
            .inc_by(3);
        let gauge = PromGauge::<i64>::default();
        registry.register("open", "Open", gauge.clone());
        gauge.set(7);
        let histogram = PromHistogram::new([0.1, 1.0]);
        registry.register("seconds", "Seconds", histogram.clone());
        for value in [0.05, 0.5, 0.7, 5.0] {
            histogram.observe(value);
        }
        let metrics = converted(&registry);

        let metric::Data::Sum(sum) = find(&metrics, "sent") else {
            panic!("a counter is a Sum: {metrics:?}");
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        let point = &sum.data_points[0];
        assert_eq!(point.value, Some(number_data_point::Value::AsDouble(3.0)));
        assert_eq!(point.attributes, vec![text("protocol", "v1")]);
        assert_eq!((point.start_time_unix_nano, point.time_unix_nano), (1, 2));

        let metric::Data::Gauge(gauge) = find(&metrics, "open") else {
            panic!("a gauge is a Gauge: {metrics:?}");
        };
        assert_eq!(
            gauge.data_points[0].value,
            Some(number_data_point::Value::AsDouble(7.0))
        );

        let metric::Data::Histogram(histogram) = find(&metrics, "seconds") else {
            panic!("a histogram is a Histogram: {metrics:?}");
        };
        let point = &histogram.data_points[0];
        assert_eq!(point.explicit_bounds, vec![0.1, 1.0]);
        // Each bucket's own count: one up to 0.1, two up to 1, one above.
        assert_eq!(point.bucket_counts, vec![1, 2, 1]);
        assert_eq!(point.count, 4);
        assert_eq!(point.sum, Some(0.05 + 0.5 + 0.7 + 5.0));
    }

    #[test]
    fn a_histogram_without_its_unbounded_bucket_gets_one() {
        let bucket = |cumulative_count, upper_bound| data_model::Bucket {
            cumulative_count,
            upper_bound,
            ..Default::default()
        };
        let value = data_model::Histogram {
            sample_count: 5,
            sample_sum: 9.0,
            bucket: vec![bucket(1, 0.5), bucket(3, 1.0)],
            ..Default::default()
        };
        let point = histogram(Vec::new(), value, TIMES);
        assert_eq!(point.explicit_bounds, vec![0.5, 1.0]);
        assert_eq!(point.bucket_counts, vec![1, 2, 2]);
    }

    #[test]
    fn the_proxy_metrics_convert_under_their_registered_names() {
        let metrics = crate::metrics::Metrics::new();
        metrics.versions_published.inc();
        metrics.observe_propagation(Duration::from_millis(3));
        let families = metrics.collect_observed(|_| {});
        let request = metrics_request(families, &Resource::default(), TIMES);
        let converted = &request.resource_metrics[0].scope_metrics[0].metrics;
        assert!(matches!(
            find(converted, "flagd_proxy_versions_published"),
            metric::Data::Sum(_)
        ));
        assert!(matches!(
            find(converted, "flagd_proxy_propagation_seconds"),
            metric::Data::Histogram(h) if h.data_points[0].count == 1
        ));
        assert!(matches!(
            find(converted, "sync_active_streams"),
            metric::Data::Gauge(_)
        ));
        assert!(matches!(
            find(converted, "process_resident_memory_bytes"),
            metric::Data::Gauge(_)
        ));
    }

    #[test]
    fn spans_carry_times_attributes_status_and_distinct_ids() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        let record = |error: Option<&str>| SpanRecord {
            name: "flagd_proxy.publish",
            start,
            end: start + Duration::from_millis(5),
            attributes: vec![
                ("flagd_proxy.resource", "ns/name".into()),
                ("flagd_proxy.version", 3u64.into()),
                ("flagd_proxy.superseded", false.into()),
            ],
            error: error.map(str::to_owned),
        };
        let mut next = 0;
        let mut ids = || {
            next += 1;
            next
        };
        let request = spans_request(
            vec![record(None), record(Some("refused"))],
            &Resource::default(),
            &mut ids,
        );
        let spans = &request.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans[0].name, "flagd_proxy.publish");
        assert_eq!(spans[0].start_time_unix_nano, 10_000_000_000);
        assert_eq!(spans[0].end_time_unix_nano, 10_005_000_000);
        assert_eq!(spans[0].trace_id.len(), 16);
        assert_eq!(spans[0].span_id.len(), 8);
        assert_ne!(spans[0].trace_id, spans[1].trace_id);
        assert_eq!(
            spans[0].attributes[0],
            text("flagd_proxy.resource", "ns/name")
        );
        assert_eq!(
            spans[0].attributes[1],
            attribute("flagd_proxy.version", any_value::Value::IntValue(3))
        );
        assert_eq!(spans[0].status, None);
        assert_eq!(
            spans[1]
                .status
                .as_ref()
                .map(|s| (s.code, s.message.as_str())),
            Some((status::StatusCode::Error as i32, "refused"))
        );
    }
}
