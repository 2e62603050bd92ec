//! Pre-encoded stream messages.
//!
//! A [`Frame`] is a response message ([`Message`]: a `SyncFlagsResponse`, or the
//! `FetchAllFlagsResponse`) already encoded as a whole gRPC message (the 5-byte prefix, then the
//! protobuf), made once per version and message (the snapshot's encoding named after the
//! message; gzip ones in [`crate::wire::compression`]) and shared by every stream, which hands
//! its pieces to HTTP/2 as chunks of body data without copying them (HTTP/2 cuts them into DATA
//! frames of the client's frame size; see [`crate::wire::body`]).
//!
//! Every message carries the document as its field 1 (`flag_configuration`). A document of
//! [`SHARED_DOCUMENT`] bytes or more is not copied into the message: the frame is three pieces,
//! the prefix and field 1's key and length, the snapshot's own document bytes, and the message's
//! other fields. So the three messages of a version (and the gzip ones, which keep an
//! incompressible message as it is) cost its document once, not once each.
use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
use prost_types::value::Kind;
use prost_types::{Struct, Value as ProtoValue};
use serde_json::Value;

use crate::hub::{Encoded, EncodingName, Snapshot};
use crate::protocol::client::{flagd_sync_v1, sync_v1};
use crate::selector::ResourceKey;

/// Length of the gRPC message prefix: a compression flag and a big-endian length.
pub(crate) const PREFIX: usize = 5;

/// The smallest document sent as a piece of its own, shared by every message of its version;
/// a smaller one is copied into each message, which then goes to HTTP/2 as one piece (the
/// default largest DATA frame holds 16 KiB).
pub(crate) const SHARED_DOCUMENT: usize = 16 * 1024;

/// An encoded response message (of either protocol) with its gRPC message prefix, in the pieces
/// it is handed on in (the prefix always in the first). Empty when the message is too large for
/// the prefix's length field.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frame(pub Encoded);

impl Frame {
    /// A frame of one piece.
    pub fn whole(bytes: Bytes) -> Self {
        Self(Encoded::from(bytes))
    }

    pub fn pieces(&self) -> &[Bytes] {
        self.0.pieces()
    }

    /// The length of the whole gRPC message, its prefix included.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The protobuf message, without the prefix, piece by piece.
    pub fn message(&self) -> impl Iterator<Item = &[u8]> {
        self.pieces().iter().enumerate().map(|(i, piece)| {
            if i == 0 {
                &piece[PREFIX.min(piece.len())..]
            } else {
                &piece[..]
            }
        })
    }

    /// The protobuf message's length.
    pub fn message_len(&self) -> usize {
        self.len().saturating_sub(PREFIX)
    }

    /// The protobuf message in one piece (a copy when the frame has several).
    pub fn message_bytes(&self) -> Bytes {
        match self.pieces() {
            [one] => one.slice(PREFIX.min(one.len())..),
            _ => Bytes::from(self.message().collect::<Vec<_>>().concat()),
        }
    }
}

/// `message` as a whole gRPC message (uncompressed) in one piece; empty if its length does not
/// fit.
fn grpc_message(message: &impl prost::Message) -> Vec<Bytes> {
    let length = message.encoded_len();
    let Ok(prefix) = u32::try_from(length) else {
        return Vec::new();
    };
    let mut buffer = BytesMut::with_capacity(PREFIX + length);
    buffer.put_u8(0);
    buffer.put_u32(prefix);
    match message.encode(&mut buffer) {
        Ok(()) => vec![buffer.freeze()],
        // A growing buffer always has room.
        Err(_) => Vec::new(),
    }
}

