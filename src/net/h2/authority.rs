//! Any `:authority` a client sends is accepted on the unix socket.
//!
//! The HTTP/2 server parses `:authority` as a URI authority and resets a stream whose value is
//! not one. Over a unix socket gRPC clients send what names the socket: C-core (Python grpcio,
//! C++, Ruby, PHP) the percent-encoded path (`tmp%2Fsync.sock`), grpc-java the path itself
//! (`/tmp/sync.sock`). Neither parses, and on a unix socket the authority means nothing (the
//! proxy does not route by it). So the bytes a unix-socket client sends are read through
//! [`AuthorityFilter`]: every frame passes unchanged except header blocks, which are decoded,
//! get `localhost` for an `:authority` that does not parse (one that parses is kept), and are
//! encoded again with literals only.
//!
//! Why the server's HPACK decoder stays in step with the client's encoder: the blocks it gets
//! from here never insert into its dynamic table, so the table stays empty while this decoder
//! mirrors the client's. Whatever this cannot rewrite (a block that does not decode, a frame
//! out of place, a block over the server's limits) is passed on unchanged together with
//! everything after it, and the server answers as it would without this filter (or, where
//! the block refers to entries of the client's table that the server never got, with a
//! decoding error, COMPRESSION_ERROR). From then on the server's table holds only what the
//! client inserted since, the newest entries of the client's own table, so an index it
//! resolves names the entry the client meant and any other index is a decoding error: it can
//! never read a header the client did not send.
//!
//! Only reads are filtered; what the server writes passes straight through. The client's bytes
//! are walked with the transport's [`FrameReader`]. Frames other than header blocks are not
//! copied on their way (their payload is read into the server's buffer directly); only their
//! 9-byte headers are looked at.
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use self::hpack::{fragment, write_literal};
use super::frame::{CONTINUATION, END_HEADERS, END_STREAM, HEAD_LEN, HEADERS, Head, PUSH_PROMISE};
use super::reader::{Event, FrameReader};

mod hpack;

/// The largest frame the server accepts (SETTINGS_MAX_FRAME_SIZE, the sync server's setting);
/// header blocks are written again in frames no larger.
pub(crate) const MAX_FRAME_SIZE: u32 = 16_384;
/// The server's HPACK table size (SETTINGS_HEADER_TABLE_SIZE): the server never announces
/// another, so it is the protocol's initial value, and a client's size update may not exceed it.
const HEADER_TABLE_SIZE: usize = 4_096;
/// A header list this many times over the server's limit ends the connection there (h2 does
/// so, rather than refusing the stream); such a block is passed on unchanged.
const ABUSE_MULTIPLIER: usize = 4;
/// What a header list's size counts for each field besides its name and value (RFC 9113 6.5.2).
const FIELD_OVERHEAD: usize = 32;
/// The authority a header block gets instead of one that does not parse.
const REPLACEMENT: &[u8] = b"localhost";
/// How many bytes a read from the socket asks for when the filter buffers.
const READ_CHUNK: usize = 8 * 1024;
/// What the filter adds to a connection: its HPACK decoder's table (at most
/// [`HEADER_TABLE_SIZE`]) and its read buffer. Charged to the memory budget with the connection.
pub(crate) const FILTER_BYTES: usize = HEADER_TABLE_SIZE + READ_CHUNK;

/// A client's byte stream with each header block's `:authority` made one the server accepts.
pub(crate) struct AuthorityFilter<S> {
    inner: S,
    /// Read from `inner` and not looked at yet.
    input: BytesMut,
    /// Ready for the server.
    output: BytesMut,
    /// Walks the input: preface, frame headers, payloads.
    frames: FrameReader,
    /// How many bytes at the start of `input` the reader has passed that wait there: a frame
    /// header cut short, or a frame that may be part of a header block until it is whole.
    held: usize,
    /// The header of the frame whose payload is held until it is whole (a HEADERS or
    /// CONTINUATION frame); `None`: the payload the reader passes goes on unchanged.
    collecting: Option<Head>,
    /// Everything passes unchanged from here on.
    raw: bool,
    /// A header block whose END_HEADERS has not arrived yet.
    block: Option<Block>,
    /// Mirrors the client's HPACK encoder.
    decoder: Decoder<'static>,
    /// The server's SETTINGS_MAX_HEADER_LIST_SIZE.
    max_header_list_size: usize,
    /// `inner` has ended.
    eof: bool,
}

