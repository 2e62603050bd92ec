//! The checks of a flag configuration document against the structure flagd clients rely on:
//! what makes a version unusable ([`DocumentError`]), flag by flag (state, variants,
//! `defaultVariant`, metadata, targeting), with the targeting rules handed to [`Warnings`] for
//! what clients only report when they evaluate a flag.
use serde_json::{Map, Value};

use super::warnings::Warnings;
use super::{DocumentError, DocumentWarning, MAX_DEPTH, Place, depth, invalid, kind};

/// Checks a flag configuration document against the structure flagd clients rely on: an error
/// if clients cannot use it, else the problems they report per flag when they evaluate it.
pub fn check(document: &Value) -> Result<Vec<DocumentWarning>, DocumentError> {
    if depth(document) > MAX_DEPTH {
        return Err(DocumentError::TooDeep);
    }
    let document = document.as_object().ok_or(DocumentError::NotAnObject)?;
    let flags = match document.get("flags") {
        Some(Value::Object(flags)) => flags,
        _ => return Err(DocumentError::FlagsNotAnObject),
    };
    let evaluators = match document.get("$evaluators") {
        None => None,
        Some(Value::Object(evaluators)) => Some(evaluators),
        Some(other) => {
            return Err(DocumentError::InvalidEvaluators {
                reason: format!("found {}", kind(other)),
            });
        }
    };
    let mut warnings = Warnings {
        evaluators,
        found: Vec::new(),
    };
    for (key, flag) in flags {
        validate_flag(key, flag, &mut warnings)?;
    }
    if let Some(metadata) = document.get("metadata") {
        check_metadata(metadata).map_err(|reason| DocumentError::InvalidMetadata { reason })?;
    }
    for (name, rule) in evaluators.into_iter().flatten() {
        warnings.rule(Place::Evaluator(name.clone()), rule);
    }
    Ok(warnings.found)
}

/// Whether clients can use a flag configuration document ([`check`] without its warnings).
pub fn validate(document: &Value) -> Result<(), DocumentError> {
    check(document).map(drop)
}

fn validate_flag(key: &str, flag: &Value, warnings: &mut Warnings) -> Result<(), DocumentError> {
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
            Value::Object(_) => warnings.rule(Place::Flag(key.to_owned()), targeting),
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
