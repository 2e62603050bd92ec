//! Tests of the settings checks made before anything listens, and of the drain.
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::*;

#[test]
fn the_two_ports_must_differ_unless_both_are_any_free_port() {
    let mut same = Settings::default();
    same.serve.management_port = same.serve.port;
    assert!(matches!(check(&same), Err(ConfigError::SamePort(8015))));
    let mut free = Settings::default();
    (free.serve.port, free.serve.management_port) = (0, 0);
    assert!(check(&free).is_ok());
    assert!(check(&Settings::default()).is_ok());
}

#[test]
fn the_unix_socket_cannot_require_client_certificates() {
    let tls = |client_ca: Option<&str>| TlsFiles {
        cert: "cert.pem".into(),
        key: "key.pem".into(),
        client_ca: client_ca.map(PathBuf::from),
    };
    let mut with_ca = Settings::default();
    with_ca.serve.sync_socket_path = Some("/run/flagd-proxy.sock".into());
    with_ca.tls = Some(tls(Some("ca.pem")));
    assert!(matches!(
        check(&with_ca),
        Err(ConfigError::SocketWithoutClientCertificates)
    ));
    with_ca.tls = Some(tls(None));
    assert!(check(&with_ca).is_ok());
}

/// A client that stops reading while its stream is behind can never be sent the status that
/// ends the stream: at the end of the drain its connection is closed all the same (not left to
/// the process's exit), and `run` returns.
#[tokio::test]
async fn the_end_of_the_drain_closes_connections_whose_client_stopped_reading() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Larger than a stream's initial window (64 KiB): the client never has all of it.
    let big = "x".repeat(200 * 1024);
    let object = serde_json::json!({
        "apiVersion": "core.openfeature.dev/v1beta1",
        "kind": "FeatureFlag",
        "metadata": {"name": "big", "namespace": "default"},
        "spec": {"flagSpec": {"flags": {"color": {
            "state": "ENABLED", "variants": {"big": big}, "defaultVariant": "big"
        }}}}
    });
    std::fs::write(dir.path().join("big.json"), object.to_string()).expect("manifest");
    let mut settings = local_settings(dir.path());
    settings.serve.shutdown_timeout = Duration::from_millis(100);
    let bound = prepare(settings)
        .await
        .expect("prepare")
        .bind()
        .await
        .expect("bind");
    let addr = bound.sync_addr().expect("sync address");
    let shutdown = CancellationToken::new();
    let proxy = tokio::spawn(bound.run(shutdown.clone(), CancellationToken::new()));

    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, connection) = h2::client::handshake(tcp).await.expect("handshake");
    let mut connection = tokio::spawn(connection);
    let request = http::Request::post("http://localhost/flagd.sync.v1.FlagSyncService/SyncFlags")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    // SyncFlagsRequest { selector: "core.openfeature.dev/default/big" }, length-prefixed.
    let selector = b"core.openfeature.dev/default/big";
    let mut message = vec![
        0,
        0,
        0,
        0,
        u8::try_from(selector.len() + 2).expect("short"),
        0x12,
    ];
    message.push(u8::try_from(selector.len()).expect("short"));
    message.extend_from_slice(selector);
    let (response, mut body) = send.send_request(request, false).expect("send");
    body.send_data(message.into(), true).expect("message");
    let mut data = response.await.expect("response").into_body();
    // The first window's worth arrives; the client never opens the window again.
    let mut received = 0;
    while received < 65_535 {
        received += data.data().await.expect("data").expect("data").len();
    }

    shutdown.cancel();
    proxy.await.expect("join").expect("run");
    // The connection ends (its task would otherwise wait for the window forever).
    tokio::time::timeout(Duration::from_secs(60), &mut connection)
        .await
        .expect("the connection is closed")
        .expect("join")
        .ok();
    assert!(
        !matches!(data.trailers().await, Ok(Some(_))),
        "no status could be sent"
    );
}

/// A proxy on free ports of the loopback address, serving the manifests in `dir`.
fn local_settings(dir: &std::path::Path) -> Settings {
    let mut settings = Settings::default();
    settings.serve.bind_address = IpAddr::V4(Ipv4Addr::LOCALHOST);
    (settings.serve.port, settings.serve.management_port) = (0, 0);
    settings.source = SourceSettings::Manifests(vec![dir.to_owned()]);
    settings
}

/// Shutdown stops the hub's watches and waits for them: once `run` has returned, no watch is
/// left, although its resource had a subscriber until the end and an idle watch would stay for
/// an hour.
#[tokio::test]
async fn run_returns_once_every_watch_has_stopped() {
    use crate::protocol::client::flagd_sync_v1::SyncFlagsRequest;
    use crate::protocol::client::flagd_sync_v1::flag_sync_service_client::FlagSyncServiceClient;

    let dir = tempfile::tempdir().expect("tempdir");
    let object = crate::testing::flag_resource("on");
    std::fs::write(dir.path().join("a.json"), object.to_string()).expect("manifest");
    let mut settings = local_settings(dir.path());
    settings.hub.idle_timeout = Duration::from_secs(3600);
    let prepared = prepare(settings).await.expect("prepare");
    let metrics = prepared.metrics.clone();
    let bound = prepared.bind().await.expect("bind");
    let addr = bound.sync_addr().expect("sync address");
    let shutdown = CancellationToken::new();
    let proxy = tokio::spawn(bound.run(shutdown.clone(), CancellationToken::new()));

    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut stream = FlagSyncServiceClient::new(channel)
        .sync_flags(SyncFlagsRequest {
            provider_id: "test".into(),
            selector: "core.openfeature.dev/ns/a".into(),
        })
        .await
        .expect("a stream")
        .into_inner();
    stream
        .message()
        .await
        .expect("the flags")
        .expect("a message");
    assert_eq!(metrics.upstream_watches.get(), 1);

    shutdown.cancel();
    proxy.await.expect("join").expect("run");
    assert_eq!(
        metrics.upstream_watches.get(),
        0,
        "a watch outlived the proxy"
    );
    drop(stream);
}

/// Tasks still running at the deadline are counted (and logged); tasks that ended are not.
#[tokio::test(start_paused = true)]
async fn tasks_still_running_at_the_deadline_are_counted() {
    let stuck = TaskTracker::new();
    stuck.spawn(futures::future::pending::<()>());
    let ended = TaskTracker::new();
    ended.spawn(async {});
    let (stuck_too, going) = (TaskTracker::new(), CancellationToken::new());
    let gone = going.clone();
    stuck_too.spawn(async move { gone.cancelled().await });
    for tracker in [&stuck, &ended, &stuck_too] {
        tracker.close();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    assert_eq!(
        running::wait_for_tasks(&[&stuck, &ended, &stuck_too], deadline).await,
        2
    );
    going.cancel();
    assert_eq!(
        running::wait_for_tasks(&[&ended, &stuck_too], deadline + Duration::from_secs(10)).await,
        0
    );
}
