//! What the load generator's subscribers do with each message: a large one is compared with the
//! messages decoded before instead of being decoded again.
//!
//! Real subscribers each decode (and, when it comes gzipped, decompress) their copy of a
//! version on their own CPU. The load generator runs all of them on the machine's cores beside
//! the proxy, where doing that work ten thousand times over would make its own CPU what
//! propagation measures. So every message is received whole, and one of at least [`LARGE`]
//! bytes is compared, in full, with the recent messages already decoded: if its bytes equal one
//! of theirs (compressed or not, as received), it carries that message's version; otherwise it
//! is decompressed if compressed, and decoded. Smaller messages, and every message with
//! `--decode-each`, are decompressed and decoded one by one. Nothing is taken on trust from a
//! hash: equal bytes are compared as bytes.
//!
//! [`Received`] wraps a channel: a response's messages reach tonic's decoder uncompressed (a
//! `grpc-encoding: gzip` header is taken off), and a large one that was seen before as just its
//! version's marker.

use std::collections::VecDeque;
use std::io::Read as _;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use http_body::Frame;
use tonic::Status;
use tonic::body::Body;

use crate::SEQ_MARKER;

/// Whether every message is decoded, large and equal ones too (`--decode-each`).
pub(crate) static DECODE_EACH: AtomicBool = AtomicBool::new(false);

/// Large messages decoded in full (decompressed first if compressed).
pub(crate) static DECODED: AtomicU64 = AtomicU64::new(0);

/// Messages of at least this many bytes (as received) are compared with recent ones.
const LARGE: usize = 16 * 1024;
/// How many distinct large messages are kept with their versions (the newest first): more
/// than the resources of any scenario with large documents.
const KEPT: usize = 64;
/// The gRPC message prefix: the compressed flag and the length.
const PREFIX: usize = 5;

/// The most recent large messages (whether compressed, and their bytes as received) and their
/// version's marker.
static RECENT: Mutex<VecDeque<(bool, Bytes, Bytes)>> = Mutex::new(VecDeque::new());

/// A channel whose responses reach the decoder as the module says.
#[derive(Clone)]
pub(crate) struct Received<S>(pub(crate) S);

impl<S> tower::Service<http::Request<Body>> for Received<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let response = self.0.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            let gzip = response
                .headers()
                .get("grpc-encoding")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
            if gzip {
                response.headers_mut().remove("grpc-encoding");
            }
            Ok(response.map(|body| Body::new(Messages::new(body))))
        })
    }
}

/// A response body whose messages are uncompressed, a large one seen before replaced by its
/// version's marker.
struct Messages {
    inner: Body,
    /// Bytes of a message not yet complete.
    partial: BytesMut,
    /// Data ready to hand on.
    ready: VecDeque<Bytes>,
}

impl Messages {
    fn new(inner: Body) -> Self {
        Self {
            inner,
            partial: BytesMut::new(),
            ready: VecDeque::new(),
        }
    }

    /// Moves the complete messages of `partial` to `ready`, as the module says.
    fn split(&mut self) -> Result<(), Status> {
        while self.partial.len() >= PREFIX {
            let mut length = [0u8; 4];
            length.copy_from_slice(&self.partial[1..PREFIX]);
            let length = u32::from_be_bytes(length) as usize;
            if self.partial.len() < PREFIX + length {
                // The rest of the message is on its way: room for all of it at once.
                self.partial.reserve(PREFIX + length - self.partial.len());
                break;
            }
            let message = self.partial.split_to(PREFIX + length).freeze();
            let compressed = message[0] != 0;
            let large = length >= LARGE && !DECODE_EACH.load(Ordering::Relaxed);
            if !compressed && !large {
                self.ready.push_back(message);
                continue;
            }
            let payload = message.slice(PREFIX..);
            let plain = if large {
                marker(compressed, payload)?
            } else {
                gunzip(&payload)?
            };
            let length = u32::try_from(plain.len())
                .map_err(|_| Status::internal("a decompressed message over 4 GiB"))?;
            let mut prefix = Vec::with_capacity(PREFIX);
            prefix.push(0);
            prefix.extend_from_slice(&length.to_be_bytes());
            self.ready.push_back(Bytes::from(prefix));
            self.ready.push_back(plain);
        }
        Ok(())
    }
}

impl http_body::Body for Messages {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        loop {
            if let Some(data) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None if this.partial.is_empty() => return Poll::Ready(None),
                None => {
                    return Poll::Ready(Some(Err(Status::internal(
                        "the response ended inside a message",
                    ))));
                }
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        this.partial.extend_from_slice(&data);
                        if let Err(error) = this.split() {
                            return Poll::Ready(Some(Err(error)));
                        }
                    }
                    // Trailers.
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
            }
        }
    }
}

