//! Tests of the settings checks made before anything listens, and of the drain.
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

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
    let mut settings = Settings::default();
    settings.serve.bind_address = IpAddr::V4(Ipv4Addr::LOCALHOST);
    (settings.serve.port, settings.serve.management_port) = (0, 0);
    settings.serve.shutdown_timeout = Duration::from_millis(100);
    settings.source = SourceSettings::Manifests(vec![dir.path().to_owned()]);
    let bound = prepare(settings)
        .await
        .expect("prepare")
        .bind()
        .await
        .expect("bind");
    let addr = bound.sync_addr().expect("sync address");
    let shutdown = CancellationToken::new();
    let proxy = tokio::spawn(bound.run(shutdown.clone()));

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
