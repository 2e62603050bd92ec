//! gzip for sync messages: negotiated per call from the client's `grpc-accept-encoding`, made at
//! most once per version and protocol (one more encoding of the snapshot, shared by every stream
//! that takes it, like the uncompressed frame). A large document is deflated once per version,
//! and each message's gzip member is made around it ([`gzip`]).
//!
//! A stream whose client lists gzip is answered with `grpc-encoding: gzip`; each of its messages
//! is then either the shared gzip frame (compressed flag set) or, when the message is smaller
//! than `--compression-min-bytes` or gzip would not make it smaller, the shared uncompressed
//! frame (flag clear), which gRPC allows on any stream.
mod gzip;

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prost_types::Struct;

use crate::hub::{EncodingName, Snapshot};
use crate::metrics::{AcceptLabels, EncodingLabels, Metrics, ResourceLabels};
use crate::selector::ResourceKey;
use crate::wire::frame::{Frame, Message};

/// The snapshot encoding of a large document deflated on its own, which the gzip messages of
/// every protocol share.
const DEFLATED_DOCUMENT: EncodingName = "document+deflate";

/// The request header that lists the encodings a client decodes.
pub const ACCEPT_ENCODING: &str = "grpc-accept-encoding";
/// The response header that names the encoding of compressed messages.
pub const ENCODING: &str = "grpc-encoding";
/// The one compression this proxy sends.
pub const GZIP: &str = "gzip";

/// Default of [`CompressionSettings::min_bytes`] (and of `--compression-min-bytes`): messages
/// up to one HTTP/2 DATA frame (16 KiB) go out in one write either way, and a flag set that
/// small costs its subscribers little to send uncompressed.
pub const DEFAULT_MIN_BYTES: usize = 16 * 1024;
/// Default of [`CompressionSettings::level`] (and of `--compression-level`). Measured on
/// generated flag sets with targeting rules (100 KiB and 1 MiB): level 6 makes them 5.7–6.2
/// times smaller, level 1 3.6–3.8 times, level 9 no smaller than 6 at twice the time; each
/// version is compressed once, however many subscribers it has.
pub const DEFAULT_LEVEL: u32 = 6;

/// Whether sync messages may be compressed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompressionMode {
    /// gzip for clients that accept it, for messages of at least the minimum size.
    #[default]
    Auto,
    /// Never compressed.
    Off,
}

/// How sync messages are compressed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressionSettings {
    pub mode: CompressionMode,
    /// Messages smaller than this are sent uncompressed.
    pub min_bytes: usize,
    /// gzip level, 1 (fastest) to 9 (smallest).
    pub level: u32,
}

impl Default for CompressionSettings {
    fn default() -> Self {
        Self {
            mode: CompressionMode::default(),
            min_bytes: DEFAULT_MIN_BYTES,
            level: DEFAULT_LEVEL,
        }
    }
}

/// The proxy's compression: its settings and the metrics it keeps. Shared by every stream.
pub(crate) struct Compressor {
    settings: CompressionSettings,
    metrics: Arc<Metrics>,
}

impl Compressor {
    pub(crate) fn new(settings: CompressionSettings, metrics: Arc<Metrics>) -> Self {
        Self { settings, metrics }
    }

    /// Whether a call with these request headers gets gzip; counted in `sync_requests`.
    pub(crate) fn negotiate(&self, headers: &http::HeaderMap) -> bool {
        let accepted = accepts_gzip(headers);
        self.metrics
            .sync_requests
            .get_or_create(&AcceptLabels {
                accepts_gzip: if accepted { "yes" } else { "no" },
            })
            .inc();
        self.settings.mode == CompressionMode::Auto && accepted
    }

    /// `frame` (this protocol's frame of `snapshot`) for a client that accepts gzip: the gzip
    /// frame, made the first time any stream needs it and shared afterwards, or `frame` itself
    /// when the message is below the minimum size or gzip does not make it smaller.
    pub(crate) fn gzip_frame(
        &self,
        message: Message,
        snapshot: &Snapshot,
        key: &ResourceKey,
        frame: Frame,
    ) -> Frame {
        if frame.message_len() < self.settings.min_bytes {
            return frame;
        }
        let encoding = message.gzip_encoding();
        let level = self.settings.level;
        let deflated = (frame.pieces().len() > 1).then(|| {
            snapshot.encoded(DEFLATED_DOCUMENT, |_| {
                gzip::deflated_document(&frame, level)
            })
        });
        Frame(snapshot.encoded(encoding, |_| {
            let compressed = match deflated.as_ref().map(|d| d.pieces().first()) {
                Some(Some(deflated)) => gzip::around(&frame, deflated, level),
                Some(None) => None,
                None => gzip::whole(&frame, level),
            };
            let length = compressed
                .as_ref()
                .map(|pieces| pieces.iter().map(|piece| piece.len()).sum());
            self.record(encoding, key, &frame, length);
            // An incompressible message stays as it is: the same pieces, not charged again.
            compressed.unwrap_or_else(|| frame.pieces().to_vec())
        }))
    }

