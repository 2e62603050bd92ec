//! The sync protocols over real sockets, against the proxy binary serving a manifests directory.
use flagd_proxy_testkit as support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use flagd_proxy::introspection::ResourceStatus;
use serde_json::json;
use support::client::{
    Client, LegacyClient, assert_status, client, default_variant, fetch, legacy, legacy_client,
    next, open, open_in_body, open_legacy, v1, with_selector,
};
use support::{EVENT_TIMEOUT, Proxy, string_flag, write_color, write_manifest};
use tonic::transport::Channel;
use tonic::{Code, Streaming};

const SELECTOR: &str = "core.openfeature.dev/default/demo";

/// The variants of `color` in `default/demo` as [`manifests_proxy`] and its edits write it.
const COLORS: &[&str] = &["red", "blue", "green"];

async fn manifests_proxy() -> (tempfile::TempDir, Proxy) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_color(dir.path(), "default", "demo", "red", COLORS);
    let proxy = Proxy::start(&["--manifests", dir.path().to_str().expect("utf-8")]).await;
    (dir, proxy)
}

/// The variant of `color` in the stream's next message.
async fn next_color(stream: &mut Streaming<v1::SyncFlagsResponse>) -> String {
    default_variant(&next(stream).await.flag_configuration, "color")
}

#[tokio::test]
async fn header_selector_stream_gets_snapshot_then_each_real_change() {
    let (dir, proxy) = manifests_proxy().await;
    let mut client = client(&proxy).await;
    // The body names another resource: the header wins.
    let request = v1::SyncFlagsRequest {
        provider_id: "t".into(),
        selector: "core.openfeature.dev/x/y".into(),
    };
    let mut stream = client
        .sync_flags(with_selector(request, SELECTOR))
        .await
        .expect("stream")
        .into_inner();

    let first = next(&mut stream).await;
    assert_eq!(default_variant(&first.flag_configuration, "color"), "red");
    let context = first
        .sync_context
        .expect("sync_context set on every message");
    assert_eq!(context.fields["selector"].kind, text(SELECTOR));

    // Updating the resource so that its flag configuration stays byte-identical is not a
    // change: no new version, no message; the next message is the real change.
    let served = demo_status(&proxy).await.version;
    let red = string_flag("color", "red", COLORS);
    // A label only, with a second resource in the same file: once that one reaches its
    // subscriber, the proxy has read this version of the file.
    let mut marker = open(&mut client, MARKER).await.expect("marker stream");
    write_labelled(dir.path(), red.clone(), "1", true);
    assert_eq!(next_color(&mut marker).await, "here");
    // A version that fails the checks (its flags are not an object), then the same flags as
    // before: once the resource shows as present again, the proxy has taken that update in.
    write_manifest(dir.path(), "default", "demo", json!("not an object"));
    wait_for_demo(&proxy, "invalid").await;
    write_labelled(dir.path(), red, "2", false);
    let status = wait_for_demo(&proxy, "present").await;
    assert_eq!(
        status.version, served,
        "identical content became a new version: {status:?}"
    );
    write_color(dir.path(), "default", "demo", "blue", COLORS);
    let second = next(&mut stream).await;
    assert_eq!(
        default_variant(&second.flag_configuration, "color"),
        "blue",
        "the identical content was sent again"
    );
    assert!(second.sync_context.is_some());
}

/// A resource the identical-content check watches to know when the proxy has read a file.
const MARKER: &str = "core.openfeature.dev/default/marker";

