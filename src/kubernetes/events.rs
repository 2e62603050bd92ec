//! Kubernetes Events on served `FeatureFlag` resources: what the person who edits one sees.
//!
//! A rejected version (invalid, or too large for clients) gets a `Warning` Event on the object
//! (`FlagConfigurationRejected`) that names what is wrong (the flag, for a flag's error) and
//! which version clients keep. A version that is served but has flags that clients will report
//! errors for when they evaluate them (an operator the proxy does not know, say) gets a
//! `Warning` Event too (`FlagConfigurationWarning`), naming each such flag and its problem. The
//! first valid version without warnings after either gets a `Normal` one. `kubectl describe
//! featureflag NAME` and `kubectl get events` show them.
//!
//! Events are written with kube's [`Recorder`] (events.k8s.io/v1; an Event that recurs is
//! counted in its series instead of written again, as Kubernetes' own recorders do). In front of
//! it, per watched resource:
//!
//! - only changes are reported: the same problem again (another edit that is just as broken)
//!   writes nothing, and a `Normal` Event follows only a `Warning`;
//! - writes are spaced by at least [`MIN_INTERVAL`]; while one waits, a newer outcome replaces
//!   the older one, so a burst of edits ends with the newest outcome written, not a queue.
//!
//! So a resource causes at most `1 + elapsed / MIN_INTERVAL` Event writes, however fast it is
//! edited. Writing happens off the watch path: a missing permission or a slow API server never
//! delays flags; a refused write is logged once, naming the missing permission.
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::hub::{EventSink, ResourceEventSink};
use crate::selector::ResourceKey;

/// The shortest time between two Event writes for one resource.
pub const MIN_INTERVAL: Duration = Duration::from_secs(5);

/// The `reportingController` of the Events.
pub const CONTROLLER: &str = "flagd-proxy";

/// Reason of the Warning Event about a rejected version.
pub const REASON_REJECTED: &str = "FlagConfigurationRejected";
/// Reason of the Warning Event about a version that is served with warnings.
pub const REASON_WARNING: &str = "FlagConfigurationWarning";
/// Reason of the Normal Event.
pub const REASON_VALID: &str = "FlagConfigurationValid";

/// Distinct problems a watch keeps a recorder (and so a series) for; older ones are forgotten.
const MAX_SERIES: usize = 32;

/// Records Events for every watched resource. Cheap to clone.
#[derive(Clone)]
pub struct EventRecorder {
    inner: Arc<Shared>,
    /// The writers, one per watched resource.
    writers: TaskTracker,
}

struct Shared {
    client: Client,
    reporter: Reporter,
    /// A refused write has been logged (logged again after a write has worked).
    refusal_logged: AtomicBool,
}

impl EventRecorder {
    /// `instance` is the reporting instance (the pod name).
    pub fn new(client: Client, instance: Option<String>) -> Self {
        Self {
            inner: Arc::new(Shared {
                client,
                reporter: Reporter {
                    controller: CONTROLLER.to_owned(),
                    instance,
                },
                refusal_logged: AtomicBool::new(false),
            }),
            writers: TaskTracker::new(),
        }
    }

    /// Runs the writers on `tasks`, so that whoever owns it can wait for them: a writer ends
    /// once its resource's handle is dropped and what it still had to write is written.
    pub fn tracked_by(self, tasks: TaskTracker) -> Self {
        Self {
            writers: tasks,
            ..self
        }
    }

    /// Starts recording for one watched resource; writing stops when the handle is dropped.
    pub fn reporter_for(&self, key: ResourceKey) -> ResourceEvents {
        let (tx, rx) = watch::channel(None);
        self.writers
            .spawn(write_events(self.inner.clone(), key, rx));
        ResourceEvents {
            tx,
            kept: std::sync::Mutex::new(None),
        }
    }
}

impl EventSink for EventRecorder {
    fn reporter_for(&self, key: ResourceKey) -> Box<dyn ResourceEventSink> {
        Box::new(EventRecorder::reporter_for(self, key))
    }
}

