//! HTTP/2 as the transport reads it on its way to the server (RFC 9113): the client preface and
//! frame headers, never more. One reader ([`FrameReader`]) walks a client's bytes as they pass,
//! without copying them; what reads a connection's frames builds on it: the preface deadline and
//! the count of the streams a client opens (`connection`, with [`arrivals`]), and on the unix
//! socket the filter that makes any `:authority` one the server accepts ([`authority`]).
use bytes::{BufMut, BytesMut};

pub(crate) mod arrivals;
pub(crate) mod authority;
mod reader;

pub(crate) use self::authority::{AuthorityFilter, FILTER_BYTES, MAX_FRAME_SIZE};
pub(crate) use self::reader::{Event, FrameReader};

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

    /// Writes a frame header (`len` is at most [`MAX_FRAME_SIZE`]).
    pub(crate) fn write(len: usize, kind: u8, flags: u8, stream: u32, out: &mut BytesMut) {
        out.put_slice(&(len as u32).to_be_bytes()[1..]);
        out.put_u8(kind);
        out.put_u8(flags);
        out.put_u32(stream);
    }
}
