//! The streams a client opens in one go. An HTTP/2 server reads everything a client has sent
//! before it hands the new streams to the services, so a burst of requests that arrive together
//! fills the connection's stream store at once, however quickly each is answered (and that store
//! does not shrink again). Reading only frame headers as the bytes pass, this counts the new
//! streams between two moments when the client had nothing more to read.
use crate::net::deadlines::PREFACE;

/// An HTTP/2 frame header: length (3 bytes), type, flags, stream identifier (4 bytes).
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;

/// Counts the streams a client opens, batch by batch of reads.
#[derive(Debug)]
pub(crate) struct StreamArrivals {
    /// Bytes of the connection preface still to pass.
    preface_left: usize,
    header: [u8; FRAME_HEADER],
    header_len: usize,
    /// Bytes of the current frame's payload still to pass.
    payload_left: usize,
    /// The highest stream a client opened so far (a new stream's identifier is higher than
    /// every earlier one).
    last_stream: u32,
    /// New streams since the last [`StreamArrivals::take_batch`].
    batch: usize,
}

impl Default for StreamArrivals {
    fn default() -> Self {
        Self {
            preface_left: PREFACE.len(),
            header: [0; FRAME_HEADER],
            header_len: 0,
            payload_left: 0,
            last_stream: 0,
            batch: 0,
        }
    }
}

impl StreamArrivals {
    /// Passes `bytes` read from the client, counting the streams their HEADERS frames open;
    /// returns how many they open.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> usize {
        let before = self.batch;
        let preface = self.preface_left.min(bytes.len());
        self.preface_left -= preface;
        bytes = &bytes[preface..];
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let skip = self.payload_left.min(bytes.len());
                self.payload_left -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let take = (FRAME_HEADER - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + take].copy_from_slice(&bytes[..take]);
            self.header_len += take;
            bytes = &bytes[take..];
            if self.header_len == FRAME_HEADER {
                self.header_len = 0;
                self.frame();
            }
        }
        self.batch - before
    }

    fn frame(&mut self) {
        let h = self.header;
        self.payload_left = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let stream = u32::from_be_bytes([h[5] & 0x7f, h[6], h[7], h[8]]);
        // A client opens odd-numbered streams; HEADERS on a stream already open are trailers.
        if h[3] == HEADERS && stream % 2 == 1 && stream > self.last_stream {
            self.last_stream = stream;
            self.batch += 1;
        }
    }

    /// The streams opened since the last call.
    pub(crate) fn take_batch(&mut self) -> usize {
        std::mem::take(&mut self.batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).expect("small");
        let mut bytes = len.to_be_bytes()[1..].to_vec();
        bytes.extend([kind, 0x4]);
        bytes.extend(stream.to_be_bytes());
        bytes.extend(payload);
        bytes
    }

    #[test]
    fn new_streams_are_counted_however_the_bytes_are_cut() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(0x4, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
        for stream in [1, 3, 5] {
            // HEADERS whose block happens to look like a frame header, then DATA.
            bytes.extend(frame(HEADERS, stream, &[0, 0, 0, HEADERS, 0, 0, 0, 0, 7]));
            bytes.extend(frame(0x0, stream, b"message"));
        }
        bytes.extend(frame(HEADERS, 3, b"trailers"));
        for cut in [1, 2, 5, 9, 10, 64, bytes.len()] {
            let mut arrivals = StreamArrivals::default();
            let opened: usize = bytes.chunks(cut).map(|chunk| arrivals.feed(chunk)).sum();
            assert_eq!(opened, 3);
            assert_eq!(arrivals.take_batch(), 3, "in pieces of {cut}");
            assert_eq!(arrivals.take_batch(), 0, "taken");
        }
    }

    #[test]
    fn streams_are_counted_per_batch() {
        let mut arrivals = StreamArrivals::default();
        assert_eq!(arrivals.feed(PREFACE), 0);
        assert_eq!(arrivals.feed(&frame(HEADERS, 1, b"a")), 1);
        assert_eq!(arrivals.take_batch(), 1);
        let batch: Vec<u8> = (1..=100)
            .flat_map(|i| frame(HEADERS, 2 * i + 1, b"a"))
            .collect();
        assert_eq!(arrivals.feed(&batch), 100);
        assert_eq!(arrivals.take_batch(), 100);
    }
}
