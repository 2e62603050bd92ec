//! The flags of OpenTelemetry export (`OpenTelemetry`): collector endpoint, headers, CA,
//! interval and resource attributes; they become [`OtlpSettings`] when an endpoint is given.
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::duration_text;
use crate::telemetry::{self, OtlpSettings};

/// OpenTelemetry export ([`OtlpSettings`]); off without `--otlp-endpoint`.
#[derive(Debug, Args)]
#[command(next_help_heading = "OpenTelemetry")]
pub struct OtlpArgs {
    /// Export metrics (the ones /metrics shows) and traces (a span per published version and
    /// per attempt of a watch to reach the upstream or the Kubernetes API) over OTLP/gRPC to
    /// this collector: http://HOST:PORT, or https://HOST:PORT for TLS. Off when not set;
    /// /metrics is served either way.
    #[arg(long, value_name = "URL", env = "FLAGD_PROXY_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// A header sent with every export, such as an API key. Repeatable or comma-separated.
    #[arg(
        long = "otlp-header",
        value_name = "KEY=VALUE",
        env = "FLAGD_PROXY_OTLP_HEADERS",
        value_delimiter = ',',
        value_parser = super::KeyValue(telemetry::parse_pair),
        requires = "otlp_endpoint"
    )]
    pub otlp_headers: Vec<(String, String)>,

    /// CA bundle (PEM) that signs the collector's certificate, trusted besides the system
    /// roots; with an https:// endpoint.
    #[arg(
        long,
        value_name = "FILE",
        env = "FLAGD_PROXY_OTLP_CA_FILE",
        requires = "otlp_endpoint"
    )]
    pub otlp_ca_file: Option<PathBuf>,

    /// How often metrics and the spans recorded since are exported.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_OTLP_INTERVAL", default_value = duration_text(telemetry::DEFAULT_INTERVAL), value_parser = humantime::parse_duration)]
    pub otlp_interval: Duration,

    /// A resource attribute of everything exported, added to service.name (flagd-proxy),
    /// service.instance.id (--pod-name, else the host name) and service.version, or replacing
    /// one of them. Repeatable or comma-separated.
    #[arg(
        long = "otlp-resource-attribute",
        value_name = "KEY=VALUE",
        env = "FLAGD_PROXY_OTLP_RESOURCE_ATTRIBUTES",
        value_delimiter = ',',
        value_parser = super::KeyValue(telemetry::parse_pair),
        requires = "otlp_endpoint"
    )]
    pub otlp_resource_attributes: Vec<(String, String)>,
}

impl OtlpArgs {
    /// The export settings, when an endpoint is given; `instance` is the pod's name.
    pub fn into_settings(self, instance: Option<String>) -> Option<OtlpSettings> {
        Some(OtlpSettings {
            endpoint: self.otlp_endpoint?,
            headers: self.otlp_headers,
            ca_file: self.otlp_ca_file,
            interval: self.otlp_interval,
            resource_attributes: self.otlp_resource_attributes,
            instance,
        })
    }
}
