//! The flag-configuration check against flagd's published schema test vectors
//! (github.com/open-feature/flagd-schemas, the version in tests/data/modules.txt, fetched by
//! scripts/fetch-test-data.sh).
use flagd_proxy_testkit as support;

use std::path::PathBuf;

use flagd_proxy::document::{check, validate};
use serde_json::Value;
use support::control_plane::{TestDataMissing, test_data, test_data_or_skip};

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
fn positive_vectors_pass() {
    let Some(vectors) = vectors("positive") else {
        return;
    };
    for (path, document) in vectors {
        // flagd's own import format may list flags as an array; providers (what this proxy
        // serves) accept only the map form, so those vectors are not provider documents.
        if document.get("flags").is_some_and(Value::is_array) {
            continue;
        }
        validate(&document).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// Negative vectors of the pinned schema version that later versions of flagd-schemas moved to
/// the positive side, with why this proxy follows the later schema.
const NOW_POSITIVE: &[(&str, &str)] = &[(
    "no-default-variant.json",
    "defaultVariant became optional (flag evaluation then falls back to the code default); \
     documents made from a FeatureFlag always carry it, as an empty string when absent",
)];

/// Negative vectors whose problem flagd tolerates when it loads a document and reports for the
/// flag concerned only, when that flag is evaluated: the proxy serves them with a warning naming
/// the flag (README, "Invalid resources").
const SERVED_WITH_A_WARNING: &[(&str, &str)] = &[(
    "with-invalid-targeting.json",
    "flag \"targetedFlag\": targeting uses operator \"not-a-real-rule\"",
)];

#[test]
fn negative_vectors_fail() {
    let Some(vectors) = vectors("negative") else {
        return;
    };
    for (path, document) in vectors {
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if let Some((_, warning)) = SERVED_WITH_A_WARNING.iter().find(|(name, _)| *name == file) {
            let warnings = check(&document).unwrap_or_else(|e| panic!("{file} was refused: {e}"));
            assert!(
                warnings.iter().any(|w| w.to_string().contains(warning)),
                "{file}: {warning:?} is not among {warnings:?}"
            );
            continue;
        }
        if let Some((_, why)) = NOW_POSITIVE.iter().find(|(name, _)| *name == file) {
            eprintln!("{file}: accepted on purpose: {why}");
            assert!(validate(&document).is_ok(), "{file} was refused");
            continue;
        }
        assert!(
            validate(&document).is_err(),
            "{} was accepted",
            path.display()
        );
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
