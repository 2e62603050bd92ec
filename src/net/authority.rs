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
//! Only reads are filtered; what the server writes passes straight through. Frames other than
//! header blocks are not copied on their way (their payload is read into the server's buffer
//! directly); only their 9-byte headers are looked at.
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::net::deadlines::PREFACE;

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

const HEAD_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// A client's byte stream with each header block's `:authority` made one the server accepts.
pub(crate) struct AuthorityFilter<S> {
    inner: S,
    /// Read from `inner` and not looked at yet.
    input: BytesMut,
    /// Ready for the server.
    output: BytesMut,
    state: State,
    /// A header block whose END_HEADERS has not arrived yet.
    block: Option<Block>,
    /// Mirrors the client's HPACK encoder.
    decoder: Decoder<'static>,
    /// The server's SETTINGS_MAX_HEADER_LIST_SIZE.
    max_header_list_size: usize,
    /// `inner` has ended.
    eof: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The 24-byte preface has not passed yet.
    Preface,
    /// The next bytes are a frame's header.
    FrameHead,
    /// This many bytes of a frame's payload pass unchanged.
    Forward(usize),
    /// Everything passes unchanged from here on.
    Raw,
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

/// A frame's 9-byte header.
#[derive(Clone, Copy)]
struct Head {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl Head {
    fn parse(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; HEAD_LEN] = bytes.get(..HEAD_LEN)?.try_into().ok()?;
        Some(Self {
            len: usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]),
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
        })
    }

    fn write(len: usize, kind: u8, flags: u8, stream: u32, out: &mut BytesMut) {
        // `len` is at most MAX_FRAME_SIZE.
        out.put_slice(&(len as u32).to_be_bytes()[1..]);
        out.put_u8(kind);
        out.put_u8(flags);
        out.put_u32(stream);
    }
}

