//! From a `FeatureFlag` resource to the document clients get: the flag configuration under
//! `spec.flagSpec` is parsed, rebuilt with only the keys clients accept
//! ([`FLAG_KEYS`](super::FLAG_KEYS), [`DOCUMENT_KEYS`](super::DOCUMENT_KEYS)), checked
//! ([`check`]) and rendered as JSON, with the size its metadata adds to every message.
use serde_json::{Map, Value};

use super::{DocumentError, DocumentWarning, MAX_DEPTH, check, depth, invalid, kind};

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
        .and_then(Value::as_object)
        .ok_or(DocumentError::MissingFlagSpec)?;
    let document = from_flag_spec(flag_spec)?;
    let warnings = check(&document)?;
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

fn from_flag_spec(spec: &Map<String, Value>) -> Result<Value, DocumentError> {
    let flags = match spec.get("flags") {
        Some(Value::Object(flags)) => flags,
        _ => return Err(DocumentError::FlagsNotAnObject),
    };
    let mut out_flags = Map::with_capacity(flags.len());
    for (key, flag) in flags {
        let Value::Object(flag) = flag else {
            return Err(invalid(key, "a flag must be an object"));
        };
        let mut out = Map::with_capacity(5);
        for field in ["state", "variants"] {
            if let Some(value) = flag.get(field) {
                out.insert(field.to_owned(), value.clone());
            }
        }
        let default_variant = match flag.get("defaultVariant") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(invalid(
                    key,
                    &format!("defaultVariant must be a string, found {}", kind(other)),
                ));
            }
        };
        out.insert("defaultVariant".to_owned(), Value::String(default_variant));
        for field in ["targeting", "metadata"] {
            match flag.get(field) {
                None | Some(Value::Null) => {}
                Some(value) => {
                    out.insert(field.to_owned(), value.clone());
                }
            }
        }
        out_flags.insert(key.clone(), Value::Object(out));
    }
    let mut document = Map::with_capacity(3);
    document.insert("flags".to_owned(), Value::Object(out_flags));
    for field in ["metadata", "$evaluators"] {
        match spec.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) if map.is_empty() => {}
            Some(value) => {
                document.insert(field.to_owned(), value.clone());
            }
        }
    }
    Ok(Value::Object(document))
}
