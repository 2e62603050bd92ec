//! One bad flag must not hide a whole first version, over real sockets against the proxy binary
//! serving a manifests directory:
//!
//! - a flag whose targeting uses an operator the proxy does not know is served as it is, with
//!   the other flags, and warned about (log, metric); edits like that are served too;
//! - so is every flag flagd itself loads (a state other than ENABLED or DISABLED, a null
//!   variant, targeting that is not a rule, variants of mixed types): the other flags reach
//!   clients, and the odd one is named in the log, the metric and `/status`;
//! - a first version that clients cannot use at all ends `SyncFlags` and `FetchAllFlags` with
//!   `FAILED_PRECONDITION` and the reason, and is served once it is fixed;
//! - a resource that does not exist yet still keeps its streams open.
//!
//! The same through real in-process providers is a feature of the compatibility matrix
//! (`tests/compatibility/`).
use flagd_proxy_testkit as support;

use serde_json::{Value, json};
use support::client::{
    Client, assert_status, client, default_variant, next, next_message, open, v1, with_selector,
};
use support::or_return;
use support::{Proxy, write_color, write_manifest};
use tonic::Code;

const NAMESPACE: &str = "default";

fn selector(name: &str) -> String {
    format!("core.openfeature.dev/{NAMESPACE}/{name}")
}

/// A string flag `color` defaulting to `variant`.
fn color(variant: &str) -> Value {
    json!({"state": "ENABLED", "variants": {"red": "red", "blue": "blue"}, "defaultVariant": variant})
}

/// A boolean flag whose targeting uses `operator`, which neither the proxy nor flagd knows.
fn unknown_operator(operator: &str) -> Value {
    json!({"state": "ENABLED", "variants": {"on": true, "off": false}, "defaultVariant": "off",
           "targeting": {"if": [{operator: [{"var": "tier"}, "gold"]}, "on", "off"]}})
}

fn warnings_metric(name: &str) -> String {
    format!("flagd_proxy_document_warnings{{namespace=\"{NAMESPACE}\",name=\"{name}\"}}")
}

fn invalid_metric(name: &str) -> String {
    format!("flagd_proxy_invalid_documents_total{{namespace=\"{NAMESPACE}\",name=\"{name}\"}}")
}

async fn manifests_proxy(dir: &tempfile::TempDir) -> Proxy {
    Proxy::start(&["--manifests", dir.path().to_str().expect("utf-8")]).await
}

async fn fetch(client: &mut Client, name: &str) -> Result<String, tonic::Status> {
    client
        .fetch_all_flags(with_selector(
            v1::FetchAllFlagsRequest::default(),
            &selector(name),
        ))
        .await
        .map(|response| response.into_inner().flag_configuration)
}

fn parse(flag_configuration: &str) -> Value {
    serde_json::from_str(flag_configuration).expect("the configuration is JSON")
}

#[tokio::test]
async fn a_first_version_with_an_unknown_operator_is_served_whole_and_warned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = json!({"color": color("red"), "beta": unknown_operator("no_such_op")});
    write_manifest(dir.path(), NAMESPACE, "mixed", flags.clone());
    let proxy = manifests_proxy(&dir).await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, &selector("mixed")).await.expect("stream");

    // The first version reaches the client, every flag as written.
    let first = parse(&next(&mut stream).await.flag_configuration);
    assert_eq!(first["flags"]["color"]["defaultVariant"], "red");
    assert_eq!(first["flags"]["beta"], flags["beta"]);
    let fetched = fetch(&mut client, "mixed").await.expect("fetched");
    assert_eq!(parse(&fetched)["flags"], first["flags"]);

    // Warned: logged (naming the flag and the operator) and counted; not counted as invalid.
    proxy.wait_for_metric(&warnings_metric("mixed"), 1.0).await;
    proxy
        .wait_for_log("flag \"beta\": targeting uses operator \"no_such_op\"")
        .await;
    assert_eq!(proxy.metric(&invalid_metric("mixed")).await, 0.0);

    // An edit that adds another one is served too, not rejected.
    write_manifest(
        dir.path(),
        NAMESPACE,
        "mixed",
        json!({"color": color("blue"), "beta": unknown_operator("no_such_op"),
               "gamma": unknown_operator("newer_op")}),
    );
    let second = parse(&next(&mut stream).await.flag_configuration);
    assert_eq!(second["flags"]["color"]["defaultVariant"], "blue");
    assert!(second["flags"]["gamma"].is_object(), "{second}");
    proxy.wait_for_metric(&warnings_metric("mixed"), 2.0).await;

    // A version without them clears the count.
    write_color(dir.path(), NAMESPACE, "mixed", "red", &["red", "blue"]);
    assert_eq!(
        default_variant(&next(&mut stream).await.flag_configuration, "color"),
        "red"
    );
    proxy.wait_for_metric(&warnings_metric("mixed"), 0.0).await;
    assert_eq!(proxy.metric(&invalid_metric("mixed")).await, 0.0);
}

