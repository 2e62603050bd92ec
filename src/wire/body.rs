//! The bytes of a server-streaming call on the wire: the one request message read whole, and a
//! response body that writes each frame straight from its shared bytes.
//!
//! tonic's generic streaming path encodes each message of a stream into a buffer of that stream,
//! which then keeps the capacity of the largest message for as long as the stream lives: with
//! 10,000 subscribers and a 100 KiB flag set, about a gigabyte of copies. Here every snapshot
//! goes to the HTTP/2 stream as one DATA frame of the version's shared `Bytes`, gRPC prefix
//! included: a stream holds no copy of the flags.
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http_body::Frame;
use http_body_util::BodyExt;
use tonic::Status;
use tonic::body::Body;

use crate::wire::frame::PREFIX;
use crate::wire::stream::FrameStream;

/// Reads the one length-prefixed request message of a server-streaming call, and nothing more:
/// the stream is served as soon as the message is complete, whether or not the client has ended
/// its side (the request body's deadline, see `server::limits`, bounds the wait).
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
/// message for large ones); the status that ends the stream as trailers.
pub(crate) struct FrameBody {
    stream: FrameStream,
    /// The message to send after the prefix just sent.
    pending: Option<Bytes>,
    done: bool,
}

impl FrameBody {
    pub(crate) fn new(stream: FrameStream) -> Self {
        Self {
            stream,
            pending: None,
            done: false,
        }
    }
}

impl http_body::Body for FrameBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(message) = self.pending.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        let status = match self.stream.poll_next_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(frame))) if frame.0.len() <= ONE_FRAME => {
                return Poll::Ready(Some(Ok(Frame::data(frame.0))));
            }
            Poll::Ready(Some(Ok(frame))) if !frame.0.is_empty() => {
                // Larger than one HTTP/2 frame: the prefix first, then the message, both
                // slices of the shared bytes. Measured: handing h2 a 100 KiB message together
                // with its prefix made the slowest subscribers wait (p99) about 45 % longer.
                self.pending = Some(frame.0.slice(PREFIX..));
                return Poll::Ready(Some(Ok(Frame::data(frame.0.slice(..PREFIX)))));
            }
            Poll::Ready(Some(Ok(_))) => Status::internal("a snapshot is too large to send"),
            Poll::Ready(Some(Err(status))) => status,
            // The sync streams end only with an error; should one end otherwise, clients must
            // still reconnect, and an OK status would stop some of them.
            Poll::Ready(None) => Status::unavailable("the stream ended; reconnect"),
        };
        self.done = true;
        Poll::Ready(Some(Ok(trailers(&status))))
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.pending.is_none()
    }
}

fn trailers(status: &Status) -> Frame<Bytes> {
    let mut headers = http::HeaderMap::new();
    if status.add_header(&mut headers).is_err() {
        headers.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    Frame::trailers(headers)
}
