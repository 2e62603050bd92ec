//! HPACK as the authority filter needs it (RFC 7541): the header-block fragment of a HEADERS or
//! CONTINUATION frame (RFC 9113), and literal fields.
use bytes::{BufMut, BytesMut};

use crate::net::h2::frame::{HEADERS, Head, PADDED, PRIORITY};

/// The HPACK bytes of a HEADERS or CONTINUATION frame's `payload`: padding and priority taken
/// off. Both are safe to drop: padding carries nothing, and the server does not act on
/// priorities (it only refuses a stream that depends on itself: such a frame is `None`, as is
/// one whose padding is longer than its payload, and passes unchanged).
pub(super) fn fragment(head: Head, payload: &[u8]) -> Option<&[u8]> {
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
pub(super) fn write_literal(name: &[u8], value: &[u8], out: &mut BytesMut) {
    out.put_u8(0);
    for string in [name, value] {
        write_integer(string.len(), out);
        out.put_slice(string);
    }
}

/// An HPACK integer with a 7-bit prefix and the Huffman bit clear (RFC 7541 5.1).
pub(super) fn write_integer(mut value: usize, out: &mut BytesMut) {
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
