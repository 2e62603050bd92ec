//! The upstream source: resources taken from another flagd-proxy over the sync protocol, for a
//! node-local tier that never talks to the Kubernetes API itself.
//!
//! One `SyncFlags` stream per resource in use, opened and closed on demand like a Kubernetes
//! watch, spread over as many HTTP/2 connections as they need, at most
//! [`UpstreamSettings::streams_per_connection`] on each (`pool`): never all on one connection,
//! whose stream cap at the upstream would make every new resource wait behind one busy client.
//! When the upstream is lost, subscribers keep their last version; the stream is opened again
//! after the process's backoff ([`crate::backoff`]) and catches up on the newest version.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tonic::Code;
use tonic::codec::CompressionEncoding;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::backoff::Backoff;
use crate::hub::{Publisher, SpanSink};
use crate::introspection::{SourceStatus, UpstreamStatus};
use crate::metrics::Metrics;
use crate::protocol::SELECTOR_HEADER;
use crate::protocol::client::flagd_sync_v1::SyncFlagsRequest;
use crate::protocol::client::flagd_sync_v1::flag_sync_service_client::FlagSyncServiceClient;
use crate::selector::ResourceKey;
use crate::source::{ConnectAttempt, Source};

mod pool;

use pool::Pool;

/// The largest message accepted from the upstream (the document limit plus room for framing).
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// What one watch of the upstream holds: its task, its stream on a shared connection to the
/// upstream and that stream's buffers. Measured: a node proxy's RSS grew by 16.2 KiB for each of
/// 1,000 resources one client streamed (14.5 KiB each for 5,000), of which 3.0 KiB is the
/// client's stream on a shared connection and 0.4 KiB the version
/// (`measure_one_pods_thousands_of_resources_on_the_node_tier` in `tests/chaining.rs`).
const WATCH_BYTES: usize = 13 * 1024;

/// Default of [`UpstreamSettings::streams_per_connection`] (and of
/// `--upstream-streams-per-connection`): half the upstream's default
/// `--max-streams-per-connection`, so a connection never reaches the upstream's cap.
pub const DEFAULT_STREAMS_PER_CONNECTION: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("--upstream {address:?} is not a valid address ({source}); expected host:port")]
    Address {
        address: String,
        source: tonic::transport::Error,
    },
    #[error("--upstream-ca-path {path}: {source}")]
    Ca {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--upstream TLS settings: {0}")]
    Tls(tonic::transport::Error),
}

/// How to reach the upstream proxy.
#[derive(Clone, Debug)]
pub struct UpstreamSettings {
    /// `host:port`, or a URL with `http://` or `https://`.
    pub address: String,
    /// Use TLS (implied by `ca_path` or an `https://` address).
    pub tls: bool,
    /// CA bundle (PEM) that signs the upstream's certificate; system roots otherwise.
    pub ca_path: Option<PathBuf>,
    /// The most streams on one connection to the upstream; another connection is opened when
    /// every one has this many. Below the upstream's `--max-streams-per-connection`.
    pub streams_per_connection: usize,
}

/// The span of one attempt to follow a resource upstream: from opening the stream until its
/// first message (the resource's state), or until the attempt failed.
pub const CONNECT_SPAN: &str = "flagd_proxy.upstream.connect";

/// Resources from another flagd-proxy.
pub struct UpstreamSource {
    pool: Pool,
    address: String,
    metrics: Arc<Metrics>,
    spans: Option<Arc<dyn SpanSink>>,
}

impl UpstreamSource {
    /// Prepares the (lazily opened) connections; fails only on invalid settings. Each attempt to
    /// follow a resource is recorded in `spans` ([`CONNECT_SPAN`]), when given.
    pub fn new(
        settings: UpstreamSettings,
        metrics: Arc<Metrics>,
        spans: Option<Arc<dyn SpanSink>>,
    ) -> Result<Self, UpstreamError> {
        let tls =
            settings.tls || settings.ca_path.is_some() || settings.address.starts_with("https://");
        let bare = settings
            .address
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/');
        let uri = format!("{}://{bare}", if tls { "https" } else { "http" });
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|source| UpstreamError::Address {
                address: settings.address.clone(),
                source,
            })?
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        if tls {
            let mut config = ClientTlsConfig::new().with_enabled_roots();
            if let Some(path) = &settings.ca_path {
                let pem = std::fs::read(path).map_err(|source| UpstreamError::Ca {
                    path: path.clone(),
                    source,
                })?;
                config = config.ca_certificate(Certificate::from_pem(pem));
            }
            endpoint = endpoint.tls_config(config).map_err(UpstreamError::Tls)?;
        }
        Ok(Self {
            pool: Pool::new(endpoint, settings.streams_per_connection, metrics.clone()),
            address: bare.to_owned(),
            metrics,
            spans,
        })
    }
}

