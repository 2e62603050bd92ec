//! The hub, the core of the proxy: subscriptions and fan-out. It knows no protocol and no
//! backend: sources feed it through the ports in [`ports`], and whoever serves clients reads
//! [`Subscription`]s.
//!
//! One upstream watch per resource, started by its first subscriber and shared by all of them
//! through a `tokio::sync::watch` channel that holds only the newest state. A subscriber that is
//! slow simply finds a newer version when it looks again: it never blocks the source or other
//! subscribers, and it always ends on the newest version. Each version is kept as one shared
//! [`Snapshot`]; its encodings (named by whoever sends them) are made once, on first use, and
//! shared.
//!
//! The watch is stopped once the resource has had no subscriber for the idle time, or as soon
//! as it has none when the resource does not exist and never did.
//!
//! Waiting for resources that do not exist is bounded: at most `max_waiting_resources` watches
//! may wait on a resource the source reports absent and that has never had a version. Beyond
//! that, the subscriptions to such a resource end (`TooManyWaiting`) and its watch stops at once,
//! so clients that name random resources cannot make the proxy hold unbounded watches.
//!
//! With a [`VersionStore`] (`--state-dir`), every version the source delivers is kept there, and a
//! watch whose source has delivered nothing [`STALE_GRACE`] after it started (or has reported
//! its backend unreachable before) serves the kept version, marked stale
//! ([`ResourceState::stale`]); the first version the source delivers replaces it, and a stale
//! version never replaces one from the source.
//!
//! Each version's propagation (until the last subscriber counted at its publication was written)
//! is measured once, in `flagd_proxy_propagation_seconds` and, when the hub is given a
//! [`SpanSink`], as a [`ports::PUBLISH_SPAN`] span.
//!
//! Files: [`ports`] (the `Source`, event and span traits), [`publisher`] (what sources report
//! through), [`snapshot`] (versions and availability), [`subscription`] (a subscriber's view),
//! `propagation` (the end of each version's propagation), `waiting` (the bound above).
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::budget::{Charge, Kind, MemoryBudget};
use crate::metrics::{Metrics, ResourceLabels};
use crate::selector::ResourceKey;

pub mod ports;
mod propagation;
pub mod publisher;
pub mod snapshot;
pub mod subscription;
#[cfg(test)]
mod tests;
mod waiting;

pub use ports::{
    EventSink, ResourceEventSink, Source, SpanRecord, SpanSink, SpanValue, VersionStore,
};
use propagation::Propagation;
use publisher::Bounds;
pub use publisher::Publisher;
pub use snapshot::{Availability, Encoded, EncodingName, ResourceState, Snapshot};
pub use subscription::{INVALID_GRACE, Subscription, SubscriptionEnd};
use waiting::WaitingPlace;

/// Default of [`HubOptions::idle_timeout`] (and of `--idle-timeout`).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`HubOptions::max_watches`].
pub const DEFAULT_MAX_WATCHES: usize = 10_000;
/// Default of [`HubOptions::max_document_bytes`]: 4 MiB, the clients' limit on a message, less
/// room for the message's other fields.
pub const DEFAULT_MAX_DOCUMENT_BYTES: usize = 4 * 1024 * 1024 - 4096;
/// Default of [`HubOptions::max_waiting_resources`].
pub const DEFAULT_MAX_WAITING_RESOURCES: usize = 1_000;
/// How long a new watch waits for its source to deliver a version before it serves the version
/// kept from an earlier run, marked stale (at once when the source reports its backend
/// unreachable first). Short: a client that connects while the source is away gets flags within
/// it; the fresh version replaces the stale one when it comes.
pub const STALE_GRACE: Duration = Duration::from_millis(500);

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
    #[error(
        "the proxy is at its memory budget (--memory-budget) and cannot watch another resource; try again later or another replica"
    )]
    MemoryBudget,
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
    budget: Arc<MemoryBudget>,
    metrics: Arc<Metrics>,
    propagation: Arc<Propagation>,
    upstreams: Mutex<HashMap<ResourceKey, StateSender>>,
    /// Resources waited on that do not exist yet, over all watches.
    waiting: Arc<AtomicUsize>,
    /// Where the outcome of each version is reported, when it is.
    events: OnceLock<Arc<dyn EventSink>>,
    /// Where versions are kept across restarts, when they are, and how long a new watch waits
    /// for its source before serving the kept version.
    store: OnceLock<(Arc<dyn VersionStore>, Duration)>,
    /// Every watch task, so that shutdown can wait for them.
    tasks: TaskTracker,
    /// Cancelled when the proxy shuts down: every watch stops.
    stopping: CancellationToken,
}

