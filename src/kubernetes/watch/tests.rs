//! Unit tests of the watch loop against a scripted API server
//! (see [`super::api_server`]), asserting on what the hub's subscribers see.
use std::time::Duration;

use serde_json::Value;

use super::api_server::{Call, ScriptedApi, WatchEvents, feature_flag, status};
use super::*;
use crate::hub::SpanValue;
use crate::hub::{Availability, Hub, HubOptions, ResourceState, Subscription};
use crate::testing::{RecordedSpans, default_variant, span_attribute};

#[test]
fn field_selector_values_are_escaped() {
    assert_eq!(escape_field_value("a.b-c"), "a.b-c");
    assert_eq!(escape_field_value(r"a,b=c\d"), r"a\,b\=c\\d");
}

#[test]
fn resource_is_featureflags_v1beta1() {
    let resource = feature_flag_resource();
    assert_eq!(
        (
            resource.group.as_str(),
            resource.version.as_str(),
            resource.kind.as_str(),
            resource.plural.as_str(),
            resource.api_version.as_str()
        ),
        (
            "core.openfeature.dev",
            "v1beta1",
            "FeatureFlag",
            "featureflags",
            "core.openfeature.dev/v1beta1"
        )
    );
}

#[tokio::test]
async fn dynamic_objects_become_documents() {
    // The JSON the publisher gets from a DynamicObject is the CR as the API server sent it.
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "core.openfeature.dev/v1beta1",
        "kind": "FeatureFlag",
        "metadata": {"name": "flags", "namespace": "team-b", "resourceVersion": "7"},
        "spec": {"flagSpec": {"flags": {"f": {
            "state": "ENABLED", "variants": {"on": true, "off": false}, "defaultVariant": "on"
        }}}}
    }))
    .expect("object");
    let value = serde_json::to_value(&object).expect("json");
    let document = crate::document::from_resource(&value).expect("valid");
    let parsed: Value = serde_json::from_str(&document).expect("json");
    assert_eq!(parsed["flags"]["f"]["defaultVariant"], "on");
}

/// The Kubernetes source on a scripted API server, with one subscriber to `ns/flags`.
struct Harness {
    api: ScriptedApi,
    hub: Hub,
    subscription: Subscription,
    /// The watch's attempts to reach the API server ([`CONNECT_SPAN`]).
    spans: Arc<RecordedSpans>,
}

impl Harness {
    async fn start() -> Self {
        let api = ScriptedApi::start().await;
        let mut source = KubernetesSource::with_client(
            api.client(),
            api.url().to_owned(),
            "test",
            Arc::new(Metrics::new()),
        );
        // The policy, with bounds short enough for a test.
        source.backoff = Backoff::with_bounds(Duration::from_millis(1), Duration::from_millis(20));
        let spans = Arc::new(RecordedSpans::default());
        let source = source.with_spans(Some(spans.clone()));
        let metrics = Arc::new(Metrics::new());
        let budget = crate::budget::MemoryBudget::unlimited(metrics.clone());
        let hub = Hub::new(Arc::new(source), HubOptions::default(), metrics, budget);
        let subscription = hub
            .subscribe(ResourceKey::new("ns", "flags"))
            .expect("a subscription");
        Self {
            api,
            hub,
            subscription,
            spans,
        }
    }

    /// The next request, which must be the list of `ns/flags`.
    async fn list(&mut self) -> Call {
        let call = self.api.next_call().await;
        assert_eq!(
            call.path,
            "/apis/core.openfeature.dev/v1beta1/namespaces/ns/featureflags"
        );
        assert!(
            call.query.contains("fieldSelector=metadata.name%3Dflags") && !call.is_watch(),
            "expected the list of ns/flags: {call:?}"
        );
        call
    }

    /// The next request, which must be the watch of `ns/flags` from `resource_version`; it is
    /// answered with an open stream of events.
    async fn watch(&mut self, resource_version: &str) -> WatchEvents {
        self.watch_call(resource_version).await.watch()
    }

    /// The next request, which must be the watch of `ns/flags` from `resource_version`,
    /// unanswered.
    async fn watch_call(&mut self, resource_version: &str) -> Call {
        let call = self.api.next_call().await;
        assert!(
            call.is_watch()
                && call.query.contains("fieldSelector=metadata.name%3Dflags")
                && call
                    .query
                    .contains(&format!("resourceVersion={resource_version}")),
            "expected the watch of ns/flags from {resource_version}: {call:?}"
        );
        call
    }