impl Source for UpstreamSource {
    fn name(&self) -> &'static str {
        "upstream"
    }

    fn watch_bytes(&self) -> usize {
        WATCH_BYTES
    }

    fn status(&self) -> SourceStatus {
        SourceStatus::Upstream(UpstreamStatus {
            upstream: self.address.clone(),
        })
    }

    fn watch(&self, key: ResourceKey, publisher: Publisher) -> BoxFuture<'static, ()> {
        let pool = self.pool.clone();
        let metrics = self.metrics.clone();
        let spans = self.spans.clone();
        let address = self.address.clone();
        Box::pin(async move {
            let mut backoff = Backoff::new();
            for attempt in 1_u64.. {
                let connecting = spans.clone().map(|spans| {
                    let upstream = ("flagd_proxy.upstream", address.as_str().into());
                    ConnectAttempt::start(spans, CONNECT_SPAN, &key, attempt, [upstream])
                });
                // A place on a connection for this stream only: while it waits to try again,
                // the place is free, and a connection left with no stream is closed.
                let lease = pool.lease();
                // gzip from the upstream when it offers it (it does for messages of at least its
                // --compression-min-bytes): the bytes between the tiers shrink as much as those
                // to clients. Each version is decompressed once here, as it is validated and
                // published.
                let client = FlagSyncServiceClient::new(lease.channel())
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .accept_compressed(CompressionEncoding::Gzip);
                let received_any = follow(client, &key, &publisher, &metrics, connecting).await;
                drop(lease);
                if received_any {
                    backoff.reset();
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        })
    }
}

/// Follows one upstream stream until it ends; true if it delivered anything. `connecting` is
/// told when the first message comes, or the stream fails before it.
async fn follow(
    mut client: FlagSyncServiceClient<Channel>,
    key: &ResourceKey,
    publisher: &Publisher,
    metrics: &Metrics,
    mut connecting: Option<ConnectAttempt>,
) -> bool {
    let mut connected = |error: Option<String>| {
        if let Some(connecting) = connecting.take() {
            connecting.done(error);
        }
    };
    let selector = key.to_string();
    let mut request = tonic::Request::new(SyncFlagsRequest {
        provider_id: "flagd-proxy".into(),
        selector: selector.clone(),
    });
    if let Ok(value) = selector.parse() {
        request.metadata_mut().insert(SELECTOR_HEADER, value);
    }
    let mut stream = match client.sync_flags(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            connected(Some(failure(&status)));
            report(status, publisher, metrics);
            return false;
        }
    };
    let mut received = false;
    loop {
        match stream.message().await {
            Ok(Some(message)) => {
                received = true;
                connected(None);
                publisher.flag_configuration(message.flag_configuration, Instant::now());
            }
            Ok(None) => {
                connected(Some("the upstream ended the stream".into()));
                metrics.source_error("upstream", "stream_ended");
                publisher.unreachable("the upstream ended the stream".into());
                return received;
            }
            Err(status) => {
                connected(Some(failure(&status)));
                report(status, publisher, metrics);
                return received;
            }
        }
    }
}

/// What the upstream answered, for logs and spans. A status with a cause was made here, from
/// an error of the connection (refused, TLS, not HTTP/2): the upstream answered nothing, and
/// the causes say why.
fn failure(status: &tonic::Status) -> String {
    let Some(cause) = std::error::Error::source(status) else {
        let answer = format!(
            "upstream answered {:?}: {}",
            status.code(),
            status.message()
        );
        if status.code() == Code::Unimplemented {
            // Not a flagd.sync.v1 server: most likely a management port, whose 404 gRPC reads as
            // Unimplemented.
            return format!(
                "{}; it does not serve flagd.sync.v1 (--upstream takes a flagd-proxy's sync port, not its management port)",
                answer.trim_end_matches([':', ' '])
            );
        }
        return answer;
    };
    let mut why = cause.to_string();
    let mut next = cause.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !why.contains(&text) {
            why = format!("{why}: {text}");
        }
        next = cause.source();
    }
    format!("cannot reach the upstream: {why}")
}

fn report(status: tonic::Status, publisher: &Publisher, metrics: &Metrics) {
    let message = failure(&status);
    match status.code() {
        Code::PermissionDenied | Code::Unauthenticated => publisher.forbidden(message),
        Code::NotFound => publisher.absent(),
        // The upstream has no valid version of the resource: its clients are told so, and
        // so are this proxy's (a version fixed upstream arrives on the next stream).
        Code::FailedPrecondition => {
            metrics.source_error("upstream", "invalid");
            publisher.invalid_upstream(status.message().to_owned());
        }
        _ => {
            metrics.source_error("upstream", "unreachable");
            publisher.unreachable(message);
        }
    }
}
