//! From a `FeatureFlag` resource to the document clients get: the flag configuration under
//! `spec.flagSpec` is checked as flagd would load it ([`check`]), rebuilt with only the keys
//! clients accept ([`FLAG_KEYS`](super::FLAG_KEYS), [`DOCUMENT_KEYS`](super::DOCUMENT_KEYS);
//! the array form of `flags` becomes the map form, as flagd reads it) and rendered as JSON,
//! with the size its metadata adds to every message.
use serde_json::{Map, Value};

use super::validation::field;
use super::{DocumentError, DocumentWarning, FLAG_KEYS, MAX_DEPTH, check, depth};

/// A flag configuration document made from a resource, and what clients will report about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Converted {
    /// The flag configuration JSON clients get.
    pub document: String,
    /// Problems clients report per flag; the document is served all the same.
    pub warnings: Vec<DocumentWarning>,
    /// What the flag set's metadata adds to every message besides the document
    /// ([`context_bytes`]).
    pub context_bytes: usize,
}

/// Bytes the flag set's metadata adds to a message besides the document: `flagd.sync.v1` sends
/// its scalar entries again in every message's `sync_context`. An upper bound of their protobuf
/// encoding (key, value and each entry's framing).
pub fn context_bytes(document: &Value) -> usize {
    /// Tags, lengths and the value's kind of one `Struct` entry, at most.
    const ENTRY_FRAMING: usize = 16;
    let Some(Value::Object(metadata)) = document.get("metadata") else {
        return 0;
    };
    metadata
        .iter()
        .map(|(key, value)| {
            let value = match value {
                Value::String(s) => s.len(),
                Value::Bool(_) => 1,
                Value::Number(_) => 8,
                _ => return 0,
            };
            key.len() + value + ENTRY_FRAMING
        })
        .sum()
}

/// Builds the flag configuration document from a `FeatureFlag` resource (as JSON) and checks it:
/// an error if clients cannot use it, else the document and its warnings.
pub fn convert(resource: &Value) -> Result<Converted, DocumentError> {
    if depth(resource) > MAX_DEPTH {
        return Err(DocumentError::TooDeep);
    }
    let flag_spec = resource
        .pointer("/spec/flagSpec")
        .filter(|spec| spec.is_object())
        .ok_or(DocumentError::MissingFlagSpec)?;
    let warnings = check(flag_spec)?;
    let document = from_flag_spec(
        flag_spec
            .as_object()
            .ok_or(DocumentError::MissingFlagSpec)?,
    );
    Ok(Converted {
        context_bytes: context_bytes(&document),
        document: document.to_string(),
        warnings,
    })
}

/// [`convert`], for callers that need the document only.
pub fn from_resource(resource: &Value) -> Result<String, DocumentError> {
    convert(resource).map(|converted| converted.document)
}

/// The document clients get from a flag spec that [`check`] accepted: what flagd reads of it,
/// under the keys clients know.
fn from_flag_spec(spec: &Map<String, Value>) -> Value {
    let mut out_flags = Map::new();
    match field(spec, "flags") {
        Some(Value::Object(flags)) => {
            for (key, flag) in flags {
                out_flags.insert(key.clone(), client_flag(flag));
            }
        }
        Some(Value::Array(flags)) => {
            for flag in flags {
                if let Value::Object(object) = flag
                    && let Some(Value::String(key)) = field(object, "key")
                    && !key.is_empty()
                {
                    out_flags.insert(key.clone(), client_flag(flag));
                }
            }
        }
        _ => {}
    }
    let mut document = Map::with_capacity(3);
    document.insert("flags".to_owned(), Value::Object(out_flags));
    for name in ["metadata", "$evaluators"] {
        match field(spec, name) {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) if map.is_empty() => {}
            Some(value) => {
                document.insert(name.to_owned(), value.clone());
            }
        }
    }
    Value::Object(document)
}

/// A flag as clients get it: the fields flagd reads, under their own names, each as the
/// resource has it (a missing field stays missing and a null one null: clients may tell them
/// apart, and flagd does not). A `null` flag stays `null` (flagd loads it with nothing set).
fn client_flag(flag: &Value) -> Value {
    let Value::Object(flag) = flag else {
        return Value::Null;
    };
    let mut out = Map::with_capacity(FLAG_KEYS.len());
    for name in FLAG_KEYS {
        if let Some(value) = field(flag, name) {
            out.insert((*name).to_owned(), value.clone());
        }
    }
    Value::Object(out)
}
