//! The Helm chart in `charts/flagd-proxy`: `helm lint` and `helm template` in every mode (with TLS,
//! cert-manager and the ServiceMonitor toggled), checks on the rendered objects, and then the
//! real thing: every rendered object is applied to a real kube-apiserver (see
//! `testkit/src/control_plane.rs`) with strict field validation, the pod templates are admitted as
//! bare pods (dry run) in a namespace that enforces the "restricted" Pod Security Standard, and
//! RBAC is asked what each tier's service account may do.
//!
//! helm comes from `scripts/install-helm.sh` (`${FLAGD_PROXY_CACHE:-~/.cache/flagd-proxy}/bin/helm`),
//! `FLAGD_PROXY_HELM`, or `PATH`. Without helm, or without the control-plane binaries, these tests
//! print a notice and pass, unless `CI` is set.
use flagd_proxy_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::{self, Scope};
use serde::Deserialize;
use serde_json::{Value, json};
use support::control_plane::{self, ControlPlane};
use support::eventually;
use support::or_return;

mod apiserver;
mod cases;
mod checks;
mod driver;
mod objects;

use apiserver::*;
use cases::*;
use checks::*;
use driver::*;
use objects::*;

/// Kinds that need CRDs the test control plane does not have: rendered and checked, not applied.
const CRD_KINDS: [&str; 3] = ["ServiceMonitor", "PrometheusRule", "Certificate"];

const FIELD_MANAGER: &str = "flagd-proxy-helm-test";

// ---------------------------------------------------------------------------------------------
// Tests without a cluster

#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn chart_lints_and_renders_in_every_mode() {
    let helm = or_return!(Helm::find_or_skip());
    for case in cases() {
        helm.lint(&case);
        let objects = helm.template(&case);
        check_rendered(&case, &objects);
    }
}

/// The node tier's unix socket is an opt-in: a hostPath directory mounted at the same path, the
/// socket flags, and nothing of it by default.
#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn node_socket_is_an_opt_in_hostpath() {
    let helm = or_return!(Helm::find_or_skip());
    let daemonset = |case: &Case| {
        let objects = helm.template(case);
        one_of(&objects, "DaemonSet").clone()
    };
    let plain = daemonset(&Case::new(
        "node",
        "node",
        &[("node.upstream.address", CENTRAL_UPSTREAM)],
    ));
    assert!(!args(&plain).iter().any(|a| a.starts_with("--sync-socket")));
    assert_eq!(
        plain["spec"]["template"]["spec"]["volumes"],
        json!([state_volume()]),
        "only the state directory"
    );

    let case = Case::new(
        "node-socket",
        "node",
        &[
            ("node.upstream.address", CENTRAL_UPSTREAM),
            ("node.socket.enabled", "true"),
            ("node.socket.hostPath", "/run/flags/"),
            ("node.socket.mode", "0666"),
            ("node.socket.only", "true"),
        ],
    );
    helm.lint(&case);
    let ds = daemonset(&case);
    let args = args(&ds);
    assert_eq!(
        arg_value(&args, "--sync-socket-path"),
        Some("/run/flags/sync.sock")
    );
    assert_eq!(arg_value(&args, "--sync-socket-mode"), Some("0666"));
    assert!(args.iter().any(|a| a == "--sync-socket-only"));
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"],
        json!([{"name": "sync-socket",
                "hostPath": {"path": "/run/flags", "type": "DirectoryOrCreate"}},
               state_volume()])
    );
    assert_eq!(
        container(&ds)["volumeMounts"],
        json!([{"name": "sync-socket", "mountPath": "/run/flags"},
               {"name": "state", "mountPath": "/var/lib/flagd-proxy"}])
    );
}

/// The state directory's volume as the chart's defaults make it.
fn state_volume() -> Value {
    json!({"name": "state", "emptyDir": {"sizeLimit": "80Mi"}})
}

/// Both tiers keep their last versions in an emptyDir by default (flags the proxy's own command
/// line accepts); `stateDir.enabled=false` leaves out the flags and the volume.
#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn both_tiers_keep_their_versions_in_an_empty_dir_by_default() {
    let helm = or_return!(Helm::find_or_skip());
    let on = helm.template(&Case::new(
        "state-dir",
        "both",
        &[("stateDir.path", "/state"), ("stateDir.maxBytes", "8Mi")],
    ));
    for workload in [one_of(&on, "Deployment"), one_of(&on, "DaemonSet")] {
        let start = start_args(workload);
        assert_eq!(
            start.state.into_settings(),
            Some(flagd_proxy::state::StateSettings {
                dir: "/state".into(),
                max_bytes: 8 << 20,
            })
        );
        assert!(
            container(workload)["volumeMounts"]
                .as_array()
                .expect("volume mounts")
                .contains(&json!({"name": "state", "mountPath": "/state"})),
            "{workload}"
        );
        assert!(
            workload["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .expect("volumes")
                .contains(&state_volume()),
            "{workload}"
        );
    }
    let off = helm.template(&Case::new(
        "state-dir-off",
        "both",
        &[("stateDir.enabled", "false")],
    ));
    for workload in [one_of(&off, "Deployment"), one_of(&off, "DaemonSet")] {
        assert!(!args(workload).iter().any(|a| a.starts_with("--state-dir")));
        assert!(workload["spec"]["template"]["spec"]["volumes"].is_null());
    }
}

