//! What clients report about a document only when they evaluate the flags concerned, or what
//! flagd loads although its schema says otherwise ([`DocumentWarning`]): targeting rules and
//! shared evaluators are walked for operators flagd does not know and `$ref`s to evaluators
//! that are not defined; flags are looked at for states, variants, targeting and metadata that
//! flagd's schema does not allow.
use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

/// The targeting operators of flagd's JSON schema (`targeting.json` of flagd-schemas: the
/// rules it defines, flagd's own `fractional`, `sem_ver`, `starts_with` and `ends_with`, and
/// evaluator references, `$ref`), plus those its JsonLogic library registers beyond the schema
/// (`?:`, `abs`, `set`, `contains_all`, `contains_any`, `contains_none`). A test compares the
/// schema's part with the schema itself. Only used to warn: an operator missing here may be one
/// that a newer flagd knows, so it never makes a document invalid.
pub const KNOWN_OPERATORS: &[&str] = &[
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
    "all",
    "and",
    "cat",
    "ends_with",
    "filter",
    "fractional",
    "if",
    "in",
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
    // flagd's JsonLogic library, beyond the schema.
    "?:",
    "abs",
    "set",
    "contains_all",
    "contains_any",
    "contains_none",
];

/// How many of [`KNOWN_OPERATORS`] come from flagd's schema (the rest from its library).
pub const SCHEMA_OPERATORS: usize = 38;

/// A problem that flagd tolerates when it loads a document: it reports it for the flags
/// concerned only, when they are evaluated, or not at all. A document with warnings is served as
/// it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentWarning {
    pub place: Place,
    pub problem: Problem,
}

/// Where a [`DocumentWarning`] is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    /// A flag's targeting rule.
    Flag(String),
    /// A shared evaluator in `$evaluators`, which the flags that refer to it use.
    Evaluator(String),
    /// The flag set as a whole (its `metadata`).
    FlagSet,
}

/// What a [`DocumentWarning`] is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Operators this proxy does not know (each once, sorted). Clients that do not know them
    /// either evaluate the flags concerned to `PARSE_ERROR`; a newer flagd may know them.
    UnknownOperators(Vec<String>),
    /// `$ref`s to shared evaluators that `$evaluators` does not define (each once, sorted).
    UndefinedEvaluators(Vec<String>),
    /// `state` is neither `ENABLED` nor `DISABLED` (`None`: missing or null). flagd disables a
    /// flag only for `DISABLED`: this flag is enabled.
    State(Option<String>),
    /// The flag has no variants: clients answer with the caller's default.
    NoVariants,
    /// A variant whose value is not a flag value (null or an array).
    VariantValue {
        variant: String,
        found: &'static str,
    },
    /// Variants of two types.
    MixedVariants(&'static str, &'static str),
    /// `targeting` is not an object (a JsonLogic rule).
    Targeting(&'static str),
    /// A metadata entry that is not a string, number or boolean.
    Metadata { entry: String, found: &'static str },
    /// The flag is `null`: flagd loads it as a flag with nothing set.
    Null,
    /// The flag has no key (an empty key, or an element of the array form without `key`):
    /// flagd drops it.
    NoKey,
}

impl fmt::Display for DocumentWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (place, evaluated) = match &self.place {
            Place::Flag(flag) => (format!("flag {flag:?}"), "this flag"),
            Place::Evaluator(name) => (
                format!("evaluator {name:?}"),
                "the flags that use this evaluator",
            ),
            Place::FlagSet => ("the flag set".to_owned(), "its flags"),
        };
        let subject = match &self.place {
            Place::Flag(_) => format!("{place}: targeting"),
            _ => place.clone(),
        };
        match &self.problem {
            Problem::UnknownOperators(operators) => write!(
                f,
                "{subject} uses {}, which flagd does not know; clients that do not know {} \
                 either evaluate {evaluated} to PARSE_ERROR",
                quoted("operator", operators),
                if operators.len() == 1 { "it" } else { "them" },
            ),
            Problem::UndefinedEvaluators(names) => write!(
                f,
                "{subject} refers to {}, which $evaluators does not define; clients cannot \
                 evaluate {evaluated} (they answer with an error and the caller's default)",
                quoted("evaluator", names),
            ),
            Problem::State(Some(state)) => write!(
                f,
                "{place}: state is {state:?}, not \"ENABLED\" or \"DISABLED\"; flagd evaluates \
                 the flag as enabled (only \"DISABLED\" disables a flag)"
            ),
            Problem::State(None) => write!(
                f,
                "{place}: state is missing; flagd evaluates the flag as enabled"
            ),
            Problem::NoVariants => write!(
                f,
                "{place} has no variants; clients answer with the caller's default"
            ),
            Problem::VariantValue { variant, found } => write!(
                f,
                "{place}: variant {variant:?} is {found}, not a flag value; clients answer \
                 TYPE_MISMATCH (or GENERAL) when it is selected"
            ),
            Problem::MixedVariants(first, other) => write!(
                f,
                "{place}: variants mix types ({first} and {other}); clients that ask for one \
                 type answer TYPE_MISMATCH when a variant of the other is selected"
            ),
            Problem::Targeting(found) => write!(
                f,
                "{place}: targeting is {found}, not an object (a JsonLogic rule); flagd takes \
                 it as the name of a variant (GENERAL error when no variant has that name; null \
                 gives the default variant)"
            ),
            Problem::Metadata { entry, found } => write!(
                f,
                "{place}: metadata {entry:?} is {found}, not a string, number or boolean; \
                 clients may leave it out of {evaluated}'s metadata"
            ),
            Problem::Null => write!(
                f,
                "{place} is null: flagd loads it with nothing set, and clients answer with the \
                 caller's default"
            ),
            Problem::NoKey => write!(
                f,
                "{place} has no key; flagd drops it (the other flags are served)"
            ),
        }
    }
}

