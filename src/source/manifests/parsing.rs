//! Parses of manifest files, off the scanner: at most a few at once (one permit of a
//! [`Semaphore`] each), each on Tokio's blocking threads (`spawn_blocking`: a thread without
//! work waits a while for the next, so files read one after another do not each start one);
//! per file the newest content wins (a newer edit cancels a running parse of older content and
//! replaces a queued one, so a file has at most one parse running and one waiting); and one
//! slot is kept for small files, so that an edit of a small file is parsed at once however many
//! large files are being parsed or wait.
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::ParseResult;
use crate::locks::lock;

/// Files up to this size are small: they may take the slot that large files leave free.
pub(super) const SMALL_FILE_BYTES: usize = 1024 * 1024;
/// A parse that takes longer than this is logged.
const SLOW_PARSE: Duration = Duration::from_millis(500);

/// Tells a running parse that its result is no longer wanted (a newer edit of its file came, or
/// the file is gone). The parser checks it as it goes.
#[derive(Clone, Debug, Default)]
pub(super) struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub(super) fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub(super) fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What parses a file's content (the real one is [`super::files::parse_objects`]).
pub(super) type Parser = Arc<dyn Fn(&Path, &[u8], &Cancel) -> ParseResult + Send + Sync>;

/// A finished parse: the content parsed, and its result.
pub(super) struct Parsed {
    pub(super) content: Arc<[u8]>,
    pub(super) result: ParseResult,
}

/// Parses started, finished (their result kept) and cancelled (their result dropped), and the
/// most that ran at once.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct ParseCounts {
    pub(super) started: u64,
    pub(super) finished: u64,
    pub(super) cancelled: u64,
    pub(super) most_at_once: usize,
}

/// The parses of every file.
pub(super) struct Parses {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Notified whenever a parse ends.
    ended: Condvar,
    /// One permit per parse running: the most at once.
    permits: Arc<Semaphore>,
    /// The number of permits.
    limit: usize,
    /// The runtime whose blocking threads run the parses.
    runtime: Handle,
    parser: Parser,
    /// Told when a parse finished, with the time its change was noticed.
    finished: mpsc::UnboundedSender<Instant>,
}

#[derive(Default)]
struct State {
    running: HashMap<PathBuf, Running>,
    /// The newest content of each file still to be parsed.
    queued: HashMap<PathBuf, Job>,
    /// Files with a queued parse, oldest request first.
    order: VecDeque<PathBuf>,
    finished: HashMap<PathBuf, Parsed>,
    counts: ParseCounts,
}

impl State {
    fn busy(&self) -> bool {
        !self.running.is_empty() || !self.queued.is_empty()
    }
}

struct Job {
    content: Arc<[u8]>,
    noticed: Instant,
}

struct Running {
    content: Arc<[u8]>,
    cancel: Cancel,
    large: bool,
}