/// Writes `default/demo` with `flags` and a label `edit: <edit>` (the file and the resource
/// change, the flag configuration does not), and with `marker`, `default/marker` in the same
/// file.
fn write_labelled(dir: &std::path::Path, flags: serde_json::Value, edit: &str, marker: bool) {
    let mut demo = support::feature_flag("default", "demo", flags);
    demo["metadata"]["labels"] = json!({ "edit": edit });
    let mut items = vec![demo];
    if marker {
        let color = string_flag("color", "here", &["here"]);
        items.push(support::feature_flag("default", "marker", color));
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    // JSON is YAML: this replaces the file write_manifest writes.
    support::write_atomically(
        &dir.join("default-demo.yaml"),
        &serde_json::to_string(&list).expect("json"),
    );
}

/// `default/demo` as the management port's `/status` shows it.
async fn demo_status(proxy: &Proxy) -> ResourceStatus {
    let status = proxy.status_page().await;
    status
        .resource(SELECTOR)
        .cloned()
        .unwrap_or_else(|| panic!("{SELECTOR} is not in {status:?}"))
}

/// Waits until `/status` shows `default/demo` with this availability; what it shows then.
async fn wait_for_demo(proxy: &Proxy, availability: &str) -> ResourceStatus {
    support::eventually("the resource's availability", || async {
        let status = demo_status(proxy).await;
        if status.availability == availability {
            Ok(status)
        } else {
            Err(format!("{SELECTOR} is not {availability}: {status:?}"))
        }
    })
    .await
}

#[tokio::test]
async fn body_selector_works_without_header() {
    let (_dir, proxy) = manifests_proxy().await;
    let mut client = client(&proxy).await;
    let mut stream = open_in_body(&mut client, SELECTOR).await.expect("stream");
    assert_eq!(next_color(&mut stream).await, "red");
}

#[tokio::test]
async fn legacy_protocol_sends_sync_state_all() {
    let (dir, proxy) = manifests_proxy().await;
    let mut client = legacy_client(&proxy).await;
    let mut stream = open_legacy(&mut client, SELECTOR).await.expect("stream");
    let first = next(&mut stream).await;
    assert_eq!(first.state, legacy::SyncState::All as i32);
    assert_eq!(default_variant(&first.flag_configuration, "color"), "red");
    write_color(dir.path(), "default", "demo", "green", COLORS);
    let second = next(&mut stream).await;
    assert_eq!(
        (
            second.state,
            default_variant(&second.flag_configuration, "color")
        ),
        (legacy::SyncState::All as i32, "green".into())
    );

    // An old flagd may send FetchAllFlags with an empty request; then there is no selector.
    let status = client
        .fetch_all_flags(legacy::FetchAllFlagsRequest::default())
        .await
        .expect_err("no selector");
    assert_eq!(status.code(), Code::InvalidArgument);
    let fetched = client
        .fetch_all_flags(legacy::FetchAllFlagsRequest {
            provider_id: String::new(),
            selector: SELECTOR.into(),
        })
        .await
        .expect("fetch")
        .into_inner();
    assert_eq!(
        default_variant(&fetched.flag_configuration, "color"),
        "green"
    );
}

#[tokio::test]
async fn get_metadata_and_fetch_all_flags() {
    let (_dir, proxy) = manifests_proxy().await;
    let mut client = client(&proxy).await;
    assert!(metadata(&mut client).await.fields.contains_key("proxy"));

    let fetched = fetch(&mut client, SELECTOR).await.expect("fetch");
    assert_eq!(default_variant(&fetched.flag_configuration, "color"), "red");

    let missing = fetch(&mut client, "core.openfeature.dev/default/nope")
        .await
        .expect_err("missing");
    assert_status(
        &missing,
        Code::NotFound,
        "core.openfeature.dev/default/nope",
    );
}

#[tokio::test]
async fn stream_for_a_missing_resource_waits_for_it() {
    let (dir, proxy) = manifests_proxy().await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, "core.openfeature.dev/later/flags")
        .await
        .expect("a stream opens for a resource that does not exist yet");
    proxy.wait_for_log("resource not found; waiting").await;
    write_manifest(
        dir.path(),
        "later",
        "flags",
        string_flag("size", "big", &["big", "small"]),
    );
    assert_eq!(
        default_variant(&next(&mut stream).await.flag_configuration, "size"),
        "big"
    );
}

