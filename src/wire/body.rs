//! The bytes of a server-streaming call on the wire: the one request message read whole, and a
//! response body that writes each frame straight from its shared bytes.
//!
//! tonic's generic streaming path encodes each message of a stream into a buffer of that stream,
//! which then keeps the capacity of the largest message for as long as the stream lives: with
//! 10,000 subscribers and a 100 KiB flag set, about a gigabyte of copies. Here every snapshot
//! goes to the HTTP/2 stream as the chunks of body data its frame is made of, the version's
//! shared `Bytes` with the gRPC prefix included (HTTP/2 sends them as DATA frames of the client's
//! frame size, straight from those bytes): a stream holds no copy of the flags.
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::task::AtomicWaker;
use http_body::Frame;
use http_body_util::BodyExt;
use tonic::Status;
use tonic::body::Body;

use crate::wire::frame::PREFIX;
use crate::wire::stream::FrameStream;

/// Reads the one length-prefixed request message of a server-streaming call, and nothing more:
/// the stream is served as soon as the message is complete, whether or not the client has ended
/// its side (the request body's deadline, see `net::deadlines`, bounds the wait).
pub(crate) async fn read_message(mut body: Body, limit: usize) -> Result<Bytes, Status> {
    let too_large = |size: String| {
        Status::out_of_range(format!(
            "the request message is {size}, over the limit of {limit} bytes (--max-request-bytes)"
        ))
    };
    let mut buffer = BytesMut::new();
    loop {
        if buffer.len() >= PREFIX {
            if buffer[0] != 0 {
                return Err(Status::unimplemented(
                    "compressed requests are not supported",
                ));
            }
            let length = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
            if length > limit {
                return Err(too_large(format!("{length} bytes")));
            }
            if buffer.len() > PREFIX + length {
                return Err(Status::invalid_argument(
                    "the request must hold exactly one whole message",
                ));
            }
            if buffer.len() == PREFIX + length {
                return Ok(buffer.freeze().slice(PREFIX..));
            }
        }
        match body.frame().await {
            None => {
                return Err(Status::invalid_argument(if buffer.len() < PREFIX {
                    "the request has no message"
                } else {
                    "the request must hold exactly one whole message"
                }));
            }
            Some(Err(status)) if status.code() == tonic::Code::DeadlineExceeded => {
                return Err(status);
            }
            Some(Err(error)) => {
                return Err(Status::cancelled(format!(
                    "the request could not be read: {error}"
                )));
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    if buffer.len() + data.len() > limit + PREFIX {
                        return Err(too_large("larger".to_owned()));
                    }
                    buffer.extend_from_slice(&data);
                }
            }
        }
    }
}

/// A whole gRPC message up to this size goes to HTTP/2 as one piece (it fits the default
/// largest DATA frame, 16 KiB).
const ONE_FRAME: usize = 16 * 1024;

/// The response body: each frame's shared bytes (in one piece, or the prefix and then the
/// message for a large one, or the frame's own pieces); the status that ends the stream as
/// trailers.
///
/// The next frame is taken from the stream only once the last message handed to HTTP/2 has been
/// written out. HTTP/2 queues whatever it is handed until the client's window lets it out, so
/// otherwise a client that is behind would have a second version queued behind the one it is
/// still receiving: it then gets the newest version when it can take it, not an older one
/// committed early, and at shutdown the status follows the message under way instead of waiting
/// for a version the client would receive only to drop it as it reconnects.
pub(crate) struct FrameBody {
    stream: FrameStream,
    /// The rest of the message under way, after the piece just sent.
    pending: VecDeque<Bytes>,
    /// Whether the last message handed to HTTP/2 is out.
    written: Arc<Written>,
    done: bool,
}

impl FrameBody {
    pub(crate) fn new(stream: FrameStream) -> Self {
        Self {
            stream,
            pending: VecDeque::new(),
            written: Arc::new(Written {
                done: AtomicBool::new(true),
                waker: AtomicWaker::new(),
            }),
            done: false,
        }
    }

    /// `message`, tracked: the body learns when HTTP/2 has written it out (or dropped it with
    /// the stream), which is when the bytes are released.
    fn tracked(&self, message: Bytes) -> Bytes {
        self.written.done.store(false, Ordering::Release);
        Bytes::from_owner(InFlight {
            bytes: message,
            written: self.written.clone(),
        })
    }
}

/// Set (and the body woken) once a message handed to HTTP/2 is released.
struct Written {
    done: AtomicBool,
    waker: AtomicWaker,
}

impl Written {
    fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.done.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        if self.done.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// A message's shared bytes while HTTP/2 holds them.
struct InFlight {
    bytes: Bytes,
    written: Arc<Written>,
}

impl AsRef<[u8]> for InFlight {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.written.done.store(true, Ordering::Release);
        self.written.waker.wake();
    }
}

