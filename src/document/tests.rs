//! Unit tests of the conversion and validation of flag configurations.
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

/// A field the resource leaves out stays out, and a null one stays null: clients may tell them
/// apart (flagd does not), and a client must see what it would read from the file.
#[test]
fn fields_are_passed_as_the_resource_has_them() {
    let doc = from_resource(&resource(json!({
        "flags": {"f": {"state": "DISABLED", "variants": {"on": true}},
                  "g": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": null}}
    })))
    .expect("valid");
    let doc: Value = serde_json::from_str(&doc).expect("json");
    assert_eq!(
        doc["flags"]["f"],
        json!({"state": "DISABLED", "variants": {"on": true}})
    );
    assert_eq!(doc["flags"]["g"]["defaultVariant"], Value::Null);
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

/// What flagd refuses as a whole when it loads a document (a field of the wrong JSON type, a
/// default variant that is not a variant, an empty shared evaluator, no `flags`) is refused,
/// with the flag named.
#[test]
fn what_flagd_refuses_is_refused_naming_the_flag() {
    let cases = [
        (
            json!({"flags": {"f": {"state": 5, "variants": {"a": 1}}}}),
            "flag \"f\": state must be a string, found a number",
        ),
        (
            json!({"flags": {"f": {"state": "ENABLED", "variants": {"a": 1}, "defaultVariant": "z"}}}),
            "flag \"f\": defaultVariant \"z\" is not one of the variants",
        ),
        (
            json!({"flags": {"f": {"state": "ENABLED", "variants": {}, "defaultVariant": "z"}}}),
            "not one of the variants",
        ),
        (
            json!({"flags": {"f": {"state": "ENABLED", "variants": {"a": 1}, "defaultVariant": 3}}}),
            "defaultVariant must be a string, found a number",
        ),
        (
            json!({"flags": {"f": {"state": "ENABLED", "variants": [1]}}}),
            "variants must be an object, found an array",
        ),
        (
            json!({"flags": {"f": {"state": "ENABLED", "variants": {"a": 1}, "metadata": "x"}}}),
            "metadata must be an object, found a string",
        ),
        (
            json!({"flags": {"f": {"STATE": true, "variants": {"a": 1}}}}),
            "STATE must be a string",
        ),
        (
            json!({"flags": {"f": {"source": 1, "variants": {"a": 1}}}}),
            "source must be a string",
        ),
        (
            json!({"flags": {"f": 3}}),
            "flag \"f\": a flag must be an object, found a number",
        ),
        (json!({"flags": 3}), "`flags` must be an object"),
        (json!({"metadata": {}}), "`flags` is missing"),
        (
            json!({"flags": {}, "metadata": []}),
            "`metadata` must be an object",
        ),
        (
            json!({"flags": {}, "$evaluators": {"e": {}}}),
            "evaluator \"e\" is empty",
        ),
        (
            json!({"flags": {}, "$evaluators": "x"}),
            "`$evaluators` must be an object",
        ),
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

/// What flagd loads although its schema says otherwise is served as it is (the other flags
/// with it), each problem a warning naming the flag.
#[test]
fn what_flagd_loads_is_served_with_a_warning_per_flag() {
    let ok = json!({"state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on"});
    let cases = [
        (
            json!({"state": "ON", "variants": {"a": 1}, "defaultVariant": "a"}),
            "state is \"ON\"",
        ),
        (json!({"variants": {"a": 1}}), "state is missing"),
        (
            json!({"state": "ENABLED", "variants": {}}),
            "has no variants",
        ),
        (
            json!({"state": "ENABLED", "variants": {"a": null}, "defaultVariant": "a"}),
            "variant \"a\" is null",
        ),
        (
            json!({"state": "ENABLED", "variants": {"a": [1]}}),
            "variant \"a\" is an array",
        ),
        (
            json!({"state": "ENABLED", "variants": {"a": 1, "b": "x"}}),
            "variants mix types",
        ),
        (
            json!({"state": "ENABLED", "variants": {"a": 1}, "targeting": "nope"}),
            "targeting is a string",
        ),
        (
            json!({"state": "ENABLED", "variants": {"a": 1}, "metadata": {"x": {}}}),
            "metadata \"x\" is an object",
        ),
        (Value::Null, "is null"),
    ];
    for (odd, needle) in cases {
        let spec = json!({"flags": {"ok": ok, "odd": odd}});
        let converted = convert(&resource(spec.clone())).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let doc: Value = serde_json::from_str(&converted.document).expect("json");
        assert_eq!(doc["flags"]["ok"], ok, "{spec}");
        assert!(doc["flags"].get("odd").is_some(), "{spec}");
        let texts: Vec<String> = converted.warnings.iter().map(ToString::to_string).collect();
        assert!(
            texts
                .iter()
                .any(|t| t.starts_with("flag \"odd\"") && t.contains(needle)),
            "{spec}: {texts:?} lacks {needle:?}"
        );
        assert!(
            texts.iter().all(|t| !t.starts_with("flag \"ok\"")),
            "{texts:?}"
        );
    }
}

#[test]
fn the_array_form_becomes_the_map_form_and_flags_without_a_key_are_dropped() {
    let converted = convert(&resource(json!({"flags": [
        {"key": "a", "state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on"},
        {"state": "ENABLED", "variants": {"on": true}},
        null
    ]})))
    .expect("served");
    let doc: Value = serde_json::from_str(&converted.document).expect("json");
    assert_eq!(
        doc,
        json!({"flags": {"a": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on"}}})
    );
    let texts: Vec<String> = converted.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        texts,
        vec![
            "flag \"#1\" has no key; flagd drops it (the other flags are served)",
            "flag \"#2\" has no key; flagd drops it (the other flags are served)",
        ]
    );
}

#[test]
fn fields_are_found_whatever_their_case_and_null_targeting_is_kept() {
    let doc = from_resource(&resource(json!({
        "Flags": {"f": {"State": "DISABLED", "VARIANTS": {"a": 1}, "defaultvariant": "a",
                        "targeting": null}}
    })))
    .expect("served");
    let doc: Value = serde_json::from_str(&doc).expect("json");
    assert_eq!(
        doc,
        json!({"flags": {"f": {"state": "DISABLED", "variants": {"a": 1}, "defaultVariant": "a",
                               "targeting": null}}})
    );
}

fn converted(flag_spec: Value) -> Converted {
    convert(&resource(flag_spec)).expect("served")
}

fn good(targeting: Value) -> Value {
    json!({"state": "ENABLED", "variants": {"on": true, "off": false}, "defaultVariant": "off",
           "targeting": targeting})
}

#[test]
fn an_unknown_operator_is_served_with_a_warning_on_its_flag() {
    let spec = json!({"flags": {
        "ok": good(json!({"if": [{"==": [{"var": "tier"}, "gold"]}, "on", "off"]})),
        "bad": good(json!({"if": [{"no_such_op": [1, 2]}, "on", {"other_op": []}]})),
    }});
    let converted = converted(spec.clone());
    // Served as it is: both flags, the unknown rule untouched.
    let doc: Value = serde_json::from_str(&converted.document).expect("json");
    assert_eq!(doc["flags"], spec["flags"]);
    assert_eq!(
        converted.warnings,
        vec![DocumentWarning {
            place: Place::Flag("bad".into()),
            problem: Problem::UnknownOperators(vec!["no_such_op".into(), "other_op".into()]),
        }]
    );
    let text = converted.warnings[0].to_string();
    for needle in [
        "flag \"bad\"",
        "operators \"no_such_op\", \"other_op\"",
        "PARSE_ERROR",
    ] {
        assert!(text.contains(needle), "{needle:?} not in {text:?}");
    }
    assert_eq!(validate(&doc), Ok(()));
    assert_eq!(check(&doc).expect("usable"), converted.warnings);
}

#[test]
fn shared_evaluators_are_checked_the_same_way() {
    let converted = converted(json!({
        "flags": {
            "uses": good(json!({"if": [{"$ref": "gold"}, "on", "off"]})),
            "dangling": good(json!({"if": [{"$ref": "missing"}, "on", "off"]})),
        },
        "$evaluators": {"gold": {"newer_op": [{"var": "tier"}]}},
    }));
    let texts: Vec<String> = converted.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(
        texts.iter().any(|t| t.starts_with("flag \"dangling\"")
            && t.contains("evaluator \"missing\", which $evaluators does not define")),
        "{texts:?}"
    );
    assert!(
        texts.iter().any(
            |t| t.starts_with("evaluator \"gold\" uses operator \"newer_op\"")
                && t.contains("the flags that use this evaluator")
        ),
        "{texts:?}"
    );
}

#[test]
fn known_operators_give_no_warning() {
    let converted = converted(json!({
        "flags": {"f": good(json!({"if": [
            {"and": [{"starts_with": [{"var": "email"}, "a"]}, {"sem_ver": [{"var": "v"}, ">=", "1.0.0"]}]},
            {"fractional": [["on", 50], ["off", 50]]},
            {"$ref": "e"}
        ]}))},
        "$evaluators": {"e": {"in": ["@x", {"var": "email"}]}},
    }));
    assert_eq!(converted.warnings, vec![]);
}
