//! Row 11: a TLS client that spends most of `--handshake-timeout` before its handshake and
//! sends the preface after as long again: past the deadline, though within a fresh one counted
//! from the handshake. The proxy must close it, never serve it. The bench runs it against the
//! proxy; the tests assert the property on a paused clock (`net::tls` of the proxy), since
//! these waits race the deadline on the wall clock.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::TestCa;
use crate::raw_h2::{self, ACK, PING, SETTINGS};

/// What became of the late client.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A PING sent after the preface was answered: the connection was served.
    Served,
    /// The connection closed without answering.
    Closed,
    /// The TLS handshake failed.
    HandshakeFailed(String),
    /// Neither within the time given.
    Undecided,
}

/// Connects to `port`, waits `before`, completes the handshake against `ca`, waits `after`,
/// then sends the preface, SETTINGS and a PING, and reads for at most `within`.
pub async fn attempt(
    ca: &TestCa,
    port: u16,
    before: Duration,
    after: Duration,
    within: Duration,
) -> std::io::Result<Outcome> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    tokio::time::sleep(before).await;
    let mut tls = match ca.tls_connect(tcp).await {
        Ok(tls) => tls,
        Err(error) => return Ok(Outcome::HandshakeFailed(error.to_string())),
    };
    tokio::time::sleep(after).await;
    let mut hello = [raw_h2::PREFACE, &raw_h2::frame(SETTINGS, 0, 0, &[])].concat();
    hello.extend(raw_h2::ping(*b"late-tls"));
    // The proxy may have closed already: what it does is read below.
    let _ = tls.write_all(&hello).await;
    let _ = tls.flush().await;
    let answered = async {
        while let Some(frame) = raw_h2::read_frame(&mut tls).await {
            if frame.kind == PING && frame.flags & ACK != 0 {
                return Outcome::Served;
            }
        }
        Outcome::Closed
    };
    Ok(tokio::time::timeout(within, answered)
        .await
        .unwrap_or(Outcome::Undecided))
}
