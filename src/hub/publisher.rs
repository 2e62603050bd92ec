//! The handle a source reports through: resources become checked, versioned snapshots.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Notify;

use crate::budget::MemoryBudget;
use crate::document::{self, DocumentWarning};
use crate::hub::StateSender;
use crate::hub::ports::{ResourceEventSink, VersionStore};
use crate::hub::propagation::Propagation;
use crate::hub::snapshot::{Availability, Snapshot};
use crate::hub::waiting::WaitingPlace;
use crate::metrics::{Metrics, ResourceLabels};
use crate::selector::ResourceKey;

/// The handle a source reports through. Turns resources into checked, versioned snapshots and
/// publishes them; identical content is not published again.
#[derive(Clone)]
pub struct Publisher {
    source: &'static str,
    key: ResourceKey,
    tx: StateSender,
    metrics: Arc<Metrics>,
    propagation: Arc<Propagation>,
    bounds: Bounds,
    next_version: Arc<AtomicU64>,
    waiting: Arc<WaitingPlace>,
    events: Option<Arc<dyn ResourceEventSink>>,
    /// Where each version the source delivers is kept across restarts (`--state-dir`).
    store: Option<Arc<dyn VersionStore>>,
    /// Told when the source reports its backend unreachable.
    unreachable: Arc<Notify>,
}

/// What a version may be: its size, and the budget its memory is counted against.
#[derive(Clone)]
pub(super) struct Bounds {
    pub(super) max_document_bytes: usize,
    pub(super) budget: Arc<MemoryBudget>,
}

impl Publisher {
    pub(super) fn new(
        source: &'static str,
        key: ResourceKey,
        tx: StateSender,
        propagation: Arc<Propagation>,
        bounds: Bounds,
        waiting: Arc<WaitingPlace>,
        events: Option<Arc<dyn ResourceEventSink>>,
    ) -> Self {
        Self {
            source,
            key,
            tx,
            metrics: propagation.metrics.clone(),
            propagation,
            bounds,
            next_version: Arc::new(AtomicU64::new(1)),
            waiting,
            events,
            store: None,
            unreachable: Arc::new(Notify::new()),
        }
    }

