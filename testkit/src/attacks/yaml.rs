//! Rows 7 and 8: YAML files that would cost memory or time out of proportion to their size,
//! as the manifests folder may receive them. The proxy must report each as a problem of its
//! file, quickly, and keep serving the other files.

/// Row 7: one anchor of `anchor_bytes` referenced `refs` times (100 KB × 20,000 expands to
/// 2 GB from a 182 KB file).
pub fn aliases(anchor_bytes: usize, refs: usize) -> String {
    let mut yaml = format!("a: &a \"{}\"\nrefs: [", "x".repeat(anchor_bytes));
    yaml.push_str(&vec!["*a"; refs].join(", "));
    yaml.push_str("]\n");
    yaml
}

/// Row 8: about `bytes` of flow mappings nested through quoted scalars that hold closing
/// brackets (`{a: "}", b: …`), which once hid the nesting from the depth pre-check.
pub fn quoted_brackets(bytes: usize) -> String {
    const LEVEL: &str = "{a: \"}\", b: ";
    let levels = bytes / LEVEL.len();
    format!("{}1{}", LEVEL.repeat(levels), "}".repeat(levels))
}

/// The most the proxy's peak RSS may reach while it reads both files (the aliases expanded
/// are 2 GB), and the most CPU seconds their parses may take (the nesting once took tens).
pub const PEAK_MIB_AT_MOST: u64 = 256;
pub const CPU_SECONDS_AT_MOST: u64 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_are_as_large_as_asked() {
        let aliases = aliases(100, 3);
        assert!(aliases.starts_with("a: &a \"xxx"));
        assert!(aliases.ends_with("refs: [*a, *a, *a]\n"));
        let quoted = quoted_brackets(1200);
        assert_eq!(quoted.matches("{a: ").count(), 100);
        assert_eq!(
            quoted.matches('}').count(),
            200,
            "one in each scalar, one closing it"
        );
    }
}