/// The version marker of the large message `payload` (as received; `compressed` if gzipped):
/// that of an equal message decoded before, or decoded now (under the lock, so that
/// subscribers receiving the same new message wait for one decoding instead of each making
/// their own). Empty when the message carries no version.
fn marker(compressed: bool, payload: Bytes) -> Result<Bytes, Status> {
    let mut recent = RECENT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(at) = recent
        .iter()
        .position(|(c, bytes, _)| *c == compressed && *bytes == payload)
    {
        let marker = recent[at].2.clone();
        if at > 0 {
            let entry = recent.remove(at).expect("an entry found at this position");
            recent.push_front(entry);
        }
        return Ok(marker);
    }
    DECODED.fetch_add(1, Ordering::Relaxed);
    let plain = if compressed {
        gunzip(&payload)?
    } else {
        payload.clone()
    };
    let marker = match find_seq(&plain) {
        Some(seq) => Bytes::from(format!(
            "{}{seq}",
            String::from_utf8_lossy(crate::SEQ_MARKER)
        )),
        None => Bytes::new(),
    };
    recent.push_front((compressed, payload, marker.clone()));
    recent.truncate(KEPT);
    Ok(marker)
}

fn gunzip(compressed: &[u8]) -> Result<Bytes, Status> {
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(compressed)
        .read_to_end(&mut plain)
        .map_err(|e| Status::internal(format!("a gzip message does not decompress: {e}")))?;
    Ok(Bytes::from(plain))
}

/// The sequence number a version carries (`"benchSeq":<n>`), found in its raw bytes.
pub(crate) fn find_seq(bytes: &[u8]) -> Option<u64> {
    // A 1 MiB document is searched for every subscriber: memchr's vectorised search.
    let at = memchr::memmem::find(bytes, SEQ_MARKER)?;
    let digits = &bytes[at + SEQ_MARKER.len()..];
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn gzip(text: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(text).expect("writes to memory");
        encoder.finish().expect("finishes")
    }

    fn message(compressed: bool, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::from(compressed)];
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn split_all(input: &[u8], chunk: usize) -> Vec<u8> {
        let mut messages = Messages::new(Body::empty());
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            messages.partial.extend_from_slice(piece);
            messages.split().expect("valid messages");
            for data in messages.ready.drain(..) {
                out.extend_from_slice(&data);
            }
        }
        assert!(messages.partial.is_empty(), "a message left incomplete");
        out
    }

    /// A document of at least LARGE bytes that carries version `seq` (and `tag`, to tell
    /// documents of different tests apart).
    fn large(seq: u64, tag: &str) -> Vec<u8> {
        format!(
            "{{\"tag\":\"{tag}\",\"filler\":\"{}\",\"benchSeq\":{seq}}}",
            "x".repeat(LARGE)
        )
        .into_bytes()
    }

    fn marker_of(seq: u64) -> Vec<u8> {
        format!("\"benchSeq\":{seq}").into_bytes()
    }

    #[test]
    fn messages_come_out_uncompressed_and_large_ones_as_their_version() {
        let small = br#"{"flags":{},"benchSeq":2}"#;
        let document = large(7, "split");
        let mut input = message(true, &gzip(small));
        input.extend(message(false, small));
        input.extend(message(true, &gzip(&document)));
        input.extend(message(false, &document));
        // The filler compresses far below LARGE: that message is decompressed in full.
        assert!(gzip(&document).len() < LARGE);
        let mut expected = message(false, small);
        expected.extend(message(false, small));
        expected.extend(message(false, &document));
        expected.extend(message(false, &marker_of(7)));
        // Whole, and arriving a few bytes at a time (split across prefixes and payloads).
        assert_eq!(split_all(&input, input.len()), expected);
        assert_eq!(split_all(&input, 1000), expected);
    }

    #[test]
    fn equal_messages_are_decoded_once_and_different_ones_each() {
        let tag = format!("equal-{}", std::process::id());
        let compressed = Bytes::from(gzip(&large(3, &tag)));
        let before = DECODED.load(Ordering::Relaxed);
        let a = marker(true, compressed.clone()).expect("decodes");
        let b = marker(true, Bytes::copy_from_slice(&compressed)).expect("decodes");
        assert_eq!(a, marker_of(3));
        assert!(DECODED.load(Ordering::Relaxed) > before);
        // The second is the first one's marker itself, not a decoding of its own.
        assert_eq!(a.as_ptr(), b.as_ptr());
        // Different bytes are never taken for an earlier message, however alike.
        let other = marker(true, Bytes::from(gzip(&large(4, &tag)))).expect("decodes");
        assert_eq!(other, marker_of(4));
        // Nor are the same bytes received uncompressed taken for compressed ones.
        let plain = marker(false, compressed.clone()).expect("decodes");
        assert!(plain.is_empty(), "gzip bytes carry no readable version");
        assert!(marker(true, Bytes::from_static(b"not gzip")).is_err());
    }
}
