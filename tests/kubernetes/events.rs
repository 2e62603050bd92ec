//! Kubernetes Events on FeatureFlags: rejected versions told on the resource, and a missing permission.

use super::*;
use flagd_proxy_testkit::or_return;

/// The pod name the proxy reports Events as.
const POD_NAME: &str = "flagd-proxy-7d9f-abcde";

/// Grants the proxy identity the events rules of `deploy/clusterrole.yaml` (and only those),
/// cluster-wide, and waits until RBAC honours them.
async fn grant_events_as_deployed(cp: &ControlPlane) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/clusterrole.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/clusterrole.yaml");
    let role: Value = serde_norway::from_str(&text).expect("the ClusterRole parses");
    let rules: Vec<Value> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|rule| rule["apiGroups"].to_string().contains("events.k8s.io"))
        .cloned()
        .collect();
    assert_eq!(rules.len(), 1, "one events rule in {}", path.display());
    let admin = cp.admin_client();
    let role: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "flagd-proxy-events"},
        "rules": rules,
    }))
    .expect("events ClusterRole");
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("creating the events ClusterRole");
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "flagd-proxy-events"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flagd-proxy-events"},
        "subjects": [{"kind": "ServiceAccount", "name": "proxy", "namespace": "flagd"}],
    }))
    .expect("events ClusterRoleBinding");
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &binding)
        .await
        .expect("creating the events ClusterRoleBinding");
    for verb in ["create", "patch"] {
        support::eventually("the events grant takes effect", || async {
            let may = cp
                .service_account_may(
                    "flagd",
                    "proxy",
                    verb,
                    "events.k8s.io",
                    "events",
                    "anywhere",
                )
                .await;
            if may {
                Ok(())
            } else {
                Err(format!("may not {verb} events yet"))
            }
        })
        .await;
    }
}

/// Makes flag `bad` of `<ns>/<name>` invalid: its default variant `missing` is not a variant.
async fn break_flag(cp: &ControlPlane, ns: &str, name: &str, missing: &str) {
    let patch = json!({"spec": {"flagSpec": {"flags": {"bad": {
        "state": "ENABLED",
        "variants": {"on": true, "off": false},
        "defaultVariant": missing
    }}}}});
    patch_flag(cp, ns, name, "breaking", &patch).await;
}

/// Makes `<ns>/<name>` valid again with `color` defaulting to `variant`.
async fn fix_flag(cp: &ControlPlane, ns: &str, name: &str, variant: &str) {
    let patch = json!({"spec": {"flagSpec": {"flags": {
        "bad": null,
        "color": {"variants": {variant: variant}, "defaultVariant": variant}
    }}}});
    patch_flag(cp, ns, name, "fixing", &patch).await;
}

/// The Events (events.k8s.io/v1) about FeatureFlag `<ns>/<name>`, read back through the API.
async fn events_about(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(cp.admin_client(), ns);
    let params = kube::api::ListParams::default();
    let list = eventually("listing Events", || api.list(&params)).await;
    list.items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("FeatureFlag") && r.name.as_deref() == Some(name)
            })
        })
        .collect()
}

/// Waits until `count` Events of `type_` about `<ns>/<name>` exist; returns the newest.
async fn wait_for_events(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    type_: &str,
    count: usize,
) -> k8s_openapi::api::events::v1::Event {
    support::eventually("the Events", || async {
        let all = events_about(cp, ns, name).await;
        let mut events: Vec<_> = all
            .iter()
            .filter(|e| e.type_.as_deref() == Some(type_))
            .cloned()
            .collect();
        events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
        match events.pop() {
            Some(newest) if events.len() + 1 >= count => Ok(newest),
            _ => Err(format!(
                "no {count} {type_} Events about {ns}/{name}: {all:#?}"
            )),
        }
    })
    .await
}