impl Parses {
    /// At most `limit` parses at once (at least 2: one slot is kept for small files), on the
    /// blocking threads of the current Tokio runtime (called within one); each finished parse
    /// is announced on `finished`.
    pub(super) fn new(
        limit: usize,
        parser: Parser,
        finished: mpsc::UnboundedSender<Instant>,
    ) -> Self {
        let limit = limit.max(2);
        Self {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                ended: Condvar::new(),
                permits: Arc::new(Semaphore::new(limit)),
                limit,
                runtime: Handle::current(),
                parser,
                finished,
            }),
        }
    }

    /// The number of parses at once for this machine: its cores, at least 2 and at most 4.
    pub(super) fn default_limit() -> usize {
        std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4))
    }

    /// Asks for `content` of `path` to be parsed (its change noticed at `noticed`), superseding
    /// any parse of other content of the same file.
    pub(super) fn request(&self, path: &Path, content: &[u8], noticed: Instant) {
        let mut state = lock(&self.shared.state);
        if state
            .finished
            .get(path)
            .is_some_and(|f| *f.content == *content)
        {
            return;
        }
        state.finished.remove(path);
        if let Some(running) = state.running.get(path) {
            if *running.content == *content && !running.cancel.is_cancelled() {
                // Back to the content being parsed: a newer one queued is not wanted.
                state.queued.remove(path);
                return;
            }
            running.cancel.cancel();
        }
        if state
            .queued
            .get(path)
            .is_some_and(|q| *q.content == *content)
        {
            return;
        }
        let job = Job {
            content: content.into(),
            noticed,
        };
        if state.queued.insert(path.to_owned(), job).is_none() {
            state.order.push_back(path.to_owned());
        }
        self.shared.dispatch(&mut state);
    }

    /// The result of parsing `content` of `path`, once finished.
    pub(super) fn take(&self, path: &Path, content: &[u8]) -> Option<Parsed> {
        let mut state = lock(&self.shared.state);
        match state.finished.remove(path) {
            Some(parsed) if *parsed.content == *content => Some(parsed),
            Some(_) | None => None,
        }
    }

    /// Drops every parse of `path` (the file is gone).
    pub(super) fn forget(&self, path: &Path) {
        let mut state = lock(&self.shared.state);
        if let Some(running) = state.running.get(path) {
            running.cancel.cancel();
        }
        state.queued.remove(path);
        state.finished.remove(path);
    }

    /// Whether a parse is running or waiting.
    pub(super) fn busy(&self) -> bool {
        lock(&self.shared.state).busy()
    }

    /// Waits until a parse ends or none is left, for at most `timeout`; false if parses are
    /// still running or waiting and none ended.
    pub(super) fn wait_for_one(&self, timeout: Duration) -> bool {
        let state = lock(&self.shared.state);
        let ended = |s: &State| s.counts.finished + s.counts.cancelled;
        let before = ended(&state);
        let (state, _) = self
            .shared
            .ended
            .wait_timeout_while(state, timeout, |s| ended(s) == before && s.busy())
            .unwrap_or_else(|p| p.into_inner());
        ended(&state) != before || !state.busy()
    }

    #[cfg(test)]
    pub(super) fn counts(&self) -> ParseCounts {
        lock(&self.shared.state).counts
    }
}

impl Shared {
    /// Starts queued parses while permits are free. Permits are taken and given back only
    /// with the state locked, so a parse that may start is never left waiting.
    fn dispatch(self: &Arc<Self>, state: &mut State) {
        while let Ok(permit) = self.permits.clone().try_acquire_owned() {
            let Some((path, job, cancel)) = self.next(state) else {
                return;
            };
            let shared = self.clone();
            self.runtime
                .spawn_blocking(move || shared.work(permit, path, job, cancel));
        }
    }

    /// Takes the oldest queued parse that may start now (a permit is free): not while its file
    /// is being parsed, and a large file not in the last free slot. Counts it as running.
    fn next(&self, state: &mut State) -> Option<(PathBuf, Job, Cancel)> {
        let large_running = state.running.values().filter(|r| r.large).count();
        let position = state.order.iter().position(|path| {
            let Some(job) = state.queued.get(path) else {
                return false;
            };
            let large = job.content.len() > SMALL_FILE_BYTES;
            !state.running.contains_key(path) && (!large || large_running + 1 < self.limit)
        })?;
        let path = state.order.remove(position)?;
        let job = state.queued.remove(&path)?;
        let cancel = Cancel::default();
        state.running.insert(
            path.clone(),
            Running {
                content: job.content.clone(),
                cancel: cancel.clone(),
                large: job.content.len() > SMALL_FILE_BYTES,
            },
        );
        state.counts.started += 1;
        state.counts.most_at_once = state.counts.most_at_once.max(state.running.len());
        Some((path, job, cancel))
    }

