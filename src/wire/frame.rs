//! Pre-encoded stream messages.
//!
//! A [`Frame`] is a `SyncFlagsResponse` already encoded in protobuf, made once per version and
//! protocol (the snapshot's encoding named after the protocol) and shared by every stream,
//! which writes its bytes to the connection as they are (see [`crate::wire::body`]).
use bytes::Bytes;
use prost::Message;
use prost_types::value::Kind;
use prost_types::{Struct, Value as ProtoValue};
use serde_json::Value;

use crate::hub::Snapshot;
use crate::selector::ResourceKey;
use crate::wire::proto::client::{flagd_sync_v1, sync_v1};

/// An encoded `SyncFlagsResponse` (of either protocol).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frame(pub Bytes);

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
        let bytes = match self {
            Protocol::FlagdSyncV1 => snapshot.encoded(self.label(), |s| {
                let message = flagd_sync_v1::SyncFlagsResponse {
                    flag_configuration: s.flag_configuration.to_string(),
                    sync_context: Some(sync_context(&s.flag_configuration, key, identity)),
                };
                message.encode_to_vec().into()
            }),
            Protocol::LegacySyncV1 => snapshot.encoded(self.label(), |s| {
                let message = sync_v1::SyncFlagsResponse {
                    flag_configuration: s.flag_configuration.to_string(),
                    state: sync_v1::SyncState::All as i32,
                };
                message.encode_to_vec().into()
            }),
        };
        Frame(bytes)
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

/// The flag set's own scalar metadata, then the context values, the proxy's identity and the
/// selector.
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
    context
        .fields
        .extend(identity.fields.iter().map(|(k, v)| (k.clone(), v.clone())));
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
    use super::*;

    #[test]
    fn frames_decode_as_the_protocol_messages() {
        let snapshot = Snapshot::for_test(r#"{"flags":{},"metadata":{"flagSetId":"s","n":2}}"#);
        let key = ResourceKey::new("ns", "a");
        let v1 = Protocol::FlagdSyncV1.frame(&snapshot, &key, &proxy_identity(&[]));
        let decoded = flagd_sync_v1::SyncFlagsResponse::decode(v1.0.clone()).expect("decodes");
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
        let decoded = sync_v1::SyncFlagsResponse::decode(legacy.0).expect("decodes");
        assert_eq!(decoded.state, sync_v1::SyncState::All as i32);

        // The same bytes are shared, not encoded again.
        let again = Protocol::FlagdSyncV1.frame(&snapshot, &key, &proxy_identity(&[]));
        assert_eq!(again.0.as_ptr(), v1.0.as_ptr());
    }
}