    fn record(
        &self,
        encoding: EncodingName,
        key: &ResourceKey,
        frame: &Frame,
        gzip_length: Option<usize>,
    ) {
        self.metrics
            .messages_compressed
            .get_or_create(&EncodingLabels { encoding })
            .inc();
        let ratio = match gzip_length {
            Some(gzip) => frame.len() as f64 / gzip as f64,
            None => 1.0,
        };
        self.metrics
            .compression_ratio
            .get_or_create(&ResourceLabels {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
            })
            .set(ratio);
    }

    /// The encoder of one stream: gzip when `gzip` (negotiated), identity otherwise.
    pub(crate) fn for_stream(self: &Arc<Self>, gzip: bool) -> StreamEncoder {
        let counter = |encoding| {
            self.metrics
                .sent_bytes
                .get_or_create(&EncodingLabels { encoding })
                .clone()
        };
        StreamEncoder {
            gzip: gzip.then(|| self.clone()),
            sent_identity: counter("identity"),
            sent_gzip: counter(GZIP),
        }
    }
}

/// How one stream's messages are made: the shared frames of its protocol, gzip ones when its
/// client accepts them; each counted in `sent_bytes` by the encoding it goes out in.
#[derive(Default)]
pub(crate) struct StreamEncoder {
    gzip: Option<Arc<Compressor>>,
    sent_identity: Counter,
    sent_gzip: Counter,
}

impl StreamEncoder {
    /// The message for `snapshot` on this stream, counted as sent.
    pub(crate) fn message(
        &self,
        message: Message,
        snapshot: &Snapshot,
        key: &ResourceKey,
        identity: &Struct,
    ) -> Frame {
        let frame = message.frame(snapshot, key, identity);
        let frame = match &self.gzip {
            Some(compressor) => compressor.gzip_frame(message, snapshot, key, frame),
            None => frame,
        };
        let counter = if is_compressed(&frame) {
            &self.sent_gzip
        } else {
            &self.sent_identity
        };
        counter.inc_by(frame.len() as u64);
        frame
    }
}

/// Whether the message's compressed flag is set.
pub(crate) fn is_compressed(frame: &Frame) -> bool {
    frame.pieces().first().and_then(|piece| piece.first()) == Some(&1)
}

