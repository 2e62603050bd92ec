//! One accepted client connection (TCP, TLS or unix socket) as the HTTP/2 server sees it: its
//! bytes pass the deadline for the first bytes and the stalled-writer check, and it holds its
//! places in the connection limits until it is dropped.
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use crate::budget::Charge;
use crate::connection::{Activity, ConnectionInfo};
use crate::server::limits::{AddressSlot, PrefaceDeadline, WriteStall};
use crate::server::room::IdleClose;

/// A client connection, plain or TLS.
pub struct Connection {
    pub(super) stream: Stream,
    pub(super) preface: PrefaceDeadline,
    pub(super) write_stall: WriteStall,
    /// The streams open on this connection, counted by its requests.
    pub(super) activity: Arc<Activity>,
    /// Ends the connection when it is idle too long or closed to make room; holds its place
    /// among all connections.
    pub(super) idle: IdleClose,
    pub(super) closed: Closed,
    /// This connection's place in its address's count, given back when the connection drops.
    pub(super) _slot: AddressSlot,
    /// Its charge to the memory budget.
    pub(super) _memory: Charge,
}

pub(super) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
}

/// The byte stream under a connection, whichever kind it is.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Stream {
    fn io(&mut self) -> Pin<&mut dyn Io> {
        match self {
            Stream::Plain(s) => Pin::new(s),
            Stream::Tls(s) => Pin::new(s.as_mut()),
            Stream::Unix(s) => Pin::new(s),
        }
    }
}

/// Fails a connection's reads and writes once the drain has ended, so that the connection is
/// closed even when its client never reads again (its streams cannot end otherwise).
pub(crate) struct Closed(Pin<Box<WaitForCancellationFutureOwned>>);

impl Closed {
    /// Closes the connection when `drain_end` is cancelled (through a child token: connections
    /// do not share one list of waiters).
    pub(crate) fn new(drain_end: &CancellationToken) -> Self {
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

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
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
        let result = this.stream.io().poll_read(cx, buf);
        let read = buf.filled().len() - before;
        let result = this.preface.check(cx, read, result);
        let result = this.closed.check(cx, result);
        this.idle.check(cx, result)
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
        this.closed.check(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = this.stream.io().poll_write_vectored(cx, bufs);
        let result = this.write_stall.check(cx, result);
        this.closed.check(cx, result)
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
        this.closed.check(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().stream.io().poll_shutdown(cx)
    }
}
