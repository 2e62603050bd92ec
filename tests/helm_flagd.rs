//! The chart's flagd workloads (`flagd.deployment`, `flagd.daemonset`), rendered with
//! `helm template`: what flagd syncs from (which tier, which FeatureFlags, TLS), the Services
//! RPC-mode providers dial, the restricted security context and probes, and that none of the
//! proxy's selectors (Services, PodDisruptionBudget, NetworkPolicy) picks up flagd pods.
//! The cluster tests (tests/cluster/) run the same workloads for real.
use flagd_proxy_testkit as support;

use std::collections::BTreeMap;

use serde_json::{Value, json};
use support::helm::ChartRenderer;
use support::or_return;

const RELEASE: &str = "flagd-proxy";
const NS: &str = "flags";

/// The sync addresses of the central and the node tier's Services of the release in [`NS`].
fn tier_addresses() -> (String, String) {
    (
        format!("flagd-proxy-svc.{NS}.svc.cluster.local:8015"),
        format!("flagd-proxy-node.{NS}.svc.cluster.local:8015"),
    )
}
const FLAGS: &str = "flagd.featureFlags={apps/demo,team-b/checkout}";

fn render(helm: &ChartRenderer, sets: &[&str]) -> Vec<Value> {
    helm.render(RELEASE, NS, sets)
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == json!(kind) && o["metadata"]["name"] == json!(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in {:?}", names(objects)))
}

fn names(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]))
        .collect()
}

fn labels(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect()
}

fn selects(selector: &Value, pod_labels: &BTreeMap<String, String>) -> bool {
    let selector = labels(selector);
    !selector.is_empty() && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
}

fn flagd_container(workload: &Value) -> &Value {
    let containers = workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// flagd's `--sources`, parsed.
fn sources(workload: &Value) -> Vec<Value> {
    let args: Vec<&str> = flagd_container(workload)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg"))
        .collect();
    assert_eq!(
        &args[..5],
        &["start", "--port", "8013", "--management-port", "8014"]
    );
    let at = args
        .iter()
        .position(|a| *a == "--sources")
        .expect("--sources");
    serde_json::from_str::<Vec<Value>>(args[at + 1]).expect("--sources is a JSON list")
}

/// One gRPC source per FeatureFlag, all from `uri`.
fn assert_sources(what: &str, workload: &Value, uri: &str, tls: bool) {
    let mut want = Vec::new();
    for flag in ["apps/demo", "team-b/checkout"] {
        let mut source = json!({
            "uri": uri,
            "provider": "grpc",
            "selector": format!("core.openfeature.dev/{flag}"),
        });
        if tls {
            source["tls"] = json!(true);
            source["certPath"] = json!("/etc/flagd/proxy-ca/ca.crt");
        }
        want.push(source);
    }
    assert_eq!(sources(workload), want, "{what}: sources");
}

/// The "restricted" Pod Security Standard's fields, the probes and the ports.
fn assert_pod(what: &str, workload: &Value) {
    let pod = &workload["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"]["runAsNonRoot"],
        json!(true),
        "{what}"
    );
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        json!("RuntimeDefault"),
        "{what}"
    );
    assert_eq!(pod["automountServiceAccountToken"], json!(false), "{what}");
    let c = flagd_container(workload);
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], json!(false), "{what}");
    assert_eq!(sc["readOnlyRootFilesystem"], json!(true), "{what}");
    assert_eq!(sc["runAsNonRoot"], json!(true), "{what}");
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{what}");
    assert_eq!(
        sc["seccompProfile"]["type"],
        json!("RuntimeDefault"),
        "{what}"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["path"], json!(path), "{what}: {probe}");
        assert_eq!(
            c[probe]["httpGet"]["port"],
            json!("management"),
            "{what}: {probe}"
        );
    }
    assert_eq!(
        c["ports"],
        json!([
            {"name": "evaluation", "containerPort": 8013, "protocol": "TCP"},
            {"name": "management", "containerPort": 8014, "protocol": "TCP"}
        ]),
        "{what}: ports"
    );
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        assert!(volume["secret"].is_object(), "{what}: volume {volume}");
    }
}

