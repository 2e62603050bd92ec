//! Checks the test control plane itself: CRDs installed, RBAC for the proxy identity, the
//! apiserver's open-watch metric, and an apiserver restart on the same port.

use std::pin::pin;
use std::time::Duration;

use flagd_proxy_testkit::control_plane::{
    self, ControlPlane, ControlPlaneError, feature_flag_resource,
};
use flagd_proxy_testkit::or_return;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn feature_flag(ns: &str, name: &str) -> DynamicObject {
    control_plane::feature_flag_object(
        ns,
        name,
        json!({
            "new-welcome-message": {
                "state": "ENABLED",
                "variants": { "on": true, "off": false },
                "defaultVariant": "on",
            },
        }),
    )
}

async fn create_flag(cp: &ControlPlane, ns: &str, name: &str) {
    Api::<DynamicObject>::namespaced_with(cp.admin_client(), ns, &feature_flag_resource())
        .create(&PostParams::default(), &feature_flag(ns, name))
        .await
        .unwrap_or_else(|e| panic!("creating FeatureFlag {ns}/{name} as admin: {e}"));
}

/// The HTTP status of a failed call, or 0 for success / a non-API error.
fn api_code<T>(result: &Result<T, kube::Error>) -> u16 {
    match result {
        Err(kube::Error::Api(status)) => status.code,
        _ => 0,
    }
}

#[test]
fn missing_binaries_are_reported_with_the_build_script() {
    let empty = tempfile::tempdir().expect("creating an empty directory");
    let err =
        control_plane::find_binaries(empty.path()).expect_err("an empty directory has no binaries");
    assert!(
        matches!(err, ControlPlaneError::BinariesMissing { .. }),
        "unexpected error: {err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("scripts/build-control-plane.sh"),
        "message does not say how to build the binaries: {message}"
    );
    assert!(
        matches!(err, ControlPlaneError::BinariesMissing { ref missing, .. } if missing.len() == 2)
    );
}

#[test]
fn watch_gauge_is_summed_over_scopes() {
    let metrics = r#"# HELP apiserver_longrunning_requests [STABLE] Gauge of all active long-running apiserver requests
# TYPE apiserver_longrunning_requests gauge
apiserver_longrunning_requests{component="apiserver",group="core.openfeature.dev",resource="featureflags",scope="namespace",subresource="",verb="WATCH",version="v1beta1"} 2
apiserver_longrunning_requests{component="apiserver",group="core.openfeature.dev",resource="featureflags",scope="cluster",subresource="",verb="WATCH",version="v1beta1"} 1
apiserver_longrunning_requests{component="apiserver",group="core.openfeature.dev",resource="featureflagsources",scope="cluster",subresource="",verb="WATCH",version="v1beta1"} 5
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="log",verb="GET",version="v1"} 7
"#;
    assert_eq!(
        control_plane::sum_long_running_watches(metrics, "featureflags"),
        3
    );
    assert_eq!(
        control_plane::sum_long_running_watches(metrics, "featureflagsources"),
        5
    );
    assert_eq!(control_plane::sum_long_running_watches(metrics, "pods"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn control_plane_serves_feature_flags_with_rbac_watches_and_restarts() {
    let mut cp = or_return!(control_plane::start_or_skip().await);
    let ar = feature_flag_resource();

    cp.create_namespace("granted").await;
    cp.create_namespace("other").await;
    create_flag(&cp, "granted", "flags").await;
    create_flag(&cp, "other", "flags").await;

    let proxy = cp.proxy_client().await;
    let granted: Api<DynamicObject> = Api::namespaced_with(proxy.clone(), "granted", &ar);
    let other: Api<DynamicObject> = Api::namespaced_with(proxy.clone(), "other", &ar);
    let everywhere: Api<DynamicObject> = Api::all_with(proxy.clone(), &ar);

    // Nothing is bound yet.
    assert_eq!(api_code(&granted.list(&ListParams::default()).await), 403);

    cp.grant_proxy_namespace("granted").await;
    let list = granted
        .list(&ListParams::default())
        .await
        .expect("the proxy lists featureflags in the granted namespace");
    let names: Vec<_> = list
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    assert_eq!(names, ["flags"]);
    assert_eq!(api_code(&other.list(&ListParams::default()).await), 403);
    assert_eq!(
        api_code(&everywhere.list(&ListParams::default()).await),
        403
    );

    // One watch open as the proxy shows up in the apiserver's gauge, and goes away with it.
    let before = cp.open_watches("featureflags").await;
    {
        let stream = granted
            .watch(&WatchParams::default(), "0")
            .await
            .expect("the proxy opens a watch in the granted namespace");
        let mut stream = pin!(stream);
        cp.wait_for_open_watches("featureflags", before + 1).await;

        create_flag(&cp, "granted", "second").await;
        let seen = tokio::time::timeout(WAIT, async {
            while let Some(event) = stream.next().await {
                if let WatchEvent::Added(obj) = event.expect("a watch event")
                    && obj.metadata.name.as_deref() == Some("second")
                {
                    return true;
                }
            }
            false
        })
        .await
        .expect("the watch delivers the new FeatureFlag in time");
        assert!(seen, "the watch ended before the new FeatureFlag arrived");
    }
    cp.wait_for_open_watches("featureflags", before).await;

    cp.revoke_proxy_namespace("granted").await;
    assert_eq!(api_code(&granted.list(&ListParams::default()).await), 403);

    cp.grant_proxy_cluster_wide().await;
    let all = everywhere
        .list(&ListParams::default())
        .await
        .expect("the proxy lists featureflags cluster-wide once granted");
    assert_eq!(all.items.len(), 3);

    // The apiserver goes away and comes back on the same address, with the same data.
    let url = cp.server_url();
    cp.stop_apiserver().await;
    assert_eq!(api_code(&everywhere.list(&ListParams::default()).await), 0);
    assert!(
        everywhere.list(&ListParams::default()).await.is_err(),
        "listing succeeded while the apiserver was down"
    );
    cp.start_apiserver().await;
    assert_eq!(cp.server_url(), url);
    let all = everywhere
        .list(&ListParams::default())
        .await
        .expect("the proxy lists featureflags after the apiserver restarted");
    assert_eq!(all.items.len(), 3);

    // The kubeconfig files are complete on their own (as a child process would load them).
    let kubeconfig = kube::config::Kubeconfig::read_from(cp.proxy_kubeconfig())
        .expect("reading the proxy kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("loading the proxy kubeconfig");
    assert_eq!(config.cluster_url.to_string().trim_end_matches('/'), url);
    let token = std::fs::read_to_string(cp.proxy_token_path()).expect("reading the proxy token");
    assert!(!token.is_empty() && !token.ends_with('\n'));
    assert!(cp.ca_path().is_file());
    assert!(cp.admin_kubeconfig().is_file());
}