/// OpenTelemetry export is an opt-in of both tiers: the flags (which the proxy's own command
/// line accepts), the headers from a Secret, the collector's CA mounted; nothing of it by default.
#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn otlp_export_is_an_opt_in_of_both_tiers() {
    let helm = or_return!(Helm::find_or_skip());
    let plain = helm.template(&Case::new("otlp-off", "both", &[]));
    for workload in [one_of(&plain, "Deployment"), one_of(&plain, "DaemonSet")] {
        assert!(!args(workload).iter().any(|a| a.starts_with("--otlp")));
        assert!(!container(workload).to_string().contains("OTLP"));
    }
    // Linted, rendered, checked and applied with the other cases.
    let case = cases()
        .into_iter()
        .find(|case| case.name == "both-otlp")
        .expect("the OTLP case");
    let objects = helm.template(&case);
    for workload in [
        one_of(&objects, "Deployment"),
        one_of(&objects, "DaemonSet"),
    ] {
        let start = start_args(workload);
        let otlp = start.otlp.into_settings(None).expect("OTLP is on");
        assert_eq!(otlp.endpoint, "https://otel-collector.monitoring:4317");
        assert_eq!(otlp.interval, std::time::Duration::from_secs(10));
        assert_eq!(
            otlp.ca_file.as_deref(),
            Some(Path::new("/etc/flagd-proxy/otlp-ca/ca.crt"))
        );
        assert_eq!(
            otlp.resource_attributes,
            vec![("deployment.environment".to_owned(), "prod".to_owned())]
        );
        let container = container(workload);
        let env = container["env"].as_array().expect("env");
        assert!(
            env.contains(&json!({"name": "FLAGD_PROXY_OTLP_HEADERS", "valueFrom":
                {"secretKeyRef": {"name": "otlp-headers", "key": "headers"}}})),
            "{env:?}"
        );
        assert!(
            container["volumeMounts"]
                .as_array()
                .expect("volume mounts")
                .contains(&json!({"name": "otlp-ca", "mountPath": "/etc/flagd-proxy/otlp-ca", "readOnly": true})),
            "{container}"
        );
        let volumes = workload["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .expect("volumes");
        assert!(
            volumes.iter().any(|v| v["name"] == "otlp-ca"
                && v["secret"]["secretName"] == "collector-ca"
                && v["secret"]["items"] == json!([{"key": "ca.crt", "path": "ca.crt"}])),
            "{volumes:?}"
        );
    }
}

#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn invalid_values_are_refused_with_a_message() {
    let helm = or_return!(Helm::find_or_skip());
    let refused = |sets: &[&str], expected: &[&str]| {
        let mut args = Vec::new();
        for set in sets {
            args.push("--set".to_owned());
            args.push((*set).to_owned());
        }
        let run = helm.template_run(RELEASE, "helm-invalid", &args);
        assert!(!run.ok, "helm template {sets:?} succeeded:\n{}", run.stdout);
        for needle in expected {
            assert!(
                run.stderr.contains(needle),
                "helm template {sets:?}: no {needle:?} in:\n{}",
                run.stderr
            );
        }
    };
    // The schema.
    refused(&["mode=sidecar"], &["mode"]);
    refused(&["replicas=3"], &["replicas"]);
    refused(&["central.maxConnectionAge=soon"], &["maxConnectionAge"]);
    refused(&["logFormat=xml"], &["logFormat"]);
    refused(&["image.pullPolicy=Sometimes"], &["pullPolicy"]);
    refused(&["central.service.name=Flagd_Proxy"], &["name"]);
    refused(&["securityContext.runAsUser=0"], &["runAsUser"]);
    refused(
        &["prometheusRule.requestsRefused.perReason.no_such_reason=1"],
        &["no_such_reason", "max_watches"],
    );
    refused(
        &["prometheusRule.requestsRefused.perSecond=0"],
        &["perSecond"],
    );
    refused(&["prometheusRule.requestsRefused.window=soon"], &["window"]);
    // Checks across values, with a message that says what to do.
    refused(&["mode=node"], &["node.upstream.address"]);
    refused(
        &["tls.enabled=true", "tls.certManager.enabled=true"],
        &["issuerRef.name"],
    );
    refused(
        &[
            "tls.certManager.enabled=true",
            "tls.certManager.issuerRef.name=ca",
        ],
        &["tls.enabled"],
    );
    refused(
        &[
            "mode=node",
            "node.upstream.address=a:8015",
            "tls.enabled=true",
        ],
        &["node.upstream.tls"],
    );
    refused(
        &["mode=both", "node.service.name=flagd-proxy-svc"],
        &["must differ"],
    );
    refused(
        &["central.podDisruptionBudget.minAvailable=1"],
        &["not both"],
    );
    refused(
        &[
            "serviceMonitor.enabled=true",
            "metrics.service.enabled=false",
        ],
        &["metrics.service.enabled"],
    );
    refused(&["otlp.endpoint=collector:4317"], &["endpoint"]);
    refused(&["otlp.interval=10s"], &["need otlp.endpoint"]);
    refused(
        &[
            "otlp.endpoint=http://collector:4317",
            "otlp.ca.secretName=ca",
        ],
        &["https://"],
    );
}