/// A header block being collected: HEADERS and the CONTINUATION frames after it.
struct Block {
    stream: u32,
    end_stream: bool,
    /// The HPACK bytes, without padding and priority.
    fragment: BytesMut,
    /// The frames as they arrived, passed on instead when the block cannot be rewritten.
    raw: BytesMut,
}

impl<S> AuthorityFilter<S> {
    /// Reads `inner` for a server whose SETTINGS_MAX_HEADER_LIST_SIZE is
    /// `max_header_list_size`.
    pub(crate) fn new(inner: S, max_header_list_size: usize) -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Self {
            inner,
            input: BytesMut::new(),
            output: BytesMut::new(),
            frames: FrameReader::default(),
            held: 0,
            collecting: None,
            raw: false,
            block: None,
            decoder,
            max_header_list_size,
            eof: false,
        }
    }

    /// Moves what can be decided from `input` to `output`.
    fn process(&mut self) {
        loop {
            if self.raw {
                let input = self.input.split();
                self.output.unsplit(input);
                self.held = 0;
                return;
            }
            let mut rest = &self.input[self.held..];
            let before = rest.len();
            let event = self.frames.next(&mut rest);
            self.held += before - rest.len();
            match event {
                // A header cut short stays held.
                None => return,
                Some(Event::Preface(_) | Event::Other(_)) => {
                    self.raw = !self.frames.is_http2();
                    self.pass_held();
                }
                Some(Event::Head(head)) => self.frame(head),
                Some(Event::Payload(_)) => match self.collecting {
                    None => self.pass_held(),
                    Some(head) if self.frames.payload_left() == 0 => self.collected(head),
                    Some(_) => {}
                },
            }
        }
    }

    /// What the reader has passed of `input` goes on to the server.
    fn pass_held(&mut self) {
        let bytes = self.input.split_to(std::mem::take(&mut self.held));
        self.output.unsplit(bytes);
    }

    /// Handles a frame whose header the reader has just passed: one that is no part of a
    /// header block goes on as it comes, a part of one is held until it is whole.
    fn frame(&mut self, head: Head) {
        let in_block = self.block.is_some();
        let header_frame = match head.kind {
            HEADERS => !in_block,
            CONTINUATION => self.block.as_ref().is_some_and(|b| b.stream == head.stream),
            // A header block the server refuses anyway (clients do not push).
            PUSH_PROMISE => false,
            // Between a block's frames only its CONTINUATION may come.
            _ if in_block => false,
            _ => {
                self.pass_held();
                return;
            }
        };
        if !header_frame || head.len > MAX_FRAME_SIZE as usize {
            self.give_up("a frame out of place or too large");
            return;
        }
        self.collecting = Some(head);
        if head.len == 0 {
            self.collected(head);
        }
    }

    /// Adds the frame held whole at the start of the input to its header block.
    fn collected(&mut self, head: Head) {
        self.collecting = None;
        let total = std::mem::take(&mut self.held);
        let Some(fragment) = fragment(head, &self.input[HEAD_LEN..total]) else {
            self.give_up("padding or priority the server refuses");
            return;
        };
        let block = self.block.get_or_insert_with(|| Block {
            stream: head.stream,
            end_stream: head.flags & END_STREAM != 0,
            fragment: BytesMut::new(),
            raw: BytesMut::new(),
        });
        block.fragment.extend_from_slice(fragment);
        block.raw.unsplit(self.input.split_to(total));
        // The server reads no more than its limit of a block either; a flood of small frames
        // is bounded by the frames' own bytes.
        let limit = self.max_header_list_size;
        if block.fragment.len() > limit || block.raw.len() > limit + MAX_FRAME_SIZE as usize {
            self.give_up("a header block over the header list limit");
        } else if head.flags & END_HEADERS != 0 {
            self.rewrite();
        }
    }

    /// Passes the block collected so far, and everything after it, on unchanged.
    fn give_up(&mut self, why: &'static str) {
        tracing::debug!(
            why,
            "a unix socket client's bytes pass on unchanged from here"
        );
        self.pass_rest();
    }

    fn pass_rest(&mut self) {
        if let Some(block) = self.block.take() {
            self.output.unsplit(block.raw);
        }
        self.raw = true;
    }

    /// Decodes the complete block and writes it again, or passes it on unchanged when it does
    /// not decode or its rewrite would be over the server's limits.
    fn rewrite(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        let limit = self.max_header_list_size;
        let mut encoded = BytesMut::with_capacity(block.fragment.len() + REPLACEMENT.len());
        // The size of the list written, and of the whole list decoded.
        let (mut written, mut decoded) = (0usize, 0usize);
        let result = self.decoder.decode_with_cb(&block.fragment, |name, value| {
            decoded = decoded.saturating_add(name.len() + value.len() + FIELD_OVERHEAD);
            // Once the list is over the limit the server refuses the stream and reads no
            // further fields; they are not written.
            if written >= limit {
                return;
            }
            let value = if name.as_ref() == b":authority"
                && http::uri::Authority::try_from(value.as_ref()).is_err()
            {
                REPLACEMENT
            } else {
                value.as_ref()
            };
            written += name.len() + value.len() + FIELD_OVERHEAD;
            write_literal(&name, value, &mut encoded);
        });
        // Past the list limit, the field that crossed it can make the block larger than the
        // frames the server reads for a block under its limit (its CONTINUATION limit allows
        // at least that limit plus one frame); such a block, one that does not decode, and one
        // the server ends the connection for, pass unchanged.
        let too_large = encoded.len() > limit + MAX_FRAME_SIZE as usize
            || decoded > limit.saturating_mul(ABUSE_MULTIPLIER);
        if result.is_err() || too_large {
            self.block = Some(block);
            self.give_up(if too_large {
                "a header block over the header list limit"
            } else {
                "a header block that does not decode"
            });
            return;
        }
        self.write_block(block.stream, block.end_stream, encoded);
    }

    /// `encoded` as HEADERS and CONTINUATION frames of `stream`.
    fn write_block(&mut self, stream: u32, end_stream: bool, mut encoded: BytesMut) {
        let mut kind = HEADERS;
        let mut flags = if end_stream { END_STREAM } else { 0 };
        loop {
            let chunk = encoded.split_to(encoded.len().min(MAX_FRAME_SIZE as usize));
            if encoded.is_empty() {
                flags |= END_HEADERS;
            }
            Head::write(chunk.len(), kind, flags, stream, &mut self.output);
            self.output.unsplit(chunk);
            if encoded.is_empty() {
                return;
            }
            (kind, flags) = (CONTINUATION, 0);
        }
    }

    /// After `inner` ended: what is left passes on unchanged.
    fn end(&mut self) {
        self.eof = true;
        self.pass_rest();
        self.process();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFilter<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.output.is_empty() {
                let n = buf.remaining().min(this.output.len());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.input.is_empty() {
                if this.raw {
                    return Pin::new(&mut this.inner).poll_read(cx, buf);
                }
                if this.collecting.is_none() && this.frames.payload_left() > 0 {
                    return this.poll_forward(cx, buf);
                }
            }
            this.input.reserve(READ_CHUNK);
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.input) {
                Poll::Ready(Ok(0)) => this.end(),
                Poll::Ready(Ok(_)) => this.process(),
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AuthorityFilter<S> {
    /// Reads the rest of a frame's payload straight into the server's buffer; bytes read past
    /// it are kept for the next frame.
    fn poll_forward(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let read = &buf.filled()[before..];
        if read.is_empty() {
            self.eof = true;
            return Poll::Ready(Ok(()));
        }
        let payload = read.len().min(self.frames.payload_left());
        let (mut passed, past) = read.split_at(payload);
        // One piece: all of it payload.
        let _ = self.frames.next(&mut passed);
        if !past.is_empty() {
            self.input.extend_from_slice(past);
            buf.set_filled(before + payload);
            self.process();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFilter<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
