//! The streams a client opens in one go. An HTTP/2 server reads everything a client has sent
//! before it hands the new streams to the services, so a burst of requests that arrive together
//! fills the connection's stream store at once, however quickly each is answered (and that store
//! does not shrink again). Reading only frame headers as the bytes pass, this counts the new
//! streams between two moments when the client had nothing more to read.
use super::frame::HEADERS;
use super::reader::{Event, FrameReader};

/// Counts the streams a client opens, batch by batch of reads. Its reader is the connection's
/// one reader of frames: the preface deadline asks it whether the preface has passed.
#[derive(Debug, Default)]
pub(crate) struct StreamArrivals {
    frames: FrameReader,
    /// The highest stream a client opened so far (a new stream's identifier is higher than
    /// every earlier one).
    last_stream: u32,
    /// New streams since the last [`StreamArrivals::take_batch`].
    batch: usize,
}

impl StreamArrivals {
    /// Passes `bytes` read from the client, counting the streams their HEADERS frames open;
    /// returns how many they open.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> usize {
        let before = self.batch;
        while let Some(event) = self.frames.next(&mut bytes) {
            let Event::Head(head) = event else {
                continue;
            };
            // A client opens odd-numbered streams; HEADERS on a stream already open are
            // trailers.
            if head.kind == HEADERS && head.stream % 2 == 1 && head.stream > self.last_stream {
                self.last_stream = head.stream;
                self.batch += 1;
            }
        }
        self.batch - before
    }

    /// The streams opened since the last [`StreamArrivals::take_batch`].
    pub(crate) fn batch(&self) -> usize {
        self.batch
    }

    /// The streams opened since the last call.
    pub(crate) fn take_batch(&mut self) -> usize {
        std::mem::take(&mut self.batch)
    }

    /// The client's whole preface has passed (see [`FrameReader::preface_passed`]).
    pub(crate) fn preface_passed(&self) -> bool {
        self.frames.preface_passed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::h2::frame::PREFACE;

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
