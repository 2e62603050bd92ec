//! Tests of the settings checks made before anything listens.
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
