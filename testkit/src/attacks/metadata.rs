//! Row 1: a FeatureFlag whose flag-set metadata, which `flagd.sync.v1` sends again in every
//! message's `sync_context`, makes a document under `--max-document-bytes` into a message of
//! twice its size, past the 4 MiB a default gRPC client accepts. The proxy must refuse such a
//! version with the reason, and clients keep their stream and their last version.

use serde_json::{Value, json};

/// The metadata's `notes`: the document stays under the default `--max-document-bytes`, the
/// message would not.
pub const NOTES_BYTES: usize = 2_300_000;

/// The metadata of the attack's version (`notes_bytes` of notes), or of an ordinary one (0).
pub fn metadata(notes_bytes: usize) -> Value {
    if notes_bytes == 0 {
        json!({"team": "checkout"})
    } else {
        json!({"team": "checkout", "notes": "n".repeat(notes_bytes)})
    }
}

/// `default/demo` with the string flag `color` (`default` of `variants`) and the flag-set
/// metadata of [`metadata`], as the manifests folder holds it.
pub fn manifest(default: &str, variants: &[&str], notes_bytes: usize) -> String {
    let mut object = crate::feature_flag(
        "default",
        "demo",
        crate::string_flag("color", default, variants),
    );
    object["spec"]["flagSpec"]["metadata"] = metadata(notes_bytes);
    serde_norway::to_string(&object).expect("a FeatureFlag is YAML")
}
