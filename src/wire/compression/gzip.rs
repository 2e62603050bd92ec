//! gzip members made from a frame's pieces.
//!
//! A frame in one piece is compressed whole. A frame whose document is a piece of its own
//! ([`crate::wire::frame::SHARED_DOCUMENT`]) gets a gzip member in three pieces too: the gRPC
//! prefix with gzip's header; the message up to the end of its document, deflated on its own
//! and flushed to a whole byte, which every message of the version shares (their bytes up to
//! there are the same: field 1's key and length, then the document); and the rest of the
//! message, deflated as the final blocks, with gzip's trailer (the CRC and length of the whole
//! message). Deflate blocks of separate runs may follow one another, so the three pieces are
//! one valid member.
use std::io::Write;

use bytes::{BufMut, Bytes, BytesMut};
use flate2::Compression as Level;
use flate2::write::{DeflateEncoder, GzEncoder};

use crate::wire::frame::{Frame, PREFIX};

/// gzip's member header: deflate, no flags, no time, no extra flags, operating system unknown.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// `frame`'s message gzipped, as a whole gRPC message with the compressed flag set, in one
/// piece; `None` when that is not smaller than `frame` (or its length would not fit the prefix).
pub(super) fn whole(frame: &Frame, level: u32) -> Option<Vec<Bytes>> {
    let mut buffer = BytesMut::with_capacity(PREFIX + frame.message_len() / 4);
    buffer.put_bytes(0, PREFIX);
    let mut encoder = GzEncoder::new((&mut buffer).writer(), Level::new(level));
    // Writing to memory cannot fail.
    for piece in frame.message() {
        encoder.write_all(piece).ok()?;
    }
    encoder.finish().ok()?;
    if buffer.len() >= frame.len() {
        return None;
    }
    let length = u32::try_from(buffer.len() - PREFIX).ok()?;
    buffer[0] = 1;
    buffer[1..PREFIX].copy_from_slice(&length.to_be_bytes());
    Some(vec![buffer.freeze()])
}

/// The middle of the gzip member of a frame in pieces: its message up to the end of the
/// document, deflated and flushed to a whole byte (blocks that are not the last). Nothing for a
/// frame in one piece.
pub(super) fn deflated_document(frame: &Frame, level: u32) -> Vec<Bytes> {
    let [head, document, ..] = frame.pieces() else {
        return Vec::new();
    };
    let mut encoder =
        DeflateEncoder::new(Vec::with_capacity(document.len() / 4), Level::new(level));
    // Writing to memory cannot fail; a sync flush ends on a whole byte.
    let flushed = encoder
        .write_all(&head[PREFIX.min(head.len())..])
        .and_then(|()| encoder.write_all(document))
        .and_then(|()| encoder.flush());
    match flushed {
        Ok(()) => vec![Bytes::from(std::mem::take(encoder.get_mut()))],
        Err(_) => Vec::new(),
    }
}

/// `frame`'s message gzipped around `deflated` (its [`deflated_document`]), as a whole gRPC
/// message with the compressed flag set, in three pieces, the middle one `deflated` itself;
/// `None` when that is not smaller than `frame` (or its length would not fit the prefix).
pub(super) fn around(frame: &Frame, deflated: &Bytes, level: u32) -> Option<Vec<Bytes>> {
    let rest = frame.pieces().get(2..).unwrap_or_default().concat();
    let mut encoder = DeflateEncoder::new(Vec::new(), Level::new(level));
    encoder.write_all(&rest).ok()?;
    let mut end = encoder.finish().ok()?;
    let mut crc = flate2::Crc::new();
    for piece in frame.message() {
        crc.update(piece);
    }
    end.extend(crc.sum().to_le_bytes());
    // ISIZE: the length modulo 2^32.
    end.extend(((frame.message_len() & 0xffff_ffff) as u32).to_le_bytes());
    let length = HEADER.len() + deflated.len() + end.len();
    if PREFIX + length >= frame.len() {
        return None;
    }
    let mut start = BytesMut::with_capacity(PREFIX + HEADER.len());
    start.put_u8(1);
    start.put_u32(u32::try_from(length).ok()?);
    start.put_slice(&HEADER);
    Some(vec![start.freeze(), deflated.clone(), Bytes::from(end)])
}