#[tokio::test]
#[ignore = "needs helm, etcd and kube-apiserver: scripts/test installs them"]
async fn rendered_objects_are_accepted_by_a_real_apiserver() {
    let helm = or_return!(Helm::find_or_skip());
    let cp = or_return!(control_plane::start_or_skip().await);

    // Pod Security admission is live: a template without the restricted settings is refused.
    let sample = cases().remove(0);
    let objects = helm.template(&sample);
    restricted_namespace(&cp, "helm-pss-control").await;
    let mut weakened = one_of(&objects, "Deployment").clone();
    let sc = &mut weakened["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    sc["allowPrivilegeEscalation"] = json!(true);
    sc["capabilities"] = json!({"drop": ["NET_RAW"]});
    let pod = pod_from_template(&weakened, "weakened", "helm-pss-control");
    match dry_run_pod(&cp, "helm-pss-control", &pod).await {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("violates PodSecurity"),
            "unexpected refusal: {status:?}"
        ),
        other => panic!("a weakened pod was not refused by Pod Security admission: {other:?}"),
    }

    for case in cases() {
        let objects = helm.template(&case);
        apply_case(&cp, &case, &objects).await;
    }

    // helm itself against the apiserver: install, list, uninstall.
    let ns = "helm-install";
    restricted_namespace(&cp, ns).await;
    let kubeconfig = cp.admin_kubeconfig();
    let install = helm.run(
        &strings(&[
            "install",
            RELEASE,
            &chart_dir(),
            "--namespace",
            ns,
            "--set",
            "mode=both",
            "--set",
            "central.maxConnectionAge=30m",
        ]),
        Some(kubeconfig),
    );
    install.assert_ok("helm install");
    assert!(
        install.stdout.contains("STATUS: deployed"),
        "{}",
        install.stdout
    );
    // NOTES.txt names the addresses and warns about the placeholder image.
    for needle in [
        "flagd-proxy-svc.helm-install.svc.cluster.local:8015",
        "flagd-proxy-node.helm-install.svc.cluster.local:8015",
        "\"selector\":\"core.openfeature.dev/<namespace>/<name>\"",
        "PLACEHOLDER",
    ] {
        assert!(
            install.stdout.contains(needle),
            "no {needle:?} in the notes:\n{}",
            install.stdout
        );
    }
    assert!(
        !install.stdout.contains("central.maxConnectionAge (e.g."),
        "the notes ask for a max connection age that is set:\n{}",
        install.stdout
    );
    let deployments =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(cp.admin_client(), ns);
    let daemonsets =
        Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(cp.admin_client(), ns);
    deployments
        .get("flagd-proxy")
        .await
        .expect("the installed Deployment");
    daemonsets
        .get("flagd-proxy-node")
        .await
        .expect("the installed DaemonSet");
    let uninstall = helm.run(
        &strings(&["uninstall", RELEASE, "--namespace", ns]),
        Some(kubeconfig),
    );
    uninstall.assert_ok("helm uninstall");
    assert!(
        deployments
            .get_opt("flagd-proxy")
            .await
            .expect("get")
            .is_none()
            || deployments
                .get("flagd-proxy")
                .await
                .expect("get")
                .metadata
                .deletion_timestamp
                .is_some(),
        "helm uninstall removed the Deployment"
    );
}
