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
use tonic::transport::server::Connected;

use crate::connection::ConnectionInfo;
use crate::server::limits::{AddressSlot, PrefaceDeadline, TotalSlot, WriteStall};

/// A client connection, plain or TLS.
pub struct Connection {
    pub(super) stream: Stream,
    pub(super) preface: PrefaceDeadline,
    pub(super) write_stall: WriteStall,
    /// This connection's place in its address's count, given back when the connection drops.
    pub(super) _slot: AddressSlot,
    pub(super) _total: TotalSlot,
}

pub(super) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        match &self.stream {
            Stream::Plain(tcp) => ConnectionInfo {
                remote_addr: tcp.peer_addr().ok(),
                peer_certificates: None,
            },
            Stream::Unix(_) => ConnectionInfo {
                remote_addr: None,
                peer_certificates: None,
            },
            Stream::Tls(tls) => {
                let (tcp, session) = tls.get_ref();
                ConnectionInfo {
                    remote_addr: tcp.peer_addr().ok(),
                    peer_certificates: session.peer_certificates().map(|c| Arc::new(c.to_vec())),
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
        let result = match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        };
        let read = buf.filled().len() - before;
        this.preface.check(cx, read, result)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        };
        this.write_stall.check(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        };
        this.write_stall.check(cx, result)
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
        let result = match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        };
        this.write_stall.check(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
