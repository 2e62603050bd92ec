//! Selectors: which resource a client asks for.
//!
//! A selector names one `FeatureFlag` resource: `core.openfeature.dev/<namespace>/<name>` (the
//! form the OpenFeature Operator writes into injected sidecars), or the same with flagd's
//! `source=` key (`source=core.openfeature.dev/<namespace>/<name>`, flagd v0.13 and later: one
//! `key=value` pair, a bare value meaning `source=`). Anything else (including flagd's `file:`
//! sources) is refused, so a client cannot make the proxy read arbitrary files.
//!
//! `flagSetId=<id>` is refused: a flag set is named inside documents, so serving it would mean
//! reading every resource that might hold a flag of that set (listing FeatureFlags across
//! namespaces), which the proxy neither may nor should do on a client's request.
use std::fmt;

/// The API group of `FeatureFlag` resources, the prefix of every selector.
pub const GROUP: &str = "core.openfeature.dev";

/// The accepted form, shown in every rejection.
pub const ACCEPTED_FORM: &str = "core.openfeature.dev/<namespace>/<name>";

/// The forms that work, shown when a selector uses a key this proxy does not serve.
pub const WORKING_FORMS: &str = "\"core.openfeature.dev/<namespace>/<name>\" or \"source=core.openfeature.dev/<namespace>/<name>\"";

/// flagd's selector key that names a source.
pub const SOURCE_KEY: &str = "source";

/// flagd's selector key that names a flag set (refused here, see the module documentation).
pub const FLAG_SET_KEY: &str = "flagSetId";

/// One `FeatureFlag` resource, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    pub namespace: String,
    pub name: String,
}

impl ResourceKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{GROUP}/{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error(
        "no selector given: set the `flagd-selector` header or the request's `selector` field to \"{ACCEPTED_FORM}\""
    )]
    Missing,
    #[error("selector {selector} is not supported: this proxy serves only \"{ACCEPTED_FORM}\"")]
    Unsupported { selector: String },
    #[error("selector {selector}: {reason}; expected \"{ACCEPTED_FORM}\"")]
    Invalid {
        selector: String,
        reason: &'static str,
    },
    #[error(
        "selector {selector}: flag sets are not served, because a flag set can draw on resources the proxy may not list; name one resource as {WORKING_FORMS}"
    )]
    FlagSet { selector: String },
    #[error(
        "selector {selector}: unknown key {key}; the accepted keys are `{SOURCE_KEY}` (and `{FLAG_SET_KEY}`, which this proxy refuses); use {WORKING_FORMS}"
    )]
    UnknownKey { selector: String, key: String },
}

/// Parses a selector into the resource it names: a bare resource selector or flagd's
/// `key=value` form.
pub fn parse(selector: &str) -> Result<ResourceKey, SelectorError> {
    let selector = selector.trim();
    if selector.is_empty() {
        return Err(SelectorError::Missing);
    }
    let Some((key, value)) = selector.split_once('=') else {
        return parse_resource(selector);
    };
    match key.trim() {
        SOURCE_KEY => {
            let value = value.trim();
            if value.is_empty() {
                return Err(SelectorError::Missing);
            }
            parse_resource(value)
        }
        FLAG_SET_KEY => Err(SelectorError::FlagSet {
            selector: truncate(selector),
        }),
        other => Err(SelectorError::UnknownKey {
            selector: truncate(selector),
            key: truncate(other),
        }),
    }
}

/// Parses `core.openfeature.dev/<namespace>/<name>`.
fn parse_resource(selector: &str) -> Result<ResourceKey, SelectorError> {
    let shown = || truncate(selector);
    let Some(rest) = selector
        .strip_prefix(GROUP)
        .and_then(|r| r.strip_prefix('/'))
    else {
        return Err(SelectorError::Unsupported { selector: shown() });
    };
    let mut parts = rest.split('/');
    let (Some(namespace), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(SelectorError::Invalid {
            selector: shown(),
            reason: "it must have exactly a namespace and a name",
        });
    };
    if !is_dns_label(namespace) {
        return Err(SelectorError::Invalid {
            selector: shown(),
            reason: "the namespace is not a valid Kubernetes namespace name (lowercase letters, digits and '-', at most 63)",
        });
    }
    if !is_dns_subdomain(name) {
        return Err(SelectorError::Invalid {
            selector: shown(),
            reason: "the name is not a valid Kubernetes object name (lowercase letters, digits, '-' and '.', at most 253)",
        });
    }
    Ok(ResourceKey::new(namespace, name))
}

