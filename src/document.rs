//! The document: a `FeatureFlag` resource turned into the flag configuration JSON that flagd
//! clients parse, and the checks that keep a broken resource from reaching them.
//!
//! The output matches what flagd's own Kubernetes sync produces:
//! `{"flags": {...}, "metadata": ..., "$evaluators": ...}`, with at most the keys `state`,
//! `variants`, `defaultVariant`, `targeting` and `metadata` per flag, each as the resource has
//! it. Some clients reject a whole payload for one unknown key, so nothing else is passed
//! through.
//!
//! The checks follow flagd, the reference server, and come in two kinds:
//!
//! - [`DocumentError`]: what makes flagd refuse the whole document when it loads it (not an
//!   object, `flags` missing or not an object, a flag that is not an object, a field of the
//!   wrong JSON type, a `defaultVariant` that is not one of the flag's variants, an empty shared
//!   evaluator), and what cannot be delivered at all (nesting deeper than [`MAX_DEPTH`]; the
//!   size limit is the hub's). Such a version is refused.
//! - [`DocumentWarning`]: everything flagd loads although its schema says otherwise, and what it
//!   reports for one flag only, when that flag is evaluated (a `state` other than `ENABLED` or
//!   `DISABLED`, variants of mixed types or holding null, targeting that is not a rule, an
//!   operator flagd does not know, a reference to a shared evaluator that is not defined). Such
//!   a version is served as it is, and the warnings are told to whoever edits the resource.
//!
//! This file holds the limits and the error; the steps are in `conversion.rs` (a resource to a
//! document), `validation.rs` (what makes a document unusable) and `warnings.rs` (what clients
//! report per flag).
use serde_json::Value;

mod conversion;
mod validation;
mod warnings;

pub use conversion::{Converted, context_bytes, convert, from_resource};
pub use validation::{check, validate};
pub use warnings::{DocumentWarning, KNOWN_OPERATORS, Place, Problem, SCHEMA_OPERATORS};

/// The keys of a flag in a converted document: all that clients get.
pub const FLAG_KEYS: &[&str] = &[
    "state",
    "variants",
    "defaultVariant",
    "targeting",
    "metadata",
];
/// The keys of a converted document.
pub const DOCUMENT_KEYS: &[&str] = &["flags", "metadata", "$evaluators"];

/// Why a resource or document was rejected. The message names the offending place.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DocumentError {
    #[error("the resource has no spec.flagSpec object")]
    MissingFlagSpec,
    #[error("`flags` is missing")]
    FlagsMissing,
    #[error("`flags` must be an object mapping flag keys to flags, found {found}")]
    FlagsNotAnObject { found: &'static str },
    #[error("flag {flag:?}: {reason}")]
    InvalidFlag { flag: String, reason: String },
    #[error("`metadata` must be an object: {reason}")]
    InvalidMetadata { reason: String },
    #[error("`$evaluators` must be an object of JsonLogic rules, none of them empty: {reason}")]
    InvalidEvaluators { reason: String },
    #[error("the document is not a JSON object")]
    NotAnObject,
    #[error("objects and arrays are nested more than {MAX_DEPTH} levels deep")]
    TooDeep,
}

/// The deepest nesting of objects and arrays accepted in a resource or document, from every
/// source (flag configurations in practice stay within a dozen or two levels).
pub const MAX_DEPTH: usize = 64;

/// How deeply objects and arrays nest in `value` (a scalar is 0), counted without recursion.
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(value, 0usize)];
    while let Some((value, level)) = pending.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Object(map) => Box::new(map.values()),
            Value::Array(items) => Box::new(items.iter()),
            _ => continue,
        };
        deepest = deepest.max(level + 1);
        pending.extend(children.map(|child| (child, level + 1)));
    }
    deepest
}

fn invalid(flag: &str, reason: &str) -> DocumentError {
    DocumentError::InvalidFlag {
        flag: flag.to_owned(),
        reason: reason.to_owned(),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;
