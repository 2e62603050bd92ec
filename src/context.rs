//! Context values: `--context-value key=value` entries that every `sync_context` and
//! `GetMetadata` answer carry, as flagd's own sync server does. Providers merge `sync_context`
//! into their evaluation context, so targeting rules can use them.
//! The entries are parsed here; the wire's `SyncService` carries them into every message.

/// Keys the proxy fills itself; a context value may not take them.
pub const RESERVED_KEYS: &[&str] = &["proxy", "proxyVersion", "selector"];

/// Keys flagd's schema defines for a flag set's own `metadata` (`flagSetId`, `version`): they
/// describe each flag set, so a proxy-wide context value may not take them. Other keys a flag
/// set's metadata uses win over a context value of the same key in that flag set's messages.
pub const FLAG_SET_KEYS: &[&str] = &["flagSetId", "version"];

/// The most bytes all context values (keys and values) may take together. They go into every
/// message beside the flag configuration, whose limit leaves 4 KiB of a client's 4 MiB for
/// everything else; this keeps them well within it.
pub const MAX_TOTAL_BYTES: usize = 2048;

/// Checks the entries together: their total size, and keys that differ only in case from a
/// reserved one (refused: a client reading `Selector` beside `selector` is confused).
pub fn check_entries(entries: &[(String, String)]) -> Result<(), String> {
    let total: usize = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_TOTAL_BYTES {
        return Err(format!(
            "--context-value entries take {total} bytes together, over the limit of \
             {MAX_TOTAL_BYTES}: they are sent in every message; keep them to short labels"
        ));
    }
    for (key, _) in entries {
        if let Some(reserved) = RESERVED_KEYS
            .iter()
            .find(|reserved| reserved.eq_ignore_ascii_case(key))
        {
            return Err(format!(
                "--context-value key {key:?} differs only in case from the proxy's own key \
                 {reserved:?}; choose another key"
            ));
        }
        if let Some(own) = FLAG_SET_KEYS
            .iter()
            .find(|own| own.eq_ignore_ascii_case(key))
        {
            return Err(format!(
                "--context-value key {key:?} is (or differs only in case from) {own:?}, which \
                 each flag set's own metadata sets; choose another key"
            ));
        }
    }
    Ok(())
}

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

    #[test]
    fn entries_are_bounded_together_and_look_alikes_refused() {
        let entry = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(check_entries(&[entry("region", "eu-west")]), Ok(()));
        let big = vec![entry("a", &"x".repeat(1500)), entry("b", &"y".repeat(600))];
        let error = check_entries(&big).expect_err("too large together");
        assert!(error.contains("over the limit of 2048"), "{error}");
        for key in ["flagSetId", "version", "FlagSetID", "Version"] {
            let error = check_entries(&[entry(key, "x")]).expect_err("a flag set's own key");
            assert!(error.contains("each flag set's own metadata"), "{error}");
        }
        let error = check_entries(&[entry("Selector", "x")]).expect_err("look-alike");
        assert!(error.contains("\"selector\""), "{error}");
    }
}
