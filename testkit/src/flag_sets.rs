//! Generated flag sets that look like real ones: flags of every value type, most with a
//! targeting rule (lists of users, e-mail domains, fractional rollouts, version and region
//! checks), names and values that vary. gzip shrinks them about as much as real flag sets
//! (5–6 times at level 6), not as much as repeated filler would.
use serde_json::{Map, Value, json};

/// A small deterministic generator (xorshift64), so a seed always gives the same flag set.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    fn hex(&mut self, digits: usize) -> String {
        (0..digits)
            .map(|_| char::from_digit(self.below(16) as u32, 16).unwrap_or('0'))
            .collect()
    }
}

const WORDS: &[&str] = &[
    "checkout",
    "search",
    "banner",
    "pricing",
    "onboarding",
    "recommendations",
    "cart",
    "billing",
    "profile",
    "dark-mode",
    "beta",
    "experiment",
    "rollout",
    "api",
    "cache",
    "payments",
    "shipping",
    "ui",
    "mobile",
    "web",
];

/// One generated flag: its key and definition.
fn flag(rng: &mut Rng, i: usize) -> (String, Value) {
    let key = format!("{}-{}-{i}-{}", rng.pick(WORDS), rng.pick(WORDS), rng.hex(4));
    let (variants, default) = match rng.below(4) {
        0 => (json!({"on": true, "off": false}), "off".to_owned()),
        1 => {
            let mut variants = Map::new();
            for k in 0..2 + rng.below(3) {
                let value = format!("{}-{}", rng.pick(WORDS), rng.hex(8));
                variants.insert(format!("v{k}-{}", rng.hex(6)), Value::String(value));
            }
            let default = variants.keys().next().cloned().unwrap_or_default();
            (Value::Object(variants), default)
        }
        2 => (
            json!({"small": rng.below(100), "medium": rng.below(1000), "large": rng.below(100_000)}),
            "small".to_owned(),
        ),
        _ => (
            json!({
                "a": {"color": format!("#{}", rng.hex(6)), "limit": rng.below(500), "enabled": true},
                "b": {"color": format!("#{}", rng.hex(6)), "limit": rng.below(500), "enabled": false}
            }),
            "a".to_owned(),
        ),
    };
    let names: Vec<String> = variants
        .as_object()
        .map(|v| v.keys().cloned().collect())
        .unwrap_or_default();
    let mut flag = json!({"state": "ENABLED", "defaultVariant": default, "variants": variants});
    if rng.below(10) < 8 {
        let first = names[rng.below(names.len() as u64) as usize].clone();
        let second = names[rng.below(names.len() as u64) as usize].clone();
        flag["targeting"] = match rng.below(4) {
            0 => {
                let users: Vec<String> = (0..1 + rng.below(6))
                    .map(|_| format!("{}@{}.com", rng.hex(8), rng.pick(WORDS)))
                    .collect();
                json!({"if": [{"in": [{"var": "email"}, users]}, first, second]})
            }
            1 => json!({"if": [
                {"ends_with": [{"var": "email"}, format!("@{}.example.com", rng.pick(WORDS))]},
                first, null
            ]}),
            2 => {
                let share = 1 + rng.below(99);
                json!({"fractional": [
                    {"cat": [{"var": "$flagd.flagKey"}, {"var": "targetingKey"}]},
                    [first, share], [second, 100 - share]
                ]})
            }
            _ => json!({"if": [{"and": [
                {"sem_ver": [{"var": "version"}, ">=", format!("{}.{}.0", rng.below(5), rng.below(20))]},
                {"==": [{"var": "region"}, rng.pick(&["eu-west-1", "us-east-1", "ap-south-1"])]}
            ]}, first, second]}),
        };
    }
    (key, flag)
}

/// Generated flags (the `flags` object of a flag set) of at least `bytes` bytes as JSON, the
/// same for the same `seed`.
pub fn realistic_flags(seed: u64, bytes: usize) -> Map<String, Value> {
    // xorshift needs a state other than zero.
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut flags = Map::new();
    let mut size = 2;
    let mut i = 0;
    while size < bytes {
        let (key, flag) = flag(&mut rng, i);
        size += key.len() + 4 + flag.to_string().len();
        flags.insert(key, flag);
        i += 1;
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_sets_have_the_asked_size_and_depend_only_on_the_seed() {
        let flags = realistic_flags(7, 100 * 1024);
        let size = Value::Object(flags.clone()).to_string().len();
        assert!((100 * 1024..110 * 1024).contains(&size), "{size}");
        assert_eq!(flags, realistic_flags(7, 100 * 1024));
        assert_ne!(flags, realistic_flags(8, 100 * 1024));
    }
}