/// What became of the frame at the head of the input.
enum Step {
    /// Handled; look at the next one.
    Next,
    /// More bytes are needed.
    NeedMore,
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
            state: State::Preface,
            block: None,
            decoder,
            max_header_list_size,
            eof: false,
        }
    }

    /// Moves what can be decided from `input` to `output`.
    fn process(&mut self) {
        loop {
            match self.state {
                State::Raw => {
                    let input = self.input.split();
                    self.output.unsplit(input);
                    return;
                }
                State::Preface => {
                    if self.input.len() < PREFACE.len() {
                        return;
                    }
                    let preface = self.input.split_to(PREFACE.len());
                    self.state = if preface[..] == *PREFACE {
                        State::FrameHead
                    } else {
                        State::Raw
                    };
                    self.output.unsplit(preface);
                }
                State::Forward(left) => {
                    let take = left.min(self.input.len());
                    if take == 0 {
                        return;
                    }
                    let payload = self.input.split_to(take);
                    self.output.unsplit(payload);
                    self.state = forward(left - take);
                }
                State::FrameHead => match self.frame() {
                    Step::Next => {}
                    Step::NeedMore => return,
                },
            }
        }
    }

    /// Handles the frame at the head of the input.
    fn frame(&mut self) -> Step {
        let Some(head) = Head::parse(&self.input) else {
            return Step::NeedMore;
        };
        let in_block = self.block.is_some();
        let header_frame = match head.kind {
            HEADERS => !in_block,
            CONTINUATION => self.block.as_ref().is_some_and(|b| b.stream == head.stream),
            // A header block the server refuses anyway (clients do not push).
            PUSH_PROMISE => false,
            // Between a block's frames only its CONTINUATION may come.
            _ if in_block => false,
            _ => {
                let bytes = self.input.split_to(HEAD_LEN);
                self.output.unsplit(bytes);
                self.state = forward(head.len);
                return Step::Next;
            }
        };
        if !header_frame || head.len > MAX_FRAME_SIZE as usize {
            self.give_up("a frame out of place or too large");
            return Step::Next;
        }
        let total = HEAD_LEN + head.len;
        let Some(payload) = self.input.get(HEAD_LEN..total) else {
            return Step::NeedMore;
        };
        let Some(fragment) = fragment(head, payload) else {
            self.give_up("padding or priority the server refuses");
            return Step::Next;
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
        Step::Next
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
        self.state = State::Raw;
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

/// The state after a frame header whose payload has `left` bytes.
fn forward(left: usize) -> State {
    if left == 0 {
        State::FrameHead
    } else {
        State::Forward(left)
    }
}

/// The HPACK bytes of a HEADERS or CONTINUATION frame's `payload`: padding and priority taken
/// off. Both are safe to drop: padding carries nothing, and the server does not act on
/// priorities (it only refuses a stream that depends on itself: such a frame is `None`, as is
/// one whose padding is longer than its payload, and passes unchanged).
fn fragment(head: Head, payload: &[u8]) -> Option<&[u8]> {
    if head.kind != HEADERS {
        return Some(payload);
    }
    let (mut payload, padding) = if head.flags & PADDED != 0 {
        let (&pad, rest) = payload.split_first()?;
        (rest, usize::from(pad))
    } else {
        (payload, 0)
    };
    if head.flags & PRIORITY != 0 {
        let dependency = payload.get(..4)?;
        let dependency = u32::from_be_bytes(dependency.try_into().ok()?) & 0x7fff_ffff;
        if dependency == head.stream {
            return None;
        }
        payload = payload.get(5..)?;
    }
    payload.get(..payload.len().checked_sub(padding)?)
}

/// A literal field without indexing and with a literal name, no Huffman coding (RFC 7541
/// 6.2.2): the server's table is never written to.
fn write_literal(name: &[u8], value: &[u8], out: &mut BytesMut) {
    out.put_u8(0);
    for string in [name, value] {
        write_integer(string.len(), out);
        out.put_slice(string);
    }
}

/// An HPACK integer with a 7-bit prefix and the Huffman bit clear (RFC 7541 5.1).
fn write_integer(mut value: usize, out: &mut BytesMut) {
    const PREFIX: usize = 0x7f;
    if value < PREFIX {
        out.put_u8(value as u8);
        return;
    }
    out.put_u8(PREFIX as u8);
    value -= PREFIX;
    while value >= 0x80 {
        out.put_u8((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
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
                match this.state {
                    State::Raw => return Pin::new(&mut this.inner).poll_read(cx, buf),
                    State::Forward(left) => return this.poll_forward(cx, buf, left),
                    State::Preface | State::FrameHead => {}
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
    /// Reads a frame's payload (`left` bytes of it) straight into the server's buffer; bytes
    /// read past it are kept for the next frame.
    fn poll_forward(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        left: usize,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let read = buf.filled().len() - before;
        if read == 0 {
            self.eof = true;
        } else if read > left {
            self.input.extend_from_slice(&buf.filled()[before + left..]);
            buf.set_filled(before + left);
            self.state = State::FrameHead;
            self.process();
        } else {
            self.state = forward(left - read);
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
mod tests {
    use std::collections::VecDeque;

    use proptest::collection::vec;
    use proptest::prelude::*;
    use tokio::io::AsyncReadExt;

    use super::*;

    const LIMIT: usize = 32 * 1024;
    const PATH: &[u8] = b"/flagd.sync.v1.FlagSyncService/SyncFlags";
    const DATA: u8 = 0x0;
    const SETTINGS: u8 = 0x4;

    /// Gives its chunks one read at a time, then ends.
    struct Chunks(VecDeque<Vec<u8>>);

    impl AsyncRead for Chunks {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            if let Some(chunk) = this.0.front_mut() {
                let n = chunk.len().min(buf.remaining());
                buf.put_slice(&chunk[..n]);
                chunk.drain(..n);
                if chunk.is_empty() {
                    this.0.pop_front();
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    /// What the server reads of `chunks` through a filter with `limit`, in reads of `read`
    /// bytes.
    fn filtered(chunks: Vec<Vec<u8>>, limit: usize, read: usize) -> Vec<u8> {
        let chunks = chunks.into_iter().filter(|c| !c.is_empty()).collect();
        let mut filter = AuthorityFilter::new(Chunks(chunks), limit);
        let mut out = Vec::new();
        let mut buf = vec![0u8; read];
        futures::executor::block_on(async {
            loop {
                let n = filter.read(&mut buf).await.expect("read");
                if n == 0 {
                    return;
                }
                out.extend_from_slice(&buf[..n]);
            }
        });
        out
    }

    fn through(input: &[u8]) -> Vec<u8> {
        filtered(vec![input.to_vec()], LIMIT, 64 * 1024)
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        Head::write(payload.len(), kind, flags, stream, &mut out);
        out.put_slice(payload);
        out.to_vec()
    }

    fn start() -> Vec<u8> {
        [PREFACE, &frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0])].concat()
    }

    // A client's HPACK representations (RFC 7541 6), short strings without Huffman coding.
    fn indexed(index: u8) -> Vec<u8> {
        vec![0x80 | index]
    }
    fn string(s: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        write_integer(s.len(), &mut out);
        out.put_slice(s);
        out.to_vec()
    }
    /// A literal with incremental indexing: inserted in the dynamic table.
    fn insert(name: u8, value: &[u8]) -> Vec<u8> {
        [vec![0x40 | name], string(value)].concat()
    }
    fn insert_new(name: &[u8], value: &[u8]) -> Vec<u8> {
        [vec![0x40], string(name), string(value)].concat()
    }
    fn literal(name: u8, value: &[u8]) -> Vec<u8> {
        [vec![name], string(value)].concat()
    }

    /// A gRPC request's block naming `authority` (inserted in the client's table).
    fn request(authority: &[u8]) -> Vec<u8> {
        [
            indexed(3), // :method POST
            indexed(6), // :scheme http
            literal(4, PATH),
            insert(1, authority),
            insert(31, b"application/grpc"),
            insert_new(b"te", b"trailers"),
        ]
        .concat()
    }

    /// The same request again, its authority, content-type and te from the dynamic table.
    fn request_again() -> Vec<u8> {
        [
            indexed(3),
            indexed(6),
            literal(4, PATH),
            indexed(64),
            indexed(63),
            indexed(62),
        ]
        .concat()
    }

    fn fields(authority: &str) -> Vec<(String, String)> {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", std::str::from_utf8(PATH).expect("utf-8")),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
    }

    #[derive(Debug, PartialEq)]
    enum Out {
        Frame {
            kind: u8,
            flags: u8,
            stream: u32,
            payload: Vec<u8>,
        },
        /// A header block: its frames' flags and its fields.
        Block {
            flags: Vec<u8>,
            stream: u32,
            fields: Vec<(String, String)>,
        },
    }

    /// The frames after the preface, header blocks decoded. Every field must be a literal
    /// without indexing with a literal name: the server's table is never touched.
    fn read_out(bytes: &[u8]) -> Vec<Out> {
        assert_eq!(&bytes[..PREFACE.len()], PREFACE);
        let mut rest = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        let mut block: Option<(Vec<u8>, u32, Vec<u8>)> = None;
        while !rest.is_empty() {
            let head = Head::parse(rest).expect("a frame header");
            let payload = rest[HEAD_LEN..HEAD_LEN + head.len].to_vec();
            rest = &rest[HEAD_LEN + head.len..];
            if head.kind == HEADERS || head.kind == CONTINUATION {
                assert!(head.len <= MAX_FRAME_SIZE as usize);
                assert_eq!(head.kind == HEADERS, block.is_none());
                let (flags, stream, fragment) =
                    block.get_or_insert_with(|| (Vec::new(), head.stream, Vec::new()));
                assert_eq!(*stream, head.stream);
                flags.push(head.flags);
                fragment.extend_from_slice(&payload);
                if head.flags & END_HEADERS != 0 {
                    let (flags, stream, fragment) = block.take().expect("a block");
                    let fields = literals(&fragment);
                    out.push(Out::Block {
                        flags,
                        stream,
                        fields,
                    });
                }
            } else {
                out.push(Out::Frame {
                    kind: head.kind,
                    flags: head.flags,
                    stream: head.stream,
                    payload,
                });
            }
        }
        assert!(block.is_none(), "a block left open");
        out
    }

    fn literals(mut block: &[u8]) -> Vec<(String, String)> {
        fn integer(bytes: &mut &[u8]) -> usize {
            let mut value = usize::from(bytes[0] & 0x7f);
            *bytes = &bytes[1..];
            if value == 0x7f {
                let mut shift = 0;
                loop {
                    let b = bytes[0];
                    *bytes = &bytes[1..];
                    value += usize::from(b & 0x7f) << shift;
                    shift += 7;
                    if b & 0x80 == 0 {
                        break;
                    }
                }
            }
            value
        }
        let mut fields = Vec::new();
        while !block.is_empty() {
            assert_eq!(
                block[0], 0,
                "a literal without indexing, with a literal name"
            );
            block = &block[1..];
            let mut strings = [0, 1].map(|_| {
                assert_eq!(block[0] & 0x80, 0, "no Huffman coding");
                let len = integer(&mut block);
                let s = String::from_utf8(block[..len].to_vec()).expect("utf-8");
                block = &block[len..];
                s
            });
            fields.push((
                std::mem::take(&mut strings[0]),
                std::mem::take(&mut strings[1]),
            ));
        }
        fields
    }

    fn block(flags: &[u8], stream: u32, authority: &str) -> Out {
        Out::Block {
            flags: flags.to_vec(),
            stream,
            fields: fields(authority),
        }
    }

    /// A connection with requests naming the socket as C-core and grpc-java do, one whose
    /// authority parses, and one that refers to an earlier request's authority in the table;
    /// a request's block spans HEADERS and two CONTINUATION frames.
    fn conversation() -> (Vec<u8>, Vec<Out>) {
        let c_core = request(b"tmp%2Fsync.sock");
        let (first, rest) = c_core.split_at(10);
        let (second, third) = rest.split_at(20);
        let input = [
            start(),
            frame(HEADERS, END_STREAM, 1, first),
            frame(CONTINUATION, 0, 1, second),
            frame(CONTINUATION, END_HEADERS, 1, third),
            frame(HEADERS, END_HEADERS, 3, &request(b"/tmp/sync.sock")),
            frame(DATA, END_STREAM, 3, b"\0\0\0\0\0"),
            frame(HEADERS, END_HEADERS, 5, &request(b"localhost:8013")),
            frame(HEADERS, END_HEADERS | END_STREAM, 7, &request_again()),
        ]
        .concat();
        let expected = vec![
            Out::Frame {
                kind: SETTINGS,
                flags: 0,
                stream: 0,
                payload: vec![0, 4, 0, 1, 0, 0],
            },
            block(&[END_STREAM | END_HEADERS], 1, "localhost"),
            block(&[END_HEADERS], 3, "localhost"),
            Out::Frame {
                kind: DATA,
                flags: END_STREAM,
                stream: 3,
                payload: vec![0; 5],
            },
            block(&[END_HEADERS], 5, "localhost:8013"),
            block(&[END_HEADERS | END_STREAM], 7, "localhost:8013"),
        ];
        (input, expected)
    }

    #[test]
    fn authorities_that_do_not_parse_become_localhost_and_the_rest_passes() {
        let (input, expected) = conversation();
        assert_eq!(read_out(&through(&input)), expected);
    }

    /// RFC 7541 C.4.1: a request with Huffman-coded strings; its authority parses and stays.
    #[test]
    fn huffman_coded_strings_are_decoded() {
        let block = [
            0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
            0x90, 0xf4, 0xff,
        ];
        let input = [start(), frame(HEADERS, END_HEADERS, 1, &block)].concat();
        let want = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ];
        let want = want
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        let out = read_out(&through(&input));
        assert_eq!(
            out[1],
            Out::Block {
                flags: vec![END_HEADERS],
                stream: 1,
                fields: want
            }
        );
    }

    #[test]
    fn frames_split_at_any_byte_read_the_same() {
        let (input, _) = conversation();
        let whole = through(&input);
        for at in 0..=input.len() {
            let (a, b) = input.split_at(at);
            assert_eq!(
                filtered(vec![a.to_vec(), b.to_vec()], LIMIT, 64 * 1024),
                whole,
                "split at {at}"
            );
        }
        let bytes = input.iter().map(|b| vec![*b]).collect();
        assert_eq!(filtered(bytes, LIMIT, 64 * 1024), whole, "a byte a read");
        assert_eq!(
            filtered(vec![input.clone()], LIMIT, 7),
            whole,
            "7-byte reads"
        );
    }

    #[test]
    fn a_large_block_is_written_in_frames_no_larger_than_the_servers() {
        let value = vec![b'v'; 20_000];
        let client = [request(b"tmp%2Fsync.sock"), literal(0, b"")].concat();
        let client = [
            &client[..client.len() - 2],
            &[0x00],
            &string(b"x-big"),
            &string(&value),
        ]
        .concat();
        let (first, rest) = client.split_at(MAX_FRAME_SIZE as usize);
        let input = [
            start(),
            frame(HEADERS, END_STREAM, 1, first),
            frame(CONTINUATION, END_HEADERS, 1, rest),
        ]
        .concat();
        let out = read_out(&through(&input));
        let mut want = fields("localhost");
        want.push(("x-big".into(), String::from_utf8(value).expect("utf-8")));
        assert_eq!(
            out[1],
            Out::Block {
                flags: vec![END_STREAM, END_HEADERS],
                stream: 1,
                fields: want
            }
        );
    }

    #[test]
    fn padding_and_priority_are_dropped() {
        let fragment = request(b"tmp%2Fsync.sock");
        let payload = [&[3][..], &[0, 0, 0, 0, 15], &fragment, &[0, 0, 0]].concat();
        let input = [
            start(),
            frame(HEADERS, END_HEADERS | PADDED | PRIORITY, 1, &payload),
        ]
        .concat();
        assert_eq!(
            read_out(&through(&input))[1],
            block(&[END_HEADERS], 1, "localhost")
        );
        // A stream that depends on itself, and padding longer than the frame: refused by the
        // server, so passed to it unchanged.
        let itself = [&[0, 0, 0, 1, 15][..], &fragment].concat();
        let too_long = [&[200][..], &fragment].concat();
        for (flags, payload) in [(PRIORITY, itself), (PADDED, too_long)] {
            let input = [start(), frame(HEADERS, END_HEADERS | flags, 1, &payload)].concat();
            assert_eq!(through(&input), input);
        }
    }

    #[test]
    fn a_size_update_is_followed() {
        // The second block empties the table (size 0), sets it back to 4,096 and inserts three
        // entries: the third block's reference to a fourth (the first block's, had the table
        // not been emptied) does not decode.
        let second = [vec![0x20, 0x3f, 0xe1, 0x1f], request(b"tmp%2Fx")].concat();
        let third = [indexed(3), indexed(6), literal(4, PATH), indexed(65)].concat();
        let head = [
            start(),
            frame(HEADERS, END_HEADERS, 1, &request(b"tmp%2Fsync.sock")),
            frame(HEADERS, END_HEADERS, 3, &second),
        ]
        .concat();
        let tail = frame(HEADERS, END_HEADERS, 5, &third);
        let out = through(&[head.clone(), tail.clone()].concat());
        let rewritten = through(&head);
        assert_eq!(
            read_out(&rewritten)[2],
            block(&[END_HEADERS], 3, "localhost")
        );
        assert_eq!(out, [rewritten, tail].concat());
        // A size over the server's table size does not decode either.
        let over = [vec![0x3f, 0xe2, 0x1f], request(b"x")].concat();
        let input = [start(), frame(HEADERS, END_HEADERS, 1, &over)].concat();
        assert_eq!(through(&input), input);
    }

    #[test]
    fn what_does_not_decode_passes_unchanged_with_all_after_it() {
        let good = frame(HEADERS, END_HEADERS, 1, &request(b"tmp%2Fsync.sock"));
        let rest = [
            frame(
                HEADERS,
                END_HEADERS,
                3,
                &[indexed(100), request(b"tmp%2Fx")].concat(),
            ),
            frame(DATA, 0, 3, b"data"),
            frame(HEADERS, END_HEADERS, 5, &request(b"tmp%2Fy")),
        ]
        .concat();
        let out = through(&[start(), good.clone(), rest.clone()].concat());
        assert_eq!(out, [through(&[start(), good].concat()), rest].concat());
        // Not HTTP/2, a frame between a block's frames, a CONTINUATION without a block, a
        // client's PUSH_PROMISE, and a block cut short by the end of the connection.
        let block = request(b"tmp%2Fsync.sock");
        for input in [
            b"GET / HTTP/1.1\r\nHost: tmp%2Fsync.sock\r\n\r\n".to_vec(),
            [
                start(),
                frame(HEADERS, 0, 1, &block),
                frame(DATA, 0, 1, b"x"),
            ]
            .concat(),
            [start(), frame(CONTINUATION, END_HEADERS, 1, &block)].concat(),
            [
                start(),
                frame(
                    PUSH_PROMISE,
                    END_HEADERS,
                    1,
                    &[&[0, 0, 0, 2][..], &block].concat(),
                ),
            ]
            .concat(),
            [start(), frame(HEADERS, 0, 1, &block)].concat(),
            [
                start(),
                frame(HEADERS, END_HEADERS, 1, &block)[..20].to_vec(),
            ]
            .concat(),
        ] {
            assert_eq!(through(&input), input);
        }
    }

    /// Frames of the kinds the filter looks at, with any flags and payloads (HPACK bytes
    /// from a valid request or arbitrary ones), cut into reads anywhere.
    fn frames() -> impl Strategy<Value = Vec<Vec<u8>>> {
        let kind = prop_oneof![
            Just(DATA),
            Just(HEADERS),
            Just(CONTINUATION),
            Just(SETTINGS)
        ];
        let payload = prop_oneof![
            Just(request(b"tmp%2Fsync.sock")),
            Just(request_again()),
            vec(any::<u8>(), 0..64),
        ];
        vec((kind, any::<u8>(), 0u32..4, payload), 0..12).prop_map(|frames| {
            frames
                .into_iter()
                .map(|(kind, flags, stream, payload)| frame(kind, flags, stream, &payload))
                .collect()
        })
    }

    proptest! {
        #[test]
        fn any_frames_in_any_reads_never_panic_and_read_the_same(
            frames in frames(),
            cuts in vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let input = [start(), frames.concat()].concat();
            let whole = filtered(vec![input.clone()], 1024, 64 * 1024);
            let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(input.len() + 1)).collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([input.len()]) {
                chunks.push(input[from..cut].to_vec());
                from = cut;
            }
            prop_assert_eq!(filtered(chunks, 1024, 5), whole);
        }
    }

    #[test]
    fn blocks_over_the_header_list_limit_are_bounded() {
        let limit = 1024;
        let run = |input: &[u8]| filtered(vec![input.to_vec()], limit, 64 * 1024);
        // More HPACK bytes than the limit, in one frame or in a flood of empty CONTINUATIONs:
        // passed on as soon as the limit is reached.
        let big = [request(b"x"), insert_new(b"x-big", &[b'v'; 1100])].concat();
        let input = [start(), frame(HEADERS, END_HEADERS, 1, &big)].concat();
        assert_eq!(run(&input), input);
        let mut flood = [start(), frame(HEADERS, 0, 1, &request(b"x"))].concat();
        for _ in 0..10_000 {
            flood.extend(frame(CONTINUATION, 0, 1, &[]));
        }
        assert_eq!(run(&flood), flood);
        // A table entry referred to again and again: written up to the limit (the server
        // refuses the stream as over its limit), and over four times the limit passed on
        // unchanged (the server ends the connection).
        let entry = insert_new(b"x", &[b'a'; 900]);
        let again = [indexed(62), indexed(62), indexed(62)].concat();
        let abuse = indexed(62).repeat(5);
        let head = [
            start(),
            frame(HEADERS, END_HEADERS, 1, &entry),
            frame(HEADERS, END_HEADERS, 3, &again),
        ]
        .concat();
        let tail = frame(HEADERS, END_HEADERS, 5, &abuse);
        let out = run(&[head.clone(), tail.clone()].concat());
        let written = run(&head);
        let Out::Block { fields, .. } = &read_out(&written)[2] else {
            panic!("a block")
        };
        assert_eq!(
            fields.len(),
            2,
            "the field that reaches the limit, and none after it"
        );
        assert_eq!(out, [written, tail].concat());
    }
}
