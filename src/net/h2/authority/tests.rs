//! Unit tests of the authority filter: every byte split, CONTINUATION, dynamic-table
//! references, size updates, padding and priority, Huffman, pass-through and bounds.
use std::collections::VecDeque;

use bytes::BufMut;
use proptest::collection::vec;
use proptest::prelude::*;
use tokio::io::AsyncReadExt;

use super::hpack::write_integer;
use super::*;
use crate::net::h2::frame::{PADDED, PREFACE, PRIORITY};

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
        let head = Head::from_bytes(rest.first_chunk().expect("a frame header"));
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
        0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90,
        0xf4, 0xff,
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
