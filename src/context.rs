//! Context values: `--context-value key=value` entries that every `sync_context` and
//! `GetMetadata` answer carry, as flagd's own sync server does. Providers merge `sync_context`
//! into their evaluation context, so targeting rules can use them.
//! The entries are parsed here; the wire's `SyncService` carries them into every message.

/// Keys the proxy fills itself; a context value may not take them.
pub const RESERVED_KEYS: &[&str] = &["proxy", "proxyVersion", "selector"];

/// Parses one `key=value` entry (the value may be empty and may contain `=`).
pub fn parse_entry(entry: &str) -> Result<(String, String), String> {
    let Some((key, value)) = entry.split_once('=') else {
        return Err(format!("expected KEY=VALUE, found {entry:?}"));
    };
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("the key is empty in {entry:?}"));
    }
    if RESERVED_KEYS.contains(&key) {
        return Err(format!(
            "the key {key:?} is the proxy's own; reserved keys: {}",
            RESERVED_KEYS.join(", ")
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse() {
        assert_eq!(
            parse_entry("region=eu-west"),
            Ok(("region".into(), "eu-west".into()))
        );
        assert_eq!(parse_entry("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_entry("empty="), Ok(("empty".into(), String::new())));
        for bad in ["novalue", "=x", "selector=x", "proxy=x"] {
            assert!(parse_entry(bad).is_err(), "{bad}");
        }
    }
}
