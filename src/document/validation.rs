//! The check of a flag configuration document, with flagd (the reference server) as the
//! judge: a document is refused ([`DocumentError`]) exactly where flagd refuses it as a whole
//! when it loads it, and every problem flagd loads and then reports for one flag only (or not
//! at all) is a [`DocumentWarning`] naming the flag.
//!
//! flagd reads a document into Go structs (`encoding/json`): a field of the wrong JSON type
//! (`state: 5`, `variants: []`, a flag that is a number) fails the whole document, `null` leaves
//! a field empty, and field names match without regard to ASCII case. After that it checks one
//! thing only: a non-empty `defaultVariant` must name a variant. Its JSON schema is advisory
//! (flagd logs a schema failure and loads the document), so `state: "ON"`, mixed variant types,
//! a `null` variant or a string as targeting are served, and warned about.
use serde_json::{Map, Value};

use super::warnings::Warnings;
use super::{DocumentError, DocumentWarning, MAX_DEPTH, Place, Problem, depth, invalid, kind};

/// The value of `name` in `map` as flagd's decoder finds it: the key itself, else a key that
/// equals it but for ASCII case.
pub(super) fn field<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name).or_else(|| {
        map.iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
    })
}

/// Every value of `map` under `name`, whatever its ASCII case: flagd decodes each of them.
fn fields<'a>(map: &'a Map<String, Value>, name: &'a str) -> impl Iterator<Item = &'a Value> {
    map.iter()
        .filter(move |(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value)
}

/// Checks a flag configuration document: an error where flagd refuses it as a whole, else the
/// problems clients report (or may report) for some of its flags.
pub fn check(document: &Value) -> Result<Vec<DocumentWarning>, DocumentError> {
    if depth(document) > MAX_DEPTH {
        return Err(DocumentError::TooDeep);
    }
    let document = document.as_object().ok_or(DocumentError::NotAnObject)?;
    let evaluators = evaluators(document)?;
    let mut warnings = Warnings {
        evaluators,
        found: Vec::new(),
    };
    for metadata in fields(document, "metadata") {
        match metadata {
            Value::Null => {}
            Value::Object(entries) => warnings.metadata(Place::FlagSet, entries),
            other => {
                return Err(DocumentError::InvalidMetadata {
                    reason: format!("found {}", kind(other)),
                });
            }
        }
    }
    match field(document, "flags") {
        None => return Err(DocumentError::FlagsMissing),
        Some(Value::Null) => {}
        Some(Value::Object(flags)) => {
            for (key, flag) in flags {
                check_flag(key, key, flag, &mut warnings)?;
            }
        }
        Some(Value::Array(flags)) => {
            // flagd's array form: each flag names its key.
            for (index, flag) in flags.iter().enumerate() {
                let key = match flag {
                    Value::Object(object) => match field(object, "key") {
                        Some(Value::String(key)) => key.as_str(),
                        _ => "",
                    },
                    _ => "",
                };
                let shown = if key.is_empty() {
                    format!("#{index}")
                } else {
                    key.to_owned()
                };
                check_flag(key, &shown, flag, &mut warnings)?;
            }
        }
        Some(other) => {
            return Err(DocumentError::FlagsNotAnObject { found: kind(other) });
        }
    }
    for (name, rule) in evaluators.into_iter().flatten() {
        warnings.rule(Place::Evaluator(name.clone()), rule);
    }
    Ok(warnings.found)
}

/// The document's shared evaluators: an object (or null), and no entry shorter than three
/// bytes of JSON (flagd refuses `{}`, `[]`, `""` or a one- or two-digit number as "empty").
fn evaluators(document: &Map<String, Value>) -> Result<Option<&Map<String, Value>>, DocumentError> {
    let mut found = None;
    for evaluators in fields(document, "$evaluators") {
        match evaluators {
            Value::Null => {}
            Value::Object(entries) => {
                if let Some((name, _)) = entries.iter().find(|(_, rule)| rule.to_string().len() < 3)
                {
                    return Err(DocumentError::InvalidEvaluators {
                        reason: format!("evaluator {name:?} is empty"),
                    });
                }
                found = Some(entries);
            }
            other => {
                return Err(DocumentError::InvalidEvaluators {
                    reason: format!("found {}", kind(other)),
                });
            }
        }
    }
    Ok(found)
}

/// Whether clients can use a flag configuration document ([`check`] without its warnings).
pub fn validate(document: &Value) -> Result<(), DocumentError> {
    check(document).map(drop)
}

/// The fields of a flag that flagd decodes as strings, and those it decodes as objects: any
/// other JSON type there (but null) fails the whole document.
const STRING_FIELDS: [&str; 4] = ["state", "defaultVariant", "key", "source"];
const OBJECT_FIELDS: [&str; 2] = ["variants", "metadata"];

/// Whether `name` is one of `names` but for ASCII case.
fn one_of(name: &str, names: &[&str]) -> bool {
    names.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// Checks the flag under `key` (empty: a flag that has none, which flagd drops when it stores
/// the flags), named `shown` in warnings.
fn check_flag(
    key: &str,
    shown: &str,
    flag: &Value,
    warnings: &mut Warnings,
) -> Result<(), DocumentError> {
    let flag = match flag {
        Value::Object(flag) => flag,
        Value::Null if key.is_empty() => {
            warnings.flag(shown, Problem::NoKey);
            return Ok(());
        }
        Value::Null => {
            warnings.flag(shown, Problem::Null);
            return Ok(());
        }
        other => {
            return Err(invalid(
                shown,
                &format!("a flag must be an object, found {}", kind(other)),
            ));
        }
    };
    for (name, value) in flag {
        let expected = if one_of(name, &STRING_FIELDS)
            && !matches!(value, Value::String(_) | Value::Null)
        {
            "a string"
        } else if one_of(name, &OBJECT_FIELDS) && !matches!(value, Value::Object(_) | Value::Null) {
            "an object"
        } else {
            continue;
        };
        return Err(invalid(
            shown,
            &format!("{name} must be {expected}, found {}", kind(value)),
        ));
    }
    let variants = match field(flag, "variants") {
        Some(Value::Object(variants)) => Some(variants),
        _ => None,
    };
    if let Some(Value::String(default)) = field(flag, "defaultVariant")
        && !default.is_empty()
        && !variants.is_some_and(|v| v.contains_key(default))
    {
        return Err(invalid(
            shown,
            &format!("defaultVariant {default:?} is not one of the variants"),
        ));
    }
    if key.is_empty() {
        warnings.flag(shown, Problem::NoKey);
        return Ok(());
    }
    match field(flag, "state") {
        Some(Value::String(state)) if state == "ENABLED" || state == "DISABLED" => {}
        Some(Value::String(state)) => warnings.flag(shown, Problem::State(Some(state.clone()))),
        _ => warnings.flag(shown, Problem::State(None)),
    }
    check_variants(shown, variants, warnings);
    if let Some(Value::Object(metadata)) = field(flag, "metadata") {
        warnings.metadata(Place::Flag(shown.to_owned()), metadata);
    }
    match field(flag, "targeting") {
        None => {}
        Some(rule @ Value::Object(_)) => warnings.rule(Place::Flag(shown.to_owned()), rule),
        Some(other) => warnings.flag(shown, Problem::Targeting(kind(other))),
    }
    Ok(())
}

/// Variants that are not all flag values of one type: served, and warned about.
fn check_variants(key: &str, variants: Option<&Map<String, Value>>, warnings: &mut Warnings) {
    let Some(variants) = variants.filter(|v| !v.is_empty()) else {
        warnings.flag(key, Problem::NoVariants);
        return;
    };
    let mut first_kind: Option<&'static str> = None;
    for (name, value) in variants {
        let Some(this) = variant_kind(value) else {
            warnings.flag(
                key,
                Problem::VariantValue {
                    variant: name.clone(),
                    found: kind(value),
                },
            );
            continue;
        };
        match first_kind {
            None => first_kind = Some(this),
            Some(first) if first != this => {
                warnings.flag(key, Problem::MixedVariants(first, this));
                return;
            }
            Some(_) => {}
        }
    }
}

/// The type of a variant value; variants of one flag should all share it.
fn variant_kind(value: &Value) -> Option<&'static str> {
    match value {
        Value::Bool(_) => Some("a boolean"),
        Value::String(_) => Some("a string"),
        Value::Number(_) => Some("a number"),
        Value::Object(_) => Some("an object"),
        Value::Array(_) | Value::Null => None,
    }
}
