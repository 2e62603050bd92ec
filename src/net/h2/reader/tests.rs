//! Unit tests of the frame-header reader: the same pieces however the bytes are cut, payloads
//! longer than a read, and a preface that is not HTTP/2's.
use bytes::{BufMut, BytesMut};

use super::*;
use crate::net::h2::frame::{HEADERS, PADDED};

const DATA: u8 = 0x0;
const SETTINGS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    Head::write(payload.len(), kind, flags, stream, &mut out);
    out.put_slice(payload);
    out.to_vec()
}

/// What a reader makes of its input, with the bytes of consecutive pieces of one kind joined.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    Preface(Vec<u8>),
    Head(Head),
    Payload(Vec<u8>),
    Other(Vec<u8>),
}

/// Reads `pieces` one after the other through one reader.
fn read<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> (Vec<Piece>, FrameReader) {
    let mut reader = FrameReader::default();
    let mut out: Vec<Piece> = Vec::new();
    for mut bytes in pieces {
        while let Some(event) = reader.next(&mut bytes) {
            match (out.last_mut(), event) {
                (Some(Piece::Preface(seen)), Event::Preface(more))
                | (Some(Piece::Payload(seen)), Event::Payload(more))
                | (Some(Piece::Other(seen)), Event::Other(more)) => seen.extend_from_slice(more),
                (_, Event::Preface(bytes)) => out.push(Piece::Preface(bytes.to_vec())),
                (_, Event::Payload(bytes)) => out.push(Piece::Payload(bytes.to_vec())),
                (_, Event::Other(bytes)) => out.push(Piece::Other(bytes.to_vec())),
                (_, Event::Head(head)) => out.push(Piece::Head(head)),
            }
        }
        assert!(bytes.is_empty(), "a piece is read to its end");
    }
    (out, reader)
}

fn head(len: usize, kind: u8, flags: u8, stream: u32) -> Piece {
    Piece::Head(Head {
        len,
        kind,
        flags,
        stream,
    })
}

/// A preface, then SETTINGS, an empty frame, HEADERS whose block looks like a frame header,
/// DATA, and a stream identifier with its reserved bit set.
fn conversation() -> (Vec<u8>, Vec<Piece>) {
    let looks_like_a_head = [0, 0, 0, HEADERS, 0, 0, 0, 0, 7];
    let bytes = [
        PREFACE.to_vec(),
        frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]),
        frame(SETTINGS, 0x1, 0, b""),
        frame(HEADERS, 0x4, 1, &looks_like_a_head),
        frame(DATA, PADDED, 1, b"message"),
        frame(DATA, 0, 0x8000_0003, b"x"),
    ]
    .concat();
    let pieces = vec![
        Piece::Preface(PREFACE.to_vec()),
        head(6, SETTINGS, 0, 0),
        Piece::Payload(vec![0, 3, 0, 0, 0, 100]),
        head(0, SETTINGS, 0x1, 0),
        head(9, HEADERS, 0x4, 1),
        Piece::Payload(looks_like_a_head.to_vec()),
        head(7, DATA, PADDED, 1),
        Piece::Payload(b"message".to_vec()),
        head(1, DATA, 0, 3),
        Piece::Payload(b"x".to_vec()),
    ];
    (bytes, pieces)
}

#[test]
fn the_pieces_are_the_same_however_the_bytes_are_cut() {
    let (bytes, want) = conversation();
    assert_eq!(read([bytes.as_slice()]).0, want, "in one read");
    for cut in 0..=bytes.len() {
        let (first, second) = bytes.split_at(cut);
        assert_eq!(read([first, second]).0, want, "cut at {cut}");
    }
    for size in 1..=bytes.len() {
        assert_eq!(read(bytes.chunks(size)).0, want, "in reads of {size}");
    }
}

#[test]
fn a_payload_longer_than_a_read_passes_in_pieces() {
    let large = vec![7u8; 100_000];
    let bytes = [
        PREFACE.to_vec(),
        frame(DATA, 0, 1, &large),
        frame(HEADERS, 0x4, 3, b"h"),
    ]
    .concat();
    let mut reader = FrameReader::default();
    let mut payload = 0;
    let mut heads = Vec::new();
    for mut piece in bytes.chunks(1_000) {
        while let Some(event) = reader.next(&mut piece) {
            match event {
                Event::Payload(bytes) if heads.len() == 1 => {
                    assert!(bytes.len() <= 1_000);
                    payload += bytes.len();
                    assert_eq!(reader.payload_left(), large.len() - payload);
                }
                Event::Head(head) => heads.push(head.stream),
                _ => {}
            }
        }
    }
    assert_eq!(payload, large.len());
    assert_eq!(heads, [1, 3]);
    assert_eq!(reader.payload_left(), 0);
}

#[test]
fn the_preface_passes_byte_by_byte() {
    let mut reader = FrameReader::default();
    for (at, byte) in PREFACE.iter().enumerate() {
        assert!(!reader.preface_passed(), "{at} bytes");
        let mut bytes = std::slice::from_ref(byte);
        assert_eq!(
            reader.next(&mut bytes),
            Some(Event::Preface(&PREFACE[at..=at]))
        );
        assert!(reader.is_http2());
    }
    assert!(reader.preface_passed());
}

#[test]
fn a_bad_preface_is_not_read_as_frames() {
    let http1 = b"GET / HTTP/1.1\r\nHost: proxy\r\n\r\n";
    let (pieces, reader) = read(http1.chunks(5));
    assert!(!reader.is_http2());
    assert!(reader.preface_passed());
    assert_eq!(
        pieces,
        [
            Piece::Preface(http1[..PREFACE.len()].to_vec()),
            Piece::Other(http1[PREFACE.len()..].to_vec()),
        ]
    );

    let (_, reader) = read([&b"PRI * HTTP/1.1"[..]]);
    assert!(!reader.is_http2(), "wrong from its 12th byte");
    assert!(!reader.preface_passed(), "and not all of it yet");
    let (_, reader) = read([&PREFACE[..10]]);
    assert!(reader.is_http2() && !reader.preface_passed());
}
