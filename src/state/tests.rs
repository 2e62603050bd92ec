//! Tests of the state directory: versions kept and read back, files that do not read back
//! ignored with a warning, the size bound, and removal.
use std::time::Duration;

use super::*;

/// Everything logged while `run` runs, as text.
fn logged<T>(run: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            crate::locks::lock(&self.0).extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, run);
    let text = String::from_utf8_lossy(&crate::locks::lock(&buffer.0)).into_owned();
    (out, text)
}

fn settings(dir: &Path, max_bytes: usize) -> StateSettings {
    StateSettings {
        dir: dir.to_owned(),
        max_bytes,
    }
}

fn open(dir: &Path) -> StateDir {
    StateDir::open(settings(dir, DEFAULT_MAX_BYTES)).expect("opens")
}

fn key(name: &str) -> ResourceKey {
    ResourceKey::new("default", name)
}

const DOCUMENT: &str =
    r#"{"flags":{"color":{"state":"ENABLED","variants":{"red":"red"},"defaultVariant":"red"}}}"#;

/// Writes `document` as the version of `key`, as the writer task does.
fn write(state: &StateDir, key: &ResourceKey, document: Option<&str>) {
    state.shared.write(key, document);
}

#[tokio::test]
async fn a_kept_version_reads_back_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = open(dir.path());
    assert_eq!(state.load(&key("demo")), None, "nothing kept yet");
    write(&state, &key("demo"), Some(DOCUMENT));
    assert_eq!(state.load(&key("demo")).as_deref(), Some(DOCUMENT));
    let (count, bytes) = state.kept();
    assert_eq!(count, 1);
    assert!(bytes > u64::try_from(DOCUMENT.len()).expect("fits"));

    let (again, log) = logged(|| open(dir.path()));
    assert_eq!(again.kept(), (count, bytes));
    assert_eq!(again.load(&key("demo")).as_deref(), Some(DOCUMENT));
    assert!(!log.contains("ignored"), "{log}");
    // Only the one file: the temporary one was renamed into place.
    assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 1);
}

