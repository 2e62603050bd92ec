//! The differential corpus: flag configuration documents that probe every field of a flag and of
//! a flag set with every JSON type, generated from a seed (nothing of it is kept on disk), plus
//! flagd's schema test vectors when the test data is installed.
//!
//! Every flag key is unique across the corpus (`d<doc>_<name>`), except where the key itself
//! is what a document probes, so documents can be loaded side by side as sources of one flagd.
use std::path::Path;

use serde_json::{Map, Value, json};

/// One document of the corpus.
#[derive(Clone, Debug)]
pub struct Doc {
    /// What the document probes, for reports.
    pub name: String,
    pub value: Value,
}

impl Doc {
    /// The flag keys a client is asked to evaluate: the keys of `flags` when it is an object.
    pub fn flag_keys(&self) -> Vec<String> {
        match self.value.get("flags") {
            Some(Value::Object(flags)) => flags.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }
}

/// One value of each JSON type, and the edge values of each (empty, zero, negative, fraction).
fn every_type() -> Vec<Value> {
    vec![
        Value::Null,
        json!(true),
        json!(false),
        json!(0),
        json!(7),
        json!(-1.5),
        json!(""),
        json!("x"),
        json!([]),
        json!([1, "a"]),
        json!({}),
        json!({"k": "v"}),
    ]
}

/// A deterministic generator (SplitMix64): the same seed gives the same corpus.
pub struct Seeded(u64);

impl Seeded {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Builds the documents, numbering their flag keys.
struct Builder {
    docs: Vec<Doc>,
}

impl Builder {
    /// A document with a good flag `ok` beside the flag `odd`, under keys unique to it.
    fn beside_good(&mut self, name: String, odd: Value) {
        self.flags(name, vec![("ok", good_bool()), ("odd", odd)], Map::new());
    }

    /// A document of `flags` (named; the key becomes `d<doc>_<name>`) and top-level `extra`.
    fn flags(&mut self, name: String, flags: Vec<(&str, Value)>, extra: Map<String, Value>) {
        let id = self.docs.len();
        let flags: Map<String, Value> = flags
            .into_iter()
            .map(|(key, flag)| (format!("d{id}_{key}"), flag))
            .collect();
        let mut document = Map::new();
        document.insert("flags".into(), Value::Object(flags));
        document.extend(extra);
        self.raw(name, Value::Object(document));
    }

