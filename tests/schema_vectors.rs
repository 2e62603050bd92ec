//! The flag-configuration check against flagd's published schema test vectors
//! (github.com/open-feature/flagd-schemas, the version in tests/data/modules.txt, fetched by
//! scripts/fetch-test-data.sh).
use flagd_proxy_testkit as support;

use std::path::PathBuf;

use flagd_proxy::document::{KNOWN_OPERATORS, SCHEMA_OPERATORS, check, validate};
use serde_json::Value;
use support::control_plane::{TestDataMissing, test_data, test_data_or_skip};
use support::or_return;

fn vectors(kind: &str) -> Option<Vec<(PathBuf, Value)>> {
    let dir = test_data_or_skip(&format!("flagd-schemas/json/test/flags/{kind}"))?;
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        let text = std::fs::read_to_string(&path).expect("read vector");
        let value = serde_json::from_str(&text).expect("vector is JSON");
        out.push((path, value));
    }
    assert!(!out.is_empty(), "no vectors in {}", dir.display());
    Some(out)
}

#[test]
#[ignore = "needs flagd's schema test vectors: scripts/test fetches them"]
fn positive_vectors_are_served() {
    let vectors = or_return!(vectors("positive"));
    for (path, document) in vectors {
        validate(&document).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// What the proxy does with a negative vector: what flagd (the reference server) does when it
/// loads it. flagd's schema is advisory (flagd logs a schema failure and loads the document), so
/// most negative vectors are served, with a warning naming the flag; the differential test
/// (tests/fidelity/) checks the same vectors against flagd itself.
enum Verdict {
    /// flagd refuses the whole document; the error names the problem.
    Refused(&'static str),
    /// flagd loads it; a warning names the problem.
    Warned(&'static str),
    /// flagd loads it, with nothing to warn about: what later schema versions allow (a flag
    /// without a default variant, the array form of `flags`).
    Served,
}

const NEGATIVE: &[(&str, Verdict)] = &[
    (
        "empty-variants.json",
        Verdict::Refused("defaultVariant \"on\" is not one of the variants"),
    ),
    (
        "malformed-flag.json",
        Verdict::Warned("flag \"not-a-flag\": state is missing"),
    ),
    (
        "missing-variants.json",
        Verdict::Refused("defaultVariant \"on\" is not one of the variants"),
    ),
    (
        "mixed-variant-types.ffconfig.json",
        Verdict::Warned("flag \"myBoolFlag\": variants mix types"),
    ),
    (
        "state-set-incorrectly.json",
        Verdict::Warned("flag \"myBoolFlag\": state is \"WILL-FAIL\""),
    ),
    ("no-default-variant.json", Verdict::Served),
    ("with-array-flags.json", Verdict::Served),
    (
        "with-invalid-flag-metadata.json",
        Verdict::Warned("flag \"myBoolFlag\": metadata \"invalid\" is an object"),
    ),
    (
        "with-invalid-flag-set-metadata.json",
        Verdict::Warned("the flag set: metadata \"invalid\" is an object"),
    ),
    (
        "with-invalid-targeting.json",
        Verdict::Warned("flag \"targetedFlag\": targeting uses operator \"not-a-real-rule\""),
    ),
];

#[test]
#[ignore = "needs flagd's schema test vectors: scripts/test fetches them"]
fn negative_vectors_get_what_flagd_gives_them() {
    let vectors = or_return!(vectors("negative"));
    for (path, document) in vectors {
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let Some((_, verdict)) = NEGATIVE.iter().find(|(name, _)| *name == file) else {
            panic!("{file}: a negative vector without a verdict; give it the one flagd gives it");
        };
        match (verdict, check(&document)) {
            (Verdict::Refused(needle), Err(error)) => {
                assert!(error.to_string().contains(needle), "{file}: {error}")
            }
            (Verdict::Warned(needle), Ok(warnings)) => assert!(
                warnings.iter().any(|w| w.to_string().contains(needle)),
                "{file}: {needle:?} is not among {warnings:?}"
            ),
            (Verdict::Served, Ok(warnings)) => assert!(warnings.is_empty(), "{file}: {warnings:?}"),
            (_, Ok(warnings)) => panic!("{file} was served (warnings: {warnings:?})"),
            (_, Err(error)) => panic!("{file} was refused: {error}"),
        }
    }
}

#[test]
fn missing_test_data_names_the_script_that_fetches_it() {
    let err: TestDataMissing =
        test_data("no-such-module/at/all").expect_err("nothing is cached under that name");
    let message = err.to_string();
    assert!(
        message.contains("scripts/fetch-test-data.sh") && message.contains("no-such-module"),
        "{message}"
    );
}

/// Every operator name a rule of `schema` defines (the properties of its rule definitions).
fn operators_in(schema: &Value, found: &mut std::collections::BTreeSet<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(properties)) = map.get("properties") {
                found.extend(properties.keys().cloned());
            }
            map.values().for_each(|v| operators_in(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| operators_in(v, found)),
        _ => {}
    }
}

/// The operators the proxy takes from flagd's schema are the ones the schema flagd v0.16.0
/// pins defines, no more and no fewer (the rest of its list are the JsonLogic library's).
#[test]
#[ignore = "needs flagd's schema test vectors: scripts/test fetches them"]
fn known_operators_are_those_of_flagds_schema() {
    let path = or_return!(test_data_or_skip("flagd-schemas-flagd/json/targeting.json"));
    let text = std::fs::read_to_string(&path).expect("read targeting.json");
    let schema: Value = serde_json::from_str(&text).expect("targeting.json is JSON");
    let mut defined = std::collections::BTreeSet::new();
    operators_in(&schema, &mut defined);
    // Evaluator references are the schema's `reference` definition.
    defined.insert("$ref".to_owned());
    let known: std::collections::BTreeSet<String> = KNOWN_OPERATORS[..SCHEMA_OPERATORS]
        .iter()
        .map(|op| (*op).to_owned())
        .collect();
    assert_eq!(
        known,
        defined,
        "only the proxy: {:?}; only the schema: {:?}",
        known.difference(&defined).collect::<Vec<_>>(),
        defined.difference(&known).collect::<Vec<_>>()
    );
}
