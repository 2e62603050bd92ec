//! Tests of `status`: a report built from a status page and metrics, and how it prints.
use std::time::UNIX_EPOCH;

use super::render::age;
use super::*;
use crate::introspection::{Samples, StatusPage};
use serde_json::Value;

const METRICS: &str = "# HELP flagd_proxy_upstream_watches Resources\n\
    # TYPE flagd_proxy_upstream_watches gauge\n\
    flagd_proxy_upstream_watches 2\n\
    flagd_proxy_waiting_resources 1\n\
    flagd_proxy_rejected_requests_total{reason=\"max_watches\"} 3\n\
    flagd_proxy_rejected_requests_total{reason=\"max_connections\"} 0\n\
    flagd_proxy_invalid_documents_total{namespace=\"shop\",name=\"checkout\"} 2\n\
    flagd_proxy_open_connections{port=\"sync\"} 5\n\
    flagd_proxy_open_connections{port=\"management\"} 1\n\
    flagd_proxy_tls_certificate_expiry_timestamp_seconds 864000\n\
    flagd_proxy_memory_budget_bytes 8388608\n\
    flagd_proxy_memory_charged_bytes{kind=\"versions\"} 1048576\n\
    flagd_proxy_memory_charged_bytes{kind=\"streams\"} 1048576\n\
    # EOF\n";

fn report() -> Report {
    let page: StatusPage = serde_json::from_value(serde_json::json!({
        "ready": true,
        "source": "manifests",
        "sourceStatus": {"resources": 2, "selectors": [], "problems": [
            {"path": "/flags/bad.yaml", "error": "not YAML"}
        ]},
        "resources": [
            {"selector": "core.openfeature.dev/default/demo", "availability": "present",
             "reason": null, "version": 3, "bytes": 120, "subscribers": 4,
             "versionAgeSeconds": 75.5},
            {"selector": "core.openfeature.dev/shop/checkout", "availability": "invalid",
             "reason": "flag \"size\": defaultVariant \"m\" is not one of the variants",
             "version": 1, "bytes": 80, "subscribers": 0},
            {"selector": "core.openfeature.dev/shop/cart", "availability": "unreachable",
             "stale": true, "reason": "cannot reach the upstream: tcp connect error: Connection refused",
             "version": 1, "bytes": 50, "subscribers": 2, "versionAgeSeconds": 2.0}
        ]
    }))
    .expect("a status page");
    Report::new("127.0.0.1:8016", page, &Samples::parse(METRICS))
}

#[test]
fn the_memory_budget_and_its_charges_are_summed_up() {
    let memory = report().memory;
    assert_eq!(memory.budget, 8 << 20);
    assert_eq!(
        memory.summary(),
        "2.0 MiB charged of 8.0 MiB budget (streams 1.0 MiB, versions 1.0 MiB)"
    );
    let idle = Memory {
        charged: BTreeMap::new(),
        ..memory
    };
    assert_eq!(idle.summary(), "0.0 MiB charged of 8.0 MiB budget");
}

#[test]
fn metrics_fill_watches_connections_and_limits() {
    let report = report();
    assert_eq!(
        report.watches,
        Watches {
            active: 2,
            waiting: 1
        }
    );
    assert_eq!(
        report.limits_hit,
        BTreeMap::from([("max_watches".to_owned(), 3)]),
        "limits that refused nothing are left out"
    );
    assert_eq!(
        report.invalid_versions,
        BTreeMap::from([("shop/checkout".to_owned(), 2)])
    );
    assert_eq!(report.connections["sync"], 5);
    assert_eq!(report.certificate_expires_at, Some(864_000));
}

#[test]
fn the_table_shows_each_resource_and_what_went_wrong() {
    let now = UNIX_EPOCH + Duration::from_secs(864_000 - 3 * 86_400);
    let table = report().to_table(now);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0],
        "flagd-proxy at 127.0.0.1:8016: ready, source manifests (2 resources in the files)"
    );
    let mut one = report();
    if let crate::introspection::SourceStatus::Manifests(manifests) = &mut one.source_status {
        manifests.resources = 1;
    }
    assert!(one.to_table(now).starts_with(
        "flagd-proxy at 127.0.0.1:8016: ready, source manifests (1 resource in the files)\n"
    ));
    assert!(lines[2].starts_with("RESOURCE "), "{table}");
    assert!(lines[2].ends_with("SUBSCRIBERS  LAST ERROR"), "{table}");
    let demo = lines[3].split_whitespace().collect::<Vec<_>>();
    assert_eq!(
        demo,
        [
            "core.openfeature.dev/default/demo",
            "present",
            "3",
            "1m15s",
            "4",
            "-"
        ]
    );
    let checkout = lines[4].split_whitespace().collect::<Vec<_>>();
    assert_eq!(
        checkout[..6],
        [
            "core.openfeature.dev/shop/checkout",
            "invalid",
            "1",
            "-",
            "0",
            "flag"
        ]
    );
    assert!(lines[4].ends_with("defaultVariant \"m\" is not one of the variants"));
    // A version kept from an earlier run, served while the source is away.
    let cart = lines[5].split_whitespace().collect::<Vec<_>>();
    assert_eq!(
        cart[..7],
        [
            "core.openfeature.dev/shop/cart",
            "unreachable,",
            "stale",
            "1",
            "2s",
            "2",
            "cannot"
        ]
    );
    assert!(
        table.contains("Watches:      2 active, 1 waiting"),
        "{table}"
    );
    assert!(table.contains("Limits hit:   max_watches 3\n"), "{table}");
    assert!(table.contains("Certificate:  expires in 3d0h\n"), "{table}");
    assert!(
        table.contains("Source problem: /flags/bad.yaml: not YAML\n"),
        "{table}"
    );
    let expired = report().to_table(UNIX_EPOCH + Duration::from_secs(864_000 + 90));
    assert!(
        expired.contains("Certificate:  EXPIRED 1m30s ago"),
        "{expired}"
    );
}

#[test]
fn json_keeps_every_field_for_scripts() {
    let json: Value = serde_json::from_str(&report().to_json()).expect("JSON");
    assert_eq!(json["resources"][0]["versionAgeSeconds"], 75.5);
    assert_eq!(
        json["resources"][1]["lastError"],
        "flag \"size\": defaultVariant \"m\" is not one of the variants"
    );
    assert_eq!(
        (
            &json["resources"][0]["stale"],
            &json["resources"][2]["stale"]
        ),
        (&Value::Bool(false), &Value::Bool(true))
    );
    assert_eq!(json["limitsHit"]["max_watches"], 3);
    assert_eq!(json["watches"]["active"], 2);
    assert_eq!(json["sourceStatus"]["resources"], 2);
}

#[test]
fn ages_read_in_their_two_largest_units() {
    let cases = [
        (0, "0s"),
        (59, "59s"),
        (60, "1m0s"),
        (3599, "59m59s"),
        (3600, "1h0m"),
        (86_399, "23h59m"),
        (86_400 * 14 + 7200, "14d2h"),
    ];
    for (secs, text) in cases {
        assert_eq!(age(Duration::from_secs(secs)), text);
    }
}
