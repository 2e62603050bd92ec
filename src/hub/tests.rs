//! Unit tests of the hub, with a scripted source.
use std::time::Instant;

use super::*;
use crate::metrics::ResourceLabels;
use crate::testing::{FakeSource, RecordedSpans, default_variant, flag_resource, span_attribute};

fn hub_with(source: &Arc<FakeSource>, options: HubOptions) -> Hub {
    Hub::for_test(source.clone(), options)
}

fn hub(source: &Arc<FakeSource>, idle: Duration) -> Hub {
    hub_with(
        source,
        HubOptions {
            idle_timeout: idle,
            ..HubOptions::default()
        },
    )
}

async fn next(sub: &mut Subscription) -> Arc<Snapshot> {
    tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("a snapshot arrives")
        .expect("not forbidden")
}

fn variant(snapshot: &Arc<Snapshot>) -> String {
    default_variant(&snapshot.flag_configuration)
}

/// A scripted source, a hub over it whose watches stay `idle` after their last subscriber, and
/// the resource `ns/a` most tests watch.
fn hub_of_a(idle: Duration) -> (Arc<FakeSource>, Hub, ResourceKey) {
    hub_of_a_with(|source| hub(source, idle))
}

/// Like [`hub_of_a`], with the hub `new_hub` makes over the source.
fn hub_of_a_with(
    new_hub: impl FnOnce(&Arc<FakeSource>) -> Hub,
) -> (Arc<FakeSource>, Hub, ResourceKey) {
    let source = FakeSource::new();
    let hub = new_hub(&source);
    (source, hub, ResourceKey::new("ns", "a"))
}

/// `N` subscribers to `key` and the publisher of its watch, once the watch has started.
async fn subscribe_watched<const N: usize>(
    source: &FakeSource,
    hub: &Hub,
    key: &ResourceKey,
) -> ([Subscription; N], Publisher) {
    let subs = std::array::from_fn(|_| hub.subscribe(key.clone()).expect("subscribe"));
    (subs, source.wait_for_watch(key).await)
}

#[tokio::test]
async fn one_watch_serves_all_subscribers() {
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    let (mut subs, publisher) = subscribe_watched::<5>(&source, &hub, &key).await;
    publisher.resource(&flag_resource("on"), Instant::now());
    for sub in &mut subs {
        assert_eq!(variant(&next(sub).await), "on");
    }
    assert_eq!(source.watches_started(&key), 1);
    assert_eq!(hub.metrics().upstream_watches.get(), 1);
}