    fn raw(&mut self, name: String, value: Value) {
        self.docs.push(Doc { name, value });
    }
}

fn good_bool() -> Value {
    json!({"state": "ENABLED", "variants": {"on": true, "off": false}, "defaultVariant": "on"})
}

fn good_string() -> Value {
    json!({
        "state": "ENABLED",
        "variants": {"red": "#f00", "blue": "#00f"},
        "defaultVariant": "red",
        "targeting": {"if": [{"==": [{"var": "tier"}, "gold"]}, "blue", null]}
    })
}

/// `$evaluators` with `rule` as the evaluator `shared`, beside an evaluator `defined` unless the
/// rule refers to it: flagd puts evaluators in place one after another in a random order, so an
/// evaluator that refers to another defined one works in some loads and not in others (flagd
/// itself answers differently each time), and the corpus leaves that out.
fn shared_evaluators(rule: Value) -> Value {
    if rule.to_string().contains(r#"{"$ref":"defined"}"#) {
        json!({"shared": rule})
    } else {
        json!({"defined": {"==": [1, 1]}, "shared": rule})
    }
}

/// A boolean flag whose targeting refers to the shared evaluator `name`.
fn referring(name: &str) -> Value {
    with(
        good_bool(),
        "targeting",
        Some(json!({"if": [{"$ref": name}, "off", "on"]})),
    )
}

/// Top-level entries of a document besides `flags`: one.
fn top(key: &str, value: Value) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert(key.to_owned(), value);
    map
}

fn with(mut flag: Value, field: &str, value: Option<Value>) -> Value {
    if let Value::Object(map) = &mut flag {
        match value {
            Some(value) => {
                map.insert(field.to_owned(), value);
            }
            None => {
                map.remove(field);
            }
        }
    }
    flag
}

/// Targeting rules: valid ones, flagd's own operators, unknown operators, `$ref`s, and rules
/// whose result is not a variant name.
fn rules() -> Vec<Value> {
    vec![
        json!({}),
        json!({"if": [{"==": [{"var": "tier"}, "gold"]}, "off", "on"]}),
        json!({"if": [true, "off", "on"]}),
        json!({"if": [true, "nope", "on"]}),
        json!({"if": [true, null, "on"]}),
        json!({"if": [true, 3, "on"]}),
        json!({"if": [true, true, "on"]}),
        json!({"var": "missing"}),
        json!({"fractional": [{"var": "targetingKey"}, ["on", 50], ["off", 50]]}),
        json!({"fractional": [["on", 50], ["off", 50]]}),
        json!({"if": [{"sem_ver": [{"var": "v"}, ">=", "1.2.0"]}, "off", "on"]}),
        json!({"if": [{"starts_with": [{"var": "e"}, "a"]}, "off", "on"]}),
        json!({"if": [{"ends_with": [{"var": "e"}, "z"]}, "off", "on"]}),
        json!({"if": [{"no_such_op": [1, 2]}, "off", "on"]}),
        json!({"no_such_op": []}),
        json!({"if": [{"$ref": "defined"}, "off", "on"]}),
        json!({"if": [{"$ref": "undefined"}, "off", "on"]}),
        json!({"if": [{"in": ["a", {"var": "list"}]}, "off", "on"]}),
        json!({"cat": ["o", "n"]}),
        json!({"if": [{"missing": ["a"]}, "off", "on"]}),
        json!({"==": [1, 1]}),
        json!({"if": []}),
        json!({"if": [{"var": ["a", "on"]}]}),
        json!({"merge": [["on"]]}),
    ]
}

/// The generated documents (systematic, then `random` drawn from `seed`) and, when present,
/// flagd's schema test vectors from `vectors` (`json/test/flags/{positive,negative}`).
pub fn corpus(seed: u64, random: usize, vectors: Option<&Path>) -> Vec<Doc> {
    let mut b = Builder { docs: Vec::new() };
    let fields = [
        "state",
        "variants",
        "defaultVariant",
        "targeting",
        "metadata",
    ];
    for field in fields {
        b.beside_good(format!("{field} missing"), with(good_bool(), field, None));
        for value in every_type() {
            b.beside_good(
                format!("{field} = {value}"),
                with(good_bool(), field, Some(value)),
            );
        }
    }
    for state in [
        "ENABLED", "DISABLED", "ON", "enabled", "Disabled", " ENABLED",
    ] {
        b.beside_good(
            format!("state {state:?}"),
            with(good_bool(), "state", Some(json!(state))),
        );
    }
    for value in every_type() {
        let one = json!({"state": "ENABLED", "variants": {"a": value}, "defaultVariant": "a"});
        b.beside_good(format!("only variant = {value}"), one);
        let mixed =
            json!({"state": "ENABLED", "variants": {"a": "s", "b": value}, "defaultVariant": "a"});
        b.beside_good(
            format!("variant b = {value} beside a string"),
            mixed.clone(),
        );
        b.beside_good(
            format!("variant b = {value} beside a string, default b"),
            with(mixed, "defaultVariant", Some(json!("b"))),
        );
    }
    for default in ["on", "off", "nope", "", "ON"] {
        b.beside_good(
            format!("defaultVariant {default:?}"),
            with(good_bool(), "defaultVariant", Some(json!(default))),
        );
    }
    for (i, rule) in rules().into_iter().enumerate() {
        b.beside_good(
            format!("targeting rule {i}: {rule}"),
            with(good_bool(), "targeting", Some(rule.clone())),
        );
        let no_default = with(
            with(good_bool(), "targeting", Some(rule.clone())),
            "defaultVariant",
            None,
        );
        b.beside_good(
            format!("targeting rule {i} without defaultVariant"),
            no_default,
        );
        b.flags(
            format!("rule {i} as a shared evaluator"),
            vec![("ok", good_bool()), ("ref", referring("shared"))],
            top("$evaluators", shared_evaluators(rule)),
        );
    }
    for value in every_type() {
        b.flags(
            format!("$evaluators = {value}"),
            vec![("ok", good_bool())],
            top("$evaluators", value.clone()),
        );
        b.flags(
            format!("evaluator e = {value}, referred to"),
            vec![("ok", good_bool()), ("ref", referring("e"))],
            top("$evaluators", json!({"e": value})),
        );
        b.flags(
            format!("flag-set metadata = {value}"),
            vec![("ok", good_bool())],
            top("metadata", value.clone()),
        );
        b.flags(
            format!("flag-set metadata entry = {value}"),
            vec![("ok", good_bool())],
            top("metadata", json!({"team": value})),
        );
        b.beside_good(
            format!("flag metadata entry = {value}"),
            with(good_bool(), "metadata", Some(json!({"owner": value}))),
        );
        b.flags(
            format!("odd flag = {value}"),
            vec![("ok", good_bool()), ("odd", value.clone())],
            Map::new(),
        );
        b.raw(format!("flags = {value}"), json!({"flags": value}));
    }
    for key in ["flagSetId", "version", "id"] {
        b.flags(
            format!("flag-set metadata {key}"),
            vec![("ok", good_bool()), ("s", good_string())],
            top("metadata", json!({key: "x"})),
        );
    }
    let mut extra = top("$schema", json!("https://flagd.dev/schema/v0/flags.json"));
    extra.insert("unknown".into(), json!({"a": 1}));
    b.flags(
        "unknown top-level keys".into(),
        vec![("ok", good_bool())],
        extra,
    );
    b.beside_good(
        "unknown flag key".into(),
        with(good_bool(), "unknown", Some(json!(1))),
    );
    b.raw("no flags".into(), json!({}));
    b.raw("not an object".into(), json!([1, 2]));
    for key in ["", " ", "a.b", "ünï", "with space", "x/y"] {
        b.raw(
            format!("flag key {key:?}"),
            json!({"flags": {key: good_bool(), "keyed_ok": good_string()}}),
        );
    }
    random_documents(&mut b, seed, random);
    if let Some(vectors) = vectors {
        schema_vectors(&mut b, vectors);
    }
    b.docs
}

/// `count` documents of one to four flags, each field of each flag mutated one time in four.
fn random_documents(b: &mut Builder, seed: u64, count: usize) {
    let mut rng = Seeded::new(seed);
    let states = [
        json!("ENABLED"),
        json!("DISABLED"),
        json!("ON"),
        json!(1),
        Value::Null,
    ];
    let types = every_type();
    let rules = rules();
    for n in 0..count {
        let flags: Vec<(String, Value)> = (0..1 + rng.below(4))
            .map(|i| {
                let mut flag = if rng.chance(50) {
                    good_bool()
                } else {
                    good_string()
                };
                if rng.chance(25) {
                    flag = with(flag, "state", Some(rng.pick(&states)));
                }
                if rng.chance(25) {
                    let value = rng.pick(&types);
                    if let Some(Value::Object(variants)) = flag.get_mut("variants") {
                        variants.insert("extra".into(), value);
                    }
                }
                if rng.chance(25) {
                    let default = rng.pick(&[
                        json!("on"),
                        json!("red"),
                        json!("extra"),
                        json!(""),
                        Value::Null,
                    ]);
                    flag = with(flag, "defaultVariant", Some(default));
                }
                if rng.chance(25) {
                    flag = with(flag, "targeting", Some(rng.pick(&rules)));
                }
                if rng.chance(15) {
                    flag = with(flag, "metadata", Some(json!({"m": rng.pick(&types)})));
                }
                if rng.chance(5) {
                    flag = rng.pick(&types);
                }
                (format!("r{i}"), flag)
            })
            .collect();
        let mut extra = Map::new();
        if rng.chance(20) {
            extra.insert("$evaluators".into(), json!({"defined": rng.pick(&rules)}));
        }
        if rng.chance(15) {
            extra.insert("metadata".into(), json!({"m": rng.pick(&types)}));
        }
        let named: Vec<(&str, Value)> =
            flags.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        b.flags(format!("random {n} (seed {seed})"), named, extra);
    }
}

/// flagd's schema test vectors, each as it is (they are JSON files of flag documents).
fn schema_vectors(b: &mut Builder, vectors: &Path) {
    for kind in ["positive", "negative"] {
        let Ok(entries) = std::fs::read_dir(vectors.join(kind)) else {
            continue;
        };
        let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            if let Ok(value) = serde_json::from_str::<Value>(&text) {
                let file = path.file_name().unwrap_or_default().to_string_lossy();
                b.raw(format!("schema vector {kind}/{file}"), value);
            }
        }
    }
}
