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
