//! Selectors: which resource a client asks for.
//!
//! The only form accepted is `core.openfeature.dev/<namespace>/<name>`, the form the OpenFeature
//! Operator writes into injected sidecars. Anything else (including flagd's `file:` sources) is
//! refused, so a client cannot make the proxy read arbitrary files.
use std::fmt;

/// The API group of `FeatureFlag` resources, the prefix of every selector.
pub const GROUP: &str = "core.openfeature.dev";

/// The accepted form, shown in every rejection.
pub const ACCEPTED_FORM: &str = "core.openfeature.dev/<namespace>/<name>";

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
}

/// Parses a selector into the resource it names.
pub fn parse(selector: &str) -> Result<ResourceKey, SelectorError> {
    let selector = selector.trim();
    if selector.is_empty() {
        return Err(SelectorError::Missing);
    }
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
            "flagSetId=abc",
            "source=x",
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
        }
        assert_eq!(parse("  "), Err(SelectorError::Missing));
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
