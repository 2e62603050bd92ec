//! Row 13: `--context-value` entries that once were taken without a word: a value too large to
//! go into every message and keys that name the message's own fields or look like the proxy's
//! own are refused at start (exit status 64); `rev`, no key of flagd's schema, is an ordinary
//! label and served.

/// One entry of the attack and what the proxy does with it.
pub struct Entry {
    /// What the entry is, as the bench's table names it.
    pub what: &'static str,
    /// The argument of `--context-value`.
    pub entry: String,
    /// Whether the proxy refuses to start with it ([`EXIT_STATUS`]) rather than serving.
    pub refused: bool,
}

/// The entries. The value is 100 KB, not the 5 MB of the original report: one argument cannot
/// be longer than 128 KiB.
pub fn entries() -> [Entry; 4] {
    let entry = |what, entry: String, refused| Entry {
        what,
        entry,
        refused,
    };
    [
        entry(
            "100 KB value",
            format!("notes={}", "n".repeat(100_000)),
            true,
        ),
        entry("flagSetId", "flagSetId=x".to_owned(), true),
        entry("rev", "rev=1".to_owned(), false),
        entry("look-alike Selector", "Selector=x".to_owned(), true),
    ]
}

/// The exit status of a proxy started with an entry it refuses (sysexits' EX_USAGE, the
/// proxy's status for a configuration that cannot work).
pub const EXIT_STATUS: i32 = 64;