#[tokio::test]
async fn versions_given_to_the_store_are_written_by_its_task() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = open(dir.path());
    state.keep(&key("demo"), Arc::from("{\"flags\":{}}"));
    state.keep(&key("demo"), Arc::from(DOCUMENT));
    tokio::time::timeout(Duration::from_secs(10), async {
        while state.load(&key("demo")).as_deref() != Some(DOCUMENT) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the newest version is written");
    state.forget(&key("demo"));
    tokio::time::timeout(Duration::from_secs(10), async {
        while state.kept().0 > 0 || state.load(&key("demo")).is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the file of a resource that is absent is removed");
    assert_eq!(state.load(&key("demo")), None);
}

#[tokio::test]
async fn a_flush_writes_what_is_pending_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = open(dir.path());
    state.keep(&key("demo"), Arc::from(DOCUMENT));
    state.flush().await;
    assert_eq!(state.load(&key("demo")).as_deref(), Some(DOCUMENT));
    // Only the proxy's user reads the files.
    let path = dir.path().join(file_name(&key("demo")));
    let mode = std::fs::metadata(path).expect("metadata").permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
}

#[tokio::test]
async fn corrupt_and_foreign_files_are_ignored_with_a_warning_naming_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = open(dir.path());
    for name in ["demo", "moved", "old"] {
        write(&state, &key(name), Some(DOCUMENT));
    }
    let path_of = |name: &str| dir.path().join(file_name(&key(name)));
    // A flipped byte in the flag configuration: the checksum no longer matches.
    let demo = std::fs::read_to_string(path_of("demo")).expect("read");
    std::fs::write(path_of("demo"), demo.replacen("red", "rex", 1)).expect("write");
    // Another resource's record under this one's name.
    std::fs::copy(path_of("old"), path_of("moved")).expect("copy");
    // Another format version.
    let old = std::fs::read_to_string(path_of("old")).expect("read");
    std::fs::write(path_of("old"), old.replace("\"format\":1", "\"format\":2")).expect("write");
    // Files that are not the proxy's at all.
    std::fs::write(dir.path().join("notes.txt"), b"\xff\xfe not JSON").expect("write");
    let mut foreign = File::create(dir.path().join("other.json")).expect("create");
    foreign.write_all(b"{\"flags\": {}}").expect("write");

    let (again, log) = logged(|| open(dir.path()));
    assert_eq!(again.kept(), (0, 0), "nothing reads back");
    for (file, why) in [
        (path_of("demo"), "its checksum does not match its content"),
        (
            path_of("moved"),
            "it holds core.openfeature.dev/default/old, which belongs in another file",
        ),
        (
            path_of("old"),
            "it is of format 2; this proxy reads format 1",
        ),
        (
            dir.path().join("notes.txt"),
            "it is not a state file of flagd-proxy",
        ),
        (
            dir.path().join("other.json"),
            "it is not a state file of flagd-proxy",
        ),
    ] {
        let line = log
            .lines()
            .find(|line| line.contains(&file.display().to_string()))
            .unwrap_or_else(|| panic!("no warning names {}: {log}", file.display()));
        assert!(
            line.contains("WARN") && line.contains("state file ignored") && line.contains(why),
            "{line}"
        );
    }
    // Nothing of them is served, and reading one again warns again.
    let (loaded, log) = logged(|| again.load(&key("demo")));
    assert_eq!(loaded, None);
    assert!(log.contains("state file ignored"), "{log}");
    assert_eq!(again.load(&key("moved")), None);
    assert_eq!(again.load(&key("old")), None);
    // The next version of a resource replaces its corrupt file.
    write(&again, &key("demo"), Some(DOCUMENT));
    assert_eq!(again.load(&key("demo")).as_deref(), Some(DOCUMENT));
}

#[tokio::test]
async fn a_version_over_the_bound_is_not_kept_and_the_older_one_goes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one_file = encode(&key("a"), DOCUMENT).len();
    let state = StateDir::open(settings(dir.path(), 2 * one_file + 10)).expect("opens");
    write(&state, &key("a"), Some(DOCUMENT));
    write(&state, &key("b"), Some(DOCUMENT));
    assert_eq!(state.kept().0, 2);
    // Replacing a file counts its new size only.
    write(&state, &key("b"), Some(DOCUMENT));
    assert_eq!(state.kept().0, 2);
    let larger = DOCUMENT.replace("red", "crimson");
    let ((), log) = logged(|| write(&state, &key("b"), Some(&larger)));
    assert!(
        log.contains("WARN") && log.contains("--state-dir-max-bytes"),
        "{log}"
    );
    assert_eq!(state.load(&key("b")), None, "the older version is not kept");
    assert_eq!(state.load(&key("a")).as_deref(), Some(DOCUMENT));
    assert_eq!(
        state.kept(),
        (1, u64::try_from(one_file).expect("fits")),
        "the bound counts the files kept"
    );
}

#[tokio::test]
async fn an_interrupted_write_is_cleared_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let temporary = dir
        .path()
        .join(format!("{}{TEMPORARY_SUFFIX}", file_name(&key("demo"))));
    std::fs::write(&temporary, b"{\"format\":1,").expect("write");
    let (state, log) = logged(|| open(dir.path()));
    assert!(!temporary.exists());
    assert_eq!(state.kept(), (0, 0));
    assert!(!log.contains("ignored"), "{log}");
}

#[test]
fn a_directory_that_cannot_be_made_is_a_configuration_error() {
    let file = tempfile::NamedTempFile::new().expect("a file");
    let error = StateDir::open(settings(&file.path().join("state"), DEFAULT_MAX_BYTES))
        .err()
        .expect("refused");
    assert!(
        matches!(error, StateError::Create { .. }) && error.to_string().starts_with("--state-dir "),
        "{error}"
    );
}

#[test]
fn file_names_are_the_resource_digest() {
    let name = file_name(&key("demo"));
    assert!(is_state_file_name(&name), "{name}");
    assert_ne!(name, file_name(&ResourceKey::new("demo", "default")));
    assert!(!is_state_file_name("other.json"));
}