/// A whole gRPC message whose field 1 is `document` and whose other fields are `rest` (with an
/// empty field 1), in three pieces: the prefix with field 1's key and length, `document` itself,
/// and `rest` encoded. Decoders take fields in any order; this is also the order prost writes.
/// Empty if its length does not fit.
fn grpc_message_around(document: Bytes, rest: &impl prost::Message) -> Vec<Bytes> {
    let key_and_length = encoded_len_varint(1 << 3) + encoded_len_varint(document.len() as u64);
    let length = key_and_length + document.len() + rest.encoded_len();
    let Ok(prefix) = u32::try_from(length) else {
        return Vec::new();
    };
    let mut head = BytesMut::with_capacity(PREFIX + key_and_length);
    head.put_u8(0);
    head.put_u32(prefix);
    encode_key(1, WireType::LengthDelimited, &mut head);
    encode_varint(document.len() as u64, &mut head);
    let mut tail = BytesMut::with_capacity(rest.encoded_len());
    if rest.encode(&mut tail).is_err() {
        // A growing buffer always has room.
        return Vec::new();
    }
    let mut pieces = vec![head.freeze(), document];
    if !tail.is_empty() {
        pieces.push(tail.freeze());
    }
    pieces
}

/// The sync protocols this proxy speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `flagd.sync.v1`, the current protocol.
    FlagdSyncV1,
    /// `sync.v1`, spoken by flagd before v0.9.0.
    LegacySyncV1,
}

impl Protocol {
    pub fn label(self) -> &'static str {
        match self {
            Protocol::FlagdSyncV1 => "flagd.sync.v1",
            Protocol::LegacySyncV1 => "sync.v1",
        }
    }

    /// This protocol's frame for `snapshot`, encoded on first use and shared afterwards;
    /// `identity` is the proxy's part of `sync_context` ([`proxy_identity`]).
    pub fn frame(self, snapshot: &Snapshot, key: &ResourceKey, identity: &Struct) -> Frame {
        Message::Sync(self).frame(snapshot, key, identity)
    }
}

/// The messages made from a snapshot: each protocol's `SyncFlagsResponse`, and the
/// `FetchAllFlagsResponse` (the same message in both protocols).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    Sync(Protocol),
    FetchAll,
}

impl Message {
    /// The snapshot encoding of this message, uncompressed.
    fn encoding(self) -> EncodingName {
        match self {
            Message::Sync(protocol) => protocol.label(),
            Message::FetchAll => "FetchAllFlags",
        }
    }

    /// The snapshot encoding of this message, gzipped (see [`crate::wire::compression`]).
    pub fn gzip_encoding(self) -> EncodingName {
        match self {
            Message::Sync(Protocol::FlagdSyncV1) => "flagd.sync.v1+gzip",
            Message::Sync(Protocol::LegacySyncV1) => "sync.v1+gzip",
            Message::FetchAll => "FetchAllFlags+gzip",
        }
    }

    /// This message for `snapshot`, uncompressed, encoded on first use and shared afterwards;
    /// `identity` is the proxy's part of `sync_context` ([`proxy_identity`]).
    pub fn frame(self, snapshot: &Snapshot, key: &ResourceKey, identity: &Struct) -> Frame {
        Frame(snapshot.encoded(self.encoding(), |s| {
            let shared = s.flag_configuration.len() >= SHARED_DOCUMENT;
            // Field 1 in the message itself, or empty and sent as a piece of its own.
            let text = if shared {
                String::new()
            } else {
                s.flag_configuration.to_string()
            };
            match self {
                Message::Sync(Protocol::FlagdSyncV1) => {
                    let message = flagd_sync_v1::SyncFlagsResponse {
                        flag_configuration: text,
                        sync_context: Some(sync_context(&s.flag_configuration, key, identity)),
                    };
                    encode(shared, s, &message)
                }
                Message::Sync(Protocol::LegacySyncV1) => {
                    let message = sync_v1::SyncFlagsResponse {
                        flag_configuration: text,
                        state: sync_v1::SyncState::All as i32,
                    };
                    encode(shared, s, &message)
                }
                Message::FetchAll => {
                    let message = flagd_sync_v1::FetchAllFlagsResponse {
                        flag_configuration: text,
                    };
                    encode(shared, s, &message)
                }
            }
        }))
    }
}

