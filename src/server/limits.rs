//! Budgets that keep hostile or broken clients from holding memory and file descriptors: a
//! bound on open connections per client address and in total, a deadline for a new connection's first bytes, and a
//! deadline for a request message to arrive.
use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as _, Frame};
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpStream;

use crate::connection::ConnectionInfo;
use crate::metrics::{Metrics, PortLabels};

/// The HTTP/2 connection preface every client sends first.
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Open connections on one port, bounded by `limit` (0: no limit), shown as the
/// `flagd_proxy_open_connections{port}` gauge.
#[derive(Clone)]
pub(crate) struct TotalLimit {
    limit: usize,
    open: Arc<AtomicUsize>,
    gauge: Gauge,
    metrics: Arc<Metrics>,
    reason: &'static str,
}

impl TotalLimit {
    /// `reason` names the flag in `flagd_proxy_rejected_requests_total` when a connection is
    /// refused.
    pub(crate) fn new(
        limit: usize,
        port: &'static str,
        reason: &'static str,
        metrics: Arc<Metrics>,
    ) -> Self {
        let gauge = metrics
            .open_connections
            .get_or_create(&PortLabels { port })
            .clone();
        metrics
            .connection_limit
            .get_or_create(&PortLabels { port })
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
        Self {
            limit,
            open: Arc::default(),
            gauge,
            metrics,
            reason,
        }
    }

    /// A place for one more connection, or `None` (counted) when all are taken.
    pub(crate) fn admit(&self) -> Option<TotalSlot> {
        let admitted = self
            .open
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |open| {
                (self.limit == 0 || open < self.limit).then_some(open + 1)
            })
            .is_ok();
        if !admitted {
            self.metrics.reject(self.reason);
            return None;
        }
        self.gauge.inc();
        Some(TotalSlot {
            open: self.open.clone(),
            gauge: self.gauge.clone(),
        })
    }
}

/// One connection's place in a [`TotalLimit`]; dropping it gives the place back.
pub(crate) struct TotalSlot {
    open: Arc<AtomicUsize>,
    gauge: Gauge,
}

impl Drop for TotalSlot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.gauge.dec();
    }
}

/// Waits until `tcp` has sent what a client sends first without waiting for an answer: the
/// whole HTTP/2 preface, or (with `http1`) any bytes that cannot begin it, which an HTTP/1
/// server reads under its own header timeout. False when that does not arrive within
/// `deadline`, or the peer closes or fails first: the connection should be dropped. Nothing is
/// consumed.
pub(crate) async fn first_bytes(tcp: &TcpStream, http1: bool, deadline: Duration) -> bool {
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
        if result.is_pending() && deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no HTTP/2 preface in time (--handshake-timeout)",
            )));
        }
        result
    }
}

/// A TCP connection that holds its places in the connection limits and closes when its writes
/// stall (see [`WriteStall`]).
pub(crate) struct GuardedTcp<P> {
    tcp: TcpStream,
    write_stall: WriteStall,
    _places: P,
}

impl<P> GuardedTcp<P> {
    pub(crate) fn new(tcp: TcpStream, write_stall: Duration, places: P) -> Self {
        Self {
            tcp,
            write_stall: WriteStall::new(write_stall),
            _places: places,
        }
    }
}

impl<P: Unpin> tokio::io::AsyncRead for GuardedTcp<P> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_read(cx, buf)
    }
}

