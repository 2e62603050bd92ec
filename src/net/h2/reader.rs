//! The frame-header reader: a client's bytes, a read at a time, as the preface, frame headers and
//! payloads.
use super::frame::{HEAD_LEN, Head, PREFACE};

/// Where a client's byte stream is, read a piece at a time: in the preface, in a frame's header
/// or in its payload. It keeps nothing of the bytes but a header cut between two pieces (at most
/// 8 bytes): headers whole in a piece are read where they are, payloads are passed over.
#[derive(Debug, Default)]
pub(crate) struct FrameReader {
    /// How many bytes of the preface have passed.
    preface_seen: usize,
    /// A byte of the preface was not the preface's: the stream is not HTTP/2, and what comes
    /// after the preface is not read as frames.
    not_http2: bool,
    /// A frame header cut between two pieces: its first `head_len` bytes.
    head: [u8; HEAD_LEN],
    head_len: usize,
    /// What is still to come of the payload of the frame whose header came last.
    payload_left: usize,
}

/// A piece of a client's byte stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event<'a> {
    /// Bytes of the preface, whether or not they are the preface's ([`FrameReader::is_http2`]).
    Preface(&'a [u8]),
    /// A frame's header, whole.
    Head(Head),
    /// Bytes of the payload of the frame whose header came last.
    Payload(&'a [u8]),
    /// Bytes after a preface that was not HTTP/2's.
    Other(&'a [u8]),
}

impl FrameReader {
    /// The piece at the start of `bytes`, which are advanced past it; `None` once they are used
    /// up (the start of a header they end in is kept for the next call).
    pub(crate) fn next<'a>(&mut self, bytes: &mut &'a [u8]) -> Option<Event<'a>> {
        if bytes.is_empty() {
            return None;
        }
        if self.preface_seen < PREFACE.len() {
            let expected = &PREFACE[self.preface_seen..];
            let (seen, rest) = bytes.split_at(expected.len().min(bytes.len()));
            self.not_http2 |= seen != &expected[..seen.len()];
            self.preface_seen += seen.len();
            *bytes = rest;
            return Some(Event::Preface(seen));
        }
        if self.not_http2 {
            return Some(Event::Other(std::mem::take(bytes)));
        }
        if self.payload_left > 0 {
            let (payload, rest) = bytes.split_at(self.payload_left.min(bytes.len()));
            self.payload_left -= payload.len();
            *bytes = rest;
            return Some(Event::Payload(payload));
        }
        let head = self.head(bytes)?;
        self.payload_left = head.len;
        Some(Event::Head(head))
    }

    /// The header at the start of `bytes` (after what an earlier piece held of it), or `None`
    /// when they end before it does: then they are kept.
    fn head(&mut self, bytes: &mut &[u8]) -> Option<Head> {
        if self.head_len == 0
            && let Some((head, rest)) = bytes.split_first_chunk::<HEAD_LEN>()
        {
            *bytes = rest;
            return Some(Head::from_bytes(head));
        }
        let take = (HEAD_LEN - self.head_len).min(bytes.len());
        let (start, rest) = bytes.split_at(take);
        self.head[self.head_len..self.head_len + take].copy_from_slice(start);
        self.head_len += take;
        *bytes = rest;
        if self.head_len < HEAD_LEN {
            return None;
        }
        self.head_len = 0;
        Some(Head::from_bytes(&self.head))
    }

    /// Every byte of the preface has passed (whether or not it was the preface).
    pub(crate) fn preface_passed(&self) -> bool {
        self.preface_seen == PREFACE.len()
    }

    /// Every byte of the preface so far was the preface's.
    pub(crate) fn is_http2(&self) -> bool {
        !self.not_http2
    }

    /// What is still to come of the payload of the frame whose header came last.
    pub(crate) fn payload_left(&self) -> usize {
        self.payload_left
    }
}

#[cfg(test)]
mod tests;
