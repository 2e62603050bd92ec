//! Row 10: gRPC clients over a unix socket name the socket in `:authority`, which is no URI
//! authority: gRPC C-core (grpcio and the languages built on it) its path percent-encoded,
//! grpc-java the path itself. The attack sends both on one connection, C-core's also as a
//! reference into the HPACK dynamic table and in a header block split over HEADERS and
//! CONTINUATION. Each must be served.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::streams::SYNC_PATH;
use crate::raw_h2::{
    self, ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PREFACE, RST_STREAM,
    SETTINGS,
};

/// The streams of the attack: C-core's authority (split over CONTINUATION), the same from the
/// dynamic table, grpc-java's.
pub const STREAMS: [u32; 3] = [1, 3, 5];

/// The `:authority` gRPC C-core sends for the socket at `socket`.
pub fn c_core(socket: &str) -> String {
    socket.trim_start_matches('/').replace('/', "%2F")
}

/// What became of the attack's streams.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every stream got a message: each one's first, as gRPC sent it (prefix stripped).
    Served(BTreeMap<u32, Vec<u8>>),
    /// The proxy refused a stream or the connection (the frame, named).
    Refused(String),
    /// A stream ended without a message, or the connection closed first.
    Ended(String),
    /// Not every stream was answered within the time given.
    Undecided,
}

/// Connects to the proxy's socket at `socket`, asks for `selector` on each of [`STREAMS`] and
/// reads for at most `within`.
pub async fn attempt(socket: &Path, selector: &str, within: Duration) -> std::io::Result<Outcome> {
    let path = socket.to_str().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "a UTF-8 socket path")
    })?;
    let (mut read, mut write) = tokio::net::UnixStream::connect(socket).await?.into_split();
    write.write_all(&requests(path, selector)).await?;
    let answers = async {
        let mut received: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        let mut served = BTreeMap::new();
        while served.len() < STREAMS.len() {
            let Some(frame) = raw_h2::read_frame(&mut read).await else {
                return Outcome::Ended("the connection closed".to_owned());
            };
            match frame.kind {
                SETTINGS if frame.flags & ACK == 0 => {
                    let ack = raw_h2::frame(SETTINGS, ACK, 0, &[]);
                    if write.write_all(&ack).await.is_err() {
                        return Outcome::Ended("the connection closed".to_owned());
                    }
                }
                RST_STREAM => {
                    let code = error_name(&frame.payload);
                    return Outcome::Refused(format!(
                        "RST_STREAM {code} on stream {}",
                        frame.stream
                    ));
                }
                GOAWAY => {
                    // GOAWAY's error code follows the last stream id.
                    let code = error_name(frame.payload.get(4..).unwrap_or_default());
                    return Outcome::Refused(format!("GOAWAY {code}"));
                }
                HEADERS if frame.flags & END_STREAM != 0 && !served.contains_key(&frame.stream) => {
                    return Outcome::Ended(format!("stream {} ended first", frame.stream));
                }
                DATA => {
                    let data = received.entry(frame.stream).or_default();
                    data.extend(&frame.payload);
                    if let Some(message) = first_message(data) {
                        served.insert(frame.stream, message.to_vec());
                    }
                }
                _ => {}
            }
        }
        Outcome::Served(served)
    };
    Ok(tokio::time::timeout(within, answers)
        .await
        .unwrap_or(Outcome::Undecided))
}

/// The name of the HTTP/2 error code (RFC 9113 7) at the start of `payload`.
fn error_name(payload: &[u8]) -> String {
    let code = payload
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map_or(u32::MAX, u32::from_be_bytes);
    match code {
        0x0 => "NO_ERROR".to_owned(),
        0x1 => "PROTOCOL_ERROR".to_owned(),
        0x2 => "INTERNAL_ERROR".to_owned(),
        0x7 => "REFUSED_STREAM".to_owned(),
        0x8 => "CANCEL".to_owned(),
        0x9 => "COMPRESSION_ERROR".to_owned(),
        0xb => "ENHANCE_YOUR_CALM".to_owned(),
        other => format!("error code {other}"),
    }
}

