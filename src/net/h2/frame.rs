//! HTTP/2 framing (RFC 9113) as the transport reads it: the client preface, frame types and
//! flags, and a frame's 9-byte header.
use bytes::{BufMut, BytesMut};

/// The connection preface every client sends first.
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame header: length (3 bytes), type, flags, stream identifier (4 bytes).
pub(crate) const HEAD_LEN: usize = 9;

/// Frame types.
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const PUSH_PROMISE: u8 = 0x5;
pub(crate) const CONTINUATION: u8 = 0x9;
/// Flags.
pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
pub(crate) const PADDED: u8 = 0x8;
pub(crate) const PRIORITY: u8 = 0x20;

/// A frame's 9-byte header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    /// The payload's length.
    pub(crate) len: usize,
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    /// The stream identifier, its reserved bit cleared.
    pub(crate) stream: u32,
}

impl Head {
    pub(crate) fn from_bytes(bytes: &[u8; HEAD_LEN]) -> Self {
        Self {
            len: usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]),
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
        }
    }

    /// Writes a frame header (`len` fits in its 3 bytes: it is at most the largest frame the
    /// server accepts).
    pub(crate) fn write(len: usize, kind: u8, flags: u8, stream: u32, out: &mut BytesMut) {
        out.put_slice(&(len as u32).to_be_bytes()[1..]);
        out.put_u8(kind);
        out.put_u8(flags);
        out.put_u32(stream);
    }
}
