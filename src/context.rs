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

/// Checks the entries together: their total size, and each key as [`parse_entry`] does.
pub fn check_entries(entries: &[(String, String)]) -> Result<(), String> {
    let total: usize = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_TOTAL_BYTES {
        return Err(format!(
            "the entries take {total} bytes together, over the limit of {MAX_TOTAL_BYTES}: \
             they are sent in every message; keep them to short labels"
        ));
    }
    entries.iter().try_for_each(|(key, _)| check_key(key))
}

/// Parses one `key=value` entry (the value may be empty and may contain `=`; whitespace around
/// the key is dropped).
pub fn parse_entry(entry: &str) -> Result<(String, String), String> {
    let Some((key, value)) = entry.split_once('=') else {
        return Err(format!("expected KEY=VALUE, found {}", shown(entry)));
    };
    // Before the whitespace around the key is dropped: a line break there is refused too.
    check_visible(key)?;
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("the key is empty in {}", shown(entry)));
    }
    check_key(key)?;
    Ok((key.to_owned(), value.to_owned()))
}

/// Refuses a key that a client could not tell from a reserved one, or could not read: one with
/// a control or invisible character (a line break, an escape sequence, a zero-width space, a
/// bidirectional control), a reserved key itself, and one that differs from a reserved key only
/// in case or in characters that look alike (Unicode's confusables: `ѕelector` with a Cyrillic
/// `ѕ`, `𝐯ersion`, `fIagSetId` with a capital `I`).
fn check_key(key: &str) -> Result<(), String> {
    check_visible(key)?;
    if RESERVED_KEYS.contains(&key) {
        return Err(format!(
            "the key {key:?} is the proxy's own; reserved keys: {}",
            RESERVED_KEYS.join(", ")
        ));
    }
    if let Some(reserved) = RESERVED_KEYS.iter().find(|r| looks_like(key, r)) {
        return Err(format!(
            "the key {} differs only in case or in characters that look alike from the \
             proxy's own key {reserved:?}; choose another key",
            shown(key)
        ));
    }
    if let Some(own) = FLAG_SET_KEYS.iter().find(|own| looks_like(key, own)) {
        return Err(format!(
            "the key {} is (or differs only in case or in characters that look alike from) \
             {own:?}, which each flag set's own metadata sets; choose another key",
            shown(key)
        ));
    }
    Ok(())
}

/// Refuses a key with a control or invisible character.
fn check_visible(key: &str) -> Result<(), String> {
    if key.chars().any(crate::text::is_hidden) {
        return Err(format!(
            "the key {} holds a control or invisible character; keys must be visible text",
            shown(key)
        ));
    }
    Ok(())
}

/// Whether `key` reads as `reserved`: the same Unicode confusable skeleton (UTS #39) once case
/// is set aside. The skeleton keeps case (`Selector` is not `selector`) and maps the capital `I`
/// to `l`, so both orders are compared: lower case first (`FLAGSETID`), and the skeleton first
/// (`fIagSetId`).
fn looks_like(key: &str, reserved: &str) -> bool {
    let skeleton = |text: &str| unicode_security::skeleton(text).collect::<String>();
    let lower_first = |text: &str| skeleton(&text.to_lowercase());
    let skeleton_first = |text: &str| skeleton(text).to_lowercase();
    lower_first(key) == lower_first(reserved) || skeleton_first(key) == skeleton_first(reserved)
}

/// `text` quoted with everything but printable ASCII escaped, so that the difference from a
/// reserved key, or a control character, shows in the message.
fn shown(text: &str) -> String {
    format!("\"{}\"", text.escape_default())
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

    /// Keys a client could not tell from a reserved one, or could not read, are refused with
    /// the key escaped in the message; look-alikes of ordinary keys are not the proxy's concern.
    #[test]
    fn look_alike_and_unreadable_keys_are_refused_with_the_key_escaped() {
        // The refusal of `key`, which shows it escaped.
        let refused = |key: &str| {
            let error = parse_entry(&format!("{key}=x")).expect_err(key);
            assert!(error.contains(&key.escape_default().to_string()), "{error}");
            error
        };
        for (key, reserved) in [
            ("\u{0455}elector", "\"selector\""), // Cyrillic dze
            ("SELECT\u{041e}R", "\"selector\""), // Cyrillic capital O
            ("pr\u{043e}xy", "\"proxy\""),       // Cyrillic o
            ("\u{ff50}roxy", "\"proxy\""),       // fullwidth p
            ("proxyVer\u{0455}ion", "\"proxyVersion\""),
            ("fIagSetId", "\"flagSetId\""),        // capital I for l
            ("flagSet\u{0406}d", "\"flagSetId\""), // Cyrillic capital I
            ("\u{1d42f}ersion", "\"version\""),    // mathematical bold v
            ("versi\u{03bf}n", "\"version\""),     // Greek omicron
        ] {
            let error = refused(key);
            assert!(error.contains(reserved), "{key}: {error}");
            assert!(error.contains("look alike"), "{error}");
        }
        for key in [
            "a\nb",
            "region\r",
            "x\u{1b}[31m",
            "tab\there",
            "del\u{7f}",
            "csi\u{9b}2J",
            "\u{200b}selector",
            "sel\u{00ad}ector",
            "\u{202e}rotceles",
            "flagSetId\u{e0041}",
        ] {
            let error = refused(key);
            assert!(error.contains("control or invisible character"), "{error}");
            assert!(!error.chars().any(crate::text::is_hidden), "{error:?}");
        }
        // Surrounding whitespace is dropped, so the reserved key it hid is refused.
        for entry in [" selector=x", "flagSetId\u{3000}=x", "\u{a0}version =x"] {
            assert!(parse_entry(entry).is_err(), "{entry:?}");
        }
        // Check_entries refuses the same keys, for settings not built from the command line.
        let error = check_entries(&[("a\nb".into(), "x".into())]).expect_err("a line break");
        assert!(error.contains("\"a\\nb\""), "{error}");
        // Ordinary keys, non-ASCII ones included, are kept as they are.
        for key in [
            "region",
            "région",
            "地域",
            "selectors",
            "proxy-id",
            "flagSet",
            "vers",
        ] {
            assert_eq!(
                parse_entry(&format!("{key}=v")),
                Ok((key.into(), "v".into()))
            );
        }
    }
}