#[tokio::test]
async fn invalid_selectors_get_invalid_argument_with_the_accepted_form() {
    let (_dir, proxy) = manifests_proxy().await;
    let mut client = client(&proxy).await;
    for selector in [
        "file:/etc/passwd",
        "flagSetId=x",
        "core.openfeature.dev/only-namespace",
        "",
    ] {
        let status = open_in_body(&mut client, selector)
            .await
            .expect_err(selector);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{selector}: {status:?}"
        );
        assert!(
            status
                .message()
                .contains("core.openfeature.dev/<namespace>/<name>"),
            "{status:?}"
        );
    }
    assert!(
        proxy
            .metric("flagd_proxy_rejected_requests_total{reason=\"invalid_selector\"}")
            .await
            >= 4.0
    );
}

/// Writes `default/demo` with flag `color` (variants red and blue) defaulting to `variant`.
fn write_demo(dir: &std::path::Path, variant: &str) {
    write_color(dir, "default", "demo", variant, &["red", "blue"]);
}

#[tokio::test]
async fn flagds_source_selector_works_in_header_and_body_and_flag_sets_are_refused() {
    let (_dir, proxy) = manifests_proxy().await;
    let mut client = client(&proxy).await;
    let source = format!("source={SELECTOR}");
    let mut stream = open(&mut client, &source)
        .await
        .expect("source= in the header");
    assert_eq!(next_color(&mut stream).await, "red");
    let mut stream = open_in_body(&mut client, &source)
        .await
        .expect("source= in the body");
    let first = next(&mut stream).await;
    assert_eq!(default_variant(&first.flag_configuration, "color"), "red");
    let fetched = fetch(&mut client, &source)
        .await
        .expect("fetch with source=");
    assert_eq!(default_variant(&fetched.flag_configuration, "color"), "red");

    let status = open(&mut client, "flagSetId=demo")
        .await
        .expect_err("flag sets are refused");
    // The message names the forms that work.
    assert_status(
        &status,
        Code::InvalidArgument,
        "\"source=core.openfeature.dev/<namespace>/<name>\"",
    );
    let status = open(&mut client, "file=/etc/passwd")
        .await
        .expect_err("unknown keys are refused");
    assert_status(
        &status,
        Code::InvalidArgument,
        "the accepted keys are `source`",
    );
}

/// A proxy on `default/demo` (red) with the flags `extra` and a config file that holds `config`,
/// and its directory.
async fn demo_proxy_with_config(config: &str, extra: &[&str]) -> (tempfile::TempDir, Proxy) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_demo(dir.path(), "red");
    let config_file = dir.path().join("config.yaml");
    std::fs::write(&config_file, config).expect("config file");
    let mut args = vec!["--manifests", dir.path().to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    args.extend(["--config", config_file.to_str().expect("utf-8")]);
    let proxy = Proxy::start(&args).await;
    (dir, proxy)
}

/// What `GetMetadata` answers.
async fn metadata(client: &mut Client) -> prost_types::Struct {
    client
        .get_metadata(v1::GetMetadataRequest {})
        .await
        .expect("metadata")
        .into_inner()
        .metadata
        .expect("metadata is set")
}

/// `s` as the kind of a protobuf value: how sync contexts and metadata carry strings.
fn text(s: &str) -> Option<prost_types::value::Kind> {
    Some(prost_types::value::Kind::StringValue(s.into()))
}