    /// Waits until the resource's state satisfies `check`.
    async fn wait_for(&self, what: &str, check: impl Fn(&ResourceState) -> bool) -> ResourceState {
        let wait = async {
            loop {
                if let Some((_, state, _)) = self.hub.resources().into_iter().next()
                    && check(&state)
                {
                    return state;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        match tokio::time::timeout(Duration::from_secs(10), wait).await {
            Ok(state) => state,
            Err(_) => panic!(
                "the resource never became {what}: {:?}",
                self.hub.resources()
            ),
        }
    }

    /// A harness whose watch is [`established`](Self::established), and that watch's events.
    async fn established_start() -> (Harness, WatchEvents) {
        let mut h = Harness::start().await;
        let events = h.established().await;
        (h, events)
    }

    /// Lists `ns/flags` (version 10, flag `f` defaulting to `red`) and opens its watch; the
    /// subscriber has the object.
    async fn established(&mut self) -> WatchEvents {
        self.list()
            .await
            .list("10", vec![feature_flag("flags", "10", "red")]);
        let events = self.watch("10").await;
        assert_eq!(self.next_variant().await, "red");
        events
    }

    /// Answers the list that follows a watch gone too old with `ns/flags` (flag `f` defaulting to
    /// `violet`, at `list_version`, the object at `object_version`) and opens the watch from
    /// there: subscribers get the listed object, and the resource stays present.
    async fn relists(&mut self, list_version: &str, object_version: &str) -> WatchEvents {
        self.list().await.list(
            list_version,
            vec![feature_flag("flags", object_version, "violet")],
        );
        let events = self.watch(list_version).await;
        assert_eq!(self.next_variant().await, "violet");
        assert_eq!(
            self.hub.resources()[0].1.availability,
            Availability::Present,
            "a relist is not a failure"
        );
        events
    }

    /// The default variant of flag `f` in the next version subscribers get.
    async fn next_variant(&mut self) -> String {
        let snapshot = tokio::time::timeout(Duration::from_secs(10), self.subscription.next())
            .await
            .expect("a new version in time")
            .expect("the subscription goes on");
        default_variant(&snapshot.flag_configuration)
    }
}

#[tokio::test]
async fn listed_then_changed_then_deleted() {
    let (mut h, events) = Harness::established_start().await;
    events.send("MODIFIED", feature_flag("flags", "11", "blue"));
    assert_eq!(h.next_variant().await, "blue");
    events.send("DELETED", feature_flag("flags", "12", "blue"));
    let state = h
        .wait_for("absent", |s| s.availability == Availability::Absent)
        .await;
    let kept = state.snapshot.expect("subscribers keep the last flags");
    assert!(kept.flag_configuration.contains("blue"));
    events.send("ADDED", feature_flag("flags", "13", "green"));
    assert_eq!(h.next_variant().await, "green");
}

#[tokio::test]
async fn gone_watch_lists_again() {
    let (mut h, events) = Harness::established_start().await;
    // The watch's resource version is too old: the watcher lists again, and the list is what
    // subscribers get (here: the object was deleted and created again meanwhile).
    events.send(
        "ERROR",
        status(410, "Expired", "too old resource version: 10 (20)"),
    );
    let _events = h.relists("20", "19").await;
}

#[tokio::test]
async fn recovers_after_server_errors() {
    let mut h = Harness::start().await;
    h.list().await.status(500, "InternalError", "etcd is down");
    let state = h
        .wait_for("unreachable", |s| {
            matches!(s.availability, Availability::Unreachable(_))
        })
        .await;
    let Availability::Unreachable(reason) = state.availability else {
        unreachable!()
    };
    assert!(
        reason.contains("unavailable (500 InternalError)") && reason.contains("etcd is down"),
        "{reason}"
    );
    // The source tries again after the backoff, with a fresh list. A 503 is retried by the
    // client's own retry layer (as kube's client does), so the same list comes again.
    h.list()
        .await
        .status(503, "ServiceUnavailable", "still down");
    h.list()
        .await
        .list("30", vec![feature_flag("flags", "30", "red")]);
    let _events = h.watch("30").await;
    assert_eq!(h.next_variant().await, "red");
    h.wait_for("present", |s| s.availability == Availability::Present)
        .await;
}

#[tokio::test]
async fn refused_at_once_on_a_new_watch() {
    let mut h = Harness::start().await;
    h.list().await.status(
        403,
        "Forbidden",
        "featureflags.core.openfeature.dev is forbidden: User \"system:serviceaccount:flagd:proxy\" cannot list",
    );
    let end = tokio::time::timeout(Duration::from_secs(10), h.subscription.next())
        .await
        .expect("the subscription ends in time");
    match end {
        Err(crate::hub::SubscriptionEnd::Forbidden(reason)) => assert!(
            reason.starts_with("RBAC forbids list on featureflags.core.openfeature.dev")
                && reason.contains("system:serviceaccount:flagd:proxy"),
            "{reason}"
        ),
        other => panic!("expected forbidden, got {other:?}"),
    }
}

#[tokio::test]
async fn refusal_after_success_is_believed_when_it_repeats() {
    let (mut h, events) = Harness::established_start().await;
    // The watch expires and the relist is refused: once or twice may be an API server whose
    // RBAC caches are not filled yet, and subscribers keep their stream.
    events.send("ERROR", status(410, "Expired", "too old"));
    let mut list = h.list().await;
    for _ in 1..failure::FORBIDDEN_CONFIRMATIONS {
        list.status(403, "Forbidden", "denied");
        // The next list comes after the refusal was judged (and the backoff).
        list = h.list().await;
        assert_eq!(
            h.hub.resources()[0].1.availability,
            Availability::Present,
            "a refusal that is not confirmed yet is not reported"
        );
    }
    // The refusal in a row that confirms it.
    list.status(403, "Forbidden", "denied");
    let state = h
        .wait_for("forbidden", |s| {
            matches!(s.availability, Availability::Forbidden(_))
        })
        .await;
    assert!(
        state.snapshot.is_some(),
        "the last version stays for subscribers that come back"
    );
    let end = tokio::time::timeout(Duration::from_secs(10), h.subscription.next())
        .await
        .expect("the subscription ends in time");
    assert!(
        matches!(end, Err(crate::hub::SubscriptionEnd::Forbidden(_))),
        "{end:?}"
    );
}

/// A bookmark as the API server sends it: only the kind and the resource version.
fn bookmark(resource_version: &str) -> Value {
    serde_json::json!({
        "apiVersion": "core.openfeature.dev/v1beta1",
        "kind": "FeatureFlag",
        "metadata": {"resourceVersion": resource_version},
    })
}

#[tokio::test]
async fn a_lost_watch_resumes_from_its_last_version_without_a_list() {
    let (mut h, events) = Harness::established_start().await;
    events.send("MODIFIED", feature_flag("flags", "11", "blue"));
    assert_eq!(h.next_variant().await, "blue");
    events.send("BOOKMARK", bookmark("25"));
    // The watch ends (the API server went away): the next request is the watch from the
    // bookmark's version, and it fails.
    drop(events);
    h.watch_call("25")
        .await
        .status(500, "InternalError", "the API server is restarting");
    h.wait_for("unreachable", |s| {
        matches!(s.availability, Availability::Unreachable(_))
    })
    .await;
    // After the backoff: the same watch again, no list; it works, and subscribers are told the
    // flags they have are current again (with no new version).
    let events = h.watch("25").await;
    let state = h
        .wait_for("present", |s| s.availability == Availability::Present)
        .await;
    assert_eq!(
        state.snapshot.expect("a version").version,
        2,
        "no new version"
    );
    events.send("MODIFIED", feature_flag("flags", "26", "green"));
    assert_eq!(h.next_variant().await, "green");
}

#[tokio::test]
async fn a_watch_refused_as_too_old_lists_again() {
    let (mut h, events) = Harness::established_start().await;
    drop(events);
    // The version to resume from was compacted away: 410 Gone on the watch request itself.
    h.watch_call("10")
        .await
        .status(410, "Expired", "too old resource version: 10 (40)");
    let _events = h.relists("40", "39").await;
}

/// (attempt, request, failed) of every connect span so far.
fn attempts(spans: &RecordedSpans) -> Vec<(i64, String, bool)> {
    spans
        .all()
        .iter()
        .map(|span| {
            assert_eq!(span.name, CONNECT_SPAN);
            assert_eq!(
                span_attribute(span, "flagd_proxy.resource"),
                SpanValue::from("ns/flags")
            );
            let (SpanValue::Int(attempt), SpanValue::Text(request)) = (
                span_attribute(span, "flagd_proxy.attempt"),
                span_attribute(span, "flagd_proxy.request"),
            ) else {
                panic!("unexpected attributes: {span:?}");
            };
            (attempt, request, span.error.is_some())
        })
        .collect()
}

/// The first request, and the first after every failure, are attempts to reach the API server,
/// each a span once answered or failed; a watch made again after the API server ended one is
/// not.
#[tokio::test]
async fn attempts_to_reach_the_api_server_are_spans() {
    let (mut h, events) = Harness::established_start().await;
    assert_eq!(attempts(&h.spans), vec![(1, "list".into(), false)]);
    // The API server ends the watch; it is made again at once, and works: no attempt.
    drop(events);
    let events = h.watch("10").await;
    events.send("MODIFIED", feature_flag("flags", "11", "blue"));
    assert_eq!(h.next_variant().await, "blue");
    assert_eq!(attempts(&h.spans).len(), 1);
    // It ends again, and the API server is away: the watch made again fails, and so does the
    // next attempt; the one after works.
    drop(events);
    h.watch_call("11")
        .await
        .status(500, "InternalError", "the API server is restarting");
    h.watch_call("11")
        .await
        .status(500, "InternalError", "still restarting");
    let _events = h.watch("11").await;
    h.wait_for("present", |s| s.availability == Availability::Present)
        .await;
    assert_eq!(
        attempts(&h.spans),
        vec![
            (1, "list".into(), false),
            (2, "watch".into(), true),
            (3, "watch".into(), false)
        ]
    );
    let failed = &h.spans.all()[1];
    assert!(
        failed
            .error
            .as_deref()
            .is_some_and(|e| e.contains("still restarting")),
        "{failed:?}"
    );
}
