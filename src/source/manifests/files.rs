//! Reading manifest files: finding them under a directory, reading them with a size limit, and
//! parsing the `FeatureFlag` objects out of them (YAML or JSON, `List`s included).
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::identity;
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
    if !file.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err(not_regular());
    }
    let mut content = Vec::new();
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

/// Manifest files under `dir`: `.yaml`, `.yml` and `.json`, skipping hidden entries, each
/// directory once (symlink loops end), at most [`MAX_DIRECTORY_DEPTH`] levels down. False if
/// `dir` itself cannot be read.
pub(super) fn collect_files(
    dir: &Path,
    depth: usize,
    visited: &mut HashSet<(u64, u64)>,
    out: &mut Vec<PathBuf>,
) -> bool {
    let Some(id) = identity(dir) else {
        return false;
    };
    if !visited.insert(id) {
        tracing::debug!(dir = %dir.display(), "directory already read (a symlink loop?); skipped");
        return true;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
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
                collect_files(&path, depth + 1, visited, out);
            }
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(path);
        }
    }
    true
}

/// Refuses text whose flow collections (`{`/`[`, in JSON and YAML alike) nest deeper than
/// [`document::MAX_DEPTH`], before a parser spends time on it: YAML parsers take time that
/// grows with the square of the nesting. Brackets inside strings count too; no real manifest
/// comes near the limit with them.
fn check_nesting(text: &str) -> Result<(), String> {
    let mut depth = 0usize;
    for byte in text.bytes() {
        match byte {
            b'{' | b'[' => {
                depth += 1;
                if depth > document::MAX_DEPTH {
                    return Err(format!(
                        "brackets nest more than {} levels deep; not parsed",
                        document::MAX_DEPTH
                    ));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// The `FeatureFlag` objects in one file.
pub(super) fn parse_objects(
    path: &Path,
    content: &[u8],
) -> Result<Vec<(ResourceKey, Arc<Value>)>, String> {
    let text = std::str::from_utf8(content).map_err(|e| format!("not UTF-8: {e}"))?;
    check_nesting(text)?;
    let mut documents = Vec::new();
    if path.extension().is_some_and(|e| e == "json") {
        documents
            .push(serde_json::from_str::<Value>(text).map_err(|e| format!("invalid JSON: {e}"))?);
    } else {
        for (index, document) in serde_norway::Deserializer::from_str(text).enumerate() {
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

fn collect_objects(
    document: Value,
    out: &mut Vec<(ResourceKey, Arc<Value>)>,
) -> Result<(), String> {
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
            out.push((key, Arc::new(document)));
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
        parse_objects(Path::new("x.yaml"), text.as_bytes())
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
        let ok = format!(
            "{}1{}",
            "[".repeat(document::MAX_DEPTH),
            "]".repeat(document::MAX_DEPTH)
        );
        assert!(check_nesting(&ok).is_ok());
        // Closing brackets never go below zero: stray ones do not buy depth.
        let stray = format!("{}{ok}", "]".repeat(10));
        assert!(check_nesting(&stray).is_ok());
        let deep = format!("{{a: {ok}}}");
        let err = parse(&deep).expect_err("too deep");
        assert!(err.contains("nest more than"), "{err}");
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
