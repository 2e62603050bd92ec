//! Reading manifest files: finding them under a directory, reading them with a size limit, and
//! parsing the `FeatureFlag` objects out of them (YAML or JSON, `List`s included).
use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::Object;
use super::parsing::Cancel;
use crate::document;
use crate::selector::{self, GROUP, ResourceKey};

/// Files larger than this are not read.
pub(super) const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Directories deeper than this below a configured directory are not read.
const MAX_DIRECTORY_DEPTH: usize = 16;

/// Reads a regular file of at most [`MAX_FILE_BYTES`], counting while reading (a reported size
/// may be wrong, and a file may grow while it is read).
pub(super) fn read_limited(path: &Path) -> Result<Vec<u8>, String> {
    let not_regular = || "not a regular file; skipped".to_owned();
    // Checked before opening: opening a FIFO would wait for a writer.
    if !std::fs::metadata(path)
        .map_err(|e| e.to_string())?
        .is_file()
    {
        return Err(not_regular());
    }
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    // Room for what the file holds now (and one byte to see its end), so that it is read in
    // one or two calls; the reported size is a hint only, bounded by the limit.
    let hint = meta.len().min(MAX_FILE_BYTES) as usize + 1;
    let mut content = Vec::with_capacity(hint);
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut content)
        .map_err(|e| e.to_string())?;
    if content.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "the file is over the limit of {MAX_FILE_BYTES} bytes"
        ));
    }
    Ok(content)
}

/// What a walk of the configured directories found.
#[derive(Default)]
pub(super) struct Found {
    /// The manifest files.
    pub(super) files: Vec<PathBuf>,
    /// The directories whose entries could not be listed: their files' last good resources stay.
    pub(super) unreadable: Vec<Unreadable>,
}

/// A directory that could not be read, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Unreadable {
    pub(super) dir: PathBuf,
    pub(super) error: String,
}

/// Adds the manifest files under `dir` to `found`: `.yaml`, `.yml` and `.json`, skipping hidden
/// entries, each directory once (symlink loops end), at most [`MAX_DIRECTORY_DEPTH`] levels down.
/// A directory that cannot be read (no permission, an I/O error) is added to
/// `found.unreadable` with why: `dir` itself whatever the reason, a directory below it unless it
/// is gone (deleted since its parent was listed: its files are gone too).
pub(super) fn collect_files(
    dir: &Path,
    depth: usize,
    visited: &mut HashSet<(u64, u64)>,
    found: &mut Found,
) {
    let unreadable = |found: &mut Found, error: std::io::Error| {
        if depth == 0 || error.kind() != std::io::ErrorKind::NotFound {
            found.unreadable.push(Unreadable {
                dir: dir.to_owned(),
                error: error.to_string(),
            });
        }
    };
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        Err(error) => return unreadable(found, error),
    };
    if !visited.insert((meta.dev(), meta.ino())) {
        tracing::debug!(dir = %dir.display(), "directory already read (a symlink loop?); skipped");
        return;
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => return unreadable(found, error),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if hidden {
            continue;
        }
        // Follows symlinks; a dangling or looping one has no metadata and is skipped.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if depth < MAX_DIRECTORY_DEPTH {
                collect_files(&path, depth + 1, visited, found);
            }
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            found.files.push(path);
        }
    }
}

/// The most a YAML file may expand to through its aliases: what its nodes add up to once every
/// alias is replaced by the node it names (scalar bytes, plus one per node). The same as the
/// largest file read, so aliases cannot make a file yield more than a file without them could.
const MAX_EXPANDED_BYTES: u64 = MAX_FILE_BYTES;

