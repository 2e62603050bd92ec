//! The document: a `FeatureFlag` resource turned into the flag configuration JSON that flagd
//! clients parse, and the structural checks that keep a broken resource from reaching them.
//!
//! The output matches what flagd's own Kubernetes sync produces:
//! `{"flags": {...}, "metadata": ..., "$evaluators": ...}`, with exactly the keys `state`,
//! `variants`, `defaultVariant` (always a string), `targeting` and `metadata` per flag. Some
//! clients reject a whole payload for one unknown key, so nothing else is passed through.
use serde_json::{Map, Value};

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
    let variants = match flag.get("variants") {
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
mod tests {
    use super::*;
    use serde_json::json;

    fn resource(flag_spec: Value) -> Value {
        json!({"apiVersion": "core.openfeature.dev/v1beta1", "kind": "FeatureFlag",
               "metadata": {"name": "x", "namespace": "default"}, "spec": {"flagSpec": flag_spec}})
    }

    #[test]
    fn emits_exactly_the_client_keys() {
        let doc = from_resource(&resource(json!({
            "flags": {"f": {"state": "ENABLED", "variants": {"a": 1, "b": 2},
                             "defaultVariant": "a", "targeting": {"if": [true, "b"]},
                             "metadata": {"team": "x"}, "description": "dropped"}},
            "$evaluators": {"e": {"in": ["@x", {"var": "email"}]}},
            "metadata": {"flagSetId": "set"},
            "extra": "dropped"
        })))
        .expect("valid");
        let doc: Value = serde_json::from_str(&doc).expect("json");
        assert_eq!(
            doc,
            json!({"flags": {"f": {"state": "ENABLED", "variants": {"a": 1, "b": 2},
                                   "defaultVariant": "a", "targeting": {"if": [true, "b"]},
                                   "metadata": {"team": "x"}}},
                   "$evaluators": {"e": {"in": ["@x", {"var": "email"}]}},
                   "metadata": {"flagSetId": "set"}})
        );
    }

    #[test]
    fn missing_default_variant_becomes_empty_string() {
        let doc = from_resource(&resource(json!({
            "flags": {"f": {"state": "DISABLED", "variants": {"on": true}}}
        })))
        .expect("valid");
        let doc: Value = serde_json::from_str(&doc).expect("json");
        assert_eq!(doc["flags"]["f"]["defaultVariant"], json!(""));
        assert!(doc.get("metadata").is_none() && doc.get("$evaluators").is_none());
    }

    #[test]
    fn empty_metadata_and_evaluators_are_omitted() {
        let doc = from_resource(&resource(json!({
            "flags": {}, "metadata": {}, "$evaluators": {}
        })))
        .expect("valid");
        assert_eq!(doc, r#"{"flags":{}}"#);
    }

    #[test]
    fn rejections_name_the_flag() {
        let cases = [
            (
                json!({"flags": {"f": {"state": "ON", "variants": {"a": 1}}}}),
                "flag \"f\": state",
            ),
            (
                json!({"flags": {"f": {"state": "ENABLED", "variants": {}}}}),
                "must not be empty",
            ),
            (
                json!({"flags": {"f": {"state": "ENABLED", "variants": {"a": 1, "b": "x"}}}}),
                "mix types",
            ),
            (
                json!({"flags": {"f": {"state": "ENABLED", "variants": {"a": 1}, "defaultVariant": "z"}}}),
                "not one of the variants",
            ),
            (
                json!({"flags": {"f": {"state": "ENABLED", "variants": {"a": 1}, "defaultVariant": 3}}}),
                "must be a string",
            ),
            (
                json!({"flags": {"f": {"state": "ENABLED", "variants": {"a": [1]}}}}),
                "not a flag value",
            ),
            (json!({"flags": []}), "`flags` must be an object"),
        ];
        for (spec, needle) in cases {
            let err = from_resource(&resource(spec.clone()))
                .expect_err("rejected")
                .to_string();
            assert!(err.contains(needle), "{spec}: {err:?} lacks {needle:?}");
        }
        let err = from_resource(&json!({"spec": {}})).expect_err("rejected");
        assert_eq!(err, DocumentError::MissingFlagSpec);
    }
}

/// Property tests: arbitrary JSON, biased towards the `FeatureFlag` shape, never makes the
/// conversion panic, and whatever it accepts is a document clients can use.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::select;
    use serde_json::json;

    const FLAG_KEYS: &[&str] = &[
        "state",
        "variants",
        "defaultVariant",
        "targeting",
        "metadata",
    ];
    const DOCUMENT_KEYS: &[&str] = &["flags", "metadata", "$evaluators"];

    fn object(entries: Vec<(String, Value)>) -> Value {
        Value::Object(entries.into_iter().collect())
    }

    /// Object keys: the ones the conversion looks at, operators, and anything else.
    fn key() -> impl Strategy<Value = String> {
        let mut known: Vec<&'static str> = FLAG_KEYS.to_vec();
        known.extend(DOCUMENT_KEYS);
        known.extend(["spec", "flagSpec", "description", "flagSetId", ""]);
        known.extend(OPERATORS);
        prop_oneof![
            3 => select(known).prop_map(str::to_owned),
            1 => "\\PC{0,8}",
        ]
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            // Non-finite floats become null, as serde_json does.
            any::<f64>().prop_map(Value::from),
            select(vec!["ENABLED", "DISABLED", "on", "off", "", "a", "b"])
                .prop_map(|s| Value::String(s.to_owned())),
            "\\PC{0,12}".prop_map(Value::String),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(5, 64, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..5).prop_map(object),
            ]
        })
    }

    /// JsonLogic-like rules: known and unknown operators over arbitrary arguments.
    fn rule() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                (
                    prop_oneof![
                        4 => select(OPERATORS).prop_map(str::to_owned),
                        1 => "\\PC{0,6}",
                    ],
                    inner
                )
                    .prop_map(|(op, args)| object(vec![(op, args)])),
                Just(json!({})),
            ]
        })
    }

    fn variant_name() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => select(vec!["on", "off", "a", "b", ""]).prop_map(str::to_owned),
            1 => "\\PC{0,6}",
        ]
    }

    fn variants() -> impl Strategy<Value = Value> {
        prop_oneof![
            // One type for every variant (mostly valid)...
            3 => prop::collection::vec((variant_name(), any::<bool>().prop_map(Value::Bool)), 0..4)
                .prop_map(object),
            3 => prop::collection::vec((variant_name(), "\\PC{0,6}".prop_map(Value::String)), 0..4)
                .prop_map(object),
            // ...or any mix of values.
            2 => prop::collection::vec((variant_name(), value()), 0..4).prop_map(object),
            1 => value(),
        ]
    }

    fn metadata() -> impl Strategy<Value = Value> {
        prop_oneof![
            3 => prop::collection::vec((key(), leaf()), 0..4).prop_map(object),
            1 => value(),
        ]
    }

    fn flag() -> impl Strategy<Value = Value> {
        let state = prop_oneof![
            4 => select(vec!["ENABLED", "DISABLED"]).prop_map(|s| Value::String(s.to_owned())),
            1 => value(),
        ];
        let default_variant = prop_oneof![
            4 => variant_name().prop_map(Value::String),
            1 => value(),
        ];
        let targeting = prop_oneof![3 => rule(), 1 => value()];
        (
            prop::option::weighted(0.9, state),
            prop::option::weighted(0.9, variants()),
            prop::option::weighted(0.7, default_variant),
            prop::option::weighted(0.4, targeting),
            prop::option::weighted(0.3, metadata()),
            prop::option::weighted(0.2, (key(), value())),
        )
            .prop_map(|(state, variants, default, targeting, metadata, extra)| {
                let mut flag = Map::new();
                for (field, value) in [
                    ("state", state),
                    ("variants", variants),
                    ("defaultVariant", default),
                    ("targeting", targeting),
                    ("metadata", metadata),
                ] {
                    if let Some(value) = value {
                        flag.insert(field.to_owned(), value);
                    }
                }
                if let Some((key, value)) = extra {
                    flag.insert(key, value);
                }
                Value::Object(flag)
            })
    }

    fn flag_spec() -> impl Strategy<Value = Value> {
        let flags = prop_oneof![
            8 => prop::collection::vec(
                (prop_oneof![3 => "[a-z-]{1,8}", 1 => key()], prop_oneof![6 => flag(), 1 => value()]),
                0..4,
            )
            .prop_map(object),
            1 => value(),
        ];
        let evaluators = prop_oneof![
            3 => prop::collection::vec(("[a-z]{1,6}", rule()), 0..3).prop_map(object),
            1 => value(),
        ];
        (
            prop::option::weighted(0.95, flags),
            prop::option::weighted(0.3, metadata()),
            prop::option::weighted(0.3, evaluators),
            prop::option::weighted(0.2, (key(), value())),
        )
            .prop_map(|(flags, metadata, evaluators, extra)| {
                let mut spec = Map::new();
                for (field, value) in [
                    ("flags", flags),
                    ("metadata", metadata),
                    ("$evaluators", evaluators),
                ] {
                    if let Some(value) = value {
                        spec.insert(field.to_owned(), value);
                    }
                }
                if let Some((key, value)) = extra {
                    spec.insert(key, value);
                }
                Value::Object(spec)
            })
    }

    /// Mostly `FeatureFlag` objects; sometimes a broken spec, sometimes anything at all.
    fn resource() -> impl Strategy<Value = Value> {
        prop_oneof![
            8 => flag_spec().prop_map(|spec| json!({
                "apiVersion": "core.openfeature.dev/v1beta1",
                "kind": "FeatureFlag",
                "metadata": {"name": "x", "namespace": "default"},
                "spec": {"flagSpec": spec},
            })),
            1 => value().prop_map(|spec| json!({"spec": {"flagSpec": spec}})),
            1 => value(),
        ]
    }

    fn check_document(text: &str) -> Result<(), TestCaseError> {
        let document: Value = serde_json::from_str(text)
            .map_err(|e| TestCaseError::fail(format!("not JSON: {e}: {text}")))?;
        prop_assert_eq!(validate(&document), Ok(()));
        let top = document.as_object().expect("validated as an object");
        for key in top.keys() {
            prop_assert!(DOCUMENT_KEYS.contains(&key.as_str()), "key {:?}", key);
        }
        let flags = top["flags"].as_object().expect("validated as an object");
        for (name, flag) in flags {
            let flag = flag.as_object().expect("validated as an object");
            for key in flag.keys() {
                prop_assert!(
                    FLAG_KEYS.contains(&key.as_str()),
                    "flag {:?} has key {:?}",
                    name,
                    key
                );
            }
            for required in ["state", "variants", "defaultVariant"] {
                prop_assert!(
                    flag.contains_key(required),
                    "flag {:?} lacks {}",
                    name,
                    required
                );
            }
            prop_assert!(
                flag["defaultVariant"].is_string(),
                "flag {:?}: defaultVariant {}",
                name,
                flag["defaultVariant"]
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn conversion_yields_a_valid_document_or_an_error(resource in resource()) {
            match from_resource(&resource) {
                Ok(text) => check_document(&text)?,
                Err(error) => prop_assert!(!error.to_string().is_empty()),
            }
        }

        #[test]
        fn validation_never_panics(document in prop_oneof![
            3 => flag_spec(),
            1 => value(),
        ]) {
            let _ = validate(&document);
        }
    }

    #[test]
    fn depth_is_bounded() {
        let mut deep = json!(1);
        for _ in 0..MAX_DEPTH {
            deep = json!([deep]);
        }
        assert_eq!(depth(&deep), MAX_DEPTH);
        assert_eq!(depth(&json!({"a": [1, {"b": {}}], "c": 2})), 4);
        let resource = json!({"spec": {"flagSpec": {"flags": {"f": {"state": "ENABLED",
            "variants": {"on": true}, "defaultVariant": "on", "targeting": deep}}}}});
        assert_eq!(from_resource(&resource), Err(DocumentError::TooDeep));
    }
}
