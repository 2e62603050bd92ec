//! The hostile attacks of docs/security.md ("The attacks, one by one"), one catalogue for the
//! tests that assert their bounds (`tests/hostile.rs`) and the benchmark that measures them
//! (`flagd-proxy-bench --attacks`): each row's number and name ([`ROWS`]), and, for the attacks
//! defined here, the attack itself (the client code, its size) and the bound it must meet.
//!
//! - [`metadata`]: row 1, flag-set metadata that would double a message past clients' limit.
//! - [`pinned`]: row 2, versions pinned by streams that cannot be written to.
//! - [`unfinished`]: row 4, streams whose request never comes, from many addresses.
//! - [`management`]: row 5, idle HTTP/2 connections filling the management port, and probes.
//! - [`yaml`]: rows 7 and 8, the YAML files and the bounds on what reading them may cost.
//! - [`socket_authority`]: row 10, the `:authority` gRPC clients send on a unix socket.
//! - [`late_tls`]: row 11, the TLS handshake and the preface each late by most of the deadline.
//! - [`context`]: row 13, `--context-value` entries that must be refused at start.
//! - [`streams`]: the raw HTTP/2 streams rows 2 to 4 open, and reading until they end.

pub mod context;
pub mod late_tls;
pub mod management;
pub mod metadata;
pub mod pinned;
pub mod socket_authority;
pub mod streams;
pub mod unfinished;
pub mod yaml;

use flagd_proxy::introspection::Samples;

/// One row of the attacks' table.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub number: u8,
    /// What the attack is, as the table names it.
    pub attack: &'static str,
}

/// The attacks, as docs/security.md numbers and names them.
pub const ROWS: [Row; 15] = [
    row(
        1,
        "flag-set `metadata` of 2.3 MB, under `--max-document-bytes`",
    ),
    row(
        2,
        "one connection, stream windows never opened, a new stream per version of a large document",
    ),
    row(
        3,
        "connections × 1,000 requests ending at once, then idle, from 4 addresses",
    ),
    row(
        4,
        "header-only streams from many addresses, held to the request deadline",
    ),
    row(
        5,
        "8 addresses × 32 idle HTTP/2 connections to the management port",
    ),
    row(
        6,
        "idle reconnects filling `--max-connections` from 4 addresses",
    ),
    row(7, "one 100 KB YAML anchor referenced 20,000 times"),
    row(
        8,
        "brackets inside quoted YAML scalars; another file edited meanwhile",
    ),
    row(9, "unix socket `--sync-socket-mode 0600` under umask 000"),
    row(
        10,
        "gRPC C-core `:authority` (percent-encoded socket path) on the unix socket",
    ),
    row(11, "TLS finished late, then the preface after the deadline"),
    row(12, "SIGHUP and SIGUSR1 in the first 0.2 s of start-up"),
    row(
        13,
        "`--context-value`: a large value, reserved and look-alike keys",
    ),
    row(14, "memory after every attack on a running proxy"),
    row(
        15,
        "connections from one address × a burst of 1,200 requests, then one stream held on each",
    ),
];

const fn row(number: u8, attack: &'static str) -> Row {
    Row { number, attack }
}

/// The name of attack `number` (empty when there is none).
pub fn name(number: u8) -> &'static str {
    ROWS.iter()
        .find(|row| row.number == number)
        .map_or("", |row| row.attack)
}

/// The value of `sample` on the proxy's `/metrics` (0 when it has none); the error when the
/// management port does not answer.
pub(crate) async fn sample(management_port: u16, sample: &str) -> Result<f64, String> {
    let (_, body) = crate::http_get(management_port, "/metrics")
        .await
        .map_err(|error| format!("the proxy does not answer: {error}"))?;
    Ok(Samples::parse(&body).get(sample).unwrap_or(0.0))
}