/// Checks a YAML text with a tokenizing parser before it is deserialized: collections nest at
/// most [`document::MAX_DEPTH`] levels (a deserializer's time can grow with the square of the
/// nesting; quoted scalars are read as scalars, so brackets inside them count for nothing), and
/// the text expanded through its aliases stays under [`MAX_EXPANDED_BYTES`] (one anchor
/// referenced many times is a "billion laughs"). Stops at the first problem, or once `cancel` is
/// set, so the time it takes is linear in the part of the text it reads.
fn check_yaml(text: &str, cancel: &Cancel) -> Result<(), String> {
    use saphyr_parser::{Event, Parser};
    // Open collections: their anchor (0 for none) and the expanded size when they began.
    let mut open: Vec<(usize, u64)> = Vec::new();
    // The expanded size of each anchored node, once it is complete.
    let mut anchored: std::collections::HashMap<usize, u64> = std::collections::HashMap::new();
    let mut expanded: u64 = 0;
    for (count, event) in Parser::new_from_str(text).enumerate() {
        if count % CANCEL_CHECK_EVENTS == 0 && cancel.is_cancelled() {
            return Err(CANCELLED.to_owned());
        }
        let (event, span) = event.map_err(|e| format!("invalid YAML: {e}"))?;
        match event {
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if open.len() >= document::MAX_DEPTH {
                    return Err(format!(
                        "collections nest more than {} levels deep (line {}); not parsed",
                        document::MAX_DEPTH,
                        span.start.line()
                    ));
                }
                open.push((anchor, expanded));
                expanded += 1;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((anchor, began)) = open.pop()
                    && anchor != 0
                {
                    anchored.insert(anchor, expanded - began);
                }
            }
            Event::Scalar(value, _, anchor, _) => {
                let size = value.len() as u64 + 1;
                expanded += size;
                if anchor != 0 {
                    anchored.insert(anchor, size);
                }
            }
            // An alias of a node still open (a cycle) counts once; the deserializer refuses it.
            Event::Alias(anchor) => expanded += anchored.get(&anchor).copied().unwrap_or(1),
            _ => {}
        }
        if expanded > MAX_EXPANDED_BYTES {
            return Err(format!(
                "aliases expand the YAML past {} MiB (line {}); not parsed",
                MAX_EXPANDED_BYTES / (1024 * 1024),
                span.start.line()
            ));
        }
    }
    Ok(())
}

/// How often (in YAML events) a parse checks whether it was cancelled.
const CANCEL_CHECK_EVENTS: usize = 4096;
/// The error of a cancelled parse (its result is dropped, never shown).
const CANCELLED: &str = "cancelled";

/// The `FeatureFlag` objects in one file; stops early, with an error, once `cancel` is set.
pub(super) fn parse_objects(
    path: &Path,
    content: &[u8],
    cancel: &Cancel,
) -> Result<Vec<(ResourceKey, Object)>, String> {
    let text = std::str::from_utf8(content).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut documents = Vec::new();
    if path.extension().is_some_and(|e| e == "json") {
        // serde_json bounds its own recursion (128 levels) and is linear in the text.
        documents
            .push(serde_json::from_str::<Value>(text).map_err(|e| format!("invalid JSON: {e}"))?);
    } else {
        check_yaml(text, cancel)?;
        for (index, document) in serde_norway::Deserializer::from_str(text).enumerate() {
            if cancel.is_cancelled() {
                return Err(CANCELLED.to_owned());
            }
            let value = Value::deserialize(document)
                .map_err(|e| format!("invalid YAML in document {}: {e}", index + 1))?;
            documents.push(value);
        }
    }
    let mut objects = Vec::new();
    for document in documents {
        if document::depth(&document) > document::MAX_DEPTH {
            return Err(format!(
                "objects nest more than {} levels deep",
                document::MAX_DEPTH
            ));
        }
        collect_objects(document, &mut objects)?;
    }
    Ok(objects)
}

fn collect_objects(document: Value, out: &mut Vec<(ResourceKey, Object)>) -> Result<(), String> {
    let kind = document
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match kind {
        "" if document.is_null() => Ok(()),
        "List" | "FeatureFlagList" => {
            if let Some(Value::Array(items)) = document.get("items") {
                for item in items {
                    collect_objects(item.clone(), out)?;
                }
            }
            Ok(())
        }
        "FeatureFlag" if is_our_api(&document) => {
            let name = document
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .ok_or("a FeatureFlag has no metadata.name")?;
            let namespace = document
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default");
            let key = selector::parse(&format!("{GROUP}/{namespace}/{name}"))
                .map_err(|e| e.to_string())?;
            let text = serde_json::to_string(&document).map_err(|e| e.to_string())?;
            out.push((key, text.into()));
            Ok(())
        }
        _ => Ok(()),
    }
}