/// `message` as a whole gRPC message: with the document as a shared piece when `shared` (the
/// message's field 1 then is empty), in one piece otherwise.
fn encode(shared: bool, snapshot: &Snapshot, message: &impl prost::Message) -> Vec<Bytes> {
    if shared {
        grpc_message_around(snapshot.document(), message)
    } else {
        grpc_message(message)
    }
}

/// The proxy's identity and the `--context-value` entries, as reported by `GetMetadata` and in
/// every `sync_context` (a later entry of one key wins).
pub fn proxy_identity(context_values: &[(String, String)]) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    for (key, value) in context_values {
        fields.insert(key.clone(), string(value));
    }
    fields.insert("proxy".to_owned(), string("flagd-proxy"));
    fields.insert("proxyVersion".to_owned(), string(env!("CARGO_PKG_VERSION")));
    Struct { fields }
}

/// The flag set's own scalar metadata, the context values where the flag set does not set the
/// same key, then the proxy's identity and the selector (which always win).
fn sync_context(flag_configuration: &str, key: &ResourceKey, identity: &Struct) -> Struct {
    let mut context = Struct::default();
    if let Ok(Metadata(Some(Value::Object(metadata)))) =
        serde_json::from_str::<Metadata>(flag_configuration)
    {
        for (name, value) in &metadata {
            let kind = match value {
                Value::String(s) => Kind::StringValue(s.clone()),
                Value::Bool(b) => Kind::BoolValue(*b),
                Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
                _ => continue,
            };
            context
                .fields
                .insert(name.clone(), ProtoValue { kind: Some(kind) });
        }
    }
    for (name, value) in &identity.fields {
        if crate::context::RESERVED_KEYS.contains(&name.as_str()) {
            context.fields.insert(name.clone(), value.clone());
        } else {
            context
                .fields
                .entry(name.clone())
                .or_insert_with(|| value.clone());
        }
    }
    context
        .fields
        .insert("selector".to_owned(), string(&key.to_string()));
    context
}

/// A document's top-level `metadata` (the last one, as a parse into a map keeps it), read
/// without building the rest of the document: the flags are skipped as they are read (a parsed
/// flag set takes many times its text).
struct Metadata(Option<Value>);

