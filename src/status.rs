//! `flagd-proxy status`: a client of a running proxy's management port. It reads `/status` and
//! `/metrics` over plain HTTP/1.1 and prints the proxy's state: every watched resource (state,
//! version, how long ago that version changed at the source, subscribers, why it is not served
//! as it is), the watches, the connections, the limits that refused something, and the serving
//! certificate's expiry. As a table for people, or as JSON (`-o json`) for scripts.
//!
//! This file holds the report and its error; reading it is in `collect.rs`, printing it in
//! `render.rs`.
use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::introspection::SourceStatus;

mod collect;
mod render;

pub use collect::fetch;

/// How long one request to the management port may take, connecting included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest answer read from the management port (`/status` or `/metrics`). A proxy at
/// `--max-watches` (10,000 resources) answers with a few MiB; anything beyond this is not a
/// flagd-proxy, and is not read further.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// An error of the HTTP client, or of reading an answer's body.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why no status could be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("cannot connect to the management port at {address}: {source}")]
    Connect {
        address: String,
        source: std::io::Error,
    },
    #[error("GET {path} from {address}: {source}")]
    Http {
        address: String,
        path: &'static str,
        source: BoxError,
    },
    #[error(
        "GET {path} from {address}: the answer is larger than {} MiB, which no flagd-proxy sends; \
         not read further",
        MAX_RESPONSE_BYTES / (1024 * 1024)
    )]
    TooLarge { address: String, path: &'static str },
    #[error("GET {path} from {address}: no answer within {}s", REQUEST_TIMEOUT.as_secs())]
    Timeout { address: String, path: &'static str },
    #[error(
        "GET {path} from {address}: HTTP status {status} (is this a flagd-proxy management port?)"
    )]
    Status {
        address: String,
        path: &'static str,
        status: hyper::StatusCode,
    },
    #[error("GET /status from {address}: not the JSON a flagd-proxy serves: {source}")]
    Json {
        address: String,
        source: serde_json::Error,
    },
}

/// A running proxy's state, as printed (`-o json` prints this).
#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The management port read.
    pub address: String,
    pub ready: bool,
    pub source: String,
    /// The source's own report (`/status`' `sourceStatus`: files that do not parse, the API
    /// server, the upstream proxy).
    pub source_status: SourceStatus,
    pub resources: Vec<ResourceReport>,
    pub watches: Watches,
    /// Open connections by port (`sync`, `management`).
    pub connections: BTreeMap<String, u64>,
    /// Requests refused since start, by the limit that refused them (only limits that did).
    pub limits_hit: BTreeMap<String, u64>,
    /// What is charged to the memory budget now.
    pub memory: Memory,
    /// Versions refused as invalid since start, by resource (`namespace/name`).
    pub invalid_versions: BTreeMap<String, u64>,
    /// The serving certificate's notAfter, in seconds since the Unix epoch (none without TLS).
    pub certificate_expires_at: Option<u64>,
}

/// The memory budget (`--memory-budget`) and what is charged to it, in bytes.
#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// The budget; 0: no limit.
    pub budget: u64,
    /// Charged now, by kind (`versions`, `connections`, `streams`).
    pub charged: BTreeMap<String, u64>,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceReport {
    pub selector: String,
    /// `pending`, `present`, `absent`, `invalid`, `forbidden`, `unreachable` or `refused`.
    pub state: String,
    /// The version clients get is kept from an earlier run (`--state-dir`): the source has not
    /// delivered one since the proxy started watching the resource.
    pub stale: bool,
    /// The version clients get (none before the first one).
    pub version: Option<u64>,
    /// How long ago the source changed to that version.
    pub version_age_seconds: Option<f64>,
    pub bytes: Option<u64>,
    pub subscribers: u64,
    /// Why the resource is not served as it is now (the newest version refused, the source
    /// unreachable, no permission).
    pub last_error: Option<String>,
    /// What clients report about some flags of the version they get (it is served all the
    /// same).
    pub warnings: Option<String>,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Watches {
    /// Resources watched at the source.
    pub active: u64,
    /// Of those, resources that do not exist yet and never had a version.
    pub waiting: u64,
}

#[cfg(test)]
mod tests;
