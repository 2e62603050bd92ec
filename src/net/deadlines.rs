//! Deadlines and stalls of a connection: its first bytes (the HTTP/2 preface on the sync port,
//! any request on the management port) and writes that make no progress. (A request message
//! that does not arrive is the sync server's: `server::layers`.)
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::TcpStream;

use crate::net::h2::{FrameReader, PREFACE};

/// Waits until `tcp` has sent what a client sends first without waiting for an answer: the
/// whole HTTP/2 preface, or (with `http1`) any bytes that cannot begin it, which an HTTP/1
/// server reads under its own header timeout. False when that does not arrive within
/// `deadline`, or the peer closes or fails first: the connection should be dropped. Nothing is
/// consumed.
pub(crate) async fn request_starts_within(
    tcp: &TcpStream,
    http1: bool,
    deadline: Duration,
) -> bool {
    /// How often a connection that has sent part of the preface is looked at again.
    const RECHECK: Duration = Duration::from_millis(25);
    let wait = async {
        let mut buf = [0u8; PREFACE.len()];
        loop {
            let n = match tcp.peek(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            };
            let mut frames = FrameReader::default();
            let mut peeked = &buf[..n];
            while frames.next(&mut peeked).is_some() {}
            if frames.preface_passed() || (http1 && !frames.is_http2()) {
                return true;
            }
            // Part of the preface: the rest is still on its way (or never comes).
            tokio::time::sleep(RECHECK).await;
        }
    };
    tokio::time::timeout(deadline, wait).await.unwrap_or(false)
}

/// Fails a connection's writes once they have made no progress for `limit`: a client that stops
/// reading (and so never sees pings either) is closed, and its kernel buffers freed, instead of
/// being kept until the process exits.
pub(crate) struct WriteStall {
    limit: Duration,
    since: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl WriteStall {
    pub(crate) fn new(limit: Duration) -> Self {
        Self { limit, since: None }
    }

    /// Passes `result` on, turning a write that has been pending for too long into an error.
    pub(crate) fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if result.is_ready() {
            self.since = None;
            return result;
        }
        let limit = self.limit;
        let stalled = self
            .since
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if stalled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client has read nothing for too long",
            )));
        }
        Poll::Pending
    }
}

/// Fails a connection's reads when it has not sent the HTTP/2 preface within its deadline (sync
/// connections of every kind: checked as the server reads, so a peer that closes early ends its
/// connection at once and nothing polls for bytes still to come).
pub(crate) struct PrefaceDeadline {
    /// `None` once the preface has arrived.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl PrefaceDeadline {
    pub(crate) fn new(limit: Duration) -> Self {
        Self::until(tokio::time::Instant::now() + limit)
    }

    /// The whole preface must have arrived by `deadline` (for TLS: the time the connection was
    /// accepted plus `--handshake-timeout`, which covers the handshake and the preface together).
    pub(crate) fn until(deadline: tokio::time::Instant) -> Self {
        Self {
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    /// Passes a read's `result` on (after it, the whole preface has arrived when
    /// `preface_passed`), failing a pending read once the deadline has passed without it.
    pub(crate) fn check(
        &mut self,
        cx: &mut Context<'_>,
        preface_passed: bool,
        result: Poll<std::io::Result<()>>,
    ) -> Poll<std::io::Result<()>> {
        let Some(deadline) = self.deadline.as_mut() else {
            return result;
        };
        if preface_passed {
            self.deadline = None;
            return result;
        }
        unless_timed_out(
            cx,
            deadline.as_mut(),
            result,
            "no HTTP/2 preface in time (--handshake-timeout)",
        )
    }
}

/// A read's `result`, unless it is pending and `timer` has fired: then a `TimedOut` error that
/// says `why`.
pub(crate) fn unless_timed_out(
    cx: &mut Context<'_>,
    timer: Pin<&mut tokio::time::Sleep>,
    result: Poll<std::io::Result<()>>,
    why: &'static str,
) -> Poll<std::io::Result<()>> {
    if result.is_pending() && timer.poll(cx).is_ready() {
        return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why)));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_starts_with_the_preface_or_http1() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let deadline = Duration::from_secs(30);
        let short = Duration::from_millis(200);
        for (sent, http1, want) in [
            (PREFACE, false, true),
            (&PREFACE[..10], false, false),
            (&PREFACE[..10], true, false),
            (b"GET / HTTP/1.1\r\n".as_slice(), true, true),
            (b"".as_slice(), true, false),
        ] {
            let mut client = TcpStream::connect(addr).await.expect("connect");
            let (server, _) = listener.accept().await.expect("accept");
            tokio::io::AsyncWriteExt::write_all(&mut client, sent)
                .await
                .expect("write");
            let wait = if want { deadline } else { short };
            assert_eq!(
                request_starts_within(&server, http1, wait).await,
                want,
                "{sent:?} http1={http1}"
            );
        }
    }
}
