//! One accepted client connection (TCP, TLS or unix socket) as an HTTP server sees it: its
//! writes pass the stalled-writer check and, on the sync port, its reads the preface deadline,
//! the idle and make-room close, and the end of the drain; it holds its places in the
//! connection limits and its memory charge until it is dropped.
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::budget::Charge;
use crate::net::deadlines::{PrefaceDeadline, WriteStall};
use crate::net::h2::AuthorityFilter;
use crate::net::h2::arrivals::StreamArrivals;
use crate::net::info::{Activity, ConnectionInfo};
use crate::net::limits::AddressSlot;
use crate::net::room::{IdleClose, Ticket};

/// A client connection, plain, TLS or unix.
pub struct Connection {
    stream: Stream,
    write_stall: WriteStall,
    /// The streams open on this connection, counted by its requests.
    activity: Arc<Activity>,
    preface: Option<PrefaceDeadline>,
    /// Ends the connection when it is idle too long or closed to make room; holds its place
    /// among all connections.
    idle: Option<IdleClose>,
    closed: Option<Closed>,
    /// This connection's place in its address's count, given back when the connection drops.
    _slot: AddressSlot,
    /// Its charge to the memory budget.
    memory: Option<Charge>,
    /// The streams its client opens in one go, counted on an HTTP/2 connection.
    arrivals: Option<StreamArrivals>,
    /// Set once its side is closed: how long the client's last bytes are still read.
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// How long a closed connection still reads (and drops) what its client sends, waiting for the
/// client to close too.
const LINGER: Duration = Duration::from_secs(2);

impl Connection {
    /// `stream`, closed when its writes stall for `write_stall`, holding `slot`.
    pub(crate) fn new(stream: Stream, write_stall: Duration, slot: AddressSlot) -> Self {
        Self {
            stream,
            write_stall: WriteStall::new(write_stall),
            activity: Arc::default(),
            preface: None,
            idle: None,
            closed: None,
            _slot: slot,
            memory: None,
            arrivals: None,
            linger: None,
        }
    }

    /// An HTTP/2 connection, closed unless the preface arrives in time. What its stream store
    /// keeps of each burst of new streams is charged to its memory budget (see
    /// [`Activity::retain_burst`]).
    pub(crate) fn with_preface(mut self, preface: PrefaceDeadline) -> Self {
        self.preface = Some(preface);
        self.arrivals = Some(StreamArrivals::default());
        self
    }

    /// Entered in a room with `ticket`: closed to make room, or when it has had no stream for
    /// `idle_timeout`.
    pub(crate) fn in_room(mut self, ticket: Ticket, idle_timeout: Option<Duration>) -> Self {
        self.activity = ticket.activity().clone();
        self.idle = Some(ticket.until_idle(idle_timeout));
        self
    }

    /// Closed when `drain_end` is cancelled.
    pub(crate) fn closed_by(mut self, drain_end: &CancellationToken) -> Self {
        self.closed = Some(Closed::new(drain_end));
        self
    }

    /// `result`, unless the drain has ended.
    fn check_closed<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match &mut self.closed {
            Some(closed) => closed.check(cx, result),
            None => result,
        }
    }

    /// Holding `memory` while open.
    pub(crate) fn charged(mut self, memory: Charge) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Counts the streams `read` opens and charges what the HTTP/2 layer will keep for them
    /// before it reads them: it holds a whole batch at once (the streams opened since the
    /// client last had nothing more to read) beside the streams still open. A burst that does
    /// not fit in the budget is an error: its bytes never reach the HTTP/2 layer, and the
    /// connection ends.
    fn count_arrivals(&mut self, read: &[u8], pending: bool) -> io::Result<()> {
        let Some(arrivals) = &mut self.arrivals else {
            return Ok(());
        };
        if arrivals.feed(read) > 0 {
            // A request on its way: not a connection to close as idle.
            self.activity.heard();
            if let Some(memory) = &self.memory {
                let held = self.activity.streams() + arrivals.batch();
                if !self.activity.retain_burst(held, memory.budget()) {
                    return Err(io::Error::other(format!(
                        "a burst of {} new streams does not fit in the memory budget",
                        arrivals.batch()
                    )));
                }
            }
        }
        if pending {
            arrivals.take_batch();
        }
        Ok(())
    }
}

pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// Read through the filter that makes any `:authority` one the server accepts.
    Unix(Box<AuthorityFilter<UnixStream>>),
}

/// The byte stream under a connection, whichever kind it is.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Stream {
    fn io(&mut self) -> Pin<&mut dyn Io> {
        match self {
            Stream::Plain(s) => Pin::new(s),
            Stream::Tls(s) => Pin::new(s.as_mut()),
            Stream::Unix(s) => Pin::new(s.as_mut()),
        }
    }
}

/// Fails a connection's reads and writes once the drain has ended, so that the connection is
/// closed even when its client never reads again (its streams cannot end otherwise).
struct Closed(Pin<Box<WaitForCancellationFutureOwned>>);

impl Closed {
    /// Closes the connection when `drain_end` is cancelled (through a child token: connections
    /// do not share one list of waiters).
    fn new(drain_end: &CancellationToken) -> Self {
        Self(Box::pin(drain_end.child_token().cancelled_owned()))
    }

    /// `result`, unless the drain has ended.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if self.0.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the shutdown timeout has passed",
            )));
        }
        result
    }
}

impl Connection {
    /// What the services may learn about this connection.
    pub(crate) fn info(&self) -> ConnectionInfo {
        let activity = Some(self.activity.clone());
        match &self.stream {
            Stream::Plain(tcp) => ConnectionInfo {
                remote_addr: tcp.peer_addr().ok(),
                peer_certificates: None,
                activity,
            },
            Stream::Unix(_) => ConnectionInfo {
                remote_addr: None,
                peer_certificates: None,
                activity,
            },
            Stream::Tls(tls) => {
                let (tcp, session) = tls.get_ref();
                ConnectionInfo {
                    remote_addr: tcp.peer_addr().ok(),
                    peer_certificates: session.peer_certificates().map(|c| Arc::new(c.to_vec())),
                    activity,
                }
            }
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let mut result = this.stream.io().poll_read(cx, buf);
        if let Err(refused) = this.count_arrivals(&buf.filled()[before..], result.is_pending()) {
            tracing::debug!(error = %refused, "closing a sync connection");
            buf.set_filled(before);
            result = Poll::Ready(Err(refused));
        }
        let result = match (&mut this.preface, &this.arrivals) {
            (Some(preface), Some(arrivals)) => preface.check(cx, arrivals.preface_passed(), result),
            _ => result,
        };
        let result = this.check_closed(cx, result);
        match &mut this.idle {
            Some(idle) => idle.check(cx, result),
            None => result,
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = this.stream.io().poll_write(cx, buf);
        let result = this.write_stall.check(cx, result);
        this.check_closed(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = this.stream.io().poll_write_vectored(cx, bufs);
        let result = this.write_stall.check(cx, result);
        this.check_closed(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = this.stream.io().poll_flush(cx);
        let result = this.write_stall.check(cx, result);
        this.check_closed(cx, result)
    }

    /// Ends the connection's side (FIN, after TLS' close_notify), then reads and drops what the
    /// client still sends until it closes too, for at most [`LINGER`]. Closing a socket with
    /// unread bytes (the client's window updates and pings keep coming) resets the connection,
    /// and the client's kernel then drops what it had received but not yet read: the last
    /// frames, such as the trailers that end every stream at shutdown.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let linger = match &mut this.linger {
            Some(linger) => linger,
            None => {
                std::task::ready!(this.stream.io().poll_shutdown(cx))?;
                this.linger.insert(Box::pin(tokio::time::sleep(LINGER)))
            }
        };
        let mut buf = [0u8; 1024];
        loop {
            if linger.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut buf);
            match this.stream.io().poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if !read.filled().is_empty() => {}
                Poll::Ready(_) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
