//! Property tests: arbitrary JSON, biased towards the `FeatureFlag` shape, never makes the
//! conversion panic, and whatever it accepts is a document of the keys clients know that the
//! check accepts again.
use super::warnings::KNOWN_OPERATORS;
use super::*;
use crate::document::{DOCUMENT_KEYS, FLAG_KEYS};
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Value, json};

/// An object of the fields that are present, and one `extra` field.
fn present<const N: usize>(
    fields: [(&str, Option<Value>); N],
    extra: Option<(String, Value)>,
) -> Value {
    let mut object = Map::new();
    for (field, value) in fields {
        if let Some(value) = value {
            object.insert(field.to_owned(), value);
        }
    }
    if let Some((key, value)) = extra {
        object.insert(key, value);
    }
    Value::Object(object)
}

fn object(entries: Vec<(String, Value)>) -> Value {
    Value::Object(entries.into_iter().collect())
}

/// Object keys: the ones the conversion looks at, operators, and anything else.
fn key() -> impl Strategy<Value = String> {
    let mut known: Vec<&'static str> = FLAG_KEYS.to_vec();
    known.extend(DOCUMENT_KEYS);
    known.extend(["spec", "flagSpec", "description", "flagSetId", ""]);
    known.extend(KNOWN_OPERATORS);
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
                    4 => select(KNOWN_OPERATORS).prop_map(str::to_owned),
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
            present(
                [
                    ("state", state),
                    ("variants", variants),
                    ("defaultVariant", default),
                    ("targeting", targeting),
                    ("metadata", metadata),
                ],
                extra,
            )
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
            present(
                [
                    ("flags", flags),
                    ("metadata", metadata),
                    ("$evaluators", evaluators),
                ],
                extra,
            )
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

/// Whether any object in `rule` has a key that is not a known operator (the model of the check).
fn has_unknown_operator(rule: &Value) -> bool {
    match rule {
        Value::Object(map) => map.iter().any(|(op, args)| {
            !KNOWN_OPERATORS.contains(&op.as_str()) || has_unknown_operator(args)
        }),
        Value::Array(items) => items.iter().any(has_unknown_operator),
        _ => false,
    }
}

fn check_document(text: &str) -> Result<(), TestCaseError> {
    let document: Value = serde_json::from_str(text)
        .map_err(|e| TestCaseError::fail(format!("not JSON: {e}: {text}")))?;
    prop_assert_eq!(validate(&document), Ok(()));
    let top = document.as_object().expect("validated as an object");
    for key in top.keys() {
        prop_assert!(DOCUMENT_KEYS.contains(&key.as_str()), "key {:?}", key);
    }
    let flags = top["flags"].as_object().expect("always an object");
    for (name, flag) in flags {
        // A null flag stays null (flagd loads it with nothing set).
        let Some(flag) = flag.as_object() else {
            prop_assert!(flag.is_null(), "flag {:?} is {}", name, flag);
            continue;
        };
        for key in flag.keys() {
            prop_assert!(
                FLAG_KEYS.contains(&key.as_str()),
                "flag {:?} has key {:?}",
                name,
                key
            );
        }
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

    /// A targeting rule never makes a document invalid, whatever operators it uses: unknown
    /// ones are warnings on its flag, and the rule reaches clients as it is.
    #[test]
    fn rules_are_served_and_unknown_operators_warned(targeting in rule()) {
        prop_assume!(targeting.is_object());
        let resource = json!({"spec": {"flagSpec": {"flags": {"f": {"state": "ENABLED",
            "variants": {"on": true, "off": false}, "defaultVariant": "on",
            "targeting": targeting}}}}});
        let converted = convert(&resource).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let document: Value = serde_json::from_str(&converted.document)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        // Compared as clients read it: serde_json may not read every float back bit for bit.
        let sent: Value = serde_json::from_str(&targeting.to_string())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&document["flags"]["f"]["targeting"], &sent);
        let unknown = has_unknown_operator(&targeting);
        let warned = converted.warnings.iter().any(|w| {
            w.place == Place::Flag("f".into()) && matches!(w.problem, Problem::UnknownOperators(_))
        });
        prop_assert_eq!(unknown, warned, "{}", targeting);
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
