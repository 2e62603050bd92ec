//! The hub: subscriptions and fan-out.
//!
//! One upstream watch per resource, started by its first subscriber and shared by all of them
//! through a `tokio::sync::watch` channel that holds only the newest state. A subscriber that is
//! slow simply finds a newer version when it looks again: it never blocks the source or other
//! subscribers, and it always ends on the newest version. Each version is kept as one shared
//! [`Snapshot`]; its wire encodings are made once, on first use, and shared as [`Bytes`].
//!
//! The watch is stopped once the resource has had no subscriber for the idle time, or as soon
//! as it has none when the resource does not exist and never did.
//!
//! Waiting for resources that do not exist is bounded: at most `max_waiting_resources` watches
//! may wait on a resource the source reports absent and that has never had a version. Beyond
//! that, the subscriptions to such a resource end (`TooManyWaiting`) and its watch stops at once,
//! so clients that name random resources cannot make the proxy hold unbounded watches.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::document;
use crate::metrics::{Metrics, ResourceLabels};
use crate::selector::ResourceKey;
use crate::source::Source;
use crate::source::events::{EventRecorder, ResourceEvents};

/// Default of [`HubOptions::idle_timeout`] (and of `--idle-timeout`).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`HubOptions::max_watches`].
pub const DEFAULT_MAX_WATCHES: usize = 10_000;
/// Default of [`HubOptions::max_document_bytes`]: 4 MiB, the clients' limit on a message, less
/// room for the message's other fields.
pub const DEFAULT_MAX_DOCUMENT_BYTES: usize = 4 * 1024 * 1024 - 4096;
/// Default of [`HubOptions::max_waiting_resources`].
pub const DEFAULT_MAX_WAITING_RESOURCES: usize = 1_000;

/// Hub settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubOptions {
    /// How long a watch stays open after its last subscriber has gone.
    pub idle_timeout: Duration,
    /// The most resources watched at once; further new resources are refused.
    pub max_watches: usize,
    /// The largest flag configuration pushed to clients, in bytes.
    pub max_document_bytes: usize,
    /// The most resources waited on that do not exist (absent, and never had a version).
    pub max_waiting_resources: usize,
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_watches: DEFAULT_MAX_WATCHES,
            max_document_bytes: DEFAULT_MAX_DOCUMENT_BYTES,
            max_waiting_resources: DEFAULT_MAX_WAITING_RESOURCES,
        }
    }
}

/// Why a subscription could not be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HubError {
    #[error("the proxy already watches {limit} resources, the configured maximum")]
    TooManyWatches { limit: usize },
}

/// One version of a resource's flag configuration.
#[derive(Debug)]
pub struct Snapshot {
    /// Increases by one with every new version of this resource while it is watched.
    pub version: u64,
    /// The flag configuration document (JSON).
    pub flag_configuration: Arc<str>,
    /// When the source saw the change that produced this version.
    pub changed_at: Instant,
    /// Subscribers counted when this version was published that have not been sent it yet.
    pending: AtomicUsize,
    encoded: [OnceLock<Bytes>; 2],
}

impl Snapshot {
    fn new(
        version: u64,
        flag_configuration: Arc<str>,
        changed_at: Instant,
        pending: usize,
    ) -> Self {
        Self {
            version,
            flag_configuration,
            changed_at,
            pending: AtomicUsize::new(pending),
            encoded: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// This version's encoding in wire format `slot`, made by `encode` the first time any
    /// subscriber asks for it and shared afterwards.
    pub fn encoded(&self, slot: usize, encode: impl FnOnce(&Snapshot) -> Bytes) -> Bytes {
        self.encoded[slot].get_or_init(|| encode(self)).clone()
    }
}

/// What the source last said about a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// The source has not answered yet.
    Pending,
    /// The resource exists and its newest version is the current snapshot.
    Present,
    /// The resource does not exist (yet, or any more). A snapshot may remain from before.
    Absent,
    /// The resource exists but its newest version was rejected; the snapshot is the last good one.
    Invalid(Arc<str>),
    /// The source may not read this resource.
    Forbidden(Arc<str>),
    /// The source cannot reach its backend at the moment; it keeps retrying.
    Unreachable(Arc<str>),
    /// The resource does not exist and `limit` other resources that do not exist are already
    /// waited on. Final: subscriptions end and the watch stops.
    TooManyWaiting { limit: usize },
}

/// The state of one watched resource, as seen by its subscribers.
#[derive(Clone, Debug)]
pub struct ResourceState {
    pub snapshot: Option<Arc<Snapshot>>,
    pub availability: Availability,
}

type StateSender = Arc<watch::Sender<ResourceState>>;

/// The subscription registry. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    source: Arc<dyn Source>,
    options: HubOptions,
    metrics: Arc<Metrics>,
    upstreams: Mutex<HashMap<ResourceKey, StateSender>>,
    /// Resources waited on that do not exist yet, over all watches.
    waiting: Arc<AtomicUsize>,
    /// Kubernetes Events about rejected and recovered resources, when recorded.
    events: OnceLock<EventRecorder>,
}

