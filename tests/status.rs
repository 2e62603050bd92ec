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
    let output = status(&["--address", &address]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "flagd-proxy: cannot connect to the management port at {address}: "
        )),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}