/// Someone who applies an invalid FeatureFlag that is being served gets a Warning Event on it
/// naming the bad flag and the version clients keep; fixing it gives a Normal Event. A burst of
/// 100 invalid edits makes a bounded number of Event objects.
#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn rejected_versions_are_told_with_events_on_the_resource() {
    let (_turn, cp) = or_return!(control_plane_or_skip().await);
    granted_red_flag(&cp, "events", "demo").await;
    grant_events_as_deployed(&cp).await;
    let proxy = start_proxy_with_env(&cp, &[], &[("POD_NAME", POD_NAME)]).await;
    let (_client, mut stream) = red_stream(&proxy, &selector("events", "demo")).await;
    // A second replica with Events turned off serves the same resource.
    let quiet = start_proxy_with_env(&cp, &["--events=false"], &[("POD_NAME", "quiet-pod")]).await;
    let mut quiet_client = Client::connect(quiet.endpoint())
        .await
        .expect("connecting to the quiet replica");
    let mut quiet_stream = open(&mut quiet_client, &selector("events", "demo"))
        .await
        .expect("stream");
    assert_eq!(next_variant(&mut quiet_stream).await, "red");
    let uid = flags_api(&cp, "events")
        .get("demo")
        .await
        .expect("the FeatureFlag")
        .metadata
        .uid;

    break_flag(&cp, "events", "demo", "nope").await;
    let warning = wait_for_events(&cp, "events", "demo", "Warning", 1).await;
    let note = warning.note.clone().unwrap_or_default();
    support::assert_contains_all(
        &note,
        &[
            "flag \"bad\"",
            "defaultVariant \"nope\" is not one of the variants",
            "generation 2",
            "clients keep generation 1",
        ],
    );
    assert_eq!(warning.reason.as_deref(), Some("FlagConfigurationRejected"));
    assert_eq!(warning.reporting_controller.as_deref(), Some("flagd-proxy"));
    assert_eq!(warning.reporting_instance.as_deref(), Some(POD_NAME));
    let regarding = warning.regarding.clone().expect("regarding");
    assert_eq!(
        regarding.uid, uid,
        "the Event is on the object kubectl describes"
    );
    assert_eq!(regarding.namespace.as_deref(), Some("events"));

    fix_flag(&cp, "events", "demo", "blue").await;
    wait_for_variant(&mut stream, "blue").await;
    let normal = wait_for_events(&cp, "events", "demo", "Normal", 1).await;
    let note = normal.note.clone().unwrap_or_default();
    assert!(note.contains("is valid; clients receive it"), "{note}");
    assert_eq!(normal.reason.as_deref(), Some("FlagConfigurationValid"));
    // The quiet replica saw the rejected version before the fix and wrote nothing; the Normal
    // Event above comes at least 5 s after the Warning, so a write of its own would be there.
    wait_for_variant(&mut quiet_stream, "blue").await;
    let quiet_events: Vec<_> = events_about(&cp, "events", "demo")
        .await
        .into_iter()
        .filter(|e| e.reporting_instance.as_deref() == Some("quiet-pod"))
        .collect();
    assert!(
        quiet_events.is_empty(),
        "--events=false wrote {quiet_events:#?}"
    );

    // 100 rapid invalid edits, each with a different problem, then a fix.
    let before: Vec<Option<String>> = events_about(&cp, "events", "demo")
        .await
        .into_iter()
        .map(|e| e.metadata.name)
        .collect();
    for i in 0..100 {
        break_flag(&cp, "events", "demo", &format!("nope-{i}")).await;
    }
    // The newest problem is told, whatever was skipped on the way.
    support::eventually("a Warning names the last problem", || async {
        let events = events_about(&cp, "events", "demo").await;
        let named = events.iter().any(|e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.contains("defaultVariant \"nope-99\""))
        });
        if named {
            Ok(())
        } else {
            Err(format!("not yet: {events:#?}"))
        }
    })
    .await;
    fix_flag(&cp, "events", "demo", "green").await;
    wait_for_variant(&mut stream, "green").await;
    wait_for_events(&cp, "events", "demo", "Normal", 2).await;
    // At most one Event write per resource per interval (5 s), plus the first: the bound in
    // docs/kubernetes.md, whatever the number of edits. The spacing itself is checked in
    // virtual time (`kubernetes::events` unit tests); here, that 100 edits make few Events.
    let made = events_about(&cp, "events", "demo")
        .await
        .into_iter()
        .filter(|e| !before.contains(&e.metadata.name))
        .count();
    eprintln!("{made} Event objects for 100 invalid edits and a fix");
    assert!(
        (2..100).contains(&made),
        "{made} Event objects for 100 edits"
    );
}

/// Without permission to write Events, flags still flow and one log line says what is missing.
#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn missing_events_permission_is_logged_and_flags_still_flow() {
    let (_turn, cp) = or_return!(control_plane_or_skip().await);
    let proxy = proxy_with_red_flag(&cp, "no-events", "demo", &[]).await;
    let (mut client, mut stream) = red_stream(&proxy, &selector("no-events", "demo")).await;

    break_flag(&cp, "no-events", "demo", "nope").await;
    let line = wait_for_log_line(&proxy, &["cannot record Events"]).await;
    support::assert_contains_all(
        &line,
        &[
            "create and patch on events (events.k8s.io) in namespace no-events",
            "--events=false",
        ],
    );
    fix_flag(&cp, "no-events", "demo", "blue").await;
    wait_for_variant(&mut stream, "blue").await;
    // The Normal Event is refused too: logged at debug level, the clear line stays one.
    wait_for_log_line(&proxy, &["cannot record an event"]).await;
    let lines = proxy.log_text();
    assert_eq!(
        lines.matches("cannot record Events").count(),
        1,
        "one line about the permission:\n{lines}"
    );
    set_variant(&cp, "no-events", "demo", "green").await;
    wait_for_variant(&mut stream, "green").await;
    assert!(
        events_about(&cp, "no-events", "demo").await.is_empty(),
        "no Event was written"
    );
    // A new stream works too: the watch is not stuck.
    let message = first_message(&mut client, &selector("no-events", "demo"))
        .await
        .expect("a new stream");
    assert_eq!(
        default_variant(&message.flag_configuration, "color"),
        "green"
    );
}
