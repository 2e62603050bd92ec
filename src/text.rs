//! Text that came from outside (a peer on the wire, a file name, a command-line value), made
//! safe to show: characters a terminal would act on or not show at all are written as escapes.
//!
//! "Hidden" here means the characters that are not shown as themselves: controls (C0, DEL and
//! C1, among them ESC and the one-character CSI, U+009B, that start terminal escape sequences,
//! and the line breaks that would forge a line), the line and paragraph separators, and the
//! characters Unicode lists as ignorable in display (Default_Ignorable_Code_Point: zero-width
//! spaces and joiners, the bidirectional controls that reorder what follows them, variation
//! selectors, tag characters, fillers), plus the interlinear annotation marks.
use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` is a character a terminal does not show as itself (see the module's text).
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            u32::from(c),
            0x00AD
                | 0x034F
                | 0x061C
                | 0x115F..=0x1160
                | 0x17B4..=0x17B5
                | 0x180B..=0x180F
                | 0x200B..=0x200F
                | 0x2028..=0x202E
                | 0x2060..=0x206F
                | 0x3164
                | 0xFE00..=0xFE0F
                | 0xFEFF
                | 0xFFA0
                | 0xFFF0..=0xFFFB
                | 0x1BCA0..=0x1BCA3
                | 0x1D173..=0x1D17A
                | 0xE0000..=0xE0FFF
        )
}

/// `text` with every hidden character written as an escape (`\n`, `\r`, `\t`, else
/// `\u{1b}`), so that it shows as one line of visible characters. Nothing else changes.
pub fn escaped(text: &str) -> Cow<'_, str> {
    replace_hidden(text, |c, out| match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        _ => {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    })
}

/// JSON text with every hidden character but the line breaks between its values written as a
/// JSON escape (`\u001b`; a pair of them beyond the Basic Multilingual Plane): the same JSON
/// value, with nothing a terminal would act on. A JSON writer escapes the C0 controls in strings
/// already (so a line break in the text is never inside a string); this covers DEL, C1 and the
/// invisible characters, which it writes as they are.
pub fn json_escaped(json: &str) -> Cow<'_, str> {
    replace_hidden(json, |c, out| {
        if c == '\n' {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    })
}

/// `text` with each hidden character replaced by what `write` puts in its place.
fn replace_hidden(text: &str, mut write: impl FnMut(char, &mut String)) -> Cow<'_, str> {
    if !text.chars().any(is_hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_hidden(c) {
            write(c, &mut out);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_characters_are_escaped_and_others_kept() {
        assert!(matches!(escaped("plain é ü 日本"), Cow::Borrowed(_)));
        assert_eq!(
            escaped("a\nb\r\tc\u{1b}[31m\u{7f}\u{9b}2J"),
            "a\\nb\\r\\tc\\u{1b}[31m\\u{7f}\\u{9b}2J"
        );
        assert_eq!(
            escaped("x\u{200b}y\u{202e}z\u{feff}\u{e0041}"),
            "x\\u{200b}y\\u{202e}z\\u{feff}\\u{e0041}"
        );
        for c in ['a', ' ', 'é', 'ѕ', '—', '\u{3000}'] {
            assert!(!is_hidden(c), "{c:?}");
        }
    }

    #[test]
    fn json_stays_the_same_value_without_hidden_characters() {
        let value = serde_json::json!({
            "k\u{7f}": ["\u{1b}[2J", "\u{9b}31m", "\u{202e}txt", "tag\u{e0041}", "é"]
        });
        let pretty = serde_json::to_string_pretty(&value).expect("serializes");
        let safe = json_escaped(&pretty);
        assert!(!safe.chars().any(|c| c != '\n' && is_hidden(c)), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).expect("still JSON");
        assert_eq!(back, value);
    }
}