/// `operator "a"`, or `operators "a", "b"`.
fn quoted(noun: &str, names: &[String]) -> String {
    let list: Vec<String> = names.iter().map(|name| format!("{name:?}")).collect();
    let plural = if names.len() == 1 { "" } else { "s" };
    format!("{noun}{plural} {}", list.join(", "))
}

/// The warnings found so far in one document.
pub(super) struct Warnings<'a> {
    /// The document's shared evaluators, which `$ref`s name.
    pub(super) evaluators: Option<&'a Map<String, Value>>,
    pub(super) found: Vec<DocumentWarning>,
}

impl Warnings<'_> {
    /// A problem of the flag `key`.
    pub(super) fn flag(&mut self, key: &str, problem: Problem) {
        self.found.push(DocumentWarning {
            place: Place::Flag(key.to_owned()),
            problem,
        });
    }

    /// The metadata entries at `place` that are not strings, numbers or booleans.
    pub(super) fn metadata(&mut self, place: Place, entries: &Map<String, Value>) {
        for (entry, value) in entries {
            if !matches!(value, Value::String(_) | Value::Number(_) | Value::Bool(_)) {
                self.found.push(DocumentWarning {
                    place: place.clone(),
                    problem: Problem::Metadata {
                        entry: entry.clone(),
                        found: super::kind(value),
                    },
                });
            }
        }
    }

    /// Walks the JsonLogic rule at `place`: every key of an object in it is an operator, and the
    /// argument of `$ref` names a shared evaluator. An empty object is the empty rule.
    pub(super) fn rule(&mut self, place: Place, rule: &Value) {
        let mut unknown = BTreeSet::new();
        let mut undefined = BTreeSet::new();
        // Nesting is bounded by `MAX_DEPTH` (checked first), but a stack costs nothing more.
        let mut pending = vec![rule];
        while let Some(value) = pending.pop() {
            match value {
                Value::Object(map) => {
                    for (operator, args) in map {
                        if operator == "$ref" {
                            if let Value::String(name) = args
                                && !self.evaluators.is_some_and(|e| e.contains_key(name))
                            {
                                undefined.insert(name.clone());
                            }
                        } else if !KNOWN_OPERATORS.contains(&operator.as_str()) {
                            unknown.insert(operator.clone());
                        }
                        pending.push(args);
                    }
                }
                Value::Array(items) => pending.extend(items),
                _ => {}
            }
        }
        if !unknown.is_empty() {
            self.found.push(DocumentWarning {
                place: place.clone(),
                problem: Problem::UnknownOperators(unknown.into_iter().collect()),
            });
        }
        if !undefined.is_empty() {
            self.found.push(DocumentWarning {
                place,
                problem: Problem::UndefinedEvaluators(undefined.into_iter().collect()),
            });
        }
    }
}
