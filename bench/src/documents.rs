//! The flag documents of each version: the flag that carries the version's sequence number,
//! and filler or realistic flags up to the payload's size.

use serde_json::{Value, json};

use crate::SEQ_FLAG;

/// What the documents hold besides the flag that carries the version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Documents {
    /// One filler flag repeated with another number: gzip shrinks it far more than real flags.
    Filler,
    /// Generated flags with targeting rules, the same in every version
    /// (`flagd_proxy_testkit::flag_sets`): gzip shrinks them about as much as real flag sets.
    Realistic,
}

/// The flag that carries version `seq` (found by [`SEQ_MARKER`]).
fn seq_flag(seq: u64) -> Value {
    json!({
        "state": "ENABLED",
        "variants": {"on": true, "off": false},
        "defaultVariant": "on",
        "metadata": {"benchSeq": seq}
    })
}

/// The flags of version `seq`, about `payload` bytes, of the kind `documents` says.
pub(crate) fn flags_of(
    documents: Documents,
    seq: u64,
    payload: usize,
) -> serde_json::Map<String, Value> {
    match documents {
        Documents::Filler => flags(seq, payload),
        Documents::Realistic => {
            let mut flags = flagd_proxy_testkit::flag_sets::realistic_flags(1, payload);
            flags.insert(SEQ_FLAG.to_owned(), seq_flag(seq));
            flags
        }
    }
}

/// The flags of version `seq`, padded with filler flags to about `payload` bytes.
pub(crate) fn flags(seq: u64, payload: usize) -> serde_json::Map<String, Value> {
    let mut flags = serde_json::Map::new();
    flags.insert(SEQ_FLAG.to_owned(), seq_flag(seq));
    let base = json!({"flags": flags}).to_string().len();
    let filler = |i: usize| {
        json!({
            "state": "ENABLED",
            "variants": {
                "blue": format!("blue-{i:05}-0123456789abcdef0123456789abcdef"),
                "green": format!("green-{i:05}-0123456789abcdef0123456789abcdef")
            },
            "defaultVariant": "blue",
            "targeting": {"if": [{"ends_with": [{"var": "email"}, "@example.com"]}, "green", null]}
        })
    };
    let one = format!("\"flag-00000\":{},", filler(0)).len();
    let count = payload.saturating_sub(base) / one;
    for i in 0..count {
        flags.insert(format!("flag-{i:05}"), filler(i));
    }
    flags
}

/// Version `seq` as a flagd flag configuration document of about `payload` bytes.
pub(crate) fn document(seq: u64, payload: usize) -> String {
    json!({"flags": flags(seq, payload)}).to_string()
}