/// Each odd flag flagd loads, beside a good one, in a first version: served whole, and warned
/// about on the flag (log, metric, `/status`). A default variant that is not a variant is what
/// flagd refuses: that version is held back.
#[tokio::test]
async fn a_first_version_with_one_odd_flag_flagd_loads_serves_the_other_flags() {
    let odd_flags = [
        (
            "state",
            json!({"state": "ON", "variants": {"a": "a"}, "defaultVariant": "a"}),
            "flag \"odd\": state is \"ON\"",
        ),
        (
            "null-variant",
            json!({"state": "ENABLED", "variants": {"a": null}, "defaultVariant": "a"}),
            "flag \"odd\": variant \"a\" is null",
        ),
        (
            "targeting",
            json!({"state": "ENABLED", "variants": {"a": "a"}, "defaultVariant": "a",
                   "targeting": "nope"}),
            "flag \"odd\": targeting is a string",
        ),
        (
            "mixed",
            json!({"state": "ENABLED", "variants": {"a": "a", "b": true}, "defaultVariant": "a"}),
            "flag \"odd\": variants mix types",
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, odd, _) in &odd_flags {
        write_manifest(
            dir.path(),
            NAMESPACE,
            name,
            json!({"color": color("red"), "odd": odd}),
        );
    }
    write_manifest(
        dir.path(),
        NAMESPACE,
        "refused",
        json!({"color": color("red"), "odd": {"state": "ENABLED", "variants": {"a": "a"},
                                              "defaultVariant": "b"}}),
    );
    let proxy = manifests_proxy(&dir).await;
    let mut client = client(&proxy).await;
    for (name, odd, warning) in &odd_flags {
        let mut stream = open(&mut client, &selector(name)).await.expect("stream");
        let first = parse(&next(&mut stream).await.flag_configuration);
        assert_eq!(first["flags"]["color"], color("red"), "{name}");
        assert_eq!(&first["flags"]["odd"], odd, "{name}");
        proxy.wait_for_metric(&warnings_metric(name), 1.0).await;
        proxy.wait_for_log(warning).await;
        let status = proxy.status_page().await;
        let row = status
            .resource(&selector(name))
            .unwrap_or_else(|| panic!("{name} not in {status:?}"));
        assert_eq!(row.availability, "present", "{row:?}");
        assert!(
            row.warnings.as_ref().is_some_and(|w| w.contains(warning)),
            "{name}: {row:?}"
        );
    }
    let error = fetch(&mut client, "refused").await.expect_err("refused");
    assert_status(
        &error,
        Code::FailedPrecondition,
        "defaultVariant \"b\" is not one of the variants",
    );
}

#[tokio::test]
async fn a_broken_first_version_ends_streams_with_the_reason_until_it_is_fixed() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_manifest(
        dir.path(),
        NAMESPACE,
        "broken",
        json!({"color": color("red"), "size": {"state": "ENABLED", "variants": {"s": "s"}, "defaultVariant": "m"}}),
    );
    let proxy = manifests_proxy(&dir).await;
    let mut client = client(&proxy).await;

    // A resource that does not exist yet: its stream stays open.
    let mut waiting = open(&mut client, &selector("later")).await.expect("stream");

    // The broken one: the stream ends with the reason (after the proxy's grace), and so does
    // FetchAllFlags (at once).
    let mut stream = open(&mut client, &selector("broken"))
        .await
        .expect("stream");
    let status = next_message(&mut stream)
        .await
        .expect_err("the stream ends without a message");
    assert_status(&status, Code::FailedPrecondition, &selector("broken"));
    for needle in [
        "is invalid",
        "flag \"size\": defaultVariant \"m\" is not one of the variants",
    ] {
        assert!(status.message().contains(needle), "{needle:?}: {status:?}");
    }
    let status = fetch(&mut client, "broken").await.expect_err("refused");
    assert_status(
        &status,
        Code::FailedPrecondition,
        "flag \"size\": defaultVariant \"m\" is not one of the variants",
    );
    proxy.wait_for_metric(&invalid_metric("broken"), 1.0).await;

    // The stream of the resource that does not exist outlived that answer; it delivers once
    // the resource is created.
    write_color(dir.path(), NAMESPACE, "later", "blue", &["red", "blue"]);
    assert_eq!(
        default_variant(&next(&mut waiting).await.flag_configuration, "color"),
        "blue"
    );

    // Fixed: a new stream (what a client's retry opens) gets it, and so does FetchAllFlags.
    write_manifest(
        dir.path(),
        NAMESPACE,
        "broken",
        json!({"color": color("red"), "size": {"state": "ENABLED", "variants": {"s": "s"}, "defaultVariant": "s"}}),
    );
    support::eventually("fetching the fixed resource", || {
        let mut client = client.clone();
        async move { fetch(&mut client, "broken").await }
    })
    .await;
    let mut stream = open(&mut client, &selector("broken"))
        .await
        .expect("stream");
    let fixed = parse(&next(&mut stream).await.flag_configuration);
    assert_eq!(fixed["flags"]["size"]["defaultVariant"], "s");
}

