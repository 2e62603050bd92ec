//! Tests of the metrics: the refusal reasons and process metrics exported, and the gauges of
//! the watched resources.
use super::*;

#[test]
fn every_refusal_reason_is_exported_from_the_start() {
    let text = Metrics::new().encode();
    for reason in REJECT_REASONS {
        let line = format!("flagd_proxy_rejected_requests_total{{reason=\"{reason}\"}} 0");
        assert!(text.contains(&line), "{line} in {text}");
    }
}

#[test]
fn process_metrics_are_exported() {
    let text = Metrics::new().encode();
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .parse()
            .expect("a number")
    };
    assert!(value("process_resident_memory_bytes") > 0.0);
    assert!(value("process_cpu_seconds_total") >= 0.0);
}

#[test]
fn resources_are_counted_by_state_and_refused_versions_named() {
    let metrics = Metrics::new();
    let states = ["present", "invalid"];
    let resource = |namespace, name, state, subscribers| WatchedResource {
        namespace,
        name,
        state,
        stale: state == "unreachable",
        subscribers,
    };
    metrics.observe_resources(
        &states,
        [
            resource("a", "one", "present", 3),
            resource("b", "two", "invalid", 1),
            resource("c", "three", "absent", 0),
            resource("d", "four", "unreachable", 1),
        ],
    );
    let text = metrics.encode();
    for line in [
        "flagd_proxy_stale_resources 1",
        "flagd_proxy_watched_resources{state=\"present\"} 1",
        "flagd_proxy_watched_resources{state=\"invalid\"} 1",
        "flagd_proxy_watched_resources{state=\"absent\"} 1",
        "flagd_proxy_version_rejected{namespace=\"b\",name=\"two\"} 1",
        "flagd_proxy_subscribers{namespace=\"a\",name=\"one\"} 3",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    // Fixed: the series goes, and the count of a listed state stays, at 0.
    metrics.observe_resources(&states, [resource("b", "two", "present", 2)]);
    let text = metrics.encode();
    assert!(!text.contains("flagd_proxy_version_rejected{"), "{text}");
    assert!(
        text.contains("flagd_proxy_watched_resources{state=\"invalid\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("flagd_proxy_watched_resources{state=\"present\"} 1"),
        "{text}"
    );
    assert!(!text.contains("state=\"absent\""), "{text}");
    assert!(text.contains("flagd_proxy_stale_resources 0"), "{text}");
    assert!(
        !text.contains("flagd_proxy_subscribers{namespace=\"a\""),
        "{text}"
    );
}
