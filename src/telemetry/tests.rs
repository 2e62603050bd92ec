//! The exporter against a collector stand-in on a loopback socket: what arrives, with which
//! headers, and what a collector that is away costs (counted failures and dropped spans, never
//! a wait).
use std::time::{Duration, SystemTime};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use super::*;

/// What the stand-in received: the `x-api-key` header and the request.
enum Received {
    Metrics(Option<String>, ExportMetricsServiceRequest),
    Traces(Option<String>, ExportTraceServiceRequest),
}

#[derive(Clone)]
struct Collector(mpsc::UnboundedSender<Received>);

fn api_key<T>(request: &Request<T>) -> Option<String> {
    let value = request.metadata().get("x-api-key")?;
    value.to_str().ok().map(str::to_owned)
}

#[tonic::codegen::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        let key = api_key(&request);
        let _ = self.0.send(Received::Metrics(key, request.into_inner()));
        Ok(Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::codegen::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let key = api_key(&request);
        let _ = self.0.send(Received::Traces(key, request.into_inner()));
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A collector stand-in on a free loopback port: its endpoint and what it receives.
async fn collector() -> (String, mpsc::UnboundedReceiver<Received>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    let (tx, rx) = mpsc::unbounded_channel();
    let collector = Collector(tx);
    tokio::spawn(
        tonic::transport::Server::builder()
            // (The real collector also answers gzip with gzip, which tonic does only when asked:
            // tests/otlp.rs covers that.)
            .add_service(
                MetricsServiceServer::new(collector.clone())
                    .accept_compressed(CompressionEncoding::Gzip),
            )
            .add_service(
                TraceServiceServer::new(collector).accept_compressed(CompressionEncoding::Gzip),
            )
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (endpoint, rx)
}

fn span(name: &'static str) -> SpanRecord {
    let now = SystemTime::now();
    SpanRecord {
        name,
        start: now,
        end: now,
        attributes: vec![("flagd_proxy.version", 1u64.into())],
        error: None,
    }
}

fn settings(endpoint: String) -> OtlpSettings {
    OtlpSettings {
        endpoint,
        headers: vec![("X-Api-Key".into(), "secret".into())],
        interval: Duration::from_millis(50),
        resource_attributes: vec![("service.name".into(), "edge-proxy".into())],
        ..OtlpSettings::default()
    }
}

/// The next thing the stand-in receives (a test that waits longer than this has failed).
async fn next(rx: &mut mpsc::UnboundedReceiver<Received>) -> Received {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("the collector receives an export")
        .expect("the collector runs")
}

#[tokio::test]
async fn metrics_and_spans_arrive_with_the_headers_and_resource() {
    let (endpoint, mut received) = collector().await;
    let metrics = Arc::new(Metrics::new());
    let (exporter, spans) = Exporter::new(&settings(endpoint), metrics.clone()).expect("valid");
    spans.record(span("flagd_proxy.publish"));
    let done = CancellationToken::new();
    let collect = {
        let metrics = metrics.clone();
        move || metrics.collect_observed(|_| {})
    };
    let run = tokio::spawn(exporter.run(collect, done.clone()));
    let (mut traces, mut exported) = (None, None);
    while traces.is_none() || exported.is_none() {
        match next(&mut received).await {
            Received::Traces(key, request) => traces = Some((key, request)),
            Received::Metrics(key, request) => exported = Some((key, request)),
        }
    }
    done.cancel();
    run.await.expect("the exporter ends");
    // Every export succeeded.
    for signal in [METRICS, TRACES] {
        let failures = metrics
            .otlp_export_failures
            .get_or_create(&SignalLabels { signal })
            .get();
        assert_eq!(failures, 0, "{signal} exports failed");
    }

    let (key, traces) = traces.expect("traces");
    assert_eq!(key.as_deref(), Some("secret"));
    let resource_spans = &traces.resource_spans[0];
    let span = &resource_spans.scope_spans[0].spans[0];
    assert_eq!(span.name, "flagd_proxy.publish");
    let resource = &resource_spans
        .resource
        .as_ref()
        .expect("a resource")
        .attributes;
    assert!(
        resource.contains(&convert::text("service.name", "edge-proxy")),
        "{resource:?}"
    );
    assert!(
        resource.iter().any(|a| a.key == "service.instance.id"),
        "{resource:?}"
    );

    let (key, exported) = exported.expect("metrics");
    assert_eq!(key.as_deref(), Some("secret"));
    let names: Vec<&str> = exported.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    for name in [
        "sync_active_streams",
        "flagd_proxy_versions_published",
        "flagd_proxy_propagation_seconds",
        "flagd_proxy_otlp_export_failures",
    ] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
}

#[tokio::test]
async fn a_collector_that_is_away_costs_counted_failures_and_dropped_spans_only() {
    // A port nobody listens on any more.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let metrics = Arc::new(Metrics::new());
    let (exporter, spans) = Exporter::new(
        &settings(format!("http://127.0.0.1:{port}")),
        metrics.clone(),
    )
    .expect("valid");
    // Recording never waits: past the queue's room, spans are dropped and counted.
    for _ in 0..SPAN_QUEUE + 5 {
        spans.record(span("flagd_proxy.publish"));
    }
    assert_eq!(metrics.otlp_dropped_spans.get(), 5);

    let done = CancellationToken::new();
    let collect = {
        let metrics = metrics.clone();
        move || metrics.collect_observed(|_| {})
    };
    let run = tokio::spawn(exporter.run(collect, done.clone()));
    let failures = |signal| {
        metrics
            .otlp_export_failures
            .get_or_create(&SignalLabels { signal })
            .get()
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        while failures(METRICS) == 0 || failures(TRACES) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("both exports fail and are counted");
    done.cancel();
    run.await.expect("the exporter ends");
}

#[test]
fn pairs_need_a_key_and_an_equals_sign() {
    assert_eq!(
        parse_pair(" x-key =a=b"),
        Ok(("x-key".to_owned(), "a=b".to_owned()))
    );
    assert!(parse_pair("=v").is_err());
    assert!(parse_pair("novalue").is_err());
}

#[test]
fn ids_are_drawn_afresh() {
    // Equal by chance once in 2^64 draws.
    assert_ne!(random_id(), random_id());
}