#[tokio::test]
async fn context_values_are_in_every_sync_context_and_in_get_metadata() {
    let (dir, proxy) = demo_proxy_with_config(
        "context-value:\n  tier: gold\n",
        &[
            "--context-value",
            "region=eu-west",
            "--context-value=cluster=prod-1",
        ],
    )
    .await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, SELECTOR).await.expect("stream");
    for variant in ["red", "blue"] {
        if variant == "blue" {
            write_demo(dir.path(), "blue");
        }
        let message = next(&mut stream).await;
        assert_eq!(
            default_variant(&message.flag_configuration, "color"),
            variant
        );
        let context = message.sync_context.expect("sync_context");
        // The command line's entries; the file's key is overridden by the command line's.
        assert_eq!(context.fields["region"].kind, text("eu-west"));
        assert_eq!(context.fields["cluster"].kind, text("prod-1"));
        assert!(!context.fields.contains_key("tier"), "{context:?}");
        assert_eq!(context.fields["selector"].kind, text(SELECTOR));
        assert_eq!(context.fields["proxy"].kind, text("flagd-proxy"));
    }
    let metadata = metadata(&mut client).await;
    assert_eq!(metadata.fields["region"].kind, text("eu-west"));
    assert_eq!(metadata.fields["cluster"].kind, text("prod-1"));
}

#[tokio::test]
async fn context_values_from_the_config_file() {
    let (_dir, proxy) =
        demo_proxy_with_config("context-value:\n  tier: gold\n  zone: a\n", &[]).await;
    let metadata = metadata(&mut client(&proxy).await).await;
    assert_eq!(metadata.fields["tier"].kind, text("gold"));
    assert_eq!(metadata.fields["zone"].kind, text("a"));
}

/// A channel to the proxy's unix socket.
async fn unix_channel(path: &std::path::Path) -> Channel {
    let path = path.to_owned();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .expect("connecting to the unix socket")
}

#[tokio::test]
async fn unix_socket_serves_both_protocols_and_health_and_is_removed_on_shutdown() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

    let dir = tempfile::tempdir().expect("tempdir");
    write_demo(dir.path(), "red");
    let socket = dir.path().join("sync.sock");
    // A socket file left behind by a crash does not stop the start.
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("a stale socket"));
    let mut proxy = Proxy::start(&[
        "--manifests",
        dir.path().to_str().expect("utf-8"),
        "--sync-socket-path",
        socket.to_str().expect("utf-8"),
        "--sync-socket-mode",
        "0600",
        "--sync-socket-only",
    ])
    .await;
    let meta = std::fs::symlink_metadata(&socket).expect("the socket exists");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // Instead of TCP: nothing listens on the sync port.
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", proxy.port))
            .await
            .is_err(),
        "the sync port is off with --sync-socket-only"
    );

    let channel = unix_channel(&socket).await;
    let mut v1_client = Client::new(channel.clone());
    let mut stream = open(&mut v1_client, SELECTOR)
        .await
        .expect("flagd.sync.v1 over the socket");
    assert_eq!(next_color(&mut stream).await, "red");
    let mut legacy_client = LegacyClient::new(channel.clone());
    let mut legacy_stream = open_legacy(&mut legacy_client, SELECTOR)
        .await
        .expect("sync.v1 over the socket");
    let first = next(&mut legacy_stream).await;
    assert_eq!(default_variant(&first.flag_configuration, "color"), "red");
    let mut health = HealthClient::new(channel);
    let response = health
        .check(HealthCheckRequest {
            service: "flagd.sync.v1.FlagSyncService".into(),
        })
        .await
        .expect("health over the socket")
        .into_inner();
    assert_eq!(response.status, ServingStatus::Serving as i32);

    write_demo(dir.path(), "blue");
    assert_eq!(next_color(&mut stream).await, "blue");
    let exit = proxy.terminate().await;
    assert!(exit.success(), "{exit:?}");
    assert!(!socket.exists(), "the socket file is removed on shutdown");
}