impl Hub {
    /// A hub over `source` that records its metrics in `metrics` and charges its versions to
    /// `budget` (both the process's).
    pub fn new(
        source: Arc<dyn Source>,
        options: HubOptions,
        metrics: Arc<Metrics>,
        budget: Arc<MemoryBudget>,
    ) -> Self {
        Self::traced(source, options, metrics, budget, None)
    }

    /// A hub that also records a span for every published version in `spans`
    /// ([`ports::PUBLISH_SPAN`]).
    pub fn traced(
        source: Arc<dyn Source>,
        options: HubOptions,
        metrics: Arc<Metrics>,
        budget: Arc<MemoryBudget>,
        spans: Option<Arc<dyn SpanSink>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                options,
                budget,
                propagation: Arc::new(Propagation {
                    metrics: metrics.clone(),
                    spans,
                }),
                metrics,
                upstreams: Mutex::new(HashMap::new()),
                waiting: Arc::new(AtomicUsize::new(0)),
                events: OnceLock::new(),
                store: OnceLock::new(),
                tasks: TaskTracker::new(),
                stopping: CancellationToken::new(),
            }),
        }
    }

    /// Reports the outcome of each version of the resources watched from now on to `sink`.
    /// Only the first sink given is used.
    pub fn record_events(&self, sink: Arc<dyn EventSink>) {
        let _ = self.inner.events.set(sink);
    }

    /// Keeps every version of the resources watched from now on in `store`, and serves the kept
    /// version, marked stale, when their source has delivered none within `grace` (the proxy
    /// uses [`STALE_GRACE`]) or reported its backend unreachable before. Only the first store
    /// given is used.
    pub fn keep_versions(&self, store: Arc<dyn VersionStore>, grace: Duration) {
        let _ = self.inner.store.set((store, grace));
    }

    /// A hub with metrics of its own and an unlimited budget, for tests.
    #[cfg(test)]
    pub(crate) fn for_test(source: Arc<dyn Source>, options: HubOptions) -> Self {
        let metrics = Arc::new(Metrics::new());
        let budget = MemoryBudget::unlimited(metrics.clone());
        Self::new(source, options, metrics, budget)
    }

    #[cfg(test)]
    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Subscribes to a resource, starting its watch if nobody watches it yet.
    pub fn subscribe(&self, key: ResourceKey) -> Result<Subscription, HubError> {
        let mut upstreams = self.inner.lock();
        if let Some(tx) = upstreams.get(&key) {
            return Ok(Subscription::new(
                key,
                tx.subscribe(),
                self.inner.propagation.clone(),
            ));
        }
        if upstreams.len() >= self.inner.options.max_watches {
            self.inner.metrics.reject("max_watches");
            return Err(HubError::TooManyWatches {
                limit: self.inner.options.max_watches,
            });
        }
        // Counted as `memory_budget` when refused.
        let memory = self
            .inner
            .budget
            .try_charge(self.inner.source.watch_bytes(), Kind::Watches)
            .ok_or(HubError::MemoryBudget)?;
        let (tx, rx) = watch::channel(ResourceState {
            snapshot: None,
            availability: Availability::Pending,
            stale: false,
        });
        let tx = Arc::new(tx);
        upstreams.insert(key.clone(), tx.clone());
        drop(upstreams);
        self.inner
            .tasks
            .spawn(run_upstream(self.inner.clone(), key.clone(), tx, memory));
        Ok(Subscription::new(key, rx, self.inner.propagation.clone()))
    }

    /// Stops every watch (the proxy is shutting down, its streams have ended): a subscription
    /// still held gets no further version, and a watch started after this stops at once.
    /// [`Hub::tasks`] tells when the watch tasks have ended.
    pub fn stop_watches(&self) {
        self.inner.stopping.cancel();
        self.inner.tasks.close();
    }

    /// The watch tasks: closed by [`Hub::stop_watches`], empty once every watch has stopped.
    pub fn tasks(&self) -> &TaskTracker {
        &self.inner.tasks
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
    /// Drops what the metrics say about one resource's current version. Called with the map
    /// locked, as the watch is removed from it: a new watch of the resource, which only starts
    /// under that lock, reports afresh.
    fn forget(&self, key: &ResourceKey) {
        let labels = ResourceLabels {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        };
        self.metrics.document_warnings.remove(&labels);
        self.metrics.compression_ratio.remove(&labels);
    }

    /// Removes one resource's watch from the map (and what the metrics say about it).
    fn remove(&self, key: &ResourceKey) {
        let mut upstreams = self.lock();
        upstreams.remove(key);
        self.forget(key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ResourceKey, StateSender>> {
        // The map is only touched in short, non-panicking sections; a poisoned lock still holds
        // a consistent map.
        crate::locks::lock(&self.upstreams)
    }
}

/// Runs one resource's watch for as long as it has subscribers (plus the idle time), charged
/// to the budget with `_memory` until then.
async fn run_upstream(inner: Arc<Inner>, key: ResourceKey, tx: StateSender, _memory: Charge) {
    inner.metrics.upstream_watches.inc();
    tracing::debug!(resource = %key, source = inner.source.name(), "watch started");
    let waiting = Arc::new(WaitingPlace::new(
        inner.waiting.clone(),
        inner.options.max_waiting_resources,
        inner.metrics.clone(),
    ));
    let events = inner
        .events
        .get()
        .map(|sink| Arc::from(sink.reporter_for(key.clone())));
    let publisher = Publisher::new(
        inner.source.name(),
        key.clone(),
        tx.clone(),
        inner.propagation.clone(),
        Bounds {
            max_document_bytes: inner.options.max_document_bytes,
            budget: inner.budget.clone(),
        },
        waiting.clone(),
        events,
    )
    .with_store(inner.store.get().map(|(store, _)| store.clone()));
    let mut watch = inner.source.watch(key.clone(), publisher.clone());
    let mut stale = std::pin::pin!(serve_kept(inner.store.get().cloned(), publisher.clone()));
    // A source's watch should not end; if it does, it is started again after the process's
    // one retry policy.
    let mut backoff = Backoff::new();
    let why = loop {
        tokio::select! {
            () = &mut stale => {}
            () = &mut watch => {
                let delay = backoff.next_delay();
                tracing::warn!(resource = %key, source = inner.source.name(), ?delay, "watch ended; restarting");
                tokio::time::sleep(delay).await;
                watch = inner.source.watch(key.clone(), publisher.clone());
            }
            () = waiting.refused.cancelled() => {
                // Subscribers see the final state and end; new ones start a fresh watch.
                inner.remove(&key);
                break "too many resources that do not exist are waited on";
            }
            () = inner.stopping.cancelled() => {
                inner.remove(&key);
                break "shutting down";
            }
            () = idle(&tx, inner.options.idle_timeout) => {
                let mut upstreams = inner.lock();
                if tx.receiver_count() == 0 {
                    upstreams.remove(&key);
                    inner.forget(&key);
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

/// Serves the version `store` kept of the publisher's resource, marked stale, when the source has
/// delivered none within the grace or reported its backend unreachable before; then never
/// resolves. The kept version is read only then.
async fn serve_kept(store: Option<(Arc<dyn VersionStore>, Duration)>, publisher: Publisher) {
    if let Some((store, grace)) = store {
        publisher.unreachable_within(grace).await;
        if publisher.delivered_any() {
            return futures::future::pending().await;
        }
        let key = publisher.key().clone();
        if let Ok(Some(document)) = tokio::task::spawn_blocking(move || store.load(&key)).await {
            publisher.stale(document);
        }
    }
    futures::future::pending().await
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