/// The Service selects exactly the workload's pods, on flagd's evaluation port.
fn assert_service(what: &str, service: &Value, workload: &Value, local: bool) {
    let pod_labels = labels(&workload["spec"]["template"]["metadata"]["labels"]);
    assert!(
        selects(&service["spec"]["selector"], &pod_labels),
        "{what}: the Service selects the pods"
    );
    assert_eq!(
        service["spec"]["selector"], workload["spec"]["selector"]["matchLabels"],
        "{what}: Service and workload select alike"
    );
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "evaluation", "port": 8013, "targetPort": "evaluation", "protocol": "TCP"}]),
        "{what}: Service ports"
    );
    let policy = &service["spec"]["internalTrafficPolicy"];
    if local {
        assert_eq!(policy, &json!("Local"), "{what}: node-local Service");
    } else {
        assert!(policy.is_null(), "{what}: cluster-wide Service");
    }
}

/// No Service, PodDisruptionBudget or NetworkPolicy of the proxy selects flagd pods, and the
/// NetworkPolicy lets them open the proxy's sync port.
fn assert_apart_from_the_proxy(what: &str, objects: &[Value], workload: &Value) {
    let pod_labels = labels(&workload["spec"]["template"]["metadata"]["labels"]);
    let flagd_services: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == json!("Service"))
        .filter(|o| o["metadata"]["labels"]["app.kubernetes.io/name"] == json!("flagd"))
        .collect();
    for object in objects {
        let selector = match object["kind"].as_str() {
            Some("Service") if !flagd_services.contains(&object) => &object["spec"]["selector"],
            Some("PodDisruptionBudget") => &object["spec"]["selector"]["matchLabels"],
            Some("NetworkPolicy") => &object["spec"]["podSelector"]["matchLabels"],
            Some("Deployment" | "DaemonSet") if object != workload => {
                &object["spec"]["selector"]["matchLabels"]
            }
            _ => continue,
        };
        assert!(
            !selects(selector, &pod_labels),
            "{what}: {} {} selects flagd pods",
            object["kind"],
            object["metadata"]["name"]
        );
    }
    let policy = find(objects, "NetworkPolicy", RELEASE);
    let allowed = policy["spec"]["ingress"]
        .as_array()
        .expect("ingress rules")
        .iter()
        .any(|rule| {
            rule["ports"] == json!([{"port": "grpc", "protocol": "TCP"}])
                && rule["from"].as_array().into_iter().flatten().any(|peer| {
                    peer["namespaceSelector"].is_null()
                        && selects(&peer["podSelector"]["matchLabels"], &pod_labels)
                })
        });
    assert!(
        allowed,
        "{what}: the NetworkPolicy admits flagd pods of this release to the sync port"
    );
}

#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn flagd_workloads_are_off_by_default() {
    let helm = or_return!(ChartRenderer::find_or_skip());
    for mode in ["central", "both"] {
        let objects = render(&helm, &[&format!("mode={mode}")]);
        let flagd: Vec<String> = objects
            .iter()
            .filter(|o| o["metadata"]["labels"]["app.kubernetes.io/name"] == json!("flagd"))
            .map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]))
            .collect();
        assert!(flagd.is_empty(), "mode={mode}: {flagd:?}");
        let policy = find(&objects, "NetworkPolicy", RELEASE);
        assert!(
            !policy.to_string().contains("\"flagd\""),
            "mode={mode}: no flagd rule in the NetworkPolicy"
        );
    }
}

#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn both_shapes_sync_from_the_matching_tier_in_every_mode() {
    let helm = or_return!(ChartRenderer::find_or_skip());
    let (central, node) = tier_addresses();
    let upstream = "node.upstream.address=flagd-proxy-svc.central.svc.cluster.local:8015";
    // (mode, extra values, what the Deployment's flagd dials, what the DaemonSet's flagd dials)
    let cases: [(&str, &[&str], &str, &str); 3] = [
        ("central", &[], &central, &central),
        ("node", &[upstream], &node, &node),
        ("both", &[], &central, &node),
    ];
    for (mode, extra, deployment_uri, daemonset_uri) in cases {
        let mode_set = format!("mode={mode}");
        let mut sets = vec![
            mode_set.as_str(),
            FLAGS,
            "flagd.deployment.enabled=true",
            "flagd.daemonset.enabled=true",
        ];
        sets.extend_from_slice(extra);
        let objects = render(&helm, &sets);
        let what = format!("mode={mode}");

        let deployment = find(&objects, "Deployment", "flagd-proxy-flagd");
        assert_eq!(deployment["spec"]["replicas"], json!(2), "{what}");
        assert_sources(&what, deployment, deployment_uri, false);
        assert_pod(&what, deployment);
        let service = find(&objects, "Service", "flagd-proxy-flagd");
        assert_service(&what, service, deployment, false);
        assert_apart_from_the_proxy(&what, &objects, deployment);

        let daemonset = find(&objects, "DaemonSet", "flagd-proxy-flagd-node");
        assert_sources(&what, daemonset, daemonset_uri, false);
        assert_pod(&what, daemonset);
        assert_eq!(
            daemonset["spec"]["updateStrategy"]["rollingUpdate"],
            json!({"maxSurge": 1, "maxUnavailable": 0}),
            "{what}: a node keeps its flagd through an update"
        );
        let service = find(&objects, "Service", "flagd-proxy-flagd-node");
        assert_service(&what, service, daemonset, true);
        assert_apart_from_the_proxy(&what, &objects, daemonset);
    }
}

