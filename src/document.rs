//! The document: a `FeatureFlag` resource turned into the flag configuration JSON that flagd
//! clients parse, and the checks that keep a broken resource from reaching them.
//!
//! The output matches what flagd's own Kubernetes sync produces:
//! `{"flags": {...}, "metadata": ..., "$evaluators": ...}`, with exactly the keys `state`,
//! `variants`, `defaultVariant` (always a string), `targeting` and `metadata` per flag. Some
//! clients reject a whole payload for one unknown key, so nothing else is passed through.
//!
//! The checks come in two kinds:
//!
//! - [`DocumentError`]: problems that break a client's parser or make the whole payload unusable
//!   (not an object, `flags` or `$evaluators` not an object, a flag whose `state`, `variants`,
//!   `defaultVariant`, `metadata` or `targeting` has the wrong shape, a `defaultVariant` that is
//!   not one of the flag's variants, metadata that is not flat, nesting deeper than
//!   [`MAX_DEPTH`]). Such a version is refused.
//! - [`DocumentWarning`]: problems that flagd tolerates when it loads a document and reports
//!   for one flag only, when that flag is evaluated (a targeting rule with an operator this
//!   proxy does not know, a reference to a shared evaluator that is not defined). Such a version
//!   is served as it is, and the warnings are told to whoever edits the resource. The proxy
//!   never refuses an operator it does not know: a newer flagd may know it.
use std::collections::BTreeSet;
use std::fmt;

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
/// `ends_with`) and evaluator references (`$ref`). Only used to warn: an operator missing here
/// may be one that a newer flagd knows, so it never makes a document invalid.
const KNOWN_OPERATORS: &[&str] = &[
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

/// A problem that flagd tolerates when it loads a document and reports for the flags concerned
/// only, when they are evaluated. A document with warnings is served as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentWarning {
    pub place: Place,
    pub problem: Problem,
}

/// Where a [`DocumentWarning`] is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    /// A flag's targeting rule.
    Flag(String),
    /// A shared evaluator in `$evaluators`, which the flags that refer to it use.
    Evaluator(String),
}

/// What a [`DocumentWarning`] is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Operators this proxy does not know (each once, sorted). Clients that do not know them
    /// either evaluate the flags concerned to `PARSE_ERROR`; a newer flagd may know them.
    UnknownOperators(Vec<String>),
    /// `$ref`s to shared evaluators that `$evaluators` does not define (each once, sorted).
    UndefinedEvaluators(Vec<String>),
}

impl fmt::Display for DocumentWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (subject, evaluated) = match &self.place {
            Place::Flag(flag) => (format!("flag {flag:?}: targeting"), "this flag"),
            Place::Evaluator(name) => (
                format!("evaluator {name:?}"),
                "the flags that use this evaluator",
            ),
        };
        match &self.problem {
            Problem::UnknownOperators(operators) => write!(
                f,
                "{subject} uses {}, which this proxy does not know; clients that do not know {} \
                 either evaluate {evaluated} to PARSE_ERROR",
                quoted("operator", operators),
                if operators.len() == 1 { "it" } else { "them" },
            ),
            Problem::UndefinedEvaluators(names) => write!(
                f,
                "{subject} refers to {}, which $evaluators does not define; clients cannot \
                 evaluate {evaluated} (they answer with an error and the caller's default)",
                quoted("evaluator", names),
            ),
        }
    }
}

/// `operator "a"`, or `operators "a", "b"`.
fn quoted(noun: &str, names: &[String]) -> String {
    let list: Vec<String> = names.iter().map(|name| format!("{name:?}")).collect();
    let plural = if names.len() == 1 { "" } else { "s" };
    format!("{noun}{plural} {}", list.join(", "))
}

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

/// The warnings found so far in one document.
struct Warnings<'a> {
    /// The document's shared evaluators, which `$ref`s name.
    evaluators: Option<&'a Map<String, Value>>,
    found: Vec<DocumentWarning>,
}

impl Warnings<'_> {
    /// Walks the JsonLogic rule at `place`: every key of an object in it is an operator, and the
    /// argument of `$ref` names a shared evaluator. An empty object is the empty rule.
    fn rule(&mut self, place: Place, rule: &Value) {
        let mut unknown = BTreeSet::new();
        let mut undefined = BTreeSet::new();
        // Nesting is bounded by `MAX_DEPTH` (checked first), but a stack costs nothing more.
        let mut pending = vec![rule];
        while let Some(value) = pending.pop() {
            match value {
                Value::Object(map) => {
                    for (operator, args) in map {
                        if operator == "$ref" {
                            if let Value::String(name) = args
                                && !self.evaluators.is_some_and(|e| e.contains_key(name))
                            {
                                undefined.insert(name.clone());
                            }
                        } else if !KNOWN_OPERATORS.contains(&operator.as_str()) {
                            unknown.insert(operator.clone());
                        }
                        pending.push(args);
                    }
                }
                Value::Array(items) => pending.extend(items),
                _ => {}
            }
        }
        if !unknown.is_empty() {
            self.found.push(DocumentWarning {
                place: place.clone(),
                problem: Problem::UnknownOperators(unknown.into_iter().collect()),
            });
        }
        if !undefined.is_empty() {
            self.found.push(DocumentWarning {
                place,
                problem: Problem::UndefinedEvaluators(undefined.into_iter().collect()),
            });
        }
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
