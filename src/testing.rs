//! Test helpers shared by the unit tests.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::hub::{Publisher, Source, SpanRecord, SpanSink, SpanValue};
use crate::selector::ResourceKey;

/// A `FeatureFlag` with one string flag `f` whose default variant is `variant`.
pub fn flag_resource(variant: &str) -> Value {
    json!({
        "apiVersion": "core.openfeature.dev/v1beta1",
        "kind": "FeatureFlag",
        "metadata": {"name": "a", "namespace": "ns"},
        "spec": {"flagSpec": {"flags": {"f": {
            "state": "ENABLED",
            "variants": {variant: variant, "other": "other"},
            "defaultVariant": variant
        }}}}
    })
}

/// The default variant of flag `f` in a flag configuration document.
pub fn default_variant(flag_configuration: &str) -> String {
    let document: Value = serde_json::from_str(flag_configuration).expect("a JSON document");
    document["flags"]["f"]["defaultVariant"]
        .as_str()
        .expect("a default variant")
        .to_owned()
}

#[derive(Default)]
struct Watches {
    started: HashMap<ResourceKey, usize>,
    active: HashMap<ResourceKey, usize>,
    publishers: HashMap<ResourceKey, Publisher>,
}

#[derive(Default)]
struct Shared {
    watches: Mutex<Watches>,
    changed: Notify,
}

/// A source driven by the test: it records watches and hands out their publishers.
#[derive(Default)]
pub struct FakeSource {
    shared: Arc<Shared>,
    watch_bytes: usize,
}

impl FakeSource {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A source whose every watch holds `watch_bytes` ([`Source::watch_bytes`]).
    pub fn with_watch_bytes(watch_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            watch_bytes,
            ..Self::default()
        })
    }

    /// Waits until a watch for `key` is running and returns its publisher.
    pub async fn wait_for_watch(&self, key: &ResourceKey) -> Publisher {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let notified = self.shared.changed.notified();
                {
                    let watches = self.shared.watches.lock().expect("lock");
                    if watches.active.get(key).copied().unwrap_or(0) > 0
                        && let Some(p) = watches.publishers.get(key)
                    {
                        return p.clone();
                    }
                }
                notified.await;
            }
        })
        .await
        .expect("the hub starts a watch")
    }

    pub fn watches_started(&self, key: &ResourceKey) -> usize {
        self.shared
            .watches
            .lock()
            .expect("lock")
            .started
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    pub fn active_watches(&self, key: &ResourceKey) -> usize {
        self.shared
            .watches
            .lock()
            .expect("lock")
            .active
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// Counts a watch as active until its future is dropped.
struct Active(Arc<Shared>, ResourceKey);

impl Drop for Active {
    fn drop(&mut self) {
        let mut watches = self.0.watches.lock().expect("lock");
        if let Some(n) = watches.active.get_mut(&self.1) {
            *n -= 1;
        }
        drop(watches);
        self.0.changed.notify_waiters();
    }
}

impl Source for FakeSource {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn watch_bytes(&self) -> usize {
        self.watch_bytes
    }

    fn watch(&self, key: ResourceKey, publisher: Publisher) -> BoxFuture<'static, ()> {
        {
            let mut watches = self.shared.watches.lock().expect("lock");
            *watches.started.entry(key.clone()).or_default() += 1;
            *watches.active.entry(key.clone()).or_default() += 1;
            watches.publishers.insert(key.clone(), publisher);
        }
        self.shared.changed.notify_waiters();
        let active = Active(self.shared.clone(), key);
        Box::pin(async move {
            let _active = active;
            futures::future::pending::<()>().await
        })
    }
}

/// A span sink that keeps every span, for tests of what is recorded.
#[derive(Default)]
pub struct RecordedSpans(Mutex<Vec<SpanRecord>>);

impl SpanSink for RecordedSpans {
    fn record(&self, span: SpanRecord) {
        self.0.lock().expect("spans").push(span);
    }
}

impl RecordedSpans {
    /// Every span so far, oldest first.
    pub fn all(&self) -> Vec<SpanRecord> {
        self.0.lock().expect("spans").clone()
    }
}

/// The value of attribute `key` of `span`.
pub fn span_attribute(span: &SpanRecord, key: &str) -> SpanValue {
    span.attributes
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no {key} in {span:?}"))
}