/// The selector as shown in an error: quoted with control characters escaped, and cut short so a
/// huge or hostile selector cannot make a huge message.
fn truncate(s: &str) -> String {
    const MAX: usize = 300;
    let quoted = format!("{s:?}");
    if quoted.len() <= MAX {
        return quoted;
    }
    let mut end = MAX;
    while !quoted.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &quoted[..end])
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_operator_form() {
        assert_eq!(
            parse("core.openfeature.dev/default/demo"),
            Ok(ResourceKey::new("default", "demo"))
        );
        assert_eq!(
            parse(" core.openfeature.dev/ns-1/a.b-c "),
            Ok(ResourceKey::new("ns-1", "a.b-c"))
        );
        assert_eq!(
            ResourceKey::new("a", "b").to_string(),
            "core.openfeature.dev/a/b"
        );
    }

    #[test]
    fn rejects_other_forms_with_the_accepted_one() {
        for bad in [
            "file:/etc/passwd",
            "source=x",
            "source=file:/etc/passwd",
            "source=core.openfeature.dev/ns/name/extra",
            "core.openfeature.dev",
            "core.openfeature.dev/",
            "core.openfeature.dev/ns",
            "core.openfeature.dev/ns/",
            "core.openfeature.dev//name",
            "core.openfeature.dev/ns/name/extra",
            "core.openfeature.dev/NS/name",
            "core.openfeature.dev/ns/-name",
            "core.openfeature.dev/ns/../x",
            "core.openfeature.devx/ns/name",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.to_string().contains(ACCEPTED_FORM), "{bad}: {err}");
            assert!(matches!(
                err,
                SelectorError::Unsupported { .. } | SelectorError::Invalid { .. }
            ));
        }
        assert_eq!(parse("  "), Err(SelectorError::Missing));
    }

    #[test]
    fn accepts_flagds_source_key() {
        for form in [
            "source=core.openfeature.dev/default/demo",
            " source = core.openfeature.dev/default/demo ",
        ] {
            assert_eq!(
                parse(form),
                Ok(ResourceKey::new("default", "demo")),
                "{form}"
            );
        }
        assert_eq!(parse("source="), Err(SelectorError::Missing));
    }

    #[test]
    fn refuses_flag_sets_naming_the_working_forms() {
        for selector in ["flagSetId=abc", "flagSetId="] {
            let err = parse(selector).expect_err(selector);
            assert!(matches!(err, SelectorError::FlagSet { .. }), "{err:?}");
            let message = err.to_string();
            assert!(message.contains(WORKING_FORMS), "{message}");
        }
    }

    #[test]
    fn unknown_keys_name_the_accepted_ones() {
        for selector in ["file=/etc/passwd", "Source=core.openfeature.dev/a/b", "=x"] {
            let err = parse(selector).expect_err(selector);
            assert!(matches!(err, SelectorError::UnknownKey { .. }), "{err:?}");
            let message = err.to_string();
            assert!(
                message.contains("`source`") && message.contains("`flagSetId`"),
                "{message}"
            );
        }
    }

    #[test]
    fn long_selectors_are_truncated_in_errors() {
        let long = format!("core.openfeature.dev/ns/{}", "a".repeat(10_000));
        let err = parse(&long).expect_err("too long").to_string();
        assert!(err.len() < 1_000, "{}", err.len());
        let control = "\u{1}".repeat(5_000);
        let err = parse(&control).expect_err("control characters").to_string();
        assert!(err.len() < 1_000 && err.contains("\\u{1}"), "{}", err.len());
    }

    proptest! {
        #[test]
        fn never_panics_and_round_trips(s in "\\PC*") {
            if let Ok(key) = parse(&s) {
                prop_assert_eq!(parse(&key.to_string()), Ok(key));
            }
        }

        #[test]
        fn valid_names_parse(ns in "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", name in "[a-z0-9]([a-z0-9.-]{0,40}[a-z0-9])?") {
            prop_assume!(name.split('.').all(is_dns_label));
            let key = parse(&format!("core.openfeature.dev/{ns}/{name}")).expect("valid");
            prop_assert_eq!(key, ResourceKey::new(ns, name));
        }
    }
}