#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn values_set_image_replicas_resources_and_service_names() {
    let helm = or_return!(ChartRenderer::find_or_skip());
    let objects = render(
        &helm,
        &[
            FLAGS,
            "flagd.deployment.enabled=true",
            "flagd.deployment.replicas=3",
            "flagd.deployment.service.name=flagd-rpc",
            "flagd.deployment.resources.limits.memory=1Gi",
            "flagd.daemonset.enabled=true",
            "flagd.daemonset.service.name=flagd-local",
            "flagd.image.repository=registry.example.com/flagd",
            "flagd.image.tag=v9.9.9",
            "flagd.extraArgs={--debug}",
        ],
    );
    let deployment = find(&objects, "Deployment", "flagd-proxy-flagd");
    assert_eq!(deployment["spec"]["replicas"], json!(3));
    let c = flagd_container(deployment);
    assert_eq!(c["image"], json!("registry.example.com/flagd:v9.9.9"));
    assert_eq!(c["resources"]["limits"]["memory"], json!("1Gi"));
    assert_eq!(
        c["args"].as_array().and_then(|a| a.last()),
        Some(&json!("--debug"))
    );
    find(&objects, "Service", "flagd-rpc");
    find(&objects, "Service", "flagd-local");
}

#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn flagd_verifies_the_proxy_with_the_tls_secrets_ca_when_its_tier_serves_tls() {
    let helm = or_return!(ChartRenderer::find_or_skip());
    let (central, node) = tier_addresses();
    // mode=both with TLS on the central tier only: the Deployment's flagd (central) uses TLS,
    // the DaemonSet's (node tier, plaintext) does not; with node.tls.enabled both do.
    for (node_tls, daemonset_tls) in [("false", false), ("true", true)] {
        let node_set = format!("node.tls.enabled={node_tls}");
        let objects = render(
            &helm,
            &[
                "mode=both",
                "tls.enabled=true",
                "tls.secretName=proxy-cert",
                &node_set,
                FLAGS,
                "flagd.deployment.enabled=true",
                "flagd.daemonset.enabled=true",
            ],
        );
        let deployment = find(&objects, "Deployment", "flagd-proxy-flagd");
        assert_sources("deployment", deployment, &central, true);
        let daemonset = find(&objects, "DaemonSet", "flagd-proxy-flagd-node");
        assert_sources("daemonset", daemonset, &node, daemonset_tls);
        for (workload, tls) in [(deployment, true), (daemonset, daemonset_tls)] {
            let pod = &workload["spec"]["template"]["spec"];
            if tls {
                assert_eq!(
                    pod["volumes"],
                    json!([{"name": "proxy-ca", "secret": {"secretName": "proxy-cert",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}]}}])
                );
                assert_eq!(
                    flagd_container(workload)["volumeMounts"],
                    json!([{"name": "proxy-ca", "mountPath": "/etc/flagd/proxy-ca",
                            "readOnly": true}])
                );
            } else {
                assert!(pod["volumes"].is_null(), "no CA volume without TLS");
            }
        }
    }
}

#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn invalid_flagd_values_are_refused_with_a_message() {
    let helm = or_return!(ChartRenderer::find_or_skip());
    let cases: [(&[&str], &str); 4] = [
        (
            &["flagd.deployment.enabled=true"],
            "need flagd.featureFlags",
        ),
        (
            &["flagd.daemonset.enabled=true", "flagd.featureFlags={demo}"],
            "featureFlags",
        ),
        (
            &[
                FLAGS,
                "flagd.deployment.enabled=true",
                "flagd.daemonset.enabled=true",
                "flagd.deployment.service.name=same",
                "flagd.daemonset.service.name=same",
            ],
            "must differ",
        ),
        (&["flagd.deployment.replica=2"], "replica"),
    ];
    for (sets, want) in cases {
        helm.assert_refused(RELEASE, NS, sets, want);
    }
}
