//! The Kubernetes source speaks HTTP/2 to the API server: the watches of many resources share a
//! few connections (100 streams each at most) instead of holding a connection each.
use flagd_proxy_testkit as support;

use flagd_proxy::wire::proto::client::flagd_sync_v1 as v1;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;
use support::control_plane::{self, connections_to, feature_flag_resource};
use support::{EVENT_TIMEOUT, Proxy, eventually};
use v1::flag_sync_service_client::FlagSyncServiceClient;

/// Resources watched at once: with one connection per watch (HTTP/1.1) as many connections;
/// over HTTP/2 two (100 streams on the first, the rest on a second one).
const RESOURCES: usize = 150;

#[tokio::test(flavor = "multi_thread")]
async fn watches_share_http2_connections_to_the_api_server() {
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace("many").await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(cp.admin_client(), "many", &feature_flag_resource());
    let params = PostParams::default();
    for i in 0..RESOURCES {
        let object: DynamicObject = control_plane::feature_flag_object(
            "many",
            &format!("f{i}"),
            json!({"on": {
                "state": "ENABLED",
                "variants": {"yes": true, "no": false},
                "defaultVariant": "yes"
            }}),
        );
        eventually(&format!("creating FeatureFlag many/f{i}"), || {
            api.create(&params, &object)
        })
        .await;
    }
    let kubeconfig = cp.proxy_kubeconfig().display().to_string();
    let proxy = Proxy::start_with_env(&[], &[("KUBECONFIG", &kubeconfig)]).await;
    let mut client = FlagSyncServiceClient::connect(proxy.endpoint())
        .await
        .expect("connecting to the proxy");
    let mut streams = Vec::new();
    for i in 0..RESOURCES {
        let request = v1::SyncFlagsRequest {
            selector: format!("core.openfeature.dev/many/f{i}"),
            ..Default::default()
        };
        let mut stream = tokio::time::timeout(EVENT_TIMEOUT, client.sync_flags(request))
            .await
            .expect("the proxy answers SyncFlags")
            .expect("stream opened")
            .into_inner();
        let first = tokio::time::timeout(EVENT_TIMEOUT, stream.message())
            .await
            .expect("a snapshot in time")
            .expect("no error");
        assert!(first.is_some(), "f{i}: the stream ended");
        streams.push(stream);
    }
    cp.wait_for_open_watches("featureflags", RESOURCES as u64)
        .await;
    let pid = proxy.pid();
    let connections = connections_to(pid, cp.port());
    assert_eq!(
        connections,
        RESOURCES.div_ceil(100),
        "{RESOURCES} watches over {connections} connections to the API server"
    );
}
