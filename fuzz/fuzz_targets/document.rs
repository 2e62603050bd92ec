//! FeatureFlag → flag configuration: never panics, and an accepted document is valid JSON that
//! passes the checks, with only the keys clients accept and a string `defaultVariant`.
#![no_main]

use flagd_proxy::document::{self, DOCUMENT_KEYS, FLAG_KEYS};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;


fuzz_target!(|data: &[u8]| {
    // serde_json bounds nesting at 128, as it does for resources read from the API server.
    let Ok(resource) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    // The bare flagSpec form too, so the fuzzer need not find the wrapper first.
    let wrapped = serde_json::json!({"spec": {"flagSpec": resource.clone()}});
    for resource in [&resource, &wrapped] {
        let _ = document::validate(resource);
        let Ok(text) = document::from_resource(resource) else {
            continue;
        };
        let document: Value = serde_json::from_str(&text).expect("the document is JSON");
        document::validate(&document).expect("the document passes the checks");
        let top = document.as_object().expect("an object");
        assert!(top.keys().all(|k| DOCUMENT_KEYS.contains(&k.as_str())));
        for flag in top["flags"].as_object().expect("flags object").values() {
            let flag = flag.as_object().expect("flag object");
            assert!(flag.keys().all(|k| FLAG_KEYS.contains(&k.as_str())));
            assert!(flag["defaultVariant"].is_string());
        }
    }
});