impl<P: Unpin> tokio::io::AsyncWrite for GuardedTcp<P> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.tcp).poll_write(cx, buf);
        this.write_stall.check(cx, result)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.tcp).poll_flush(cx);
        this.write_stall.check(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
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

/// Open connections per client IP address, bounded by `max_connections_per_address`.
#[derive(Clone)]
pub(crate) struct AddressLimit {
    limit: usize,
    open: OpenPerAddress,
    metrics: Arc<Metrics>,
    reason: &'static str,
}

type OpenPerAddress = Arc<Mutex<HashMap<IpAddr, usize>>>;

impl AddressLimit {
    pub(crate) fn new(limit: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            limit,
            open: Arc::default(),
            metrics,
            reason: "max_connections_per_address",
        }
    }

    /// The same limit, counted under another reason in the rejection metric.
    pub(crate) fn with_reason(self, reason: &'static str) -> Self {
        Self { reason, ..self }
    }

    /// A place for one more connection from `ip`, or `None` (counted) when it has the most.
    pub(crate) fn admit(&self, ip: IpAddr) -> Option<AddressSlot> {
        if self.limit == 0 {
            return Some(AddressSlot(None));
        }
        let ip = ip.to_canonical();
        let mut open = lock(&self.open);
        let count = open.entry(ip).or_insert(0);
        if *count >= self.limit {
            drop(open);
            self.metrics.reject(self.reason);
            return None;
        }
        *count += 1;
        Some(AddressSlot(Some((self.open.clone(), ip))))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Only short, non-panicking sections hold it; a poisoned map is still consistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One connection's place in [`AddressLimit`]; dropping it gives the place back.
pub(crate) struct AddressSlot(Option<(OpenPerAddress, IpAddr)>);

impl AddressSlot {
    /// A connection that counts against no address (a unix socket's).
    pub(crate) fn none() -> Self {
        Self(None)
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let Some((open, ip)) = self.0.take() else {
            return;
        };
        let mut open = lock(&open);
        if let Some(count) = open.get_mut(&ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_per_address_are_bounded_and_given_back() {
        let limit = AddressLimit::new(2, Arc::new(Metrics::new()));
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let first = limit.admit(a).expect("first");
        let _second = limit.admit(a).expect("second");
        assert!(limit.admit(a).is_none(), "third from the same address");
        let _other = limit.admit(b).expect("another address has its own count");
        // The same client seen over IPv6 as a mapped IPv4 address is the same address.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("ip");
        assert!(limit.admit(mapped).is_none());
        drop(first);
        let _again = limit.admit(a).expect("a place came free");
        let encoded = limit.metrics.encode();
        assert!(
            encoded.contains(
                "flagd_proxy_rejected_requests_total{reason=\"max_connections_per_address\"} 2"
            ),
            "{encoded}"
        );
        let unlimited = AddressLimit::new(0, Arc::new(Metrics::new()));
        let slots: Vec<_> = (0..1_000).filter_map(|_| unlimited.admit(a)).collect();
        assert_eq!(slots.len(), 1_000);
        assert!(lock(&unlimited.open).is_empty(), "nothing is tracked");
    }

    #[test]
    fn total_connections_are_bounded_and_given_back() {
        let metrics = Arc::new(Metrics::new());
        let limit = TotalLimit::new(2, "sync", "max_connections", metrics.clone());
        let first = limit.admit().expect("first");
        let _second = limit.admit().expect("second");
        assert!(limit.admit().is_none());
        drop(first);
        let _third = limit.admit().expect("a place came free");
        let encoded = metrics.encode();
        assert!(
            encoded.contains("flagd_proxy_open_connections{port=\"sync\"} 2"),
            "{encoded}"
        );
        assert!(
            encoded.contains("flagd_proxy_connection_limit{port=\"sync\"} 2"),
            "{encoded}"
        );
        assert!(
            encoded.contains("flagd_proxy_rejected_requests_total{reason=\"max_connections\"} 1"),
            "{encoded}"
        );
        let unlimited = TotalLimit::new(0, "management", "x", metrics);
        let slots: Vec<_> = (0..100).filter_map(|_| unlimited.admit()).collect();
        assert_eq!(slots.len(), 100);
    }

    #[tokio::test]
    async fn first_bytes_waits_for_the_preface_or_http1() {
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
                first_bytes(&server, http1, wait).await,
                want,
                "{sent:?} http1={http1}"
            );
        }
    }
}