impl ResourceEventSink for ResourceEvents {
    fn accepted(&self, resource: &Value) {
        ResourceEvents::accepted(self, resource);
    }

    fn warned(&self, resource: &Value, problems: &str) {
        ResourceEvents::warned(self, resource, problems);
    }

    fn rejected(&self, resource: &Value, problem: &str) {
        ResourceEvents::rejected(self, resource, problem);
    }
}

/// What the newest version of a resource came to.
#[derive(Clone, Debug)]
struct Outcome {
    type_: EventType,
    /// The Event's reason: one of [`REASON_REJECTED`], [`REASON_WARNING`], [`REASON_VALID`].
    reason: &'static str,
    /// What is wrong (for a Warning); outcomes with the same reason and problem are one.
    problem: Option<String>,
    note: String,
    regarding: ObjectReference,
}

impl Outcome {
    fn same(&self, other: &Outcome) -> bool {
        self.reason == other.reason && self.problem == other.problem
    }

    /// Reports `self` unless the newest outcome is the same: a problem told already is no news.
    fn report(self, tx: &watch::Sender<Option<Outcome>>) {
        tx.send_if_modified(|current| {
            if current.as_ref().is_some_and(|c| c.same(&self)) {
                return false;
            }
            *current = Some(self);
            true
        });
    }
}

/// One watched resource's Event reporting.
pub struct ResourceEvents {
    tx: watch::Sender<Option<Outcome>>,
    /// The version clients have: the last one accepted.
    kept: std::sync::Mutex<Option<String>>,
}

impl ResourceEvents {
    /// The version in `resource` was accepted and is what clients get.
    pub fn accepted(&self, resource: &Value) {
        let version = self.keep(resource);
        let Some(regarding) = reference(resource) else {
            return;
        };
        self.tx.send_if_modified(|current| {
            // A Normal Event only says that a problem is over.
            let after_warning = current
                .as_ref()
                .is_some_and(|c| c.type_ == EventType::Warning);
            if !after_warning {
                return false;
            }
            *current = Some(Outcome {
                type_: EventType::Normal,
                reason: REASON_VALID,
                problem: None,
                note: format!("{version} is valid; clients receive it"),
                regarding,
            });
            true
        });
    }

    /// The version in `resource` was accepted and is what clients get, but clients will report
    /// `problems` for some of its flags when they evaluate them.
    pub fn warned(&self, resource: &Value, problems: &str) {
        let version = self.keep(resource);
        let Some(regarding) = reference(resource) else {
            return;
        };
        Outcome {
            type_: EventType::Warning,
            reason: REASON_WARNING,
            problem: Some(problems.to_owned()),
            note: truncate(&format!(
                "{version} is served, but some of its flags have problems that clients answer for when they evaluate those flags (the other flags work): {problems}"
            )),
            regarding,
        }
        .report(&self.tx);
    }

    /// Records `resource` as the version clients have; returns how people see it.
    fn keep(&self, resource: &Value) -> String {
        let version = version_of(resource);
        *crate::locks::lock(&self.kept) = Some(version.clone());
        version
    }

    /// The version in `resource` was rejected for `problem`; clients keep the last accepted one.
    pub fn rejected(&self, resource: &Value, problem: &str) {
        let Some(regarding) = reference(resource) else {
            return;
        };
        let kept = crate::locks::lock(&self.kept).clone();
        let kept = match kept {
            Some(version) => format!("clients keep {version}, the last valid version"),
            None => "clients have no version of this resource yet".to_owned(),
        };
        Outcome {
            type_: EventType::Warning,
            reason: REASON_REJECTED,
            problem: Some(problem.to_owned()),
            note: truncate(&format!(
                "{} is not served: {problem}; {kept}",
                version_of(resource)
            )),
            regarding,
        }
        .report(&self.tx);
    }
}

