//! Unit tests of the watch loop: the event tracker, and the loop against a scripted API server.
use super::*;

#[test]
fn tracker_reports_the_listed_state_after_init_done() {
    let mut tracker = Tracker::default();
    assert_eq!(tracker.on_event(Event::Init), None);
    assert_eq!(tracker.on_event(Event::InitApply("v1")), None);
    assert_eq!(
        tracker.on_event(Event::InitDone),
        Some(Report::Present("v1"))
    );
    assert_eq!(
        tracker.on_event(Event::Apply("v2")),
        Some(Report::Present("v2"))
    );
    assert_eq!(tracker.on_event(Event::Delete("v2")), Some(Report::Absent));
    assert_eq!(
        tracker.on_event(Event::Apply("v3")),
        Some(Report::Present("v3"))
    );
}

#[test]
fn tracker_reports_absence_when_the_list_is_empty() {
    let mut tracker = Tracker::<&str>::default();
    assert_eq!(tracker.on_event(Event::Init), None);
    assert_eq!(tracker.on_event(Event::InitDone), Some(Report::Absent));
}

#[test]
fn relist_after_expiry_ends_on_the_final_state() {
    let mut tracker = Tracker::default();
    tracker.on_event(Event::Init);
    tracker.on_event(Event::InitApply("v1"));
    tracker.on_event(Event::InitDone);
    // 410 Gone: the watcher lists again; the object was deleted meanwhile.
    assert_eq!(tracker.on_event(Event::Init), None);
    assert_eq!(tracker.on_event(Event::InitDone), Some(Report::Absent));
    // Another relist that finds a newer version.
    tracker.on_event(Event::Init);
    assert_eq!(tracker.on_event(Event::InitApply("v5")), None);
    assert_eq!(
        tracker.on_event(Event::InitDone),
        Some(Report::Present("v5"))
    );
}

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