impl Hub {
    pub fn new(source: Arc<dyn Source>, options: HubOptions, metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                options,
                metrics,
                upstreams: Mutex::new(HashMap::new()),
                waiting: Arc::new(AtomicUsize::new(0)),
                events: OnceLock::new(),
            }),
        }
    }

    /// Records Kubernetes Events for the resources watched from now on (see
    /// [`crate::source::events`]). Only the first recorder given is used.
    pub fn record_events(&self, recorder: EventRecorder) {
        let _ = self.inner.events.set(recorder);
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Subscribes to a resource, starting its watch if nobody watches it yet.
    pub fn subscribe(&self, key: ResourceKey) -> Result<Subscription, HubError> {
        let mut upstreams = self.inner.lock();
        if let Some(tx) = upstreams.get(&key) {
            return Ok(Subscription::new(key, tx.subscribe()));
        }
        if upstreams.len() >= self.inner.options.max_watches {
            self.inner.metrics.reject("max_watches");
            return Err(HubError::TooManyWatches {
                limit: self.inner.options.max_watches,
            });
        }
        let (tx, rx) = watch::channel(ResourceState {
            snapshot: None,
            availability: Availability::Pending,
        });
        let tx = Arc::new(tx);
        upstreams.insert(key.clone(), tx.clone());
        drop(upstreams);
        tokio::spawn(run_upstream(self.inner.clone(), key.clone(), tx));
        Ok(Subscription::new(key, rx))
    }

    /// The resources watched right now, with their state.
    pub fn resources(&self) -> Vec<(ResourceKey, ResourceState, usize)> {
        let upstreams = self.inner.lock();
        let mut out: Vec<_> = upstreams
            .iter()
            .map(|(key, tx)| (key.clone(), tx.borrow().clone(), tx.receiver_count()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ResourceKey, StateSender>> {
        // The map is only touched in short, non-panicking sections; a poisoned lock still holds
        // a consistent map.
        self.upstreams
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Runs one resource's watch for as long as it has subscribers (plus the idle time).
async fn run_upstream(inner: Arc<Inner>, key: ResourceKey, tx: StateSender) {
    inner.metrics.upstream_watches.inc();
    tracing::debug!(resource = %key, source = inner.source.name(), "watch started");
    let waiting = Arc::new(WaitingPlace {
        count: inner.waiting.clone(),
        limit: inner.options.max_waiting_resources,
        metrics: inner.metrics.clone(),
        held: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        refused: CancellationToken::new(),
    });
    let publisher = Publisher {
        source: inner.source.name(),
        key: key.clone(),
        tx: tx.clone(),
        metrics: inner.metrics.clone(),
        max_document_bytes: inner.options.max_document_bytes,
        next_version: Arc::new(AtomicU64::new(1)),
        waiting: waiting.clone(),
        events: inner
            .events
            .get()
            .map(|recorder| Arc::new(recorder.watch(key.clone()))),
    };
    let mut watch = inner.source.watch(key.clone(), publisher.clone());
    let why = loop {
        tokio::select! {
            () = &mut watch => {
                tracing::warn!(resource = %key, source = inner.source.name(), "watch ended; restarting");
                tokio::time::sleep(Duration::from_secs(1)).await;
                watch = inner.source.watch(key.clone(), publisher.clone());
            }
            () = waiting.refused.cancelled() => {
                // Subscribers see the final state and end; new ones start a fresh watch.
                inner.lock().remove(&key);
                break "too many resources that do not exist are waited on";
            }
            () = idle(&tx, inner.options.idle_timeout) => {
                let mut upstreams = inner.lock();
                if tx.receiver_count() == 0 {
                    upstreams.remove(&key);
                    break "no subscribers";
                }
            }
        }
    };
    drop(watch);
    // Under the channel's lock, like every change of the waiting place (see `WaitingPlace`).
    tx.send_if_modified(|_| {
        waiting.close();
        false
    });
    inner.metrics.upstream_watches.dec();
    tracing::debug!(resource = %key, "watch stopped: {why}");
}

/// One watch's share of the resources waited on that do not exist. It changes only inside the
/// watch channel's `send_if_modified` (which holds the channel's lock), so one watch's
/// transitions never race each other.
struct WaitingPlace {
    count: Arc<AtomicUsize>,
    limit: usize,
    metrics: Arc<Metrics>,
    /// This watch holds one place in `count`.
    held: AtomicBool,
    /// The watch has stopped; it takes no place any more.
    closed: AtomicBool,
    /// Cancelled when the resource was refused a place: the watch stops at once.
    refused: CancellationToken,
}

impl WaitingPlace {
    /// Takes a place for this watch unless it holds one already; false if none is left.
    fn take(&self) -> bool {
        if self.held.load(Ordering::Acquire) || self.closed.load(Ordering::Acquire) {
            return true;
        }
        let taken = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok();
        if taken {
            self.held.store(true, Ordering::Release);
            self.metrics.waiting_resources.inc();
        }
        taken
    }

    /// Gives the place back: the resource has a version now, or the watch stopped.
    fn release(&self) {
        if self.held.swap(false, Ordering::AcqRel) {
            self.count.fetch_sub(1, Ordering::AcqRel);
            self.metrics.waiting_resources.dec();
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.release();
    }
}

/// Resolves once the channel has had no receiver for `timeout`, or at once when it has none
/// and the resource does not exist and never did: nobody waits for it any more, and its place
/// among the resources waited on goes back at once (a `FetchAllFlags` for a name that does not
/// exist must not hold one).
async fn idle(tx: &watch::Sender<ResourceState>, timeout: Duration) {
    loop {
        tx.closed().await;
        let never_existed = {
            let state = tx.borrow();
            state.snapshot.is_none() && state.availability == Availability::Absent
        };
        if !never_existed {
            tokio::time::sleep(timeout).await;
        }
        if tx.receiver_count() == 0 {
            return;
        }
    }
}

/// The handle a source reports through. Turns resources into checked, versioned snapshots and
/// publishes them; identical content is not published again.
#[derive(Clone)]
pub struct Publisher {
    source: &'static str,
    key: ResourceKey,
    tx: StateSender,
    metrics: Arc<Metrics>,
    max_document_bytes: usize,
    next_version: Arc<AtomicU64>,
    waiting: Arc<WaitingPlace>,
    events: Option<Arc<ResourceEvents>>,
}

impl Publisher {
    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// The resource exists with this content (a `FeatureFlag` object as JSON).
    pub fn resource(&self, resource: &Value, changed_at: Instant) {
        match document::from_resource(resource) {
            Ok(document) => self.accept(document, changed_at),
            Err(error) => self.invalid(error.to_string()),
        }
        if let Some(events) = &self.events {
            let state = self.tx.borrow();
            match &state.availability {
                Availability::Present => events.accepted(resource),
                // Only resources that are served: someone is waiting for this version.
                Availability::Invalid(reason) if self.tx.receiver_count() > 0 => {
                    events.rejected(resource, reason);
                }
                _ => {}
            }
        }
    }

    /// The resource exists and this is its flag configuration document (as another proxy
    /// serves it). It is checked like a converted resource.
    pub fn flag_configuration(&self, document: String, changed_at: Instant) {
        let checked = serde_json::from_str::<Value>(&document)
            .map_err(|e| format!("the flag configuration is not JSON: {e}"))
            .and_then(|value| document::validate(&value).map_err(|e| e.to_string()));
        match checked {
            Ok(()) => self.accept(document, changed_at),
            Err(reason) => self.invalid(reason),
        }
    }

    /// Publishes a checked document unless it is too large for clients or unchanged.
    fn accept(&self, document: String, changed_at: Instant) {
        if document.len() > self.max_document_bytes {
            let reason = format!(
                "the flag configuration is {} bytes, over the limit of {} bytes that clients accept",
                document.len(),
                self.max_document_bytes
            );
            return self.invalid(reason);
        }
        let tx = &self.tx;
        let mut published = None;
        tx.send_if_modified(|state| {
            if matches!(state.availability, Availability::TooManyWaiting { .. }) {
                return false;
            }
            let same = state
                .snapshot
                .as_ref()
                .is_some_and(|s| *s.flag_configuration == *document);
            let was = std::mem::replace(&mut state.availability, Availability::Present);
            if same {
                return was != Availability::Present;
            }
            let version = self.next_version.fetch_add(1, Ordering::Relaxed);
            let snapshot = Arc::new(Snapshot::new(
                version,
                document.into(),
                changed_at,
                tx.receiver_count(),
            ));
            published = Some(version);
            state.snapshot = Some(snapshot);
            // The resource exists: it no longer counts as waited on.
            self.waiting.release();
            true
        });
        if let Some(version) = published {
            self.metrics.versions_published.inc();
            tracing::info!(resource = %self.key, version, "new flag configuration");
        }
    }

    /// The resource does not exist. Subscribers keep the last flags they had. A resource that
    /// never had a version takes one of the places for resources waited on; when none is left,
    /// its subscriptions end and its watch stops.
    pub fn absent(&self) {
        let mut refused = false;
        let changed = self.tx.send_if_modified(|state| {
            if matches!(state.availability, Availability::TooManyWaiting { .. }) {
                return false;
            }
            let availability = if state.snapshot.is_none() && !self.waiting.take() {
                refused = true;
                Availability::TooManyWaiting {
                    limit: self.waiting.limit,
                }
            } else {
                Availability::Absent
            };
            replace(&mut state.availability, availability)
        });
        if refused {
            self.metrics.reject("max_waiting_resources");
            tracing::warn!(
                resource = %self.key,
                limit = self.waiting.limit,
                "resource not found and too many resources that do not exist are waited on already; ending its streams"
            );
            self.waiting.refused.cancel();
        } else if changed {
            tracing::info!(resource = %self.key, "resource not found; waiting for it to appear");
        }
    }

    /// The source may not read the resource.
    pub fn forbidden(&self, reason: String) {
        self.metrics.source_error(self.source, "forbidden");
        if self.set(Availability::Forbidden(reason.clone().into())) {
            tracing::error!(resource = %self.key, %reason, "access denied");
        }
    }

    /// The source cannot reach its backend; it keeps retrying and subscribers keep their flags.
    pub fn unreachable(&self, reason: String) {
        if self.set(Availability::Unreachable(reason.clone().into())) {
            tracing::warn!(resource = %self.key, %reason, "source unreachable");
        }
    }

    fn invalid(&self, reason: String) {
        self.metrics
            .invalid_documents
            .get_or_create(&ResourceLabels {
                namespace: self.key.namespace.clone(),
                name: self.key.name.clone(),
            })
            .inc();
        tracing::error!(resource = %self.key, %reason, "invalid flag configuration; keeping the last good version");
        self.set(Availability::Invalid(reason.into()));
    }

    /// Sets the availability; true if it changed. A refused resource stays refused.
    fn set(&self, availability: Availability) -> bool {
        self.tx.send_if_modified(|state| {
            !matches!(state.availability, Availability::TooManyWaiting { .. })
                && replace(&mut state.availability, availability)
        })
    }
}

/// Replaces `current` with `new`; true if that changed it.
fn replace(current: &mut Availability, new: Availability) -> bool {
    if *current == new {
        false
    } else {
        *current = new;
        true
    }
}

/// How a subscription ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionEnd {
    /// The source may not read the resource.
    Forbidden(Arc<str>),
    /// The resource does not exist and `limit` other resources that do not exist are already
    /// waited on.
    TooManyWaiting { limit: usize },
}

/// One subscriber's view of a resource.
pub struct Subscription {
    key: ResourceKey,
    rx: watch::Receiver<ResourceState>,
    /// The newest version this subscriber has been given.
    last: Option<u64>,
    /// The version current when this subscriber joined; it was not counted for that one.
    joined_at: Option<u64>,
}

impl Subscription {
    fn new(key: ResourceKey, rx: watch::Receiver<ResourceState>) -> Self {
        let joined_at = rx.borrow().snapshot.as_ref().map(|s| s.version);
        Self {
            key,
            rx,
            last: None,
            joined_at,
        }
    }

    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// Waits for a version newer than the last one returned (the current one, the first time).
    /// Intermediate versions published while the caller was busy are skipped.
    pub async fn next(&mut self) -> Result<Arc<Snapshot>, SubscriptionEnd> {
        loop {
            {
                let state = self.rx.borrow_and_update();
                match &state.availability {
                    Availability::Forbidden(reason) => {
                        return Err(SubscriptionEnd::Forbidden(reason.clone()));
                    }
                    Availability::TooManyWaiting { limit } => {
                        return Err(SubscriptionEnd::TooManyWaiting { limit: *limit });
                    }
                    _ => {}
                }
                if let Some(snapshot) = &state.snapshot
                    && self.last != Some(snapshot.version)
                {
                    self.last = Some(snapshot.version);
                    return Ok(snapshot.clone());
                }
            }
            if self.rx.changed().await.is_err() {
                // The sender lives as long as any receiver does; this cannot happen, but if it
                // did, waiting forever is the safe answer for a stream.
                futures::future::pending::<()>().await;
            }
        }
    }

    /// Marks `snapshot` as handed to this subscriber's transport, for the propagation metric.
    pub fn delivered(&self, snapshot: &Snapshot, metrics: &Metrics) {
        if self.joined_at.is_some_and(|v| snapshot.version <= v) {
            return;
        }
        if snapshot.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            metrics
                .propagation_seconds
                .observe(snapshot.changed_at.elapsed().as_secs_f64());
        }
    }

    /// Waits until the source has answered, then returns the state.
    pub async fn settled(&mut self) -> ResourceState {
        let settled = match self
            .rx
            .wait_for(|s| s.availability != Availability::Pending)
            .await
        {
            Ok(state) => Some(state.clone()),
            Err(_) => None,
        };
        match settled {
            Some(state) => state,
            None => futures::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FakeSource, flag_resource};
    use std::time::Duration;

    fn hub(source: &Arc<FakeSource>, idle: Duration) -> Hub {
        Hub::new(
            source.clone(),
            HubOptions {
                idle_timeout: idle,
                ..HubOptions::default()
            },
            Arc::new(Metrics::new()),
        )
    }

    async fn next(sub: &mut Subscription) -> Arc<Snapshot> {
        tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("a snapshot arrives")
            .expect("not forbidden")
    }

    fn variant(snapshot: &Arc<Snapshot>) -> String {
        let doc: Value = serde_json::from_str(&snapshot.flag_configuration).expect("json");
        doc["flags"]["f"]["defaultVariant"]
            .as_str()
            .expect("string")
            .to_owned()
    }

    #[tokio::test]
    async fn one_watch_serves_all_subscribers() {
        let source = FakeSource::new();
        let hub = hub(&source, Duration::from_secs(60));
        let key = ResourceKey::new("ns", "a");
        let mut subs: Vec<_> = (0..5)
            .map(|_| hub.subscribe(key.clone()).expect("subscribe"))
            .collect();
        let publisher = source.wait_for_watch(&key).await;
        publisher.resource(&flag_resource("on"), Instant::now());
        for sub in &mut subs {
            assert_eq!(variant(&next(sub).await), "on");
        }
        assert_eq!(source.watches_started(&key), 1);
        assert_eq!(hub.metrics().upstream_watches.get(), 1);
    }

    #[tokio::test]
    async fn identical_content_is_not_published_again() {
        let source = FakeSource::new();
        let hub = hub(&source, Duration::from_secs(60));
        let key = ResourceKey::new("ns", "a");
        let mut sub = hub.subscribe(key.clone()).expect("subscribe");
        let publisher = source.wait_for_watch(&key).await;
        publisher.resource(&flag_resource("on"), Instant::now());
        let first = next(&mut sub).await;
        publisher.resource(&flag_resource("on"), Instant::now());
        publisher.resource(&flag_resource("off"), Instant::now());
        let second = next(&mut sub).await;
        assert_eq!(
            (first.version, variant(&second), second.version),
            (1, "off".into(), 2)
        );
    }

    #[tokio::test]
    async fn slow_subscriber_skips_to_the_newest_version() {
        let source = FakeSource::new();
        let hub = hub(&source, Duration::from_secs(60));
        let key = ResourceKey::new("ns", "a");
        let mut fast = hub.subscribe(key.clone()).expect("subscribe");
        let mut slow = hub.subscribe(key.clone()).expect("subscribe");
        let publisher = source.wait_for_watch(&key).await;
        for (i, v) in ["a", "b", "c", "d"].iter().enumerate() {
            let _ = i;
            publisher.resource(&flag_resource(v), Instant::now());
            assert_eq!(variant(&next(&mut fast).await), *v);
        }
        // The slow subscriber never looked in between: it gets the newest version only.
        let got = next(&mut slow).await;
        assert_eq!((variant(&got), got.version), ("d".into(), 4));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), slow.next())
                .await
                .is_err(),
            "nothing newer"
        );
    }

    #[tokio::test]
    async fn invalid_versions_keep_the_last_good_one() {
        let source = FakeSource::new();
        let hub = hub(&source, Duration::from_secs(60));
        let key = ResourceKey::new("ns", "a");
        let mut sub = hub.subscribe(key.clone()).expect("subscribe");
        let publisher = source.wait_for_watch(&key).await;
        publisher.resource(&flag_resource("on"), Instant::now());
        next(&mut sub).await;
        publisher.resource(
            &serde_json::json!({"spec": {"flagSpec": {"flags": {"f": {"state": "BROKEN"}}}}}),
            Instant::now(),
        );
        let state = sub.settled().await;
        assert!(
            matches!(state.availability, Availability::Invalid(ref r) if r.contains("state")),
            "{state:?}"
        );
        assert_eq!(variant(state.snapshot.as_ref().expect("kept")), "on");
        let labels = ResourceLabels {
            namespace: "ns".into(),
            name: "a".into(),
        };
        assert_eq!(
            hub.metrics().invalid_documents.get_or_create(&labels).get(),
            1
        );
    }

    #[tokio::test]
    async fn oversized_documents_are_not_pushed() {
        let source = FakeSource::new();
        let hub = Hub::new(
            source.clone(),
            HubOptions {
                max_document_bytes: 100,
                ..HubOptions::default()
            },
            Arc::new(Metrics::new()),
        );
        let key = ResourceKey::new("ns", "a");
        let mut sub = hub.subscribe(key.clone()).expect("subscribe");
        let publisher = source.wait_for_watch(&key).await;
        publisher.resource(&flag_resource(&"x".repeat(200)), Instant::now());
        let state = sub.settled().await;
        assert!(
            matches!(state.availability, Availability::Invalid(ref r) if r.contains("over the limit"))
        );
        assert!(state.snapshot.is_none());
    }

    #[tokio::test]
    async fn forbidden_ends_subscriptions() {
        let source = FakeSource::new();
        let hub = hub(&source, Duration::from_secs(60));
        let key = ResourceKey::new("ns", "a");
        let mut sub = hub.subscribe(key.clone()).expect("subscribe");
        source
            .wait_for_watch(&key)
            .await
            .forbidden("no get on featureflags".into());
        let end = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("ends");
        assert!(matches!(end, Err(SubscriptionEnd::Forbidden(ref r)) if r.contains("no get")));
    }

    #[tokio::test(start_paused = true)]
    async fn watch_stops_after_the_idle_time_and_restarts_on_demand() {
        let source = FakeSource::new();
        let idle_time = Duration::from_secs(30);
        let hub = hub(&source, idle_time);
        let key = ResourceKey::new("ns", "a");
        let sub = hub.subscribe(key.clone()).expect("subscribe");
        source.wait_for_watch(&key).await;
        drop(sub);
        // A subscriber that comes back within the idle time reuses the watch.
        tokio::time::sleep(idle_time / 2).await;
        let sub = hub.subscribe(key.clone()).expect("subscribe");
        tokio::time::sleep(idle_time * 2).await;
        assert_eq!(
            (source.active_watches(&key), source.watches_started(&key)),
            (1, 1)
        );
        drop(sub);
        tokio::time::sleep(idle_time + Duration::from_secs(1)).await;
        assert_eq!(
            source.active_watches(&key),
            0,
            "watch dropped after the idle time"
        );
        assert!(hub.resources().is_empty());
        assert_eq!(hub.metrics().upstream_watches.get(), 0);
        let _sub = hub.subscribe(key.clone()).expect("subscribe");
        source.wait_for_watch(&key).await;
        assert_eq!(source.watches_started(&key), 2);
    }

    #[tokio::test]
    async fn watch_limit_refuses_new_resources_only() {
        let source = FakeSource::new();
        let hub = Hub::new(
            source.clone(),
            HubOptions {
                max_watches: 1,
                ..HubOptions::default()
            },
            Arc::new(Metrics::new()),
        );
        let _a = hub.subscribe(ResourceKey::new("ns", "a")).expect("first");
        let _a2 = hub
            .subscribe(ResourceKey::new("ns", "a"))
            .expect("same resource");
        let err = hub
            .subscribe(ResourceKey::new("ns", "b"))
            .err()
            .expect("refused");
        assert_eq!(err, HubError::TooManyWatches { limit: 1 });
    }

    fn waiting_hub(source: &Arc<FakeSource>, max_waiting_resources: usize) -> Hub {
        Hub::new(
            source.clone(),
            HubOptions {
                idle_timeout: Duration::from_secs(30),
                max_waiting_resources,
                ..HubOptions::default()
            },
            Arc::new(Metrics::new()),
        )
    }

    fn availability(hub: &Hub, key: &ResourceKey) -> Option<Availability> {
        hub.resources()
            .into_iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, state, _)| state.availability)
    }

    fn refused_count(hub: &Hub) -> u64 {
        hub.metrics()
            .rejected_requests
            .get_or_create(&crate::metrics::ReasonLabels {
                reason: "max_waiting_resources",
            })
            .get()
    }

    /// Waits (bounded) until `condition` holds; the hub's watch tasks run concurrently.
    async fn eventually(mut condition: impl FnMut() -> bool) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !condition() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the condition holds in time");
    }

    #[tokio::test]
    async fn waiting_limit_ends_subscriptions_to_further_missing_resources() {
        let source = FakeSource::new();
        let hub = waiting_hub(&source, 1);
        let (a, b) = (ResourceKey::new("ns", "a"), ResourceKey::new("ns", "b"));
        let mut waits = hub.subscribe(a.clone()).expect("subscribe");
        source.wait_for_watch(&a).await.absent();
        assert_eq!(availability(&hub, &a), Some(Availability::Absent));
        assert_eq!(hub.metrics().waiting_resources.get(), 1);

        let mut refused: Vec<_> = (0..2)
            .map(|_| hub.subscribe(b.clone()).expect("subscribe"))
            .collect();
        source.wait_for_watch(&b).await.absent();
        for sub in &mut refused {
            let end = tokio::time::timeout(Duration::from_secs(10), sub.next())
                .await
                .expect("ends")
                .expect_err("refused");
            assert_eq!(end, SubscriptionEnd::TooManyWaiting { limit: 1 });
        }
        // The refused resource's watch stops at once, not after the idle time.
        eventually(|| source.active_watches(&b) == 0).await;
        assert_eq!(availability(&hub, &b), None);
        eventually(|| hub.metrics().upstream_watches.get() == 1).await;
        assert_eq!(refused_count(&hub), 1);
        assert_eq!(hub.metrics().waiting_resources.get(), 1);

        // The resource waited on is unaffected: it is delivered when it appears, and then no
        // longer counts as waited on.
        source
            .wait_for_watch(&a)
            .await
            .resource(&flag_resource("on"), Instant::now());
        assert_eq!(variant(&next(&mut waits).await), "on");
        assert_eq!(hub.metrics().waiting_resources.get(), 0);

        // So `b` may wait now, on a new watch.
        let _b = hub.subscribe(b.clone()).expect("subscribe");
        eventually(|| source.watches_started(&b) == 2).await;
        source.wait_for_watch(&b).await.absent();
        assert_eq!(availability(&hub, &b), Some(Availability::Absent));
        assert_eq!(refused_count(&hub), 1);
    }

    #[tokio::test]
    async fn resources_with_a_version_are_never_refused() {
        let source = FakeSource::new();
        let hub = waiting_hub(&source, 1);
        let (a, c) = (ResourceKey::new("ns", "a"), ResourceKey::new("ns", "c"));
        let _waits = hub.subscribe(a.clone()).expect("subscribe");
        source.wait_for_watch(&a).await.absent();
        let mut sub = hub.subscribe(c.clone()).expect("subscribe");
        let publisher = source.wait_for_watch(&c).await;
        publisher.resource(&flag_resource("on"), Instant::now());
        next(&mut sub).await;
        // Deleted while every waiting place is taken: clients keep the last flags.
        publisher.absent();
        assert_eq!(availability(&hub, &c), Some(Availability::Absent));
        publisher.resource(&flag_resource("off"), Instant::now());
        assert_eq!(variant(&next(&mut sub).await), "off");
        assert_eq!(refused_count(&hub), 0);
        // A refused resource stays refused: later reports do not revive its subscribers.
        let d = ResourceKey::new("ns", "d");
        let mut refused = hub.subscribe(d.clone()).expect("subscribe");
        let publisher = source.wait_for_watch(&d).await;
        publisher.absent();
        publisher.resource(&flag_resource("on"), Instant::now());
        assert!(matches!(
            refused.next().await,
            Err(SubscriptionEnd::TooManyWaiting { limit: 1 })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_place_is_given_back_when_the_watch_stops() {
        let source = FakeSource::new();
        let hub = waiting_hub(&source, 1);
        let (a, b) = (ResourceKey::new("ns", "a"), ResourceKey::new("ns", "b"));
        let sub = hub.subscribe(a.clone()).expect("subscribe");
        let stale = source.wait_for_watch(&a).await;
        stale.absent();
        drop(sub);
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert!(hub.resources().is_empty());
        assert_eq!(hub.metrics().waiting_resources.get(), 0);
        // A late report from the stopped watch takes no place.
        stale.unreachable("late".into());
        stale.absent();
        assert_eq!(hub.metrics().waiting_resources.get(), 0);
        let _b = hub.subscribe(b.clone()).expect("subscribe");
        source.wait_for_watch(&b).await.absent();
        assert_eq!(availability(&hub, &b), Some(Availability::Absent));
        assert_eq!(hub.metrics().waiting_resources.get(), 1);
    }

    #[tokio::test]
    async fn propagation_is_measured_once_all_counted_subscribers_have_it() {
        let source = FakeSource::new();
        let hub = hub(&source, Duration::from_secs(60));
        let key = ResourceKey::new("ns", "a");
        let mut a = hub.subscribe(key.clone()).expect("subscribe");
        let mut b = hub.subscribe(key.clone()).expect("subscribe");
        let publisher = source.wait_for_watch(&key).await;
        publisher.resource(&flag_resource("on"), Instant::now());
        let snapshot = next(&mut a).await;
        a.delivered(&snapshot, hub.metrics());
        let count = || {
            hub.metrics()
                .encode()
                .contains("flagd_proxy_propagation_seconds_count 1")
        };
        assert!(!count(), "one of two subscribers still waits");
        let snapshot = next(&mut b).await;
        b.delivered(&snapshot, hub.metrics());
        assert!(count(), "{}", hub.metrics().encode());
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// A snapshot of `flag_configuration` as version 1.
    pub fn snapshot(flag_configuration: &str) -> Snapshot {
        Snapshot::new(1, flag_configuration.into(), Instant::now(), 0)
    }
}