/// Writes the newest outcome of one resource, at most once per [`MIN_INTERVAL`], until the
/// sender is dropped.
async fn write_events(shared: Arc<Shared>, key: ResourceKey, rx: watch::Receiver<Option<Outcome>>) {
    // One recorder per reason and problem, so that a recurring problem continues its series and a
    // different problem gets an Event of its own (a series keeps the note of its first Event).
    // Each Normal Event is new: it names the version that is valid.
    let mut recorders: HashMap<String, Recorder> = HashMap::new();
    let pause = || -> BoxFuture<'static, ()> { Box::pin(tokio::time::sleep(MIN_INTERVAL)) };
    paced(rx, pause, move |outcome| {
        let fresh = || Recorder::new(shared.client.clone(), shared.reporter.clone());
        let recorder = match &outcome.problem {
            Some(problem) => {
                let series = format!("{}: {problem}", outcome.reason);
                if recorders.len() >= MAX_SERIES && !recorders.contains_key(&series) {
                    recorders.clear();
                }
                recorders.entry(series).or_insert_with(fresh).clone()
            }
            None => fresh(),
        };
        let reason = outcome.reason;
        let action = if reason == REASON_REJECTED {
            "Reject"
        } else {
            "Serve"
        };
        let event = Event {
            type_: outcome.type_,
            reason: reason.to_owned(),
            note: Some(outcome.note.clone()),
            action: action.to_owned(),
            secondary: None,
        };
        let (shared, key) = (shared.clone(), key.clone());
        Box::pin(async move {
            match recorder.publish(&event, &outcome.regarding).await {
                Ok(()) => {
                    shared.refusal_logged.store(false, Ordering::Relaxed);
                    tracing::debug!(resource = %key, reason, "event recorded");
                }
                Err(error) => report_failure(&shared, &key, &error),
            }
        })
    })
    .await;
}

/// Hands `write` the newest outcome and waits for `pause` (for [`MIN_INTERVAL`]) after each
/// write; outcomes that arrive meanwhile replace each other, so the next write is of the newest.
/// Until the sender is dropped: what it left is still written, but a pause with nothing left to
/// write ends at once (shutdown does not wait for it).
async fn paced<P, W>(mut rx: watch::Receiver<Option<Outcome>>, mut pause: P, mut write: W)
where
    P: FnMut() -> BoxFuture<'static, ()>,
    W: FnMut(Outcome) -> BoxFuture<'static, ()>,
{
    // `changed` is Ok while an outcome is unseen, even once the sender has gone.
    let mut news = rx.changed().await.is_ok();
    while news {
        let Some(outcome) = rx.borrow_and_update().clone() else {
            news = rx.changed().await.is_ok();
            continue;
        };
        write(outcome).await;
        let mut pause = pause();
        news = tokio::select! {
            () = &mut pause => rx.changed().await.is_ok(),
            changed = rx.changed() => {
                if changed.is_err() {
                    return;
                }
                pause.await;
                true
            }
        };
    }
}

fn report_failure(shared: &Shared, key: &ResourceKey, error: &kube::Error) {
    let forbidden = matches!(error, kube::Error::Api(status) if status.code == 403);
    if forbidden {
        if !shared.refusal_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(
                resource = %key,
                %error,
                "cannot record Events: the proxy's service account needs create and patch on events (events.k8s.io) in namespace {}; flags are served as usual (--events=false turns Events off)",
                key.namespace
            );
        } else {
            tracing::debug!(resource = %key, %error, "cannot record an event");
        }
    } else {
        tracing::warn!(resource = %key, %error, "cannot record an event");
    }
}

/// The object an Event is about, without the resourceVersion (so a recurring Event matches).
fn reference(resource: &Value) -> Option<ObjectReference> {
    let metadata = resource.get("metadata")?;
    let text = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_owned);
    Some(ObjectReference {
        api_version: text(resource.get("apiVersion")),
        kind: text(resource.get("kind")),
        name: Some(text(metadata.get("name"))?),
        namespace: Some(text(metadata.get("namespace"))?),
        uid: text(metadata.get("uid")),
        ..ObjectReference::default()
    })
}