// ---------------------------------------------------------------------------------------------
// With the Kubernetes API: what whoever edits the resource is told.

mod kubernetes {
    use super::*;

    use k8s_openapi::api::events::v1::Event;
    use kube::Api;
    use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
    use support::control_plane::{self, ControlPlane, feature_flag_resource};
    use support::eventually;

    const NS: &str = "warned";

    fn flags_api(cp: &ControlPlane) -> Api<DynamicObject> {
        Api::namespaced_with(cp.admin_client(), NS, &feature_flag_resource())
    }

    /// Lets the proxy's identity write Events, as `deploy/` does, and waits until it may.
    async fn grant_events(cp: &ControlPlane) {
        support::identities::grant_proxy_cluster_role(
            cp,
            "bad-flags-events",
            json!([{"apiGroups": ["events.k8s.io"], "resources": ["events"],
                    "verbs": ["create", "patch"]}]),
        )
        .await;
        for verb in ["create", "patch"] {
            eventually("the grant takes effect", || async {
                if cp
                    .service_account_may("flagd", "proxy", verb, "events.k8s.io", "events", NS)
                    .await
                {
                    Ok(())
                } else {
                    Err(format!("may not {verb} events yet"))
                }
            })
            .await;
        }
    }

    /// Waits for an Event about FeatureFlag `name` with `reason`; returns its note.
    async fn wait_for_event(cp: &ControlPlane, name: &str, reason: &str) -> String {
        let api: Api<Event> = Api::namespaced(cp.admin_client(), NS);
        let params = ListParams::default();
        eventually("the Event", || async {
            let list = api.list(&params).await.map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().is_some_and(|r| {
                            r.kind.as_deref() == Some("FeatureFlag")
                                && r.name.as_deref() == Some(name)
                        })
                })
                .map(|event| event.note.unwrap_or_default())
                .ok_or_else(|| format!("no {reason} Event about {NS}/{name} yet"))
        })
        .await
    }

    /// A first version with a flag that uses an unknown operator is served, and the resource
    /// gets a Warning Event naming the flag; a first version clients cannot use gets the
    /// rejection Event, and its stream ends with the reason.
    #[tokio::test]
    #[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
    async fn warnings_and_rejections_are_told_on_the_resource() {
        let cp = or_return!(control_plane::start_or_skip().await);
        cp.grant_proxy_cluster_wide().await;
        grant_events(&cp).await;
        cp.create_namespace(NS).await;
        let api = flags_api(&cp);
        let mixed = control_plane::feature_flag_object(
            NS,
            "mixed",
            json!({"color": color("red"), "beta": unknown_operator("no_such_op")}),
        );
        let broken = control_plane::feature_flag_object(
            NS,
            "broken",
            // The CRD's own schema checks `state`; it cannot check this.
            json!({"size": {"state": "ENABLED", "variants": {"s": "s"}, "defaultVariant": "m"}}),
        );
        let params = PostParams::default();
        for object in [&mixed, &broken] {
            eventually("creating a FeatureFlag", || api.create(&params, object)).await;
        }
        let args = cp.proxy_args(&[]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy = Proxy::start(&args).await;
        let mut client = client(&proxy).await;

        let mut stream = open(&mut client, &format!("core.openfeature.dev/{NS}/mixed"))
            .await
            .expect("stream");
        let first = parse(&next(&mut stream).await.flag_configuration);
        assert_eq!(first["flags"]["color"]["defaultVariant"], "red");
        assert!(first["flags"]["beta"].is_object(), "{first}");
        let note = wait_for_event(&cp, "mixed", "FlagConfigurationWarning").await;
        support::assert_contains_all(
            &note,
            &[
                "generation 1",
                "is served",
                "flag \"beta\": targeting uses operator \"no_such_op\"",
            ],
        );

        let mut stream = open(&mut client, &format!("core.openfeature.dev/{NS}/broken"))
            .await
            .expect("stream");
        let status = next_message(&mut stream).await.expect_err("ended");
        assert_status(
            &status,
            Code::FailedPrecondition,
            "flag \"size\": defaultVariant \"m\" is not one of the variants",
        );
        let note = wait_for_event(&cp, "broken", "FlagConfigurationRejected").await;
        assert!(
            note.contains("clients have no version of this resource yet"),
            "{note}"
        );

        // Fixing the warned flag ends the warning.
        let patch = json!({"spec": {"flagSpec": {"flags": {"beta": null}}}});
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        eventually("fixing the FeatureFlag", || {
            api.patch("mixed", &params, &patch)
        })
        .await;
        let note = wait_for_event(&cp, "mixed", "FlagConfigurationValid").await;
        assert!(note.contains("generation 2"), "{note}");
    }
}