impl<'de> serde::Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Metadata;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Metadata, A::Error> {
                let mut metadata = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "metadata" {
                        metadata = Some(map.next_value::<Value>()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(Metadata(metadata))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

fn string(s: &str) -> ProtoValue {
    ProtoValue {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    /// The frame's bytes in one piece, its prefix checked: uncompressed, then the big-endian
    /// length of the rest.
    fn checked(frame: &Frame) -> Bytes {
        let length = u32::try_from(frame.message_len()).expect("a small message");
        let first = &frame.pieces()[0];
        assert_eq!(first[0], 0);
        assert_eq!(first[1..PREFIX], length.to_be_bytes());
        frame.message_bytes()
    }

    fn check_messages(document: &str) -> Vec<Frame> {
        let snapshot = Snapshot::for_test(document);
        let key = ResourceKey::new("ns", "a");
        let v1 = Protocol::FlagdSyncV1.frame(&snapshot, &key, &proxy_identity(&[]));
        let decoded = flagd_sync_v1::SyncFlagsResponse::decode(checked(&v1)).expect("decodes");
        assert_eq!(
            decoded.flag_configuration,
            snapshot.flag_configuration.as_ref()
        );
        let context = decoded.sync_context.expect("sync_context is always set");
        assert_eq!(
            context.fields["selector"],
            string("core.openfeature.dev/ns/a")
        );
        assert_eq!(context.fields["flagSetId"], string("s"));
        assert_eq!(context.fields["proxy"], string("flagd-proxy"));

        let legacy = Protocol::LegacySyncV1.frame(&snapshot, &key, &proxy_identity(&[]));
        let decoded = sync_v1::SyncFlagsResponse::decode(checked(&legacy)).expect("decodes");
        assert_eq!(decoded.state, sync_v1::SyncState::All as i32);
        assert_eq!(decoded.flag_configuration, document);

        let fetch = Message::FetchAll.frame(&snapshot, &key, &proxy_identity(&[]));
        let decoded =
            flagd_sync_v1::FetchAllFlagsResponse::decode(checked(&fetch)).expect("decodes");
        assert_eq!(decoded.flag_configuration, document);

        // The same bytes are shared, not encoded again.
        let again = Protocol::FlagdSyncV1.frame(&snapshot, &key, &proxy_identity(&[]));
        assert_eq!(again.pieces()[0].as_ptr(), v1.pieces()[0].as_ptr());
        vec![v1, legacy, fetch]
    }

    #[test]
    fn frames_decode_as_the_protocol_messages() {
        let frames = check_messages(r#"{"flags":{},"metadata":{"flagSetId":"s","n":2}}"#);
        for frame in frames {
            assert_eq!(frame.pieces().len(), 1, "a small document is copied in");
        }
    }

    /// A large document is one piece of each message, the snapshot's own bytes: every message of
    /// the version shares it.
    #[test]
    fn large_documents_are_shared_by_every_message() {
        let padding = "x".repeat(SHARED_DOCUMENT);
        let document =
            format!(r#"{{"flags":{{}},"metadata":{{"flagSetId":"s","n":2,"pad":"{padding}"}}}}"#);
        let frames = check_messages(&document);
        let shared = frames[0].pieces()[1].as_ptr();
        for frame in &frames {
            assert_eq!(frame.pieces()[1].as_ptr(), shared);
            assert_eq!(frame.pieces()[1].len(), document.len());
        }
        // Only the fetch response has no field after the document.
        assert_eq!(
            frames.iter().map(|f| f.pieces().len()).collect::<Vec<_>>(),
            [3, 3, 2]
        );
    }

    #[test]
    fn a_flag_sets_own_metadata_wins_over_a_context_value_and_the_proxys_keys_over_both() {
        let flags = r#"{"flags":{},"metadata":{"team":"checkout","proxy":"spoofed","n":2}}"#;
        let values = [
            ("team".to_owned(), "platform".to_owned()),
            ("region".to_owned(), "eu".to_owned()),
        ];
        let context = sync_context(
            flags,
            &ResourceKey::new("ns", "a"),
            &proxy_identity(&values),
        );
        assert_eq!(context.fields["team"], string("checkout"));
        assert_eq!(context.fields["region"], string("eu"));
        assert_eq!(context.fields["proxy"], string("flagd-proxy"));
        assert_eq!(
            context.fields["selector"],
            string("core.openfeature.dev/ns/a")
        );
    }

    /// The metadata read for `sync_context` is the document's last top-level `metadata`, as a
    /// parse of the whole document keeps it; nested ones and other keys do not count.
    #[test]
    fn sync_context_takes_the_last_top_level_metadata() {
        let key = ResourceKey::new("ns", "a");
        let context = |document: &str| sync_context(document, &key, &proxy_identity(&[]));
        let twice = r#"{"metadata":{"team":"a"},"flags":{"f":{"metadata":{"team":"x"}}},"metadata":{"team":"b"}}"#;
        assert_eq!(context(twice).fields["team"], string("b"));
        let whole: Value = serde_json::from_str(twice).expect("JSON");
        assert_eq!(whole["metadata"]["team"], "b");
        assert!(
            !context(r#"{"flags":{"f":{"metadata":{"team":"x"}}}}"#)
                .fields
                .contains_key("team")
        );
        assert!(!context(r#"[1]"#).fields.contains_key("team"));
    }
}