/// How people see a version: its generation (what `kubectl get -o yaml` shows) and
/// resourceVersion.
fn version_of(resource: &Value) -> String {
    let metadata = resource.get("metadata");
    let generation = metadata
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64);
    let resource_version = metadata
        .and_then(|m| m.get("resourceVersion"))
        .and_then(Value::as_str);
    match (generation, resource_version) {
        (Some(generation), Some(rv)) => format!("generation {generation} (resourceVersion {rv})"),
        (Some(generation), None) => format!("generation {generation}"),
        (None, Some(rv)) => format!("resourceVersion {rv}"),
        (None, None) => "the current version".to_owned(),
    }
}

/// Event notes are limited to 1 KiB by the API server.
fn truncate(note: &str) -> String {
    const MAX: usize = 1000;
    if note.len() <= MAX {
        return note.to_owned();
    }
    let mut end = MAX;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &note[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However fast outcomes come, nothing is written while the pause after a write lasts, and
    /// the write after it is of the newest outcome: the test holds each pause until it lets it
    /// end (one permit per pause).
    #[tokio::test]
    async fn writes_wait_for_the_pause_and_then_write_the_newest_outcome() {
        let (events, rx) = events();
        let pauses = Arc::new(tokio::sync::Semaphore::new(0));
        let ends = pauses.clone();
        let pause = move || -> BoxFuture<'static, ()> {
            let ends = ends.clone();
            Box::pin(async move {
                if let Ok(permit) = ends.acquire().await {
                    permit.forget();
                }
            })
        };
        let (written_tx, mut written) = tokio::sync::mpsc::unbounded_channel();
        let writer = tokio::spawn(paced(rx, pause, move |outcome: Outcome| {
            let _ = written_tx.send(outcome.note);
            Box::pin(async {})
        }));
        let settle = || async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        };
        events.rejected(&resource(0), "problem 0");
        let first = written
            .recv()
            .await
            .expect("the first outcome is written at once");
        assert!(first.contains("problem 0"), "{first}");
        // 99 more problems while the pause lasts: none is written.
        for i in 1..100 {
            events.rejected(&resource(i), &format!("problem {i}"));
            settle().await;
        }
        assert!(written.try_recv().is_err(), "written during the pause");
        // The pause ends: one write, of the newest.
        pauses.add_permits(1);
        let next = written.recv().await.expect("written after the pause");
        assert!(next.contains("problem 99"), "{next}");
        settle().await;
        assert!(written.try_recv().is_err(), "one write per pause");
        // The fix comes; the writer ends with its sender once the pauses end.
        events.accepted(&resource(100));
        drop(events);
        pauses.add_permits(2);
        writer.await.expect("the writer ends with its sender");
        let last = written.recv().await.expect("the fix is written");
        assert!(last.contains("generation 100"), "{last}");
        assert!(written.try_recv().is_err(), "nothing after the fix");
    }

    /// A writer in its pause, with nothing left to write, ends as soon as its sender is
    /// dropped (the watch stopped): it does not hold shutdown for the rest of the pause.
    #[tokio::test]
    async fn a_pause_with_nothing_left_to_write_ends_with_the_sender() {
        let (events, rx) = events();
        let endless = || -> BoxFuture<'static, ()> { Box::pin(futures::future::pending()) };
        let (written_tx, mut written) = tokio::sync::mpsc::unbounded_channel();
        let writer = tokio::spawn(paced(rx, endless, move |outcome: Outcome| {
            let _ = written_tx.send(outcome.note);
            Box::pin(async {})
        }));
        events.rejected(&resource(0), "problem 0");
        written.recv().await.expect("written at once");
        drop(events);
        tokio::time::timeout(Duration::from_secs(60), writer)
            .await
            .expect("the writer ends in its pause")
            .expect("join");
    }

    fn resource(generation: i64) -> Value {
        serde_json::json!({
            "apiVersion": "core.openfeature.dev/v1beta1",
            "kind": "FeatureFlag",
            "metadata": {"name": "demo", "namespace": "ns", "uid": "u-1",
                         "generation": generation, "resourceVersion": format!("{}", 100 + generation)},
        })
    }

    /// Accepting generation 5 tells a Normal event that names it.
    fn accepting_generation_5_is_told(
        events: &ResourceEvents,
        rx: &mut watch::Receiver<Option<Outcome>>,
    ) {
        events.accepted(&resource(5));
        let outcome = rx.borrow_and_update().clone().expect("normal");
        assert_eq!(outcome.type_, EventType::Normal);
        assert!(outcome.note.contains("generation 5"), "{}", outcome.note);
    }

    fn events() -> (ResourceEvents, watch::Receiver<Option<Outcome>>) {
        let (tx, rx) = watch::channel(None);
        (
            ResourceEvents {
                tx,
                kept: std::sync::Mutex::new(None),
            },
            rx,
        )
    }

    #[test]
    fn only_changes_are_reported() {
        let (events, mut rx) = events();
        events.accepted(&resource(1));
        assert!(
            !rx.has_changed().expect("open"),
            "no Normal without a Warning"
        );
        events.rejected(&resource(2), "flag \"x\": no variants");
        let outcome = rx.borrow_and_update().clone().expect("warning");
        assert_eq!(outcome.type_, EventType::Warning);
        assert!(outcome.note.contains("flag \"x\""), "{}", outcome.note);
        assert!(
            outcome
                .note
                .contains("generation 2 (resourceVersion 102) is not served"),
            "{}",
            outcome.note
        );
        assert!(
            outcome.note.contains("clients keep generation 1"),
            "{}",
            outcome.note
        );
        assert_eq!(outcome.regarding.uid.as_deref(), Some("u-1"));
        assert_eq!(outcome.regarding.resource_version, None);
        // The same problem in another edit is not news.
        events.rejected(&resource(3), "flag \"x\": no variants");
        assert!(!rx.has_changed().expect("open"));
        events.rejected(&resource(4), "flag \"y\": no variants");
        assert!(rx.has_changed().expect("open"));
        rx.borrow_and_update();
        accepting_generation_5_is_told(&events, &mut rx);
    }

    #[test]
    fn warnings_are_told_once_and_name_the_version_served() {
        let (events, mut rx) = events();
        let problem =
            "flag \"g\": targeting uses operator \"no_such_op\", which flagd does not know";
        events.warned(&resource(1), problem);
        let outcome = rx.borrow_and_update().clone().expect("warning");
        assert_eq!(
            (outcome.type_, outcome.reason),
            (EventType::Warning, REASON_WARNING)
        );
        for needle in ["generation 1 (resourceVersion 101) is served", problem] {
            assert!(outcome.note.contains(needle), "{}", outcome.note);
        }
        // The same warnings in another edit are not news; a rejected edit is, and it names the
        // version with warnings as the one clients keep.
        events.warned(&resource(2), problem);
        assert!(!rx.has_changed().expect("open"));
        events.rejected(&resource(3), problem);
        let outcome = rx.borrow_and_update().clone().expect("rejection");
        assert_eq!(outcome.reason, REASON_REJECTED);
        assert!(
            outcome.note.contains("clients keep generation 2"),
            "{}",
            outcome.note
        );
        // The same warnings after a rejection are news again: that version is served.
        events.warned(&resource(4), problem);
        assert_eq!(
            rx.borrow_and_update().as_ref().expect("warning").reason,
            REASON_WARNING
        );
        // A version without warnings ends them.
        accepting_generation_5_is_told(&events, &mut rx);
    }

    #[test]
    fn notes_are_bounded() {
        let (events, rx) = events();
        events.rejected(&resource(1), &"x".repeat(10_000));
        assert!(rx.borrow().as_ref().expect("warning").note.len() < 1_100);
    }
}