impl http_body::Body for FrameBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(piece) = self.pending.pop_front() {
            // The message is out once its last piece is.
            let piece = if self.pending.is_empty() {
                self.tracked(piece)
            } else {
                piece
            };
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        if self.written.poll(cx).is_pending() {
            return Poll::Pending;
        }
        let status = match self.stream.poll_next_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(frame))) if frame.is_empty() => {
                Status::internal("a snapshot is too large to send")
            }
            Poll::Ready(Some(Ok(frame))) => {
                match frame.pieces() {
                    [one] if one.len() <= ONE_FRAME => {
                        return Poll::Ready(Some(Ok(Frame::data(self.tracked(one.clone())))));
                    }
                    // Larger than one HTTP/2 frame: the prefix first, then the message, both
                    // slices of the shared bytes. Measured: handing h2 a 100 KiB message
                    // together with its prefix made the slowest subscribers wait (p99) about
                    // 45 % longer.
                    [one] => self
                        .pending
                        .extend([one.slice(..PREFIX), one.slice(PREFIX..)]),
                    // Already in pieces, the prefix in a small one of its own.
                    pieces => self
                        .pending
                        .extend(pieces.iter().filter(|p| !p.is_empty()).cloned()),
                }
                return self.poll_frame(cx);
            }
            Poll::Ready(Some(Err(status))) => status,
            // The sync streams end only with an error; should one end otherwise, clients must
            // still reconnect, and an OK status would stop some of them.
            Poll::Ready(None) => Status::unavailable("the stream ended; reconnect"),
        };
        self.done = true;
        Poll::Ready(Some(Ok(trailers(&status))))
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.pending.is_empty()
    }
}

fn trailers(status: &Status) -> Frame<Bytes> {
    let mut headers = http::HeaderMap::new();
    if status.add_header(&mut headers).is_err() {
        headers.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    Frame::trailers(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::Frame as WireFrame;
    use http_body::Body as _;

    fn poll(body: &mut FrameBody) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let waker = futures::task::noop_waker();
        Pin::new(body).poll_frame(&mut Context::from_waker(&waker))
    }

    fn data(polled: Poll<Option<Result<Frame<Bytes>, Status>>>) -> Bytes {
        match polled {
            Poll::Ready(Some(Ok(frame))) => frame.into_data().expect("data"),
            other => panic!("not data: {other:?}"),
        }
    }

    /// A frame of `length` bytes, gRPC prefix included.
    fn frame(length: usize) -> Result<WireFrame, Status> {
        Ok(WireFrame::whole(Bytes::from(vec![0u8; length])))
    }

    /// The next frame is taken only once HTTP/2 has released the message before it, small or
    /// large; a status that ends the stream follows the message under way.
    #[test]
    fn the_next_frame_waits_until_the_last_message_is_out() {
        let frames = vec![
            frame(100),
            frame(ONE_FRAME * 4),
            frame(100),
            Err(Status::unavailable("shutting down")),
        ];
        let mut body = FrameBody::new(Box::pin(futures::stream::iter(frames)));
        let small = data(poll(&mut body));
        assert_eq!(small.len(), 100);
        assert!(
            poll(&mut body).is_pending(),
            "taken while the last message is held"
        );
        drop(small);
        let prefix = data(poll(&mut body));
        assert_eq!(prefix.len(), PREFIX);
        let message = data(poll(&mut body));
        assert_eq!(message.len(), ONE_FRAME * 4 - PREFIX);
        // A slice of the message (HTTP/2 sends it a frame at a time) holds it too.
        let rest = message.slice(ONE_FRAME..);
        drop(message);
        drop(prefix);
        assert!(
            poll(&mut body).is_pending(),
            "taken while part of the message is held"
        );
        drop(rest);
        let small = data(poll(&mut body));
        assert!(poll(&mut body).is_pending());
        drop(small);
        match poll(&mut body) {
            Poll::Ready(Some(Ok(frame))) => {
                let trailers = frame.into_trailers().expect("trailers");
                assert_eq!(trailers["grpc-status"], "14");
            }
            other => panic!("not trailers: {other:?}"),
        }
        assert!(matches!(poll(&mut body), Poll::Ready(None)));
    }

    /// A frame in pieces goes out piece by piece, in order, and the next frame waits until its
    /// last piece is released.
    #[test]
    fn a_frame_in_pieces_goes_out_in_order() {
        let pieces = vec![
            Bytes::from_static(b"\0\0\0\0\x09\x0a\x03"),
            Bytes::from_static(b"doc"),
            Bytes::new(),
            Bytes::from_static(b"\x10\x01"),
        ];
        let frames = vec![
            Ok(WireFrame(crate::hub::Encoded::from_pieces(pieces))),
            frame(10),
        ];
        let mut body = FrameBody::new(Box::pin(futures::stream::iter(frames)));
        let out: Vec<Bytes> = (0..3).map(|_| data(poll(&mut body))).collect();
        assert_eq!(out.concat(), b"\0\0\0\0\x09\x0a\x03doc\x10\x01");
        let (first, last) = (out[0].clone(), out[2].clone());
        drop(out);
        assert!(poll(&mut body).is_pending(), "the last piece is held");
        drop(last);
        drop(first);
        assert_eq!(data(poll(&mut body)).len(), 10);
    }
}
