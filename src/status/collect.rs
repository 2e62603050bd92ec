//! Reading a running proxy's state: `/status` and `/metrics` fetched over plain HTTP/1.1 from
//! its management port, the Prometheus samples parsed, and both gathered into a [`Report`].
use std::collections::BTreeMap;

use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::{
    BoxError, MAX_RESPONSE_BYTES, Memory, REQUEST_TIMEOUT, Report, ResourceReport, StatusError,
    Watches,
};
use crate::introspection::{Samples, StatusPage};

/// Reads the state of the proxy whose management port is at `address` (`host:port`).
pub async fn fetch(address: &str) -> Result<Report, StatusError> {
    let status = get(address, "/status").await?;
    let metrics = get(address, "/metrics").await?;
    let page: StatusPage = serde_json::from_slice(&status).map_err(|source| StatusError::Json {
        address: address.to_owned(),
        source,
    })?;
    Ok(Report::new(
        address,
        page,
        &Samples::parse(&String::from_utf8_lossy(&metrics)),
    ))
}

/// One HTTP/1.1 GET on a connection of its own: the body of a 200 answer, read within
/// [`REQUEST_TIMEOUT`] and at most [`MAX_RESPONSE_BYTES`] of it.
async fn get(address: &str, path: &'static str) -> Result<Bytes, StatusError> {
    let timeout = || StatusError::Timeout {
        address: address.to_owned(),
        path,
    };
    tokio::time::timeout(REQUEST_TIMEOUT, get_bounded(address, path))
        .await
        .map_err(|_| timeout())?
}

async fn get_bounded(address: &str, path: &'static str) -> Result<Bytes, StatusError> {
    let http = |source: BoxError| StatusError::Http {
        address: address.to_owned(),
        path,
        source,
    };
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|source| StatusError::Connect {
            address: address.to_owned(),
            source,
        })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|error| http(error.into()))?;
    // The connection ends with this call, however it ends (a timeout drops this future).
    let _connection = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(connection));
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, address)
        .body(Empty::<Bytes>::new())
        .expect("a GET with a path and a host is a valid request");
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| http(error.into()))?;
    let status = response.status();
    if status != hyper::StatusCode::OK {
        return Err(StatusError::Status {
            address: address.to_owned(),
            path,
            status,
        });
    }
    let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|error| {
            if error.is::<LengthLimitError>() {
                StatusError::TooLarge {
                    address: address.to_owned(),
                    path,
                }
            } else {
                http(error)
            }
        })?;
    Ok(body.to_bytes())
}

/// Samples of `name` (only those above 0 unless `zeros`), keyed by the values of `labels`
/// (joined with `/`).
fn by(samples: &Samples, name: &str, labels: &[&str], zeros: bool) -> BTreeMap<String, u64> {
    samples
        .named(name)
        .filter(|sample| zeros || sample.value > 0.0)
        .map(|sample| {
            let key: Vec<&str> = labels
                .iter()
                .map(|label| sample.label(label).unwrap_or_default())
                .collect();
            (key.join("/"), sample.value as u64)
        })
        .collect()
}

impl Report {
    pub(super) fn new(address: &str, page: StatusPage, samples: &Samples) -> Self {
        let count = |name: &str| samples.get(name).map_or(0, |v| v as u64);
        let resources = page
            .resources
            .into_iter()
            .map(|r| ResourceReport {
                selector: r.selector,
                state: r.availability,
                stale: r.stale,
                version: r.version,
                version_age_seconds: r.version_age_seconds,
                bytes: r.bytes,
                subscribers: r.subscribers,
                last_error: r.reason,
                warnings: r.warnings,
            })
            .collect();
        Report {
            address: address.to_owned(),
            ready: page.ready,
            source: page.source,
            source_status: page.source_status,
            resources,
            watches: Watches {
                active: count("flagd_proxy_upstream_watches"),
                waiting: count("flagd_proxy_waiting_resources"),
            },
            connections: by(samples, "flagd_proxy_open_connections", &["port"], true),
            limits_hit: by(
                samples,
                "flagd_proxy_rejected_requests_total",
                &["reason"],
                false,
            ),
            memory: Memory {
                budget: count("flagd_proxy_memory_budget_bytes"),
                charged: by(samples, "flagd_proxy_memory_charged_bytes", &["kind"], true),
            },
            invalid_versions: by(
                samples,
                "flagd_proxy_invalid_documents_total",
                &["namespace", "name"],
                false,
            ),
            certificate_expires_at: samples
                .get("flagd_proxy_tls_certificate_expiry_timestamp_seconds")
                .filter(|at| *at > 0.0)
                .map(|at| at as u64),
        }
    }
}
