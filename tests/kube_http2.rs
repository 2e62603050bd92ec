//! The Kubernetes source speaks HTTP/2 to the API server: the watches of many resources share a
//! few connections (100 streams each at most) instead of holding a connection each, and the
//! short requests among them (the list before every watch, lists that are refused and retried)
//! do not spread them over more.
use flagd_proxy_testkit as support;

use flagd_proxy::protocol::client::flagd_sync_v1 as v1;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;
use support::client::open_in_body;
use support::control_plane::{self, connections_to, feature_flag_resource};
use support::or_return;
use support::{EVENT_TIMEOUT, Proxy, eventually};
use tonic::Code;
use tonic::transport::Channel;
use v1::flag_sync_service_client::FlagSyncServiceClient;

/// Resources watched at once: with one connection per watch (HTTP/1.1) as many connections;
/// over HTTP/2 three (100 streams on the first two, the rest on a third one).
const RESOURCES: usize = 250;
/// Resources asked for at once: their lists and watches interleave.
const BATCH: usize = 50;
/// Resources in a namespace the proxy may not read, asked for together with the last batch:
/// their lists are refused and retried, short requests in flight beside the last watches.
const REFUSED: usize = 100;

/// Opens a stream for `selector` and waits for its first answer: the stream, or the error.
async fn first_answer(
    mut client: FlagSyncServiceClient<Channel>,
    selector: String,
) -> Result<tonic::Streaming<v1::SyncFlagsResponse>, tonic::Status> {
    let mut stream = open_in_body(&mut client, &selector).await?;
    let first = tokio::time::timeout(EVENT_TIMEOUT, stream.message())
        .await
        .expect("a first answer in time")?;
    assert!(first.is_some(), "{selector}: the stream ended");
    Ok(stream)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn watches_share_http2_connections_to_the_api_server() {
    let cp = or_return!(control_plane::start_or_skip().await);
    cp.create_namespace("many").await;
    cp.grant_proxy_namespace("many").await;
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
    let client = FlagSyncServiceClient::connect(proxy.endpoint())
        .await
        .expect("connecting to the proxy");
    let mut streams = Vec::new();
    let batches: Vec<Vec<usize>> = (0..RESOURCES)
        .collect::<Vec<_>>()
        .chunks(BATCH)
        .map(<[usize]>::to_vec)
        .collect();
    let (last, first) = batches.split_last().expect("batches");
    for batch in first {
        let opened = batch
            .iter()
            .map(|i| first_answer(client.clone(), format!("core.openfeature.dev/many/f{i}")));
        for stream in futures::future::join_all(opened).await {
            streams.push(stream.expect("a stream with a snapshot"));
        }
    }
    let served = last
        .iter()
        .map(|i| first_answer(client.clone(), format!("core.openfeature.dev/many/f{i}")));
    let refused = (0..REFUSED).map(|i| {
        first_answer(
            client.clone(),
            format!("core.openfeature.dev/elsewhere/f{i}"),
        )
    });
    let (served, refused) = futures::future::join(
        futures::future::join_all(served),
        futures::future::join_all(refused),
    )
    .await;
    for stream in served {
        streams.push(stream.expect("a stream with a snapshot"));
    }
    for answer in refused {
        let Err(status) = answer else {
            panic!("a stream for a namespace the proxy may not read");
        };
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    }
    cp.wait_for_open_watches("featureflags", RESOURCES as u64)
        .await;
    // One socket per connection of the pool; read until the count settles (a socket the kernel
    // still lists a moment after its connection ended is not counted against the pool).
    let pid = proxy.pid();
    let want = RESOURCES.div_ceil(100);
    let connections = support::eventually("the connections settle", || async {
        let connections = connections_to(pid, cp.port());
        if connections == want {
            Ok(connections)
        } else {
            Err(format!("{connections} connections, not {want}"))
        }
    })
    .await;
    assert_eq!(
        connections, want,
        "{RESOURCES} watches over {connections} connections to the API server"
    );
    drop(streams);
}