    /// Runs one parse (on a blocking thread), then gives its permit back and starts the
    /// parses that may start now.
    fn work(
        self: Arc<Self>,
        permit: OwnedSemaphorePermit,
        path: PathBuf,
        job: Job,
        cancel: Cancel,
    ) {
        let began = Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (self.parser)(&path, &job.content, &cancel)
        }))
        .unwrap_or_else(|_| Err("the parser failed on this file".to_owned()));
        let took = began.elapsed();
        let mut state = lock(&self.state);
        state.running.remove(&path);
        if cancel.is_cancelled() {
            state.counts.cancelled += 1;
            tracing::debug!(path = %path.display(), ?took, "manifest parse cancelled: a newer edit came");
        } else {
            if took > SLOW_PARSE {
                tracing::warn!(path = %path.display(), ?took, "manifest file took long to parse; other files went ahead, and its last good resources stayed until it was done");
            }
            state.counts.finished += 1;
            self.finish(&mut state, path, job.content, result, job.noticed);
        }
        self.ended.notify_all();
        drop(permit);
        self.dispatch(&mut state);
    }

    fn finish(
        &self,
        state: &mut State,
        path: PathBuf,
        content: Arc<[u8]>,
        result: ParseResult,
        noticed: Instant,
    ) {
        state.finished.insert(path, Parsed { content, result });
        let _ = self.finished.send(noticed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parser that holds the parses of files named `large*` until the gate opens, then
    /// reports what it parsed (as the error text, which is enough to tell results apart).
    struct Gate {
        open: Mutex<bool>,
        opened: Condvar,
    }

    fn gated() -> (Arc<Gate>, Parser) {
        let gate = Arc::new(Gate {
            open: Mutex::new(false),
            opened: Condvar::new(),
        });
        let theirs = gate.clone();
        let parser: Parser = Arc::new(move |path: &Path, content: &[u8], _: &Cancel| {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.starts_with("large") {
                let open = lock(&theirs.open);
                let _open = theirs
                    .opened
                    .wait_while(open, |open| !*open)
                    .unwrap_or_else(|p| p.into_inner());
            }
            Err(String::from_utf8_lossy(&content[..content.len().min(16)]).into_owned())
        });
        (gate, parser)
    }

    impl Gate {
        fn open(&self) {
            *lock(&self.open) = true;
            self.opened.notify_all();
        }
    }

    fn large(version: u32) -> Vec<u8> {
        let mut content = format!("v{version}:").into_bytes();
        content.resize(SMALL_FILE_BYTES + 1, b' ');
        content
    }

    /// The text of a finished parse (see [`gated`]).
    fn parsed(parses: &Parses, path: &Path, content: &[u8]) -> Option<String> {
        parses
            .take(path, content)
            .map(|p| p.result.expect_err("gated"))
    }

    async fn next_finished(done: &mut mpsc::UnboundedReceiver<Instant>) {
        tokio::time::timeout(Duration::from_secs(60), done.recv())
            .await
            .expect("a parse finishes")
            .expect("the pool lives");
    }

    /// Twelve edits of a file whose parse is slow: the parse running is cancelled, the edits in
    /// between are never parsed, and the last one is.
    #[tokio::test]
    async fn the_newest_edit_of_a_file_supersedes_older_ones() {
        let (gate, parser) = gated();
        let (tx, mut done) = mpsc::unbounded_channel();
        let parses = Parses::new(2, parser, tx);
        let path = Path::new("large.yaml");
        for version in 1..=12 {
            parses.request(path, &large(version), Instant::now());
        }
        assert_eq!(parses.counts().started, 1, "only the first edit started");
        gate.open();
        next_finished(&mut done).await;
        assert_eq!(
            parsed(&parses, path, &large(12)).as_deref(),
            Some("v12:            ")
        );
        assert!(!parses.busy());
        let counts = parses.counts();
        assert_eq!(
            counts,
            ParseCounts {
                started: 2,
                finished: 1,
                cancelled: 1,
                most_at_once: 1,
            }
        );
    }

    /// Large files being parsed and waiting do not hold up an edit of a small file, and no more
    /// than the limit of parses run at once.
    #[tokio::test]
    async fn a_small_file_is_parsed_while_large_ones_wait() {
        const LIMIT: usize = 2;
        let (gate, parser) = gated();
        let (tx, mut done) = mpsc::unbounded_channel();
        let parses = Parses::new(LIMIT, parser, tx);
        let larges: Vec<PathBuf> = (0..20)
            .map(|i| PathBuf::from(format!("large-{i}.yaml")))
            .collect();
        for round in 1..=3 {
            for path in &larges {
                parses.request(path, &large(round), Instant::now());
            }
        }
        let small = Path::new("small.yaml");
        parses.request(small, b"small v2", Instant::now());
        next_finished(&mut done).await;
        assert_eq!(
            parsed(&parses, small, b"small v2").as_deref(),
            Some("small v2")
        );
        // Every large file is still held: the small one went ahead of all of them.
        let counts = parses.counts();
        assert_eq!((counts.finished, counts.cancelled), (1, 0));
        gate.open();
        for _ in &larges {
            next_finished(&mut done).await;
        }
        for path in &larges {
            assert_eq!(
                parsed(&parses, path, &large(3)).as_deref(),
                Some("v3:             ")
            );
        }
        let counts = parses.counts();
        assert!(counts.most_at_once <= LIMIT, "{counts:?}");
        // Per large file: its first edit's parse (cancelled, or the one that ran) and the last.
        assert_eq!(counts.finished, 21, "{counts:?}");
        assert!(counts.started <= 22, "{counts:?}");
    }
}