#[tokio::test]
async fn identical_content_is_not_published_again() {
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    let ([mut sub], publisher) = subscribe_watched(&source, &hub, &key).await;
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
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    let ([mut fast, mut slow], publisher) = subscribe_watched(&source, &hub, &key).await;
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
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    let ([mut sub], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.resource(&flag_resource("on"), Instant::now());
    next(&mut sub).await;
    publisher.resource(
        &serde_json::json!({"spec": {"flagSpec": {"flags": {"f": {"state": 5}}}}}),
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

/// A hub whose clients accept messages of at most `max_document_bytes`.
fn limited_hub(source: &Arc<FakeSource>, max_document_bytes: usize) -> Hub {
    hub_with(
        source,
        HubOptions {
            max_document_bytes,
            ..HubOptions::default()
        },
    )
}

#[tokio::test]
async fn oversized_documents_are_not_pushed() {
    let (source, hub, key) = hub_of_a_with(|source| limited_hub(source, 100));
    let ([mut sub], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.resource(&flag_resource(&"x".repeat(200)), Instant::now());
    let state = sub.settled().await;
    assert!(
        matches!(state.availability, Availability::Invalid(ref r) if r.contains("over the limit"))
    );
    assert!(state.snapshot.is_none());
}

/// What the flag set's metadata adds to every message (`sync_context`) counts against the limit:
/// a document under it whose message is not is refused, and subscribers keep the last version.
#[tokio::test]
async fn metadata_counts_against_the_message_limit() {
    let (source, hub, key) = hub_of_a_with(|source| limited_hub(source, 1000));
    let ([mut sub], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.resource(&flag_resource("red"), Instant::now());
    assert_eq!(variant(&next(&mut sub).await), "red");
    let mut large = flag_resource("blue");
    large["spec"]["flagSpec"]["metadata"] = serde_json::json!({"notes": "n".repeat(600)});
    let document = crate::document::from_resource(&large).expect("valid");
    assert!(document.len() < 1000, "the document alone fits");
    publisher.resource(&large, Instant::now());
    let state = sub.settled().await;
    assert!(
        matches!(state.availability, Availability::Invalid(ref r) if r.contains("sync_context")),
        "{:?}",
        state.availability
    );
    assert_eq!(
        variant(state.snapshot.as_ref().expect("the last version stays")),
        "red"
    );
}

#[tokio::test]
async fn forbidden_ends_subscriptions() {
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    let ([mut sub], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.forbidden("no get on featureflags".into());
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
    let hub = hub_with(
        &source,
        HubOptions {
            max_watches: 1,
            ..HubOptions::default()
        },
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

/// Each watch is charged to the budget at its source's cost while it runs, waiting or
/// delivering: a new resource that does not fit is refused (and counted), one already watched
/// is still served, and a watch that ends gives its charge back.
#[tokio::test]
async fn watches_are_charged_to_the_budget_while_they_run() {
    let source = FakeSource::with_watch_bytes(1000);
    let metrics = Arc::new(Metrics::new());
    let budget = MemoryBudget::new(2500, metrics.clone());
    let options = HubOptions {
        idle_timeout: Duration::ZERO,
        ..HubOptions::default()
    };
    let hub = Hub::new(source.clone(), options, metrics.clone(), budget.clone());
    let (a, b) = (ResourceKey::new("ns", "a"), ResourceKey::new("ns", "b"));
    let sub_a = hub.subscribe(a.clone()).expect("first");
    let _sub_b = hub.subscribe(b).expect("second");
    assert_eq!(budget.used(), 2000);
    let refused = hub.subscribe(ResourceKey::new("ns", "c")).err();
    assert_eq!(refused, Some(HubError::MemoryBudget));
    assert!(metrics.encode().contains("reason=\"memory_budget\"} 1"));
    let _again = hub
        .subscribe(a.clone())
        .expect("a watched resource is served");
    drop((sub_a, _again));
    eventually(|| budget.used() == 1000).await;
    let _c = hub
        .subscribe(ResourceKey::new("ns", "c"))
        .expect("room again");
    assert_eq!(budget.used(), 2000);
}

fn waiting_hub(source: &Arc<FakeSource>, max_waiting_resources: usize) -> Hub {
    hub_with(
        source,
        HubOptions {
            idle_timeout: Duration::from_secs(30),
            max_waiting_resources,
            ..HubOptions::default()
        },
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
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    let ([mut a, mut b], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.resource(&flag_resource("on"), Instant::now());
    let snapshot = next(&mut a).await;
    a.delivered(&snapshot);
    let count = || {
        hub.metrics()
            .encode()
            .contains("flagd_proxy_propagation_seconds_count 1")
    };
    assert!(!count(), "one of two subscribers still waits");
    let snapshot = next(&mut b).await;
    b.delivered(&snapshot);
    assert!(count(), "{}", hub.metrics().encode());
}

/// The number after `name ` in the hub's metrics (0 when absent).
fn metric_value(hub: &Hub, name: &str) -> f64 {
    hub.metrics()
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A subscriber that is never sent anything does not freeze the propagation histogram: each
/// version is measured when a newer one replaces it, to the last of the subscribers that had
/// it, and the stuck subscriber is counted in `versions_skipped`, once per version.
#[tokio::test]
async fn a_stuck_subscriber_is_counted_apart_and_every_version_is_measured() {
    const COUNT: &str = "flagd_proxy_propagation_seconds_count";
    const SKIPPED: &str = "flagd_proxy_versions_skipped_total";
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    let ([mut reading, _stuck], publisher) = subscribe_watched(&source, &hub, &key).await;
    for (round, variant) in ["red", "blue", "green", "gold"].into_iter().enumerate() {
        publisher.resource(&flag_resource(variant), Instant::now());
        let snapshot = next(&mut reading).await;
        reading.delivered(&snapshot);
        // Every version before this one is measured, and skipped by the stuck subscriber.
        assert_eq!(metric_value(&hub, COUNT), round as f64, "round {round}");
        assert_eq!(metric_value(&hub, SKIPPED), round as f64, "round {round}");
    }
}

/// A subscriber that leaves before it is sent the current version is not waited for.
#[tokio::test]
async fn a_subscriber_that_leaves_is_not_waited_for() {
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    let ([mut staying, leaving], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.resource(&flag_resource("on"), Instant::now());
    let snapshot = next(&mut staying).await;
    staying.delivered(&snapshot);
    assert_eq!(
        metric_value(&hub, "flagd_proxy_propagation_seconds_count"),
        0.0
    );
    drop(leaving);
    assert_eq!(
        metric_value(&hub, "flagd_proxy_propagation_seconds_count"),
        1.0
    );
    assert_eq!(
        metric_value(&hub, "flagd_proxy_versions_skipped_total"),
        0.0
    );
}

/// (version, subscribers, superseded) of every span so far, all of them publish spans of
/// `ns/a` with a size.
fn published(spans: &RecordedSpans) -> Vec<(i64, i64, bool)> {
    spans
        .all()
        .iter()
        .map(|span| {
            assert_eq!(span.name, ports::PUBLISH_SPAN);
            assert!(span.start <= span.end, "{span:?}");
            let value = |key| span_attribute(span, key);
            assert_eq!(value("flagd_proxy.resource"), SpanValue::from("ns/a"));
            assert!(
                matches!(value("flagd_proxy.bytes"), SpanValue::Int(bytes) if bytes > 0),
                "{span:?}"
            );
            match (
                value("flagd_proxy.version"),
                value("flagd_proxy.subscribers"),
                value("flagd_proxy.superseded"),
            ) {
                (SpanValue::Int(v), SpanValue::Int(s), SpanValue::Bool(b)) => (v, s, b),
                other => panic!("unexpected attributes {other:?}"),
            }
        })
        .collect()
}

/// One span per published version, recorded once: when the last counted subscriber is written,
/// when a newer version replaces it first (superseded), or at once with no subscriber.
#[tokio::test]
async fn every_published_version_ends_in_one_span() {
    let source = FakeSource::new();
    let spans = Arc::new(RecordedSpans::default());
    let metrics = Arc::new(Metrics::new());
    let hub = Hub::traced(
        source.clone(),
        HubOptions {
            idle_timeout: Duration::from_secs(60),
            ..HubOptions::default()
        },
        metrics.clone(),
        MemoryBudget::unlimited(metrics),
        Some(spans.clone()),
    );
    let key = ResourceKey::new("ns", "a");
    let ([mut sub], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.resource(&flag_resource("red"), Instant::now());
    let snapshot = next(&mut sub).await;
    assert!(
        published(&spans).is_empty(),
        "the subscriber was not written yet"
    );
    sub.delivered(&snapshot);
    assert_eq!(published(&spans), vec![(1, 1, false)]);
    // Written once only: delivering again records nothing.
    sub.delivered(&snapshot);
    assert_eq!(published(&spans).len(), 1);

    // Version 2 is replaced by 3 before the subscriber is written.
    publisher.resource(&flag_resource("blue"), Instant::now());
    publisher.resource(&flag_resource("green"), Instant::now());
    assert_eq!(published(&spans), vec![(1, 1, false), (2, 1, true)]);
    let snapshot = next(&mut sub).await;
    sub.delivered(&snapshot);
    assert_eq!(published(&spans)[2], (3, 1, false));

    // With nobody subscribed (the watch stays for the idle time), a version ends at once.
    drop(sub);
    publisher.resource(&flag_resource("gold"), Instant::now());
    assert_eq!(published(&spans)[3], (4, 0, false));
    assert_eq!(published(&spans).len(), 4);
}

/// A `FeatureFlag` like [`flag_resource`] with a second flag `g` whose targeting uses an operator
/// nobody knows.
fn resource_with_unknown_operator(variant: &str) -> serde_json::Value {
    let mut resource = flag_resource(variant);
    resource["spec"]["flagSpec"]["flags"]["g"] = serde_json::json!({
        "state": "ENABLED", "variants": {"on": true, "off": false}, "defaultVariant": "off",
        "targeting": {"if": [{"no_such_op": [1]}, "on", "off"]}
    });
    resource
}

fn broken_resource() -> serde_json::Value {
    serde_json::json!({"spec": {"flagSpec": {"flags": {"f": {"state": 5}}}}})
}

#[tokio::test(start_paused = true)]
async fn a_first_version_that_is_invalid_ends_subscriptions_after_the_grace() {
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    let ([mut sub], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.resource(&broken_resource(), Instant::now());
    // Not at once: a client that reconnects at once is answered at most once per grace.
    let early = tokio::time::timeout(INVALID_GRACE - Duration::from_millis(1), sub.next()).await;
    assert!(early.is_err(), "ended before the grace: {early:?}");
    let end = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("ends after the grace");
    assert!(
        matches!(end, Err(SubscriptionEnd::Invalid(ref reason)) if reason.contains("flag \"f\": state")),
        "{end:?}"
    );
    // A new subscriber is told the same, and a valid version then reaches the next one.
    let mut again = hub.subscribe(key.clone()).expect("subscribe");
    assert!(matches!(
        again.next().await,
        Err(SubscriptionEnd::Invalid(_))
    ));
    source
        .wait_for_watch(&key)
        .await
        .resource(&flag_resource("on"), Instant::now());
    let mut fixed = hub.subscribe(key.clone()).expect("subscribe");
    assert_eq!(variant(&next(&mut fixed).await), "on");
}

#[tokio::test(start_paused = true)]
async fn a_valid_version_within_the_grace_is_delivered() {
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    let ([mut sub], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.resource(&broken_resource(), Instant::now());
    let waiting = tokio::spawn(async move { sub.next().await.map(|s| variant(&s)) });
    tokio::time::sleep(INVALID_GRACE / 2).await;
    publisher.resource(&flag_resource("on"), Instant::now());
    let got = waiting.await.expect("join");
    assert_eq!(got, Ok("on".to_owned()));
}

#[tokio::test(start_paused = true)]
async fn only_an_invalid_resource_without_a_version_ends_subscriptions() {
    let source = FakeSource::new();
    let hub = hub(&source, Duration::from_secs(600));
    let (missing, kept) = (
        ResourceKey::new("ns", "missing"),
        ResourceKey::new("ns", "a"),
    );
    // A resource that does not exist: the subscriber keeps waiting.
    let mut waits = hub.subscribe(missing.clone()).expect("subscribe");
    source.wait_for_watch(&missing).await.absent();
    // A resource whose edit is invalid: subscribers keep the last good version.
    let mut sub = hub.subscribe(kept.clone()).expect("subscribe");
    let publisher = source.wait_for_watch(&kept).await;
    publisher.resource(&flag_resource("on"), Instant::now());
    next(&mut sub).await;
    publisher.resource(&broken_resource(), Instant::now());
    let mut late = hub.subscribe(kept.clone()).expect("subscribe");
    assert_eq!(variant(&next(&mut late).await), "on");
    for sub in [&mut waits, &mut sub, &mut late] {
        let outcome = tokio::time::timeout(INVALID_GRACE * 10, sub.next()).await;
        assert!(outcome.is_err(), "{outcome:?}");
    }
}

/// What the hub reported for one watched resource.
#[derive(Clone, Default)]
struct RecordedEvents(Arc<Mutex<Vec<String>>>);

impl EventSink for RecordedEvents {
    fn reporter_for(&self, _key: ResourceKey) -> Box<dyn ResourceEventSink> {
        Box::new(self.clone())
    }
}

impl ResourceEventSink for RecordedEvents {
    fn accepted(&self, _resource: &serde_json::Value) {
        self.0.lock().expect("lock").push("accepted".into());
    }

    fn warned(&self, _resource: &serde_json::Value, problems: &str) {
        self.0
            .lock()
            .expect("lock")
            .push(format!("warned: {problems}"));
    }

    fn rejected(&self, _resource: &serde_json::Value, problem: &str) {
        self.0
            .lock()
            .expect("lock")
            .push(format!("rejected: {problem}"));
    }
}

#[tokio::test(start_paused = true)]
async fn an_unknown_operator_is_served_warned_and_counted() {
    let source = FakeSource::new();
    let idle_time = Duration::from_secs(30);
    let hub = hub(&source, idle_time);
    let events = RecordedEvents::default();
    hub.record_events(Arc::new(events.clone()));
    let key = ResourceKey::new("ns", "a");
    let sample =
        |n: u32| format!("flagd_proxy_document_warnings{{namespace=\"ns\",name=\"a\"}} {n}");
    let ([mut sub], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.resource(&resource_with_unknown_operator("on"), Instant::now());
    // The first version is served whole: both flags, the rule as written.
    let snapshot = next(&mut sub).await;
    let document: serde_json::Value =
        serde_json::from_str(&snapshot.flag_configuration).expect("json");
    assert_eq!(variant(&snapshot), "on");
    assert_eq!(
        document["flags"]["g"]["targeting"],
        serde_json::json!({"if": [{"no_such_op": [1]}, "on", "off"]})
    );
    assert!(hub.metrics().encode().contains(&sample(1)));
    let told = events.0.lock().expect("lock").clone();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].starts_with("warned: flag \"g\"") && told[0].contains("\"no_such_op\""),
        "{told:?}"
    );
    // An invalid edit keeps the version clients have, and so its count.
    publisher.resource(&broken_resource(), Instant::now());
    assert!(hub.metrics().encode().contains(&sample(1)));
    publisher.resource(&flag_resource("off"), Instant::now());
    assert_eq!(variant(&next(&mut sub).await), "off");
    assert!(hub.metrics().encode().contains(&sample(0)));
    let told = events.0.lock().expect("lock").clone();
    assert!(
        told.len() == 3
            && told[1].starts_with("rejected: flag \"f\": state")
            && told[2] == "accepted",
        "{told:?}"
    );
    // The series goes with the watch.
    drop(sub);
    tokio::time::sleep(idle_time + Duration::from_secs(1)).await;
    assert!(hub.resources().is_empty());
    assert!(
        !hub.metrics()
            .encode()
            .contains("flagd_proxy_document_warnings{"),
        "{}",
        hub.metrics().encode()
    );
}

#[tokio::test]
async fn many_warnings_are_told_in_one_bounded_line() {
    let source = FakeSource::new();
    let hub = hub(&source, Duration::from_secs(60));
    let events = RecordedEvents::default();
    hub.record_events(Arc::new(events.clone()));
    let key = ResourceKey::new("ns", "a");
    let mut sub = hub.subscribe(key.clone()).expect("subscribe");
    let mut resource = flag_resource("on");
    for i in 0..25 {
        resource["spec"]["flagSpec"]["flags"][format!("g{i:02}")] = serde_json::json!({
            "state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on",
            "targeting": {"no_such_op": []}
        });
    }
    source
        .wait_for_watch(&key)
        .await
        .resource(&resource, Instant::now());
    next(&mut sub).await;
    assert!(
        hub.metrics()
            .encode()
            .contains("flagd_proxy_document_warnings{namespace=\"ns\",name=\"a\"} 25")
    );
    let told = events.0.lock().expect("lock").clone();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].matches("flag \"g").count(), 20, "{told:?}");
    assert!(told[0].ends_with("; and 5 more"), "{told:?}");
}

/// A version store in memory.
#[derive(Default)]
struct MemoryStore(Mutex<HashMap<ResourceKey, String>>);

impl MemoryStore {
    fn with(key: &ResourceKey, variant: &str) -> Arc<Self> {
        let store = Arc::new(Self::default());
        store.keep(key, document_of(variant).into());
        store
    }

    fn kept(&self, key: &ResourceKey) -> Option<String> {
        self.0
            .lock()
            .expect("lock")
            .get(key)
            .map(|d| default_variant(d))
    }
}

impl VersionStore for MemoryStore {
    fn load(&self, key: &ResourceKey) -> Option<String> {
        self.0.lock().expect("lock").get(key).cloned()
    }

    fn keep(&self, key: &ResourceKey, document: Arc<str>) {
        self.0
            .lock()
            .expect("lock")
            .insert(key.clone(), document.to_string());
    }

    fn forget(&self, key: &ResourceKey) {
        self.0.lock().expect("lock").remove(key);
    }
}

/// The flag configuration of [`flag_resource`]`(variant)`.
fn document_of(variant: &str) -> String {
    crate::document::convert(&flag_resource(variant))
        .expect("a valid resource")
        .document
}

/// A grace that never expires within a test: only the source's word serves a kept version.
const NO_GRACE_EXPIRES: Duration = Duration::from_secs(3600);

/// The state of the one resource watched.
fn only_state(hub: &Hub) -> ResourceState {
    let mut resources = hub.resources();
    assert_eq!(resources.len(), 1, "one resource watched");
    resources.remove(0).1
}

/// A hub over a scripted source keeping versions in `store` and serving them after `grace`, and
/// a subscriber to `ns/a` with the publisher of its watch.
async fn kept_by(store: &Arc<MemoryStore>, grace: Duration) -> (Hub, Subscription, Publisher) {
    let (source, hub, key) = hub_of_a(Duration::from_secs(60));
    hub.keep_versions(store.clone(), grace);
    let ([sub], publisher) = subscribe_watched(&source, &hub, &key).await;
    (hub, sub, publisher)
}

#[tokio::test]
async fn the_kept_version_is_served_stale_while_the_source_is_unreachable() {
    let key = ResourceKey::new("ns", "a");
    let store = MemoryStore::with(&key, "kept");
    let (hub, mut sub, publisher) = kept_by(&store, NO_GRACE_EXPIRES).await;
    publisher.unreachable("connection refused".into());
    let stale = next(&mut sub).await;
    assert_eq!((variant(&stale), stale.version), ("kept".into(), 1));
    let state = only_state(&hub);
    assert!(state.stale, "{state:?}");
    assert!(matches!(state.availability, Availability::Unreachable(_)));
    assert_eq!(
        hub.metrics().versions_published.get(),
        0,
        "not from the source"
    );

    // The first version from the source replaces it, and is kept in turn.
    publisher.resource(&flag_resource("fresh"), Instant::now());
    let fresh = next(&mut sub).await;
    assert_eq!((variant(&fresh), fresh.version), ("fresh".into(), 2));
    assert!(!only_state(&hub).stale);
    assert_eq!(store.kept(&key).as_deref(), Some("fresh"));
}

#[tokio::test]
async fn a_source_that_does_not_answer_gets_the_kept_version_served_after_the_grace() {
    let key = ResourceKey::new("ns", "a");
    let store = MemoryStore::with(&key, "kept");
    let (_hub, mut sub, _publisher) = kept_by(&store, Duration::from_millis(1)).await;
    // What FetchAllFlags waits for: the source's answer, or a stale version.
    let state = sub.settled().await;
    assert!(state.stale, "{state:?}");
    assert_eq!(state.availability, Availability::Pending);
    assert_eq!(variant(&next(&mut sub).await), "kept");
}

/// With the proxy's grace, a client of a silent source has the kept version once the grace
/// (500 ms) has run, and not before: the clock is paused and moves only as timers fire, so the
/// grace's timer is the only thing that can deliver it.
#[tokio::test(start_paused = true)]
async fn the_kept_version_is_served_when_the_grace_runs_out() {
    let key = ResourceKey::new("ns", "a");
    let store = MemoryStore::with(&key, "kept");
    let (_hub, mut sub, _publisher) = kept_by(&store, STALE_GRACE).await;
    let early = tokio::time::timeout(STALE_GRACE / 2, next(&mut sub)).await;
    assert!(early.is_err(), "served before the grace ran out");
    assert_eq!(variant(&next(&mut sub).await), "kept");
}

#[tokio::test]
async fn a_kept_version_never_replaces_one_from_the_source() {
    let key = ResourceKey::new("ns", "a");
    let store = MemoryStore::with(&key, "kept");
    let (hub, mut sub, publisher) = kept_by(&store, NO_GRACE_EXPIRES).await;
    publisher.resource(&flag_resource("fresh"), Instant::now());
    assert_eq!(variant(&next(&mut sub).await), "fresh");
    publisher.unreachable("connection refused".into());
    publisher.stale(document_of("kept"));
    let state = only_state(&hub);
    assert!(!state.stale, "{state:?}");
    assert_eq!(
        variant(state.snapshot.as_ref().expect("a version")),
        "fresh"
    );
}

#[tokio::test]
async fn a_fresh_version_like_the_stale_one_ends_staleness_without_a_new_version() {
    let key = ResourceKey::new("ns", "a");
    let store = MemoryStore::with(&key, "kept");
    let (hub, mut sub, publisher) = kept_by(&store, NO_GRACE_EXPIRES).await;
    publisher.stale(document_of("kept"));
    assert_eq!(next(&mut sub).await.version, 1);
    assert!(only_state(&hub).stale);
    publisher.resource(&flag_resource("kept"), Instant::now());
    let state = only_state(&hub);
    assert!(!state.stale, "{state:?}");
    assert_eq!(state.availability, Availability::Present);
    assert_eq!(state.snapshot.as_ref().map(|s| s.version), Some(1));
}

#[tokio::test]
async fn an_unusable_kept_version_is_not_served_and_an_absent_resource_is_forgotten() {
    let key = ResourceKey::new("ns", "a");
    let store = MemoryStore::with(&key, "kept");
    let (hub, _sub, publisher) = kept_by(&store, NO_GRACE_EXPIRES).await;
    publisher.stale(r#"{"flags": 5}"#.into());
    assert!(only_state(&hub).snapshot.is_none(), "not served");
    publisher.absent();
    assert_eq!(store.kept(&key), None);
    publisher.stale(document_of("kept"));
    assert!(
        only_state(&hub).snapshot.is_none(),
        "the source has answered"
    );
}

/// Stopping the watches ends them although they have subscribers: the source's watches are
/// dropped and the hub's tasks finish; a watch started after it stops at once.
#[tokio::test]
async fn stopped_watches_end_with_their_tasks() {
    let (source, hub, key) = hub_of_a(Duration::from_secs(3600));
    let ([mut sub], publisher) = subscribe_watched(&source, &hub, &key).await;
    publisher.resource(&flag_resource("on"), Instant::now());
    next(&mut sub).await;
    hub.stop_watches();
    let other = ResourceKey::new("ns", "b");
    let _late = hub.subscribe(other.clone()).expect("subscribe");
    tokio::time::timeout(Duration::from_secs(60), hub.tasks().wait())
        .await
        .expect("every watch task ends");
    assert_eq!(source.active_watches(&key), 0);
    assert_eq!(source.active_watches(&other), 0);
    assert_eq!(hub.metrics().upstream_watches.get(), 0);
    assert!(hub.resources().is_empty());
}
