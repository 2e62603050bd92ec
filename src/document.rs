//! The document: a `FeatureFlag` resource turned into the flag configuration JSON that flagd
//! clients parse, and the structural checks that keep a broken resource from reaching them.
//!
//! The output matches what flagd's own Kubernetes sync produces:
//! `{"flags": {...}, "metadata": ..., "$evaluators": ...}`, with exactly the keys `state`,
//! `variants`, `defaultVariant` (always a string), `targeting` and `metadata` per flag. Some
//! clients reject a whole payload for one unknown key, so nothing else is passed through.
use serde_json::{Map, Value};

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

/// JsonLogic operators flagd understands, plus its own (`fractional`, `sem_ver`, `starts_with`,
/// `ends_with`) and evaluator references (`$ref`).
const OPERATORS: &[&str] = &[
    "!",
    "!!",
    "!=",
    "!==",
    "%",
    "*",
    "+",
    "-",
    "/",
    "<",
    "<=",
    "==",
    "===",
    ">",
    ">=",
    "?:",
    "all",
    "and",
    "cat",
    "ends_with",
    "filter",
    "fractional",
    "if",
    "in",
    "log",
    "map",
    "max",
    "merge",
    "min",
    "missing",
    "missing_some",
    "none",
    "or",
    "reduce",
    "sem_ver",
    "some",
    "starts_with",
    "substr",
    "var",
    "$ref",
];

/// Why a resource or document was rejected. The message names the offending place.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DocumentError {
    #[error("the resource has no spec.flagSpec object")]
    MissingFlagSpec,
    #[error("`flags` must be an object mapping flag keys to flags")]
    FlagsNotAnObject,
    #[error("flag {flag:?}: {reason}")]
    InvalidFlag { flag: String, reason: String },
    #[error("`metadata` must be an object of string, number or boolean values: {reason}")]
    InvalidMetadata { reason: String },
    #[error("`$evaluators` must be an object of JsonLogic rules: {reason}")]
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

/// Builds the flag configuration document from a `FeatureFlag` resource (as JSON) and checks it.
pub fn from_resource(resource: &Value) -> Result<String, DocumentError> {
    if depth(resource) > MAX_DEPTH {
        return Err(DocumentError::TooDeep);
    }
    let flag_spec = resource
        .pointer("/spec/flagSpec")
        .and_then(Value::as_object)
        .ok_or(DocumentError::MissingFlagSpec)?;
    let document = from_flag_spec(flag_spec)?;
    validate(&document)?;
    Ok(document.to_string())
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

/// Checks a flag configuration document against the structure flagd clients rely on.
pub fn validate(document: &Value) -> Result<(), DocumentError> {
    if depth(document) > MAX_DEPTH {
        return Err(DocumentError::TooDeep);
    }
    let document = document.as_object().ok_or(DocumentError::NotAnObject)?;
    let flags = match document.get("flags") {
        Some(Value::Object(flags)) => flags,
        _ => return Err(DocumentError::FlagsNotAnObject),
    };
    for (key, flag) in flags {
        validate_flag(key, flag)?;
    }
    if let Some(metadata) = document.get("metadata") {
        check_metadata(metadata).map_err(|reason| DocumentError::InvalidMetadata { reason })?;
    }
    if let Some(evaluators) = document.get("$evaluators") {
        let Value::Object(evaluators) = evaluators else {
            return Err(DocumentError::InvalidEvaluators {
                reason: format!("found {}", kind(evaluators)),
            });
        };
        for (name, rule) in evaluators {
            check_rule(rule).map_err(|reason| DocumentError::InvalidEvaluators {
                reason: format!("{name:?}: {reason}"),
            })?;
        }
    }
    Ok(())
}

fn validate_flag(key: &str, flag: &Value) -> Result<(), DocumentError> {
    if key.is_empty() {
        return Err(invalid(key, "flag keys must not be empty"));
    }
    let Value::Object(flag) = flag else {
        return Err(invalid(key, "a flag must be an object"));
    };
    match flag.get("state") {
        Some(Value::String(s)) if s == "ENABLED" || s == "DISABLED" => {}
        Some(other) => {
            return Err(invalid(
                key,
                &format!("state must be \"ENABLED\" or \"DISABLED\", found {other}"),
            ));
        }
        None => return Err(invalid(key, "state is required")),
    }
    let variants = check_variants(key, flag.get("variants"))?;
    match flag.get("defaultVariant") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() || variants.contains_key(s) => {}
        Some(Value::String(s)) => {
            return Err(invalid(
                key,
                &format!("defaultVariant {s:?} is not one of the variants"),
            ));
        }
        Some(other) => {
            return Err(invalid(
                key,
                &format!("defaultVariant must be a string, found {}", kind(other)),
            ));
        }
    }
    if let Some(metadata) = flag.get("metadata") {
        check_metadata(metadata).map_err(|reason| invalid(key, &format!("metadata: {reason}")))?;
    }
    if let Some(targeting) = flag.get("targeting") {
        match targeting {
            Value::Object(_) => check_rule(targeting)
                .map_err(|reason| invalid(key, &format!("targeting: {reason}")))?,
            other => {
                return Err(invalid(
                    key,
                    &format!("targeting must be an object, found {}", kind(other)),
                ));
            }
        }
    }
    Ok(())
}

/// The variants of flag `key`: an object of flag values, all of one type, not empty.
fn check_variants<'a>(
    key: &str,
    variants: Option<&'a Value>,
) -> Result<&'a Map<String, Value>, DocumentError> {
    let variants = match variants {
        Some(Value::Object(variants)) => variants,
        Some(other) => {
            return Err(invalid(
                key,
                &format!("variants must be an object, found {}", kind(other)),
            ));
        }
        None => return Err(invalid(key, "variants is required")),
    };
    let mut first_kind = None;
    for (name, value) in variants {
        let this = variant_kind(value).ok_or_else(|| {
            invalid(
                key,
                &format!("variant {name:?} is {}, not a flag value", kind(value)),
            )
        })?;
        match first_kind {
            None => first_kind = Some(this),
            Some(first) if first != this => {
                return Err(invalid(
                    key,
                    &format!("variants mix types: {first} and {this} (variant {name:?})"),
                ));
            }
            Some(_) => {}
        }
    }
    if first_kind.is_none() {
        return Err(invalid(key, "variants must not be empty"));
    }
    Ok(variants)
}

/// The type of a variant value; variants of one flag must all share it.
fn variant_kind(value: &Value) -> Option<&'static str> {
    match value {
        Value::Bool(_) => Some("boolean"),
        Value::String(_) => Some("string"),
        Value::Number(_) => Some("number"),
        Value::Object(_) => Some("object"),
        Value::Array(_) | Value::Null => None,
    }
}

fn check_metadata(metadata: &Value) -> Result<(), String> {
    let Value::Object(map) = metadata else {
        return Err(format!("expected an object, found {}", kind(metadata)));
    };
    for (name, value) in map {
        if !matches!(value, Value::String(_) | Value::Number(_) | Value::Bool(_)) {
            return Err(format!("{name:?} is {}", kind(value)));
        }
    }
    Ok(())
}

/// Walks a JsonLogic rule: every object in it must be a single known operator.
/// An empty object is the empty rule (no targeting).
fn check_rule(rule: &Value) -> Result<(), String> {
    match rule {
        Value::Object(map) if map.is_empty() => Ok(()),
        Value::Object(map) => {
            for (op, args) in map {
                if !OPERATORS.contains(&op.as_str()) {
                    return Err(format!("unknown operator {op:?}"));
                }
                check_rule(args)?;
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(check_rule),
        _ => Ok(()),
    }
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
