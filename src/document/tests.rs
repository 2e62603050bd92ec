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

#[test]
fn what_breaks_a_client_is_still_refused() {
    let flag = |extra: Value| {
        let mut flag = good(json!({"no_such_op": []}));
        for (key, value) in extra.as_object().expect("object") {
            flag[key] = value.clone();
        }
        json!({"flags": {"f": flag, "ok": good(json!({}))}})
    };
    let cases = [
        (flag(json!({"state": "ON"})), "state must be"),
        (flag(json!({"variants": []})), "variants must be an object"),
        (
            flag(json!({"defaultVariant": 1})),
            "defaultVariant must be a string",
        ),
        (
            flag(json!({"targeting": "on"})),
            "targeting must be an object",
        ),
        (flag(json!({"metadata": {"x": {}}})), "metadata"),
        (
            json!({"flags": {"ok": good(json!({}))}, "$evaluators": []}),
            "`$evaluators` must be an object",
        ),
    ];
    for (spec, needle) in cases {
        let err = convert(&resource(spec.clone()))
            .expect_err("refused")
            .to_string();
        assert!(err.contains(needle), "{spec}: {err:?} lacks {needle:?}");
    }
}
