//! Deadlines and stalls: a new connection's first bytes (the HTTP/2 preface on the sync port,
//! any request on the management port), writes that make no progress, and a request message
//! that does not arrive.
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as _, Frame};
use tokio::net::TcpStream;

use crate::net::info::ConnectionInfo;
use crate::net::limits::{AddressLimit, AddressSlot};

/// The HTTP/2 connection preface every client sends first.
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

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
            match tcp.peek(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) if n == PREFACE.len() => return true,
                Ok(n) if http1 && buf[..n] != PREFACE[..n] => return true,
                // Part of the preface: the rest is still on its way (or never comes).
                Ok(_) => tokio::time::sleep(RECHECK).await,
            }
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
    /// Preface bytes still to come; 0 once they have.
    remaining: usize,
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
            remaining: PREFACE.len(),
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    /// Passes a read's `result` on (`read` bytes arrived), failing a pending read once the
    /// deadline has passed without the whole preface.
    pub(crate) fn check(
        &mut self,
        cx: &mut Context<'_>,
        read: usize,
        result: Poll<std::io::Result<()>>,
    ) -> Poll<std::io::Result<()>> {
        let Some(deadline) = self.deadline.as_mut() else {
            return result;
        };
        self.remaining = self.remaining.saturating_sub(read);
        if self.remaining == 0 {
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

/// A request body that fails with `DEADLINE_EXCEEDED` unless it ends within its deadline, so a
/// stream whose request never completes cannot hold its memory for longer. Reading may stop
/// before the end (the sync streams read one message); the deadline then no longer matters.
/// While it is unfinished it holds a place among its client address's pending requests.
pub(crate) struct DeadlineBody<B> {
    inner: B,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
    place: Option<AddressSlot>,
}

impl<B> DeadlineBody<B> {
    pub(crate) fn new(inner: B, limit: Duration, place: Option<AddressSlot>) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            limit,
            place,
        }
    }
}

impl<B> http_body::Body for DeadlineBody<B>
where
    B: http_body::Body<Data = Bytes, Error = tonic::Status> + Unpin,
{
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if !matches!(frame, Some(Ok(_))) || self.inner.is_end_stream() {
                self.place = None;
            }
            return Poll::Ready(frame);
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.place = None;
            let limit = self.limit;
            return Poll::Ready(Some(Err(tonic::Status::deadline_exceeded(format!(
                "the request message did not arrive within {} (--request-timeout)",
                humantime::format_duration(limit)
            )))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Gives every request body a deadline (see [`DeadlineBody`]), and refuses a request with
/// `RESOURCE_EXHAUSTED` while its client address has the most unfinished requests already.
#[derive(Clone)]
pub(crate) struct RequestDeadline {
    pub(crate) limit: Duration,
    pub(crate) pending: AddressLimit,
}

impl<S> tower::Layer<S> for RequestDeadline {
    type Service = RequestDeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestDeadlineService {
            inner,
            limits: self.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct RequestDeadlineService<S> {
    inner: S,
    limits: RequestDeadline,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for RequestDeadlineService<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        >,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::Either<
        futures::future::Ready<Result<Self::Response, Self::Error>>,
        S::Future,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.body().is_end_stream() {
            return futures::future::Either::Right(self.inner.call(request));
        }
        let ip = request
            .extensions()
            .get::<ConnectionInfo>()
            .and_then(|c| c.remote_addr)
            .map(|a| a.ip());
        let place = match ip {
            Some(ip) => match self.limits.pending.admit(ip) {
                Some(place) => Some(place),
                None => {
                    let status = tonic::Status::resource_exhausted(
                        "this address has too many requests whose message has not arrived (--max-pending-requests-per-address)",
                    );
                    return futures::future::Either::Left(futures::future::ready(Ok(
                        status.into_http()
                    )));
                }
            },
            None => None,
        };
        let limit = self.limits.limit;
        futures::future::Either::Right(self.inner.call(
            request.map(|body| tonic::body::Body::new(DeadlineBody::new(body, limit, place))),
        ))
    }
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
