//! Tests of the manifests source's scanning, with a parser the test holds.
use std::sync::Condvar;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::parsing::{Cancel, SMALL_FILE_BYTES};
use super::*;
use crate::locks::lock;

/// Holds the parses of files named `large*` until it is opened; counts the parses under way
/// (and the most at once) and those of large files started.
#[derive(Default)]
struct Held {
    open: Mutex<bool>,
    opened: Condvar,
    running: AtomicUsize,
    most: AtomicUsize,
    large_started: AtomicUsize,
}

impl Held {
    fn open(&self) {
        *lock(&self.open) = true;
        self.opened.notify_all();
    }
}

/// A parser that serves one object per file, named after the file, whose `version` is the
/// start of the file's content; parses of large files wait for `held` to open.
fn parser(held: Arc<Held>) -> Parser {
    Arc::new(move |path: &Path, content: &[u8], _: &Cancel| {
        let now = held.running.fetch_add(1, Ordering::SeqCst) + 1;
        held.most.fetch_max(now, Ordering::SeqCst);
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if name.starts_with("large") {
            held.large_started.fetch_add(1, Ordering::SeqCst);
            let open = lock(&held.open);
            let _open = held
                .opened
                .wait_while(open, |open| !*open)
                .unwrap_or_else(|p| p.into_inner());
        }
        held.running.fetch_sub(1, Ordering::SeqCst);
        let version = String::from_utf8_lossy(&content[..content.len().min(8)])
            .trim()
            .to_owned();
        Ok(vec![(
            ResourceKey::new("default", &name),
            serde_json::json!({ "version": version }).to_string().into(),
        )])
    })
}

fn version(catalog: &Catalog, name: &str) -> Option<String> {
    let object = catalog.resources.get(&ResourceKey::new("default", name))?;
    let object: serde_json::Value = serde_json::from_str(object).ok()?;
    object["version"].as_str().map(str::to_owned)
}

/// Waits until the catalog serves `want` as `name`'s version.
async fn wait_for(source: &ManifestSource, name: &str, want: &str) {
    let mut catalog = source.catalog.clone();
    let wait = async {
        while version(&catalog.borrow_and_update(), name).as_deref() != Some(want) {
            catalog.changed().await.expect("the scanner runs");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| panic!("{name} never reached {want}"));
}

/// Twelve quick edits of a large file whose parse is slow, then an edit of a small file: the
/// small file's new version is published while the large file's first parse is still held; that
/// parse is the only one of the large file under way (the edits in between wait as one), and no
/// more parses run at once than the limit. Once the parse ends, only the last edit is parsed.
#[tokio::test]
async fn a_small_files_edit_is_published_while_a_large_file_is_being_parsed() {
    const LIMIT: usize = 2;
    let dir = tempfile::tempdir().expect("tempdir");
    let large = |version: u32| {
        let mut content = format!("v{version}").into_bytes();
        content.resize(SMALL_FILE_BYTES + 1, b' ');
        content
    };
    let (large_path, small_path) = (dir.path().join("large.yaml"), dir.path().join("small.yaml"));
    std::fs::write(&large_path, large(1)).expect("write");
    std::fs::write(&small_path, "s1").expect("write");
    let held = Arc::new(Held::default());
    let source = ManifestSource::start_with(
        vec![dir.path().to_owned()],
        Arc::new(Metrics::new()),
        parser(held.clone()),
        LIMIT,
    )
    .expect("start");
    // The large file's parse is held: the proxy starts without it.
    assert_eq!(version(&source.catalog(), "small").as_deref(), Some("s1"));
    assert_eq!(version(&source.catalog(), "large"), None);

    for version in 2..=12 {
        std::fs::write(&large_path, large(version)).expect("write");
    }
    std::fs::write(&small_path, "s2").expect("write");
    wait_for(&source, "small", "s2").await;
    assert_eq!(version(&source.catalog(), "large"), None);
    assert_eq!(held.large_started.load(Ordering::SeqCst), 1);

    held.open();
    wait_for(&source, "large", "v12").await;
    assert_eq!(held.large_started.load(Ordering::SeqCst), 2);
    let most = held.most.load(Ordering::SeqCst);
    assert!(most <= LIMIT, "{most} parses at once");
}

/// Only notifications about the directories or what is in them make the scanner read again:
/// not reads, and not the neighbours of a directory in the parent watched for swaps.
#[test]
fn notifications_of_the_directories_neighbours_are_not_changes() {
    use notify::event::{AccessKind, CreateKind, ModifyKind, RenameMode};
    use notify::{Event, EventKind};
    let roots = Roots::of(&[PathBuf::from("/srv/flags/manifests")]);
    let event = |kind: EventKind, path: &str| Event::new(kind).add_path(PathBuf::from(path));
    let renamed = EventKind::Modify(ModifyKind::Name(RenameMode::To));
    // A file renamed into the directory, one in a subdirectory, the directory itself swapped.
    assert!(roots.concern(&event(renamed, "/srv/flags/manifests/a.yaml")));
    assert!(roots.concern(&event(renamed, "/srv/flags/manifests/team/b.yaml")));
    assert!(roots.concern(&event(
        EventKind::Create(CreateKind::Folder),
        "/srv/flags/manifests"
    )));
    // A log file beside the directory, a directory of a similar name, a read.
    let written = EventKind::Modify(ModifyKind::Any);
    assert!(!roots.concern(&event(written, "/srv/flags/proxy.log")));
    assert!(!roots.concern(&event(written, "/srv/flags/manifests-old/a.yaml")));
    assert!(!roots.concern(&event(
        EventKind::Access(AccessKind::Any),
        "/srv/flags/manifests/a.yaml"
    )));
    // The watcher lost events: read again.
    assert!(roots.concern(&Event::new(EventKind::Other)));
}

#[test]
fn a_configured_directory_that_is_missing_is_unreadable_with_the_reason() {
    use std::collections::HashSet;

    use super::files::{Found, collect_files};
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("team")).expect("a directory");
    std::fs::write(dir.path().join("team/a.yaml"), "").expect("a file");
    std::fs::write(dir.path().join("notes.txt"), "").expect("a file");
    let mut found = Found::default();
    collect_files(dir.path(), 0, &mut HashSet::new(), &mut found);
    assert_eq!(found.files, [dir.path().join("team/a.yaml")]);
    assert!(found.unreadable.is_empty());

    let gone = dir.path().join("gone");
    let mut found = Found::default();
    collect_files(&gone, 0, &mut HashSet::new(), &mut found);
    assert!(found.files.is_empty());
    assert_eq!(found.unreadable.len(), 1);
    assert_eq!(found.unreadable[0].dir, gone);
    assert!(
        found.unreadable[0].error.contains("No such file"),
        "{:?}",
        found.unreadable[0]
    );
    // Below a configured directory, one that is gone took its files with it: not unreadable.
    let mut found = Found::default();
    collect_files(&gone, 1, &mut HashSet::new(), &mut found);
    assert!(found.unreadable.is_empty());
}