/// gRPC clients over a unix socket name the socket in `:authority`, which is no URI authority:
/// C-core (grpcio and the languages built on it) its percent-encoded path, grpc-java the path
/// itself. Requests with both are served, the C-core one also when a later request refers to
/// it in the HPACK dynamic table, and in a block split over HEADERS and CONTINUATION (row 10 of
/// docs/security.md, `attacks::socket_authority`).
#[tokio::test]
async fn unix_socket_accepts_the_authorities_grpc_clients_send() {
    use prost::Message as _;
    use support::attacks::socket_authority::{self, Outcome, STREAMS};

    let dir = tempfile::tempdir().expect("tempdir");
    write_demo(dir.path(), "red");
    let socket = dir.path().join("sync.sock");
    let _proxy = Proxy::start(&[
        "--manifests",
        dir.path().to_str().expect("utf-8"),
        "--sync-socket-path",
        socket.to_str().expect("utf-8"),
    ])
    .await;
    let outcome = socket_authority::attempt(&socket, SELECTOR, EVENT_TIMEOUT)
        .await
        .expect("connect to the socket");
    let Outcome::Served(messages) = outcome else {
        panic!("not served: {outcome:?}");
    };
    assert_eq!(messages.keys().copied().collect::<Vec<_>>(), STREAMS);
    // Each stream's first message: the demo flags.
    for (stream, message) in messages {
        let response = v1::SyncFlagsResponse::decode(&message[..]).expect("a SyncFlagsResponse");
        let color = default_variant(&response.flag_configuration, "color");
        assert_eq!(color, "red", "stream {stream}");
    }
}

#[tokio::test]
async fn a_file_in_the_sockets_place_is_never_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("sync.sock");
    std::fs::write(&socket, "not a socket").expect("write");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_flagd-proxy"))
        .args(["start", "--manifests", dir.path().to_str().expect("utf-8")])
        .args([
            "--bind-address",
            "127.0.0.1",
            "--port",
            "0",
            "--management-port",
            "0",
        ])
        .args(["--sync-socket-path", socket.to_str().expect("utf-8")])
        .output()
        .expect("run flagd-proxy");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--sync-socket-path") && stderr.contains("not a socket"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&socket).expect("still there"),
        "not a socket"
    );

    // Client certificates cannot be required of socket clients: refused before anything listens.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_flagd-proxy"))
        .args(["start", "--manifests", dir.path().to_str().expect("utf-8")])
        .args(["--sync-socket-path", "/nonexistent/sync.sock"])
        .args(["--server-cert-path", "c.pem", "--server-key-path", "k.pem"])
        .args(["--client-ca-path", "ca.pem"])
        .output()
        .expect("run flagd-proxy");
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--client-ca-path"), "{stderr}");
}

#[tokio::test]
async fn malformed_manifests_do_not_hurt_good_ones_and_keep_the_last_good_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("broken.yaml"), "apiVersion: [unclosed\n").expect("write");
    write_demo(dir.path(), "red");
    let proxy = Proxy::start(&["--manifests", dir.path().to_str().expect("utf-8")]).await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, SELECTOR).await.expect("stream");
    assert_eq!(next_color(&mut stream).await, "red");

    // A version that fails the checks is not pushed; the next good one is.
    write_manifest(
        dir.path(),
        "default",
        "demo",
        json!({"color": {"state": "ENABLED", "variants": {"red": "red"}, "defaultVariant": "nope"}}),
    );
    proxy
        .wait_for_metric(
            "flagd_proxy_invalid_documents_total{namespace=\"default\",name=\"demo\"}",
            1.0,
        )
        .await;
    let status = proxy.status_page().await;
    assert_eq!(
        status.resource(SELECTOR).map(|r| r.availability.as_str()),
        Some("invalid"),
        "{status:?}"
    );
    assert!(
        status
            .source_status
            .problems()
            .iter()
            .any(|p| p.path.ends_with("broken.yaml")),
        "{status:?}"
    );
    // A new subscriber still gets the last good version.
    let mut late = open(&mut client, SELECTOR).await.expect("stream");
    assert_eq!(next_color(&mut late).await, "red");

    // A file that stops parsing keeps its resources too.
    std::fs::write(dir.path().join("default-demo.yaml"), "kind: [").expect("write");
    proxy
        .wait_for_metric(
            "flagd_proxy_source_errors_total{source=\"manifests\",kind=\"parse\"}",
            2.0,
        )
        .await;
    write_demo(dir.path(), "blue");
    assert_eq!(next_color(&mut stream).await, "blue");
    assert_eq!(next_color(&mut late).await, "blue");
}