/// Whether the `grpc-accept-encoding` headers list gzip (a comma-separated list; names are
/// compared without regard to case).
pub(crate) fn accepts_gzip(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|name| name.trim().eq_ignore_ascii_case(GZIP))
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::wire::frame::{PREFIX, Protocol, proxy_identity};

    fn headers(values: &[&str]) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        for value in values {
            headers.append(ACCEPT_ENCODING, value.parse().expect("a header value"));
        }
        headers
    }

    #[test]
    fn gzip_is_accepted_only_when_listed() {
        assert!(accepts_gzip(&headers(&["gzip"])));
        assert!(accepts_gzip(&headers(&["identity, deflate, GZIP"])));
        assert!(accepts_gzip(&headers(&["identity", "gzip"])));
        assert!(!accepts_gzip(&headers(&[])));
        assert!(!accepts_gzip(&headers(&["identity,deflate"])));
        assert!(!accepts_gzip(&headers(&["gzipx"])));
    }

    fn gunzip(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut out)
            .expect("gzip");
        out
    }

    /// A flag set that gzip makes much smaller, about `size` bytes long.
    fn flag_set(size: usize) -> String {
        let flags: Vec<String> = (0..size / 100)
            .map(|i| format!(r#""flag-{i}":{{"state":"ENABLED","variants":{{"on":true,"off":false}},"defaultVariant":"on"}}"#))
            .collect();
        format!(r#"{{"flags":{{{}}}}}"#, flags.join(","))
    }

    #[test]
    fn large_messages_are_gzipped_once_and_small_ones_are_not() {
        let metrics = Arc::new(Metrics::new());
        let compressor = Compressor::new(CompressionSettings::default(), metrics.clone());
        let key = ResourceKey::new("ns", "a");
        let identity = proxy_identity(&[]);
        for protocol in [Protocol::FlagdSyncV1, Protocol::LegacySyncV1] {
            let large = Snapshot::for_test(&flag_set(64 * 1024));
            let frame = protocol.frame(&large, &key, &identity);
            let gzip = compressor.gzip_frame(Message::Sync(protocol), &large, &key, frame.clone());
            assert!(is_compressed(&gzip));
            let compressed = &gzip.pieces()[0];
            let length = u32::from_be_bytes(compressed[1..PREFIX].try_into().expect("4 bytes"));
            assert_eq!(length as usize, gzip.len() - PREFIX);
            assert!(gzip.len() * 4 < frame.len(), "{}", gzip.len());
            assert_eq!(gunzip(&gzip.message_bytes()), frame.message_bytes());
            let again = compressor.gzip_frame(Message::Sync(protocol), &large, &key, frame);
            assert_eq!(again, gzip);
            assert_eq!(
                again.pieces()[0].as_ptr(),
                compressed.as_ptr(),
                "shared, not made again"
            );

            let small = Snapshot::for_test(&flag_set(1024));
            let frame = protocol.frame(&small, &key, &identity);
            let sent = compressor.gzip_frame(Message::Sync(protocol), &small, &key, frame.clone());
            assert_eq!(
                sent.pieces()[0].as_ptr(),
                frame.pieces()[0].as_ptr(),
                "small messages go as they are"
            );
        }
        let text = metrics.encode();
        for encoding in ["flagd.sync.v1+gzip", "sync.v1+gzip"] {
            let sample =
                format!("flagd_proxy_messages_compressed_total{{encoding=\"{encoding}\"}} 1\n");
            assert!(text.contains(&sample), "{text}");
        }
        assert!(text.contains("flagd_proxy_compression_ratio{namespace=\"ns\",name=\"a\"}"));
    }

    #[test]
    fn a_message_gzip_does_not_shrink_is_sent_uncompressed() {
        let settings = CompressionSettings {
            min_bytes: 0,
            ..CompressionSettings::default()
        };
        let compressor = Compressor::new(settings, Arc::new(Metrics::new()));
        // Too short for gzip's header and trailer to pay off.
        let snapshot = Snapshot::for_test("{}");
        let key = ResourceKey::new("ns", "a");
        let frame = Message::FetchAll.frame(&snapshot, &key, &proxy_identity(&[]));
        let sent = compressor.gzip_frame(Message::FetchAll, &snapshot, &key, frame.clone());
        assert!(!is_compressed(&sent));
        assert_eq!(sent, frame);
    }

    #[test]
    fn off_never_negotiates_gzip() {
        let off = CompressionSettings {
            mode: CompressionMode::Off,
            ..CompressionSettings::default()
        };
        let compressor = Compressor::new(off, Arc::new(Metrics::new()));
        assert!(!compressor.negotiate(&headers(&["gzip"])));
        let auto = Compressor::new(CompressionSettings::default(), Arc::new(Metrics::new()));
        assert!(auto.negotiate(&headers(&["gzip"])));
        assert!(!auto.negotiate(&headers(&[])));
    }

    /// A large version asked for in every form (three messages, each plain and gzipped) costs
    /// its document once, deflated once, and a few hundred bytes per message around them; each
    /// gzip message decompresses to its plain message.
    #[test]
    fn a_large_version_in_every_form_costs_its_document_and_one_deflated_copy() {
        let metrics = Arc::new(Metrics::new());
        let budget = crate::budget::MemoryBudget::new(1 << 30, metrics.clone());
        let compressor = Compressor::new(CompressionSettings::default(), metrics);
        // Noise over 90 characters: gzip saves little, so copies would show.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let noise: String = (0..256 * 1024)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                char::from(b'#' + (state % 57) as u8)
            })
            .filter(|c| *c != '\\')
            .collect();
        let document = format!(
            r#"{{"flags":{{"f":{{"state":"ENABLED","variants":{{"on":"{noise}"}},"defaultVariant":"on"}}}}}}"#
        );
        let snapshot = Snapshot::charged_for_test(&document, budget.clone());
        let key = ResourceKey::new("ns", "a");
        let identity = proxy_identity(&[]);
        let mut deflated = Vec::new();
        for message in [
            Message::Sync(Protocol::FlagdSyncV1),
            Message::Sync(Protocol::LegacySyncV1),
            Message::FetchAll,
        ] {
            let frame = message.frame(&snapshot, &key, &identity);
            let gzip = compressor.gzip_frame(message, &snapshot, &key, frame.clone());
            assert!(is_compressed(&gzip));
            assert_eq!(gunzip(&gzip.message_bytes()), frame.message_bytes());
            let length = u32::from_be_bytes(gzip.pieces()[0][1..PREFIX].try_into().expect("4"));
            assert_eq!(length as usize, gzip.message_len());
            deflated.push(gzip.pieces()[1].clone());
        }
        assert!(deflated.iter().all(|d| d.as_ptr() == deflated[0].as_ptr()));
        let charged = budget.used();
        let once = document.len() + deflated[0].len();
        assert!(
            (once..once + 4096).contains(&charged),
            "{charged} charged for a document of {} deflated to {}",
            document.len(),
            deflated[0].len()
        );
    }
}