fn is_our_api(document: &Value) -> bool {
    document
        .get("apiVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| {
            v.strip_prefix(GROUP)
                .is_some_and(|rest| rest.starts_with('/'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<ResourceKey>, String> {
        parse_objects(Path::new("x.yaml"), text.as_bytes(), &Cancel::default())
            .map(|v| v.into_iter().map(|(k, _)| k).collect())
    }

    #[test]
    fn reads_multi_document_yaml_with_default_namespace() {
        let keys = parse(
            "apiVersion: core.openfeature.dev/v1beta1\nkind: FeatureFlag\nmetadata: {name: a}\nspec: {}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n\
             apiVersion: core.openfeature.dev/v1beta1\nkind: FeatureFlag\nmetadata: {name: b, namespace: team}\n---\n",
        )
        .expect("parses");
        assert_eq!(
            keys,
            vec![
                ResourceKey::new("default", "a"),
                ResourceKey::new("team", "b")
            ]
        );
    }

    #[test]
    fn reads_lists_and_json() {
        let keys = parse_objects(
            Path::new("x.json"),
            br#"{"kind":"List","items":[{"apiVersion":"core.openfeature.dev/v1beta1","kind":"FeatureFlag","metadata":{"name":"j"}}]}"#,
            &Cancel::default(),
        )
        .expect("parses");
        assert_eq!(keys[0].0, ResourceKey::new("default", "j"));
    }

    #[test]
    fn reports_what_is_wrong() {
        assert!(
            parse("kind: [")
                .expect_err("bad yaml")
                .contains("invalid YAML")
        );
        let err = parse("apiVersion: core.openfeature.dev/v1beta1\nkind: FeatureFlag\nmetadata: {name: Bad_Name}\n").expect_err("bad name");
        assert!(err.contains("not a valid Kubernetes object name"), "{err}");
        let err =
            parse("apiVersion: core.openfeature.dev/v1beta1\nkind: FeatureFlag\nmetadata: {}\n")
                .expect_err("no name");
        assert!(err.contains("metadata.name"), "{err}");
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        let levels = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(
            check_yaml(&levels(document::MAX_DEPTH), &Cancel::default()),
            Ok(())
        );
        let err = parse(&format!("a: {}", levels(document::MAX_DEPTH))).expect_err("too deep");
        assert!(err.contains("nest more than"), "{err}");
        // Closing brackets inside quoted scalars do not hide the nesting around them.
        let hidden = format!("{}1{}", "{a: \"}}}}\", b: ".repeat(100), "}".repeat(100));
        let err = check_yaml(&hidden, &Cancel::default()).expect_err("too deep");
        assert!(err.contains("nest more than"), "{err}");
        // Brackets inside quoted scalars are text, not nesting.
        let quoted = format!("a: \"{}\"\nb: '{}'\n", "[".repeat(1000), "{".repeat(1000));
        assert_eq!(check_yaml(&quoted, &Cancel::default()), Ok(()));
    }

    #[test]
    fn aliases_are_bounded_by_what_they_expand_to() {
        // A few aliases of a small anchor, as real manifests use them, are fine.
        let shared = "rule: &r {if: [{var: x}, on, off]}\na: *r\nb: *r\nc: *r\n";
        assert_eq!(check_yaml(shared, &Cancel::default()), Ok(()));
        // One 100 KB anchor referenced 200 times expands to 20 MB: refused.
        let big = "x".repeat(100 * 1024);
        let mut text = format!("anchor: &big \"{big}\"\nrefs:\n");
        for _ in 0..200 {
            text.push_str("  - *big\n");
        }
        let err = check_yaml(&text, &Cancel::default()).expect_err("expands too far");
        assert!(err.contains("aliases expand the YAML past 16 MiB"), "{err}");
        // Nested aliases ("billion laughs") are counted at their expanded size.
        let mut laughs = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        let names: Vec<char> = ('b'..='j').collect();
        let mut previous = 'a';
        for name in names {
            let refs = vec![format!("*{previous}"); 10].join(", ");
            laughs.push_str(&format!("{name}: &{name} [{refs}]\n"));
            previous = name;
        }
        let err = check_yaml(&laughs, &Cancel::default()).expect_err("billion laughs");
        assert!(err.contains("aliases expand"), "{err}");
    }

    #[test]
    fn a_cancelled_parse_stops() {
        let cancel = Cancel::default();
        let text =
            "apiVersion: core.openfeature.dev/v1beta1\nkind: FeatureFlag\nmetadata: {name: a}\n";
        assert!(parse_objects(Path::new("x.yaml"), text.as_bytes(), &cancel).is_ok());
        cancel.cancel();
        let err =
            parse_objects(Path::new("x.yaml"), text.as_bytes(), &cancel).expect_err("cancelled");
        assert_eq!(err, CANCELLED);
    }

    #[test]
    fn only_regular_files_are_read_within_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let zero = dir.path().join("zero.yaml");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        assert!(
            read_limited(&zero)
                .expect_err("a device")
                .contains("regular")
        );
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, "a: 1\n").expect("write");
        assert_eq!(read_limited(&file).expect("a file"), b"a: 1\n");
    }
}