/// A directory under --manifests that the proxy may no longer read (its permissions changed)
/// keeps the last good resources of its files, as a file that stops parsing does, and
/// `/status` says why; once it can be read again, its files are followed again.
#[tokio::test]
#[ignore = "needs setpriv (util-linux) when run as root: scripts/test runs it"]
async fn an_unreadable_manifests_directory_keeps_its_files_resources_and_says_why() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let team = dir.path().join("team");
    std::fs::create_dir(&team).expect("a directory");
    write_demo(&team, "red");
    let manifests = dir.path().to_str().expect("utf-8");
    let proxy =
        support::or_return!(Proxy::start_bound_by_permissions(&["--manifests", manifests]).await);
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, SELECTOR).await.expect("stream");
    assert_eq!(next_color(&mut stream).await, "red");

    let mode = |mode| std::fs::set_permissions(&team, std::fs::Permissions::from_mode(mode));
    mode(0o000).expect("chmod 000");
    proxy
        .wait_for_log("cannot read a manifests directory")
        .await;
    let status = proxy.status_page().await;
    let problem = status
        .source_status
        .problems()
        .iter()
        .find(|p| p.path.ends_with("team"))
        .unwrap_or_else(|| panic!("no problem reported for team/: {status:?}"));
    assert!(
        problem.error.contains("Permission denied") && problem.error.contains("last good"),
        "{problem:?}"
    );
    assert!(
        proxy
            .metric("flagd_proxy_source_errors_total{source=\"manifests\",kind=\"read\"}")
            .await
            >= 1.0
    );
    // A new subscriber still gets the resource.
    let mut late = open(&mut client, SELECTOR).await.expect("stream");
    assert_eq!(next_color(&mut late).await, "red");

    mode(0o755).expect("chmod 755");
    write_demo(&team, "blue");
    assert_eq!(next_color(&mut stream).await, "blue");
    assert_eq!(next_color(&mut late).await, "blue");
    let status = proxy.status_page().await;
    assert!(status.source_status.problems().is_empty(), "{status:?}");
}

/// A resource defined in two files is reported (log and `/status`) when it starts to be, and
/// not again at each rescan or edit of another file while it lasts.
#[tokio::test]
async fn a_resource_defined_twice_is_logged_once_while_it_lasts() {
    let (first, second) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    write_demo(first.path(), "red");
    write_demo(second.path(), "blue");
    write_color(first.path(), "default", "other", "red", COLORS);
    let dirs = [first.path(), second.path()].map(|dir| dir.to_str().expect("utf-8"));
    let proxy = Proxy::start(&["--manifests", dirs[0], "--manifests", dirs[1]]).await;
    let mut client = client(&proxy).await;
    let other = "core.openfeature.dev/default/other";
    let mut stream = open(&mut client, other).await.expect("stream");
    assert_eq!(next_color(&mut stream).await, "red");
    for color in ["blue", "green"] {
        write_color(first.path(), "default", "other", color, COLORS);
        assert_eq!(next_color(&mut stream).await, color);
    }
    // Logged after the catalog of the last edit was built: every line before it is in.
    proxy
        .wait_for_log(&format!("resource={other} version=3"))
        .await;
    let log = proxy.log_text();
    assert_eq!(log.matches("duplicate resource").count(), 1, "{log}");
    let status = proxy.status_page().await;
    let problems = status.source_status.problems();
    assert_eq!(problems.len(), 1, "{status:?}");
    assert!(
        problems[0].error.contains("is also defined in"),
        "{status:?}"
    );
}