    /// Keeps every version the source delivers in `store`, and forgets there the resources
    /// it reports absent.
    pub(super) fn with_store(mut self, store: Option<Arc<dyn VersionStore>>) -> Self {
        self.store = store;
        self
    }

    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// The resource exists with this content (a `FeatureFlag` object as JSON).
    pub fn resource(&self, resource: &Value, changed_at: Instant) {
        let warnings = match document::convert(resource) {
            Ok(converted) => {
                let warnings = converted.warnings;
                self.accept(
                    converted.document,
                    converted.context_bytes,
                    &warnings,
                    changed_at,
                );
                warnings
            }
            Err(error) => {
                self.invalid(error.to_string());
                Vec::new()
            }
        };
        if let Some(events) = &self.events {
            let state = self.tx.borrow();
            match &state.availability {
                // Present: this version was converted and is what clients get.
                Availability::Present if warnings.is_empty() => events.accepted(resource),
                Availability::Present => events.warned(resource, &joined(&warnings)),
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
        match checked(&document) {
            Ok((warnings, context_bytes)) => {
                self.accept(document, context_bytes, &warnings, changed_at);
            }
            Err(reason) => self.invalid(reason),
        }
    }

    /// Resolves once the source reports its backend unreachable, or after `grace`.
    pub(super) async fn unreachable_within(&self, grace: Duration) {
        let _ = tokio::time::timeout(grace, self.unreachable.notified()).await;
    }

    /// Whether the resource has a version already (from the source, or stale).
    pub(super) fn delivered_any(&self) -> bool {
        self.tx.borrow().snapshot.is_some()
    }

    /// Serves `document`, the version kept from an earlier run, marked stale, if the source has
    /// delivered no version since the watch started and has not answered otherwise (it has not
    /// answered yet, or cannot reach its backend). It is checked like a fresh version; one
    /// clients could not use is not served. Its propagation is not measured, and it is not
    /// counted as published: it does not come from the source.
    pub(super) fn stale(&self, document: String) {
        let usable = checked(&document).and_then(|(warnings, context_bytes)| {
            match self.oversized(&document, context_bytes) {
                Some(reason) => Err(reason),
                None => Ok(warnings),
            }
        });
        let warnings = match usable {
            Ok(warnings) => warnings,
            Err(reason) => {
                tracing::warn!(resource = %self.key, %reason, "the version kept from an earlier run is not served");
                return;
            }
        };
        let mut served = None;
        self.tx.send_if_modified(|state| {
            let unanswered = matches!(
                state.availability,
                Availability::Pending | Availability::Unreachable(_)
            );
            if state.snapshot.is_some() || !unanswered {
                return false;
            }
            let version = self.next_version.fetch_add(1, Ordering::Relaxed);
            state.snapshot = Some(Arc::new(Snapshot::new(
                version,
                document.into(),
                Instant::now(),
                0,
                (!warnings.is_empty()).then(|| joined(&warnings).into()),
                self.bounds.budget.clone(),
            )));
            state.stale = true;
            served = Some(version);
            true
        });
        if let Some(version) = served {
            self.count_warnings(&warnings);
            tracing::warn!(
                resource = %self.key,
                version,
                "the source has not delivered this resource; serving the version kept from an earlier run, marked stale, until it does"
            );
        }
    }

    /// Publishes a checked document unless it is too large for clients or unchanged. Its
    /// `warnings` do not stop it: they are logged and counted. What counts against the limit is
    /// the whole message: the document and what its metadata adds (`context_bytes`, sent again
    /// in every `sync_context`).
    fn accept(
        &self,
        document: String,
        context_bytes: usize,
        warnings: &[DocumentWarning],
        changed_at: Instant,
    ) {
        if let Some(reason) = self.oversized(&document, context_bytes) {
            return self.invalid(reason);
        }
        let tx = &self.tx;
        let mut published = None;
        let mut served = false;
        let mut superseded = None;
        tx.send_if_modified(|state| {
            if matches!(state.availability, Availability::TooManyWaiting { .. }) {
                return false;
            }
            served = true;
            let same = state
                .snapshot
                .as_ref()
                .is_some_and(|s| *s.flag_configuration == *document);
            let was = std::mem::replace(&mut state.availability, Availability::Present);
            // A fresh version replaces a stale one even when they are the same: it is no
            // longer stale.
            let was_stale = std::mem::replace(&mut state.stale, false);
            if same {
                return was != Availability::Present || was_stale;
            }
            let version = self.next_version.fetch_add(1, Ordering::Relaxed);
            let snapshot = Arc::new(Snapshot::new(
                version,
                document.into(),
                changed_at,
                tx.receiver_count(),
                (!warnings.is_empty()).then(|| joined(warnings).into()),
                self.bounds.budget.clone(),
            ));
            published = Some(snapshot.clone());
            if let Some(previous) = state.snapshot.replace(snapshot) {
                superseded = previous.superseded().map(|settled| (previous, settled));
            }
            // The resource exists: it no longer counts as waited on.
            self.waiting.release();
            true
        });
        if served {
            self.count_warnings(warnings);
        }
        if let Some((previous, settled)) = superseded {
            self.propagation.settled(&self.key, &previous, settled);
        }
        if let Some(snapshot) = published {
            let version = snapshot.version;
            if snapshot.subscribers == 0 {
                self.propagation.unwatched(&self.key, &snapshot);
            }
            if let Some(store) = &self.store {
                store.keep(&self.key, snapshot.flag_configuration.clone());
            }
            self.metrics.versions_published.inc();
            tracing::info!(resource = %self.key, version, "new flag configuration");
            if !warnings.is_empty() {
                tracing::warn!(
                    resource = %self.key,
                    version,
                    warnings = warnings.len(),
                    problems = %joined(warnings),
                    "flag configuration served with problems that clients report for the flags concerned when they evaluate them"
                );
            }
        }
    }

    /// Why a document is too large for clients, if it is: the whole message counts, the
    /// document and what its metadata adds (`context_bytes`, sent again in every
    /// `sync_context`).
    fn oversized(&self, document: &str, context_bytes: usize) -> Option<String> {
        let message_bytes = document.len() + context_bytes;
        if message_bytes > self.bounds.max_document_bytes {
            let reason = if context_bytes == 0 {
                format!(
                    "the flag configuration is {} bytes, over the limit of {} bytes that clients accept",
                    document.len(),
                    self.bounds.max_document_bytes
                )
            } else {
                format!(
                    "the flag configuration is {} bytes and its flag-set metadata, sent again in \
                     every message's sync_context, adds {context_bytes}: {message_bytes} bytes, \
                     over the limit of {} bytes that clients accept",
                    document.len(),
                    self.bounds.max_document_bytes
                )
            };
            return Some(reason);
        }
        None
    }

    /// Sets the gauge of the warnings in the version clients get now.
    fn count_warnings(&self, warnings: &[DocumentWarning]) {
        self.metrics
            .document_warnings
            .get_or_create(&self.labels())
            .set(i64::try_from(warnings.len()).unwrap_or(i64::MAX));
    }

    fn labels(&self) -> ResourceLabels {
        ResourceLabels {
            namespace: self.key.namespace.clone(),
            name: self.key.name.clone(),
        }
    }

    /// The resource does not exist. Subscribers keep the last flags they had. A resource that
    /// never had a version takes one of the places for resources waited on; when none is left,
    /// its subscriptions end and its watch stops.
    pub fn absent(&self) {
        if let Some(store) = &self.store {
            store.forget(&self.key);
        }
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
        self.unreachable.notify_one();
        if self.set(Availability::Unreachable(reason.clone().into())) {
            tracing::warn!(resource = %self.key, %reason, "source unreachable");
        }
    }

    /// The upstream proxy refuses the resource as invalid (it has no valid version of it): it
    /// is passed on to this proxy's subscribers as if refused here, without counting it as a
    /// document this proxy found invalid.
    pub fn invalid_upstream(&self, reason: String) {
        if self.set(Availability::Invalid(reason.clone().into())) {
            tracing::warn!(resource = %self.key, %reason, "the upstream refuses the resource as invalid");
        }
    }

    fn invalid(&self, reason: String) {
        self.metrics
            .invalid_documents
            .get_or_create(&self.labels())
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

/// A flag configuration document (as another proxy serves it, or as kept from an earlier run)
/// checked like a converted resource: its warnings and what its metadata adds to every message.
fn checked(document: &str) -> Result<(Vec<DocumentWarning>, usize), String> {
    let value = serde_json::from_str::<Value>(document)
        .map_err(|e| format!("the flag configuration is not JSON: {e}"))?;
    let warnings = document::check(&value).map_err(|e| e.to_string())?;
    Ok((warnings, document::context_bytes(&value)))
}

/// The most warnings told one by one in a log line or an Event; the rest are counted.
const WARNINGS_TOLD: usize = 20;

/// Warnings as one line: each warning names its flag or evaluator.
fn joined(warnings: &[DocumentWarning]) -> String {
    let told: Vec<String> = warnings
        .iter()
        .take(WARNINGS_TOLD)
        .map(ToString::to_string)
        .collect();
    let mut line = told.join("; ");
    if warnings.len() > WARNINGS_TOLD {
        line.push_str(&format!("; and {} more", warnings.len() - WARNINGS_TOLD));
    }
    line
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
