//! Pre-encoded stream messages.
//!
//! A [`Frame`] is a response message ([`Message`]: a `SyncFlagsResponse`, or the
//! `FetchAllFlagsResponse`) already encoded as a whole gRPC message (the 5-byte prefix, then the
//! protobuf), made once per version and message (the snapshot's encoding named after the
//! message; gzip ones in [`crate::wire::compression`]) and shared by every stream, which hands it
//! to HTTP/2 as one chunk of body data without copying it (HTTP/2 cuts it into DATA frames of the
//! client's frame size; see [`crate::wire::body`]).
use bytes::{BufMut, Bytes, BytesMut};
use prost_types::value::Kind;
use prost_types::{Struct, Value as ProtoValue};
use serde_json::Value;

use crate::hub::{EncodingName, Snapshot};
use crate::protocol::client::{flagd_sync_v1, sync_v1};
use crate::selector::ResourceKey;

/// Length of the gRPC message prefix: a compression flag and a big-endian length.
pub(crate) const PREFIX: usize = 5;

/// An encoded `SyncFlagsResponse` (of either protocol) with its gRPC message prefix. Empty when
/// the message is too large for the prefix's length field.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frame(pub Bytes);

impl Frame {
    /// The protobuf message, without the prefix.
    pub fn message(&self) -> Bytes {
        self.0.slice(PREFIX.min(self.0.len())..)
    }
}

/// `message` as a whole gRPC message (uncompressed); empty if its length does not fit.
fn grpc_message(message: &impl prost::Message) -> Bytes {
    let length = message.encoded_len();
    let Ok(prefix) = u32::try_from(length) else {
        return Bytes::new();
    };
    let mut buffer = BytesMut::with_capacity(PREFIX + length);
    buffer.put_u8(0);
    buffer.put_u32(prefix);
    match message.encode(&mut buffer) {
        Ok(()) => buffer.freeze(),
        // A growing buffer always has room.
        Err(_) => Bytes::new(),
    }
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
        Frame(snapshot.encoded(self.encoding(), |s| match self {
            Message::Sync(Protocol::FlagdSyncV1) => {
                grpc_message(&flagd_sync_v1::SyncFlagsResponse {
                    flag_configuration: s.flag_configuration.to_string(),
                    sync_context: Some(sync_context(&s.flag_configuration, key, identity)),
                })
            }
            Message::Sync(Protocol::LegacySyncV1) => grpc_message(&sync_v1::SyncFlagsResponse {
                flag_configuration: s.flag_configuration.to_string(),
                state: sync_v1::SyncState::All as i32,
            }),
            Message::FetchAll => grpc_message(&flagd_sync_v1::FetchAllFlagsResponse {
                flag_configuration: s.flag_configuration.to_string(),
            }),
        }))
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
    if let Ok(Value::Object(document)) = serde_json::from_str::<Value>(flag_configuration)
        && let Some(Value::Object(metadata)) = document.get("metadata")
    {
        for (name, value) in metadata {
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

fn string(s: &str) -> ProtoValue {
    ProtoValue {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    #[test]
    fn frames_decode_as_the_protocol_messages() {
        let snapshot = Snapshot::for_test(r#"{"flags":{},"metadata":{"flagSetId":"s","n":2}}"#);
        let key = ResourceKey::new("ns", "a");
        let v1 = Protocol::FlagdSyncV1.frame(&snapshot, &key, &proxy_identity(&[]));
        // One whole gRPC message: uncompressed, then the big-endian length of the rest.
        let length = u32::try_from(v1.message().len()).expect("a small message");
        assert_eq!(v1.0[0], 0);
        assert_eq!(v1.0[1..PREFIX], length.to_be_bytes());
        let decoded = flagd_sync_v1::SyncFlagsResponse::decode(v1.message()).expect("decodes");
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
        let decoded = sync_v1::SyncFlagsResponse::decode(legacy.message()).expect("decodes");
        assert_eq!(decoded.state, sync_v1::SyncState::All as i32);

        // The same bytes are shared, not encoded again.
        let again = Protocol::FlagdSyncV1.frame(&snapshot, &key, &proxy_identity(&[]));
        assert_eq!(again.0.as_ptr(), v1.0.as_ptr());
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
}