#[tokio::test]
async fn streams_share_one_watch_and_are_counted() {
    let (_dir, proxy) = manifests_proxy().await;
    let mut streams = Vec::new();
    for _ in 0..5 {
        let mut client = client(&proxy).await;
        let mut stream = open(&mut client, SELECTOR).await.expect("stream");
        next(&mut stream).await;
        streams.push(stream);
    }
    assert_eq!(proxy.metric("flagd_proxy_upstream_watches").await, 1.0);
    assert_eq!(proxy.metric("sync_active_streams").await, 5.0);
    assert_eq!(
        proxy
            .metric("flagd_proxy_active_streams{protocol=\"flagd.sync.v1\"}")
            .await,
        5.0
    );
    drop(streams);
    proxy.wait_for_metric("sync_active_streams", 0.0).await;
}

#[tokio::test]
async fn shutdown_ends_streams_with_unavailable_and_exits_zero() {
    let (_dir, mut proxy) = manifests_proxy().await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, SELECTOR).await.expect("stream");
    next(&mut stream).await;
    let exit = tokio::spawn(async move { proxy.terminate().await });
    ends_with_unavailable(&mut stream).await;
    let exit = exit.await.expect("join");
    assert!(exit.success(), "{exit:?}");
}

/// The stream's end: `UNAVAILABLE`, never OK.
async fn ends_with_unavailable(stream: &mut Streaming<v1::SyncFlagsResponse>) {
    let end = tokio::time::timeout(EVENT_TIMEOUT, stream.message())
        .await
        .expect("the stream ends");
    let status = end.expect_err("a stream never ends with OK");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

/// A proxy of the `demo` manifest whose drain lasts an hour unless cut short.
async fn draining_an_hour() -> (tempfile::TempDir, Proxy) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_color(dir.path(), "default", "demo", "red", COLORS);
    let manifests = dir.path().to_str().expect("utf-8");
    let proxy = Proxy::start(&["--manifests", manifests, "--drain-delay", "1h"]).await;
    (dir, proxy)
}

/// A stop signal begins the drain: readiness fails and the sync port stops accepting, but the
/// open connection is left as it was (no GOAWAY: it takes new streams) and its stream keeps
/// getting every change until the drain ends (here: a second stop signal, the
/// delay being an hour); then it ends with `UNAVAILABLE` and the proxy exits 0.
#[tokio::test]
async fn a_draining_proxy_keeps_serving_its_streams_until_a_second_signal() {
    let (dir, mut proxy) = draining_an_hour().await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, SELECTOR).await.expect("stream");
    assert_eq!(next_color(&mut stream).await, "red");

    proxy.signal("TERM");
    proxy.wait_for_log("draining: no new connections").await;
    let (status, _) = support::http_get(proxy.management_port, "/readyz")
        .await
        .expect("readyz");
    assert_eq!(status, 503, "not ready while draining");
    support::wait_until_refused(proxy.port).await;
    write_color(dir.path(), "default", "demo", "blue", COLORS);
    assert_eq!(
        next_color(&mut stream).await,
        "blue",
        "served while draining"
    );
    // No GOAWAY came: the connection still takes a new stream (a reconnect would be refused).
    let mut another = open(&mut client, SELECTOR)
        .await
        .expect("a stream on the connection");
    assert_eq!(next_color(&mut another).await, "blue");

    proxy.signal("TERM");
    ends_with_unavailable(&mut stream).await;
    let exit = proxy.wait_exit().await;
    assert!(exit.success(), "{exit:?}");
}

/// With no stream open there is nothing to drain: a stop signal stops the proxy at once, however
/// long the drain delay.
#[tokio::test]
async fn with_no_stream_open_the_drain_ends_at_once() {
    let (_dir, mut proxy) = draining_an_hour().await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, SELECTOR).await.expect("stream");
    next(&mut stream).await;
    drop(stream);
    proxy.wait_for_metric("sync_active_streams", 0.0).await;
    proxy.signal("TERM");
    let exit = proxy.wait_exit().await;
    assert!(exit.success(), "{exit:?}");
    assert!(
        !proxy.log_text().contains("draining"),
        "{}",
        proxy.log_text()
    );
}

