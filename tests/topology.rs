//! Deployment topologies with a real client (the published JS in-process provider, from
//! `interop/js`): a node-local proxy chained to a central proxy that watches a real
//! kube-apiserver, and two central replicas behind a round-robin balancer with a short
//! `--max-connection-age`, so that streams move between them.
use flagd_proxy_testkit as support;

use std::path::PathBuf;
use std::process::Stdio;

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use support::control_plane::{
    ControlPlane, feature_flag_object, feature_flag_resource, start_or_skip,
};
use support::or_return;
use support::{EVENT_TIMEOUT, Proxy, string_flag};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const FLAG: &str = "color";

/// The JS provider client, reading `VALUE <v>` lines from its stdout.
struct JsClient {
    _child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl JsClient {
    /// Starts the client against `port`, or `None` (after a notice) when it is not installed
    /// and `CI` is unset.
    fn start(port: u16, selector: &str) -> Option<JsClient> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("interop/js");
        if !dir
            .join("node_modules/@openfeature/flagd-provider")
            .exists()
        {
            support::skip::skip("the JS client is not installed: run scripts/install-interop.sh");
            return None;
        }
        let mut child = Command::new("node")
            .arg(dir.join("client.mjs"))
            .current_dir(&dir)
            .env("FLAGD_HOST", "127.0.0.1")
            .env("FLAGD_PORT", port.to_string())
            .env("FLAGD_SOURCE_SELECTOR", selector)
            .env("FLAGD_TLS", "false")
            .env("INTEROP_FLAG_KEY", FLAG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("starting node");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Some(JsClient {
            _child: child,
            lines,
        })
    }

    /// Waits until the client evaluates the flag to `want`.
    async fn wait_for(&mut self, want: &str) {
        let wanted = format!("VALUE {want}");
        loop {
            let line = tokio::time::timeout(EVENT_TIMEOUT, self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("the client never evaluated {want:?}"))
                .expect("reading the client's output")
                .expect("the client exited");
            if line == wanted {
                return;
            }
        }
    }
}

fn flag(ns: &str, name: &str, variant: &str) -> DynamicObject {
    feature_flag_object(
        ns,
        name,
        string_flag(FLAG, variant, &["red", "blue", "green", "white"]),
    )
}

async fn set_variant(cp: &ControlPlane, ns: &str, name: &str, variant: &str) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(cp.admin_client(), ns, &feature_flag_resource());
    let patch = json!({"spec": {"flagSpec": {"flags": {FLAG: {"defaultVariant": variant}}}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patching the FeatureFlag");
}

async fn central(cp: &ControlPlane, extra: &[&str]) -> Proxy {
    let args = cp.proxy_args(extra);
    Proxy::start(&args.iter().map(String::as_str).collect::<Vec<_>>()).await
}

/// A TCP balancer on a free port that sends each new connection to the next backend in turn.
struct Balancer {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Balancer {
    async fn start(backends: Vec<u16>) -> Balancer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind balancer");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let mut next = 0;
            while let Ok((mut inbound, _)) = listener.accept().await {
                let backend = backends[next % backends.len()];
                next += 1;
                tokio::spawn(async move {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", backend)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Balancer { port, task }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
#[ignore = "needs etcd, kube-apiserver and the JS provider: scripts/test installs them"]
async fn topologies_with_a_real_client() {
    let cp = or_return!(start_or_skip().await);
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace("shop").await;
    let flags: Api<DynamicObject> =
        Api::namespaced_with(cp.admin_client(), "shop", &feature_flag_resource());
    flags
        .create(&PostParams::default(), &flag("shop", "checkout", "red"))
        .await
        .expect("create FeatureFlag");
    let selector = "core.openfeature.dev/shop/checkout";

    // Central proxy on the API; node-local proxy chained to it; two real clients on the node.
    let mut central_proxy = central(&cp, &[]).await;
    let node = Proxy::start(&["--upstream", &format!("127.0.0.1:{}", central_proxy.port)]).await;
    let (Some(mut first), Some(mut second)) = (
        JsClient::start(node.port, selector),
        JsClient::start(node.port, selector),
    ) else {
        return;
    };
    first.wait_for("red").await;
    second.wait_for("red").await;
    // However many clients the node serves, it holds one stream to the central proxy.
    assert_eq!(central_proxy.metric("sync_active_streams").await, 1.0);
    set_variant(&cp, "shop", "checkout", "blue").await;
    first.wait_for("blue").await;
    second.wait_for("blue").await;

    // The central proxy restarts while the flag changes: both clients end on the newest version.
    let (port, management_port) = (central_proxy.port, central_proxy.management_port);
    assert!(central_proxy.terminate().await.success());
    set_variant(&cp, "shop", "checkout", "green").await;
    let args = cp.proxy_args(&[]);
    let _central_again = Proxy::start_on(
        port,
        management_port,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    )
    .await;
    first.wait_for("green").await;
    second.wait_for("green").await;
    drop((first, second, node));

    // Two central replicas behind a balancer, connections aged out after 2 s: the client's
    // stream moves between replicas and it stays current.
    let age = [
        "--max-connection-age",
        "2s",
        "--max-connection-age-grace",
        "1s",
    ];
    let replica_a = central(&cp, &age).await;
    let replica_b = central(&cp, &age).await;
    let balancer = Balancer::start(vec![replica_a.port, replica_b.port]).await;
    let mut client = or_return!(JsClient::start(balancer.port, selector));
    client.wait_for("green").await;
    const SENT: &str = "flagd_proxy_updates_sent_total{protocol=\"flagd.sync.v1\"}";
    support::eventually("the client's stream moves to the other replica", || async {
        let sent = (replica_a.metric(SENT).await, replica_b.metric(SENT).await);
        if sent.0 > 0.0 && sent.1 > 0.0 {
            Ok(())
        } else {
            Err(format!("updates sent by the replicas: {sent:?}"))
        }
    })
    .await;
    set_variant(&cp, "shop", "checkout", "white").await;
    client.wait_for("white").await;
}
