//! `flagd-proxy status` against a running proxy, over its real management port: subscribers,
//! a refused version and a refused watch show up as the proxy sees them, as a table and as JSON.
use std::process::{Command, Output};

use flagd_proxy_testkit as support;
use serde_json::{Value, json};
use support::client;

/// A flag whose default variant is not one of its variants: a version holding it is refused.
fn invalid_flag(key: &str) -> Value {
    json!({key: {"state": "ENABLED", "variants": {"s": "s"}, "defaultVariant": "m"}})
}

fn status(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flagd-proxy"))
        .arg("status")
        .args(args)
        .env_remove("FLAGD_PROXY_STATUS_ADDRESS")
        .env_remove("FLAGD_PROXY_STATUS_OUTPUT")
        .output()
        .expect("run flagd-proxy status")
}

/// Runs `status` against `address`, which must fail (exit status 1, nothing printed on
/// stdout): its message.
fn status_error(address: &str) -> String {
    let output = status(&["--address", address]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(output.stdout.is_empty(), "{stderr}");
    stderr
}

#[tokio::test]
async fn status_shows_resources_watches_and_limits_of_a_running_proxy() {
    let manifests = tempfile::tempdir().expect("a manifests folder");
    let dir = manifests.path();
    support::write_color(dir, "default", "demo", "red", &["red", "blue"]);
    support::write_manifest(
        dir,
        "shop",
        "checkout",
        support::string_flag("size", "s", &["s", "m"]),
    );
    let manifests_arg = dir.display().to_string();
    let proxy = support::Proxy::start(&["--manifests", &manifests_arg, "--max-watches", "2"]).await;

    let mut c = client::client(&proxy).await;
    let mut demo = Vec::new();
    for _ in 0..2 {
        let mut stream = client::open(&mut c, "core.openfeature.dev/default/demo")
            .await
            .expect("a demo stream");
        client::next(&mut stream).await;
        demo.push(stream);
    }
    let mut checkout = client::open(&mut c, "core.openfeature.dev/shop/checkout")
        .await
        .expect("a checkout stream");
    client::next(&mut checkout).await;

    // A newer version of checkout that clients cannot use: they keep version 1.
    support::write_manifest(dir, "shop", "checkout", invalid_flag("size"));
    proxy
        .wait_for_metric(
            "flagd_proxy_invalid_documents_total{namespace=\"shop\",name=\"checkout\"}",
            1.0,
        )
        .await;
    // A third resource is over --max-watches.
    let refused = client::open(&mut c, "core.openfeature.dev/default/other").await;
    let refused = match refused {
        Ok(mut stream) => client::next_message(&mut stream)
            .await
            .expect_err("refused"),
        Err(status) => status,
    };
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );

    let address = format!("127.0.0.1:{}", proxy.management_port);
    let output = status(&["--address", &address, "-o", "json"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(report["ready"], true);
    assert_eq!(report["source"], "manifests");
    assert_eq!(report["watches"], json!({"active": 2, "waiting": 0}));
    assert_eq!(report["limitsHit"], json!({"max_watches": 1}));
    assert_eq!(report["invalidVersions"], json!({"shop/checkout": 1}));
    assert_eq!(report["certificateExpiresAt"], Value::Null);
    let resources = report["resources"].as_array().expect("resources");
    assert_eq!(resources.len(), 2, "{stdout}");
    let demo_row = &resources[0];
    assert_eq!(demo_row["selector"], "core.openfeature.dev/default/demo");
    assert_eq!(demo_row["state"], "present");
    assert_eq!(demo_row["version"], 1);
    assert_eq!(demo_row["subscribers"], 2);
    assert_eq!(demo_row["lastError"], Value::Null);
    assert!(demo_row["versionAgeSeconds"].as_f64().is_some(), "{stdout}");
    let checkout_row = &resources[1];
    assert_eq!(
        checkout_row["selector"],
        "core.openfeature.dev/shop/checkout"
    );
    assert_eq!(checkout_row["state"], "invalid");
    assert_eq!(checkout_row["version"], 1, "clients keep the good version");
    assert_eq!(checkout_row["subscribers"], 1);
    let error = checkout_row["lastError"].as_str().expect("an error");
    assert!(error.contains("is not one of the variants"), "{error}");

    let output = status(&["--address", &address]);
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{table}");
    assert!(
        table.starts_with(&format!(
            "flagd-proxy at {address}: ready, source manifests (2 resources in the files)\n"
        )),
        "{table}"
    );
    let row = |selector: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.starts_with(selector))
            .unwrap_or_else(|| panic!("no row for {selector}:\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        row("core.openfeature.dev/default/demo")[1..3],
        ["present", "1"]
    );
    assert_eq!(row("core.openfeature.dev/default/demo")[4..], ["2", "-"]);
    assert_eq!(
        row("core.openfeature.dev/shop/checkout")[1..3],
        ["invalid", "1"]
    );
    assert!(
        table.contains("\nWatches:      2 active, 0 waiting"),
        "{table}"
    );
    assert!(table.contains("\nLimits hit:   max_watches 1\n"), "{table}");
    assert!(
        table.contains("\nRefused versions: shop/checkout 1\n"),
        "{table}"
    );
    drop((demo, checkout));
}

#[test]
fn status_of_a_port_where_nothing_listens_fails_with_the_reason() {
    let address = format!("127.0.0.1:{}", support::free_port());
    let stderr = status_error(&address);
    assert!(
        stderr.starts_with(&format!(
            "flagd-proxy: cannot connect to the management port at {address}: "
        )),
        "{stderr}"
    );
}

/// Accepts one connection on `listener` and reads its request head: the connection and the
/// request's path.
fn accept_request(listener: &std::net::TcpListener) -> (std::net::TcpStream, String) {
    use std::io::Read as _;
    let (mut stream, _) = listener.accept().expect("a connection");
    let mut head = Vec::new();
    let mut buffer = [0; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buffer).expect("the request");
        assert_ne!(n, 0, "the request head ends early");
        head.extend_from_slice(&buffer[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).expect("a request line").to_owned();
    (stream, path)
}

/// A management port that streams garbage as the answer to `/status` (up to 128 MiB, then it
/// closes; "endless" for a client that reads a few MiB): `status` reads no more than its limit,
/// says so, and closes the connection, so the port sees its writes fail long before the end.
#[test]
fn status_reads_a_bounded_answer_from_a_hostile_port() {
    use std::io::Write as _;
    const SENT_AT_MOST: usize = 128 << 20;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let port = std::thread::spawn(move || {
        let (mut stream, _) = accept_request(&listener);
        let chunk = vec![b'x'; 64 << 10];
        let mut sent = 0;
        let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n";
        if stream.write_all(head).is_err() {
            return sent;
        }
        while sent < SENT_AT_MOST && stream.write_all(&chunk).is_ok() {
            sent += chunk.len();
        }
        sent
    });
    let stderr = status_error(&address);
    assert!(
        stderr.contains(&format!(
            "GET /status from {address}: the answer is larger than 16 MiB"
        )),
        "{stderr}"
    );
    let sent = port.join().expect("the port's thread");
    assert!(
        sent < SENT_AT_MOST,
        "the client read all {sent} bytes instead of closing at its limit"
    );
}

/// The characters a hostile management port puts in its answers to act on a terminal: ESC
/// sequences, the one-character CSI (U+009B), DEL, a line break that forges a line, and a
/// right-to-left override.
const HOSTILE: &str = "\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}31m\u{7f}\nFORGED LINE\u{202e}";

/// A management port whose answers carry [`HOSTILE`] text in every field `status` prints (the
/// source, a selector, a state, an error, a file name and its error, metric labels): neither the
/// table nor the JSON prints one of its characters raw; the table shows them escaped, and the
/// JSON still holds the same strings.
#[test]
fn status_prints_no_control_characters_from_the_wire() {
    use std::io::Write as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let page = json!({
        "ready": true,
        "source": format!("manifests{HOSTILE}"),
        "sourceStatus": {"resources": 1, "apiServer": HOSTILE, "problems": [
            {"path": format!("/flags/{HOSTILE}.yaml"), "error": HOSTILE}
        ]},
        "resources": [
            {"selector": format!("core.openfeature.dev/default/{HOSTILE}"),
             "availability": HOSTILE, "reason": HOSTILE, "version": 1, "bytes": 10,
             "subscribers": 1}
        ]
    })
    .to_string();
    let label = HOSTILE.replace('\n', "\\n");
    let metrics = format!(
        "flagd_proxy_rejected_requests_total{{reason=\"{label}\"}} 1\n\
         flagd_proxy_open_connections{{port=\"{label}\"}} 1\n\
         flagd_proxy_memory_charged_bytes{{kind=\"{label}\"}} 1\n"
    );
    // Two requests for each of the two runs.
    let port = std::thread::spawn(move || {
        for _ in 0..4 {
            let (mut stream, path) = accept_request(&listener);
            let body = if path == "/status" { &page } else { &metrics };
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }
    });
    let raw = |text: &str| {
        text.chars()
            .any(|c| c != '\n' && (c.is_control() || c == '\u{202e}'))
    };

    let output = status(&["--address", &address]);
    let table = String::from_utf8(output.stdout).expect("UTF-8");
    assert!(output.status.success(), "{table}");
    assert!(!raw(&table), "{table:?}");
    assert!(!table.contains("\nFORGED LINE"), "{table}");
    let escaped = r"\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}31m\u{7f}\nFORGED LINE\u{202e}";
    for shown in [
        format!("source manifests{escaped}"),
        format!("core.openfeature.dev/default/{escaped}"),
        format!("Source problem: /flags/{escaped}.yaml: {escaped}"),
        format!("Limits hit:   {escaped} 1"),
    ] {
        assert!(table.contains(&shown), "{shown} in {table}");
    }

    let output = status(&["--address", &address, "-o", "json"]);
    let json = String::from_utf8(output.stdout).expect("UTF-8");
    assert!(output.status.success(), "{json}");
    assert!(!raw(&json), "{json:?}");
    let report: Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(report["resources"][0]["lastError"], HOSTILE);
    assert_eq!(report["sourceStatus"]["problems"][0]["error"], HOSTILE);
    port.join().expect("the port's thread");
}