/// The first whole gRPC message in `data`, without its prefix.
fn first_message(data: &[u8]) -> Option<&[u8]> {
    let len = u32::from_be_bytes(data.get(1..5)?.try_into().ok()?) as usize;
    data.get(5..5 + len)
}

/// The preface, SETTINGS and the three requests for `selector` on the socket at `path`.
fn requests(path: &str, selector: &str) -> Vec<u8> {
    // HPACK by hand (RFC 7541 6): a literal inserted in the dynamic table (0x40 | name index,
    // 0 for a literal name), a literal not inserted, and an index.
    let literal = |first: u8, value: &str| [vec![first], string(value.as_bytes())].concat();
    let head = [
        vec![0x83, 0x86], // :method POST, :scheme http
        literal(0x04, SYNC_PATH),
    ]
    .concat();
    let rest = [
        literal(0x40 | 31, "application/grpc"),
        [vec![0x40], string(b"te"), string(b"trailers")].concat(),
    ]
    .concat();
    // Stream 1 inserts C-core's authority, then content-type and te; stream 3 refers to all
    // three (dynamic indexes 64, 63, 62); stream 5 is grpc-java's.
    let first = [head.clone(), literal(0x40 | 1, &c_core(path)), rest.clone()].concat();
    let again = [head.clone(), vec![0x80 | 64, 0x80 | 63, 0x80 | 62]].concat();
    let java = [head, literal(0x01, path), rest].concat();
    let message = raw_h2::sync_request(selector);
    let (split_a, split_b) = first.split_at(first.len() / 2);
    let mut bytes = [PREFACE, &raw_h2::frame(SETTINGS, 0, 0, &[])].concat();
    bytes.extend(raw_h2::frame(HEADERS, 0, 1, split_a));
    bytes.extend(raw_h2::frame(CONTINUATION, END_HEADERS, 1, split_b));
    bytes.extend(raw_h2::frame(DATA, 0, 1, &message));
    bytes.extend(raw_h2::frame(HEADERS, END_HEADERS, 3, &again));
    bytes.extend(raw_h2::frame(DATA, 0, 3, &message));
    bytes.extend(raw_h2::frame(HEADERS, END_HEADERS, 5, &java));
    bytes.extend(raw_h2::frame(DATA, 0, 5, &message));
    bytes
}

/// An HPACK string literal, not Huffman-coded (RFC 7541 5.2): its length as a 7-bit prefix
/// integer (5.1), then its bytes.
fn string(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 4);
    let mut len = value.len();
    if len < 0x7f {
        out.push(len as u8);
    } else {
        out.push(0x7f);
        len -= 0x7f;
        while len >= 0x80 {
            out.push((len & 0x7f) as u8 | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
    }
    out.extend_from_slice(value);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_core_percent_encodes_the_path() {
        assert_eq!(c_core("/tmp/a b/sync.sock"), "tmp%2Fa b%2Fsync.sock");
    }

    #[test]
    fn string_lengths_past_the_prefix_continue_in_the_next_bytes() {
        assert_eq!(string(b"te"), b"\x02te");
        // RFC 7541 C.1.2 encodes 1337 with a 5-bit prefix; with 7 bits, 300 is 127 + 173.
        let long = string(&[b'a'; 300]);
        assert_eq!(&long[..3], &[0x7f, 0xad, 0x01]);
        assert_eq!(long.len(), 3 + 300);
    }

    #[test]
    fn a_message_is_whole_once_its_prefix_and_body_are_in() {
        assert_eq!(first_message(&[0, 0, 0, 0, 2, 7]), None);
        assert_eq!(first_message(&[0, 0, 0, 0, 2, 7, 8, 9]), Some(&[7, 8][..]));
    }
}
