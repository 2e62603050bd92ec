//! The gRPC connection to the OTLP collector: endpoint, TLS, headers and the two export calls.
use std::path::Path;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::{OtlpError, OtlpSettings};

/// How long connecting to the collector may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest an export may take, the connection included. Exports run one after another, so
/// a slow collector delays the next one rather than piling them up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ExportError {
    #[error("the collector answered {code:?}: {message}", code = .0.code(), message = .0.message())]
    Status(#[source] tonic::Status),
    #[error("the collector rejected {rejected} of them: {message}")]
    Rejected { rejected: i64, message: String },
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Sends metrics and traces to one collector (connected lazily, again after it is lost).
#[derive(Clone)]
pub(super) struct Client {
    metrics: MetricsServiceClient<Channel>,
    traces: TraceServiceClient<Channel>,
    headers: MetadataMap,
}

impl Client {
    pub(super) fn new(settings: &OtlpSettings) -> Result<Self, OtlpError> {
        let endpoint = &settings.endpoint;
        let tls = match endpoint.split_once("://") {
            Some(("https", _)) => true,
            Some(("http", _)) => false,
            _ => return Err(OtlpError::Scheme(endpoint.clone())),
        };
        if settings.ca_file.is_some() && !tls {
            return Err(OtlpError::CaWithoutTls);
        }
        let mut channel = Endpoint::from_shared(endpoint.clone())
            .map_err(|source| OtlpError::Endpoint {
                endpoint: endpoint.clone(),
                source,
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        if tls {
            let mut config = ClientTlsConfig::new().with_enabled_roots();
            if let Some(path) = &settings.ca_file {
                config = config.ca_certificate(read_ca(path)?);
            }
            channel = channel.tls_config(config).map_err(OtlpError::Tls)?;
        }
        let channel = channel.connect_lazy();
        // Collectors answer in the encoding they were sent (grpc-go does).
        Ok(Self {
            metrics: MetricsServiceClient::new(channel.clone())
                .send_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Gzip),
            traces: TraceServiceClient::new(channel)
                .send_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Gzip),
            headers: headers(&settings.headers)?,
        })
    }

    /// `message` with the configured headers and deadline.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        for entry in self.headers.iter() {
            if let tonic::metadata::KeyAndValueRef::Ascii(key, value) = entry {
                request.metadata_mut().append(key.clone(), value.clone());
            }
        }
        request.set_timeout(EXPORT_TIMEOUT);
        request
    }

    pub(super) async fn export_metrics(
        &mut self,
        message: ExportMetricsServiceRequest,
    ) -> Result<(), ExportError> {
        let request = self.request(message);
        let response = bounded(self.metrics.export(request)).await?;
        accepted(
            response
                .partial_success
                .map(|p| (p.rejected_data_points, p.error_message)),
        )
    }

    pub(super) async fn export_traces(
        &mut self,
        message: ExportTraceServiceRequest,
    ) -> Result<(), ExportError> {
        let request = self.request(message);
        let response = bounded(self.traces.export(request)).await?;
        accepted(
            response
                .partial_success
                .map(|p| (p.rejected_spans, p.error_message)),
        )
    }
}

/// An answer's partial success (how many items were rejected, and why) as the export's result.
fn accepted(partial: Option<(i64, String)>) -> Result<(), ExportError> {
    match partial {
        Some((rejected, message)) if rejected > 0 => {
            Err(ExportError::Rejected { rejected, message })
        }
        _ => Ok(()),
    }
}

/// The answer of `call`, within [`EXPORT_TIMEOUT`] (the connection attempt included).
async fn bounded<T>(
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ExportError> {
    match tokio::time::timeout(EXPORT_TIMEOUT, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(ExportError::Status(status)),
        Err(_) => Err(ExportError::Timeout(EXPORT_TIMEOUT)),
    }
}

fn read_ca(path: &Path) -> Result<Certificate, OtlpError> {
    let pem = std::fs::read(path).map_err(|source| OtlpError::CaFile {
        path: path.to_owned(),
        source,
    })?;
    Ok(Certificate::from_pem(pem))
}

/// The headers as gRPC metadata: names in lower case, values printable ASCII.
fn headers(pairs: &[(String, String)]) -> Result<MetadataMap, OtlpError> {
    let mut map = MetadataMap::new();
    for (name, value) in pairs {
        let invalid = |reason: &str| OtlpError::Header {
            name: name.clone(),
            reason: reason.to_owned(),
        };
        let lower = name.to_ascii_lowercase();
        if lower.ends_with("-bin") {
            return Err(invalid("binary (-bin) headers are not supported"));
        }
        let key = AsciiMetadataKey::from_bytes(lower.as_bytes())
            .map_err(|_| invalid("not a valid header name"))?;
        let value = AsciiMetadataValue::try_from(value.as_str())
            .map_err(|_| invalid("the value must be printable ASCII"))?;
        map.append(key, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(endpoint: &str) -> OtlpSettings {
        OtlpSettings {
            endpoint: endpoint.to_owned(),
            ..OtlpSettings::default()
        }
    }

    // A runtime: the channel is made there (it connects lazily).
    #[tokio::test]
    async fn endpoints_need_a_grpc_scheme() {
        assert!(Client::new(&settings("http://127.0.0.1:4317")).is_ok());
        assert!(matches!(
            Client::new(&settings("127.0.0.1:4317")),
            Err(OtlpError::Scheme(_))
        ));
        assert!(matches!(
            Client::new(&settings("grpc://collector:4317")),
            Err(OtlpError::Scheme(_))
        ));
        let ca = OtlpSettings {
            ca_file: Some("/ca.pem".into()),
            ..settings("http://collector:4317")
        };
        assert!(matches!(Client::new(&ca), Err(OtlpError::CaWithoutTls)));
    }

    #[test]
    fn headers_are_checked_and_lower_cased() {
        let pair = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        let map = headers(&pair("X-Tenant", "a b")).expect("valid");
        assert_eq!(
            map.get("x-tenant").and_then(|v| v.to_str().ok()),
            Some("a b")
        );
        for (name, value) in [
            ("bad name", "v"),
            ("x-key", "line\nbreak"),
            ("key-bin", "v"),
        ] {
            assert!(
                matches!(headers(&pair(name, value)), Err(OtlpError::Header { .. })),
                "{name}: {value:?}"
            );
        }
    }
}
