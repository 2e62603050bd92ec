//! What clients report about a document only when they evaluate the flags concerned
//! ([`DocumentWarning`]): targeting rules and shared evaluators are walked for operators this
//! proxy does not know and `$ref`s to evaluators that are not defined.
use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

/// JsonLogic operators flagd understands, plus its own (`fractional`, `sem_ver`, `starts_with`,
/// `ends_with`) and evaluator references (`$ref`). Only used to warn: an operator missing here
/// may be one that a newer flagd knows, so it never makes a document invalid.
pub(super) const KNOWN_OPERATORS: &[&str] = &[
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
    "?:",
    "all",
    "and",
    "cat",
    "ends_with",
    "filter",
    "fractional",
    "if",
    "in",
    "log",
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
];

/// A problem that flagd tolerates when it loads a document and reports for the flags concerned
/// only, when they are evaluated. A document with warnings is served as it is.
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
}

/// What a [`DocumentWarning`] is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Operators this proxy does not know (each once, sorted). Clients that do not know them
    /// either evaluate the flags concerned to `PARSE_ERROR`; a newer flagd may know them.
    UnknownOperators(Vec<String>),
    /// `$ref`s to shared evaluators that `$evaluators` does not define (each once, sorted).
    UndefinedEvaluators(Vec<String>),
}

impl fmt::Display for DocumentWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (subject, evaluated) = match &self.place {
            Place::Flag(flag) => (format!("flag {flag:?}: targeting"), "this flag"),
            Place::Evaluator(name) => (
                format!("evaluator {name:?}"),
                "the flags that use this evaluator",
            ),
        };
        match &self.problem {
            Problem::UnknownOperators(operators) => write!(
                f,
                "{subject} uses {}, which this proxy does not know; clients that do not know {} \
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