/// At shutdown the watches stop and the proxy waits for them: the log tells that the watch of
/// the resource a client streamed has stopped before it tells that the proxy has.
#[tokio::test]
async fn shutdown_waits_for_the_watches_to_stop() {
    let (_dir, mut proxy) = manifests_proxy().await;
    let mut client = client(&proxy).await;
    let mut stream = open(&mut client, SELECTOR).await.expect("stream");
    next(&mut stream).await;
    let exit = proxy.terminate().await;
    assert!(exit.success(), "{exit:?}");
    const STOPPED: &str = "flagd_proxy::app::running: stopped";
    proxy.wait_for_log(STOPPED).await;
    let log = proxy.log_text();
    let line = |needle: &str| log.lines().position(|l| l.contains(needle));
    let watch = line("watch stopped: shutting down");
    assert!(
        watch.is_some() && watch < line(STOPPED),
        "the watch stopped before the proxy did:\n{log}"
    );
}

#[tokio::test]
async fn grpc_health_on_both_ports() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let (_dir, proxy) = manifests_proxy().await;
    for port in [proxy.port, proxy.management_port] {
        let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        let mut health = HealthClient::new(channel);
        for service in ["", "flagd.sync.v1.FlagSyncService"] {
            let response = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .expect("health")
                .into_inner();
            assert_eq!(
                response.status,
                ServingStatus::Serving as i32,
                "port {port} service {service:?}"
            );
        }
    }
    let (code, body) = support::http_get(proxy.management_port, "/healthz")
        .await
        .expect("healthz");
    assert_eq!((code, body.trim()), (200, "ok"));
    // A path it does not serve is not found (a probe with a mistyped path fails), and says
    // which are; a gRPC call of another service is UNIMPLEMENTED.
    for path in ["/health", "/", "/metrics/"] {
        let (code, body) = support::http_get(proxy.management_port, path)
            .await
            .expect("an answer");
        assert_eq!(
            (code, body.as_str()),
            (404, flagd_proxy::management::NO_ROUTE),
            "{path}"
        );
    }
    let mut wrong_port = Client::new(support::client::channel(proxy.management_port).await);
    let status = wrong_port
        .get_metadata(v1::GetMetadataRequest {})
        .await
        .expect_err("no sync service on the management port");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
}

#[tokio::test]
async fn client_keepalive_pings_without_streams_are_accepted() {
    let (_dir, proxy) = manifests_proxy().await;
    // The client's connection goes through a tap that counts its PINGs on the wire, and the
    // server's GOAWAYs.
    let tap = support::raw_h2::FrameTap::start(proxy.port).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", tap.port))
        .expect("endpoint")
        .http2_keep_alive_interval(Duration::from_millis(50))
        .keep_alive_while_idle(true)
        .keep_alive_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    let mut client = Client::new(channel);
    client
        .get_metadata(v1::GetMetadataRequest {})
        .await
        .expect("first call");
    proxy.wait_for_metric("sync_active_streams", 0.0).await;
    // Twenty pings on the idle connection; a server that objects to them sends GOAWAY and the
    // connection's next call fails.
    let pings = support::eventually("twenty keepalive pings on the wire", || async {
        match tap.tapped.client_pings.load(Ordering::SeqCst) {
            n if n >= 20 => Ok(n),
            n => Err(format!("{n} pings so far")),
        }
    })
    .await;
    client
        .get_metadata(v1::GetMetadataRequest {})
        .await
        .unwrap_or_else(|status| panic!("connection unusable after {pings} pings: {status:?}"));
    assert_eq!(
        tap.tapped.server_goaways.load(Ordering::SeqCst),
        0,
        "the server objected to {pings} pings"
    );
}
