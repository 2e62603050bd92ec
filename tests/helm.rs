//! The Helm chart in `charts/flagd-proxy`: `helm lint` and `helm template` in every mode (with TLS,
//! cert-manager and the ServiceMonitor toggled), checks on the rendered objects, and then the
//! real thing: every rendered object is applied to a real kube-apiserver (see
//! `support/control_plane.rs`) with strict field validation, the pod templates are admitted as
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

/// Kinds that need CRDs the test control plane does not have: rendered and checked, not applied.
const CRD_KINDS: [&str; 2] = ["ServiceMonitor", "Certificate"];

const FIELD_MANAGER: &str = "flagd-proxy-helm-test";

// ---------------------------------------------------------------------------------------------
// helm

struct Helm {
    binary: PathBuf,
    /// HELM_CACHE_HOME, HELM_CONFIG_HOME and HELM_DATA_HOME: nothing of the user's is read or
    /// written.
    home: tempfile::TempDir,
}

/// The output of one helm run.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Helm {
    /// Finds helm, or decides the calling test is skipped (a failure when `CI` is set).
    fn find_or_skip() -> Option<Helm> {
        match find_helm() {
            Some(binary) => Some(Helm {
                binary,
                home: tempfile::tempdir().expect("tempdir"),
            }),
            None => {
                let message = format!(
                    "helm not found (looked at $FLAGD_PROXY_HELM, {}, and PATH); run \
                     scripts/install-helm.sh",
                    cached_helm().display()
                );
                if std::env::var_os("CI").is_some() {
                    panic!("{message}");
                }
                eprintln!("SKIPPED (no helm): {message}");
                None
            }
        }
    }

    fn run(&self, args: &[String], kubeconfig: Option<&Path>) -> Run {
        let home = self.home.path();
        let mut command = Command::new(&self.binary);
        command
            .args(args)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env_remove("HELM_KUBECONTEXT")
            .env_remove("HELM_NAMESPACE");
        match kubeconfig {
            Some(path) => command.env("KUBECONFIG", path),
            // No cluster: render with helm's built-in capabilities only.
            None => command.env("KUBECONFIG", home.join("no-kubeconfig")),
        };
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.binary.display()));
        Run {
            ok: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    fn lint(&self, case: &Case) {
        let mut args = strings(&["lint", &chart_dir(), "--strict", "--namespace", &case.ns()]);
        args.extend(case.set_args());
        let run = self.run(&args, None);
        assert!(
            run.ok,
            "helm lint failed for case {}:\n{}\n{}",
            case.name, run.stdout, run.stderr
        );
    }

    fn template_run(&self, release: &str, ns: &str, sets: &[String]) -> Run {
        let mut args = strings(&["template", release, &chart_dir(), "--namespace", ns]);
        args.extend(sets.iter().cloned());
        self.run(&args, None)
    }

    /// `helm template` for a case, parsed into objects.
    fn template(&self, case: &Case) -> Vec<Value> {
        let run = self.template_run(RELEASE, &case.ns(), &case.set_args());
        assert!(
            run.ok,
            "helm template failed for case {}:\n{}",
            case.name, run.stderr
        );
        parse_documents(&run.stdout)
    }
}

fn find_helm() -> Option<PathBuf> {
    let works = |path: &Path| {
        Command::new(path)
            .arg("version")
            .arg("--short")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if let Some(path) = std::env::var_os("FLAGD_PROXY_HELM").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            works(&path),
            "FLAGD_PROXY_HELM={} does not run `helm version`",
            path.display()
        );
        return Some(path);
    }
    let cached = cached_helm();
    if works(&cached) {
        return Some(cached);
    }
    let on_path = PathBuf::from("helm");
    works(&on_path).then_some(on_path)
}

fn cached_helm() -> PathBuf {
    let cache = match std::env::var_os("FLAGD_PROXY_CACHE").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home).join(".cache").join("flagd-proxy")
        }
    };
    cache.join("bin").join("helm")
}

fn chart_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts")
        .join("flagd-proxy")
        .display()
        .to_string()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// Every non-empty YAML document of a rendered chart.
fn parse_documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).expect("rendered YAML parses"))
        .filter(|value| !value.is_null())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Cases

const RELEASE: &str = "flagd-proxy";

/// One way of installing the chart.
struct Case {
    name: &'static str,
    mode: &'static str,
    sets: Vec<(&'static str, &'static str)>,
}

impl Case {
    fn new(name: &'static str, mode: &'static str, sets: &[(&'static str, &'static str)]) -> Case {
        Case {
            name,
            mode,
            sets: sets.to_vec(),
        }
    }

    /// The namespace the case installs into (also its own namespace in the test apiserver).
    fn ns(&self) -> String {
        format!("helm-{}", self.name)
    }

    fn set_args(&self) -> Vec<String> {
        let mut args = vec!["--set".to_owned(), format!("mode={}", self.mode)];
        for (key, value) in &self.sets {
            args.push("--set".to_owned());
            args.push(format!("{key}={value}"));
        }
        args
    }

    fn value(&self, key: &str) -> Option<&str> {
        self.sets.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    fn flag(&self, key: &str) -> bool {
        self.value(key) == Some("true")
    }

    fn central(&self) -> bool {
        matches!(self.mode, "central" | "both")
    }

    fn node(&self) -> bool {
        matches!(self.mode, "node" | "both")
    }

    fn central_tls(&self) -> bool {
        self.central() && self.flag("tls.enabled")
    }

    fn node_tls(&self) -> bool {
        self.node() && self.flag("node.tls.enabled")
    }

    fn cert_manager(&self) -> bool {
        self.flag("tls.certManager.enabled")
    }

    fn upstream_tls(&self) -> bool {
        self.node()
            && (self.flag("node.upstream.tls")
                || self.value("node.upstream.ca.secretName").is_some()
                || (self.mode == "both" && self.flag("tls.enabled")))
    }

    /// The CA Secret the node tier mounts, if any.
    fn upstream_ca_secret(&self) -> Option<String> {
        if !self.upstream_tls() || self.flag("node.upstream.ca.systemRoots") {
            return None;
        }
        match self.value("node.upstream.ca.secretName") {
            Some(name) => Some(name.to_owned()),
            None => (self.mode == "both").then(|| format!("{RELEASE}-tls")),
        }
    }

    fn expected_upstream(&self) -> String {
        match self.value("node.upstream.address") {
            Some(address) => address.to_owned(),
            None => format!("flagd-proxy-svc.{}.svc.cluster.local:8015", self.ns()),
        }
    }
}

const CENTRAL_UPSTREAM: &str = "flagd-proxy-svc.flagd-proxy.svc.cluster.local:8015";

fn cases() -> Vec<Case> {
    vec![
        Case::new("central", "central", &[]),
        Case::new(
            "central-tls",
            "central",
            &[
                ("tls.enabled", "true"),
                ("tls.secretName", "proxy-serving"),
                ("central.replicas", "3"),
                ("central.maxConnectionAge", "30m"),
                ("central.maxConnectionAgeGrace", "15s"),
                ("central.events.enabled", "false"),
                ("logFormat", "json"),
            ],
        ),
        Case::new(
            "central-certmanager",
            "central",
            &[
                ("tls.enabled", "true"),
                ("tls.certManager.enabled", "true"),
                ("tls.certManager.issuerRef.name", "internal-ca"),
                ("tls.certManager.issuerRef.kind", "ClusterIssuer"),
                ("serviceMonitor.enabled", "true"),
                ("serviceMonitor.labels.release", "prometheus"),
            ],
        ),
        Case::new(
            "node",
            "node",
            &[("node.upstream.address", CENTRAL_UPSTREAM)],
        ),
        Case::new(
            "node-tls",
            "node",
            &[
                ("node.upstream.address", CENTRAL_UPSTREAM),
                ("node.upstream.ca.secretName", "central-ca"),
                ("node.tls.enabled", "true"),
                ("tls.certManager.enabled", "true"),
                ("tls.certManager.issuerRef.name", "internal-ca"),
                ("serviceMonitor.enabled", "true"),
            ],
        ),
        Case::new("both", "both", &[("central.maxConnectionAge", "10m")]),
        Case::new(
            "both-tls",
            "both",
            &[
                ("tls.enabled", "true"),
                ("tls.certManager.enabled", "true"),
                ("tls.certManager.issuerRef.name", "internal-ca"),
                ("node.tls.enabled", "true"),
                ("serviceMonitor.enabled", "true"),
                (
                    "networkPolicy.clients.namespaceSelector.matchLabels.flagd-proxy/clients",
                    "allowed",
                ),
            ],
        ),
        // A platform that picks the user itself, a pinned digest, system roots for the upstream.
        Case::new(
            "both-systemroots",
            "both",
            &[
                ("tls.enabled", "true"),
                ("node.upstream.ca.systemRoots", "true"),
                ("securityContext.runAsUser", "null"),
                ("securityContext.runAsGroup", "null"),
                ("securityContext.fsGroup", "null"),
                (
                    "image.digest",
                    "sha256:0000000000000000000000000000000000000000000000000000000000000000",
                ),
                ("networkPolicy.enabled", "false"),
                ("metrics.service.enabled", "false"),
            ],
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// Looking at rendered objects

fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

fn all_of<'a>(objects: &'a [Value], wanted: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| kind(o) == wanted).collect()
}

fn one_of<'a>(objects: &'a [Value], wanted: &str) -> &'a Value {
    let found = all_of(objects, wanted);
    assert_eq!(
        found.len(),
        1,
        "expected one {wanted}, found {}",
        found.len()
    );
    found[0]
}

fn find<'a>(objects: &'a [Value], wanted: &str, wanted_name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| kind(o) == wanted && name(o) == wanted_name)
        .unwrap_or_else(|| {
            let have: Vec<String> = objects
                .iter()
                .map(|o| format!("{}/{}", kind(o), name(o)))
                .collect();
            panic!("no {wanted} named {wanted_name}; rendered: {have:?}")
        })
}

fn string_list(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|v| v.as_str().expect("a string").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn labels(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(k, v)| (k.clone(), v.as_str().expect("label value").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// True if every label of `selector` is among `labels`.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_labels(workload: &Value) -> BTreeMap<String, String> {
    labels(&workload["spec"]["template"]["metadata"]["labels"])
}

fn container(workload: &Value) -> &Value {
    let containers = workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1, "{}: one container", name(workload));
    &containers[0]
}

fn args(workload: &Value) -> Vec<String> {
    string_list(&container(workload)["args"])
}

/// The value after `flag` in `args`.
fn arg_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The fields the "restricted" Pod Security Standard looks at, checked on a pod spec.
fn assert_restricted(what: &str, pod: &Value) {
    let pod_sc = &pod["securityContext"];
    assert_eq!(
        pod_sc["runAsNonRoot"],
        json!(true),
        "{what}: pod runAsNonRoot"
    );
    assert_eq!(
        pod_sc["seccompProfile"]["type"],
        json!("RuntimeDefault"),
        "{what}: pod seccompProfile"
    );
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod[key] != json!(true), "{what}: {key}");
    }
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        let kinds: Vec<&String> = volume
            .as_object()
            .expect("volume")
            .keys()
            .filter(|k| *k != "name")
            .collect();
        assert!(
            kinds.iter().all(|k| matches!(
                k.as_str(),
                "secret" | "configMap" | "emptyDir" | "projected" | "downwardAPI"
            )),
            "{what}: volume types {kinds:?}"
        );
    }
    let containers = pod["containers"].as_array().expect("containers");
    for c in containers {
        let sc = &c["securityContext"];
        assert_eq!(
            sc["allowPrivilegeEscalation"],
            json!(false),
            "{what}: allowPrivilegeEscalation"
        );
        assert!(sc["privileged"] != json!(true), "{what}: privileged");
        assert_eq!(sc["runAsNonRoot"], json!(true), "{what}: runAsNonRoot");
        assert_eq!(
            string_list(&sc["capabilities"]["drop"]),
            vec!["ALL"],
            "{what}: capabilities.drop"
        );
        assert!(
            sc["capabilities"]["add"].is_null(),
            "{what}: capabilities.add"
        );
        assert_eq!(
            sc["seccompProfile"]["type"],
            json!("RuntimeDefault"),
            "{what}: seccompProfile"
        );
        assert_eq!(
            sc["readOnlyRootFilesystem"],
            json!(true),
            "{what}: readOnlyRootFilesystem"
        );
        if let Some(user) = sc["runAsUser"].as_i64() {
            assert!(user > 0, "{what}: runAsUser {user}");
        }
        for port in c["ports"].as_array().into_iter().flatten() {
            assert!(port["hostPort"].is_null(), "{what}: hostPort");
        }
    }
}

fn assert_probes(what: &str, c: &Value) {
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], json!(path), "{what}: {probe} path");
        assert_eq!(get["port"], json!("management"), "{what}: {probe} port");
    }
    let ports: BTreeMap<String, i64> = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("port name").to_owned(),
                p["containerPort"].as_i64().expect("containerPort"),
            )
        })
        .collect();
    assert_eq!(
        ports,
        BTreeMap::from([("grpc".to_owned(), 8015), ("management".to_owned(), 8016)]),
        "{what}: container ports"
    );
}

/// The volume named `volume` is the Secret `secret`, mounted read-only at `path`.
fn assert_secret_mount(what: &str, workload: &Value, volume: &str, secret: &str, path: &str) {
    let spec = &workload["spec"]["template"]["spec"];
    let found = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == json!(volume))
        .unwrap_or_else(|| panic!("{what}: no volume {volume}"));
    assert_eq!(
        found["secret"]["secretName"],
        json!(secret),
        "{what}: Secret of volume {volume}"
    );
    let mount = container(workload)["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == json!(volume))
        .unwrap_or_else(|| panic!("{what}: volume {volume} not mounted"));
    assert_eq!(mount["mountPath"], json!(path), "{what}: mount path");
    assert_eq!(mount["readOnly"], json!(true), "{what}: read-only mount");
}

/// Checks a rendered case against what its values ask for.
fn check_rendered(case: &Case, objects: &[Value]) {
    let ns = case.ns();
    let what = case.name;
    let cluster_scoped = ["ClusterRole", "ClusterRoleBinding"];
    for object in objects {
        assert!(
            object["apiVersion"].is_string() && !name(object).is_empty(),
            "{what}: object without apiVersion or name: {object}"
        );
        if !cluster_scoped.contains(&kind(object)) {
            assert_eq!(
                object["metadata"]["namespace"],
                json!(ns),
                "{what}: namespace of {} {}",
                kind(object),
                name(object)
            );
        }
        assert_eq!(
            object["metadata"]["labels"]["app.kubernetes.io/instance"],
            json!(RELEASE),
            "{what}: instance label of {} {}",
            kind(object),
            name(object)
        );
    }

    let deployments = all_of(objects, "Deployment");
    let daemonsets = all_of(objects, "DaemonSet");
    assert!(
        all_of(objects, "Role").is_empty() && all_of(objects, "RoleBinding").is_empty(),
        "{what}: no namespaced RBAC"
    );
    assert_eq!(
        deployments.len(),
        usize::from(case.central()),
        "{what}: Deployments"
    );
    assert_eq!(
        daemonsets.len(),
        usize::from(case.node()),
        "{what}: DaemonSets"
    );

    // Every pod the chart runs meets the restricted profile and is probed on 8016.
    for workload in deployments.iter().chain(&daemonsets) {
        let label = format!("{what}: {} {}", kind(workload), name(workload));
        assert_restricted(&label, &workload["spec"]["template"]["spec"]);
        assert_probes(&label, container(workload));
        let selector = labels(&workload["spec"]["selector"]["matchLabels"]);
        assert!(
            selects(&selector, &pod_labels(workload)),
            "{label}: selector matches its pods"
        );
        let args = args(workload);
        assert_eq!(
            args[..3],
            ["start", "--management-port", "8016"],
            "{label}: args begin as the Operator's"
        );
        if case.value("logFormat") == Some("json") {
            assert_eq!(arg_value(&args, "--log-format"), Some("json"), "{label}");
        }
        let expected_image = match case.value("image.digest") {
            Some(digest) => format!("ghcr.io/open-feature/flagd-proxy-rs@{digest}"),
            None => "ghcr.io/open-feature/flagd-proxy-rs:latest".to_owned(),
        };
        assert_eq!(
            container(workload)["image"],
            json!(expected_image),
            "{label}"
        );
        if case.value("securityContext.runAsUser") == Some("null") {
            let pod = &workload["spec"]["template"]["spec"];
            assert!(pod["securityContext"]["runAsUser"].is_null(), "{label}");
            assert!(container(workload)["securityContext"]["runAsUser"].is_null());
        }
    }

    // Services by name.
    let services = all_of(objects, "Service");
    let service_names: BTreeSet<&str> = services.iter().map(|s| name(s)).collect();
    let mut expected_services = BTreeSet::new();
    if case.central() {
        expected_services.insert("flagd-proxy-svc");
    }
    if case.node() {
        expected_services.insert("flagd-proxy-node");
    }
    if case.value("metrics.service.enabled") != Some("false") {
        expected_services.insert("flagd-proxy-metrics");
    }
    assert_eq!(service_names, expected_services, "{what}: Services");
    check_central(case, objects);
    check_node(case, objects);
    check_extras(case, objects);
}

/// The central tier: Deployment, its Service, least-privilege RBAC, PodDisruptionBudget, TLS.
fn check_central(case: &Case, objects: &[Value]) {
    let ns = case.ns();
    let what = case.name;
    let deployments = all_of(objects, "Deployment");
    let daemonsets = all_of(objects, "DaemonSet");
    let cluster_roles = all_of(objects, "ClusterRole");
    let bindings = all_of(objects, "ClusterRoleBinding");
    if case.central() {
        let deployment = deployments[0];
        assert_eq!(name(deployment), "flagd-proxy", "{what}: Deployment name");
        let replicas: i64 = case
            .value("central.replicas")
            .map_or(2, |v| v.parse().expect("replicas"));
        assert_eq!(deployment["spec"]["replicas"], json!(replicas), "{what}");
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], json!(true), "{what}");
        let spread = pod["topologySpreadConstraints"]
            .as_array()
            .expect("topologySpreadConstraints");
        assert!(
            spread.iter().any(|c| {
                c["topologyKey"] == json!("kubernetes.io/hostname")
                    && selects(
                        &labels(&c["labelSelector"]["matchLabels"]),
                        &pod_labels(deployment),
                    )
            }),
            "{what}: replicas spread across nodes"
        );
        let args = args(deployment);
        assert_eq!(
            arg_value(&args, "--max-connection-age"),
            case.value("central.maxConnectionAge"),
            "{what}: --max-connection-age"
        );
        assert_eq!(
            arg_value(&args, "--max-connection-age-grace"),
            case.value("central.maxConnectionAgeGrace"),
            "{what}: --max-connection-age-grace"
        );
        assert!(!args.iter().any(|a| a.starts_with("--upstream")), "{what}");
        let secret = case.value("tls.secretName").unwrap_or("flagd-proxy-tls");
        if case.central_tls() {
            assert_eq!(
                arg_value(&args, "--server-cert-path"),
                Some("/etc/flagd-proxy/tls/tls.crt"),
                "{what}"
            );
            assert_eq!(
                arg_value(&args, "--server-key-path"),
                Some("/etc/flagd-proxy/tls/tls.key"),
                "{what}"
            );
            assert_secret_mount(what, deployment, "tls", secret, "/etc/flagd-proxy/tls");
        } else {
            assert!(!args.iter().any(|a| a.starts_with("--server-")), "{what}");
            assert!(pod["volumes"].is_null(), "{what}: no volumes without TLS");
        }

        // The Service the Operator's sidecars dial.
        let service = find(objects, "Service", "flagd-proxy-svc");
        assert_eq!(
            service["spec"]["ports"],
            json!([{"name": "grpc", "port": 8015, "targetPort": "grpc", "protocol": "TCP",
                    "appProtocol": "grpc"}]),
            "{what}: flagd-proxy-svc ports"
        );
        let selector = labels(&service["spec"]["selector"]);
        assert!(selects(&selector, &pod_labels(deployment)), "{what}");
        for ds in &daemonsets {
            assert!(
                !selects(&selector, &pod_labels(ds)),
                "{what}: central Service"
            );
        }

        // Least privilege: read FeatureFlags and FeatureFlagSources, write Events, nothing else.
        let sa = pod["serviceAccountName"]
            .as_str()
            .expect("serviceAccountName");
        find(objects, "ServiceAccount", sa);
        assert_eq!(cluster_roles.len(), 1, "{what}: ClusterRoles");
        let mut rules = vec![json!({"apiGroups": ["core.openfeature.dev"],
                "resources": ["featureflags", "featureflagsources"],
                "verbs": ["get", "list", "watch"]})];
        let events = case.value("central.events.enabled") != Some("false");
        if events {
            rules.push(json!({"apiGroups": ["events.k8s.io"],
                "resources": ["events"],
                "verbs": ["create", "patch"]}));
        }
        assert_eq!(
            cluster_roles[0]["rules"],
            json!(rules),
            "{what}: ClusterRole rules"
        );
        assert_eq!(
            args.iter().any(|a| a == "--events=false"),
            !events,
            "{what}: --events"
        );
        assert_eq!(
            container(deployment)["env"],
            json!([{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]),
            "{what}: the pod name for Events"
        );
        assert_eq!(bindings.len(), 1, "{what}: ClusterRoleBindings");
        assert_eq!(
            bindings[0]["roleRef"]["name"], cluster_roles[0]["metadata"]["name"],
            "{what}"
        );
        assert_eq!(
            bindings[0]["subjects"],
            json!([{"kind": "ServiceAccount", "name": sa, "namespace": ns}]),
            "{what}: binding subjects"
        );

        let pdb = one_of(objects, "PodDisruptionBudget");
        assert!(
            selects(
                &labels(&pdb["spec"]["selector"]["matchLabels"]),
                &pod_labels(deployment)
            ),
            "{what}: PDB selects the central pods"
        );
    } else {
        assert!(
            cluster_roles.is_empty() && bindings.is_empty(),
            "{what}: no RBAC"
        );
        assert!(all_of(objects, "PodDisruptionBudget").is_empty(), "{what}");
    }
}

/// The node tier: DaemonSet without API access, chained upstream, its node-local Service.
fn check_node(case: &Case, objects: &[Value]) {
    let what = case.name;
    let daemonsets = all_of(objects, "DaemonSet");
    let bindings = all_of(objects, "ClusterRoleBinding");
    if case.node() {
        let ds = daemonsets[0];
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], json!(false), "{what}");
        let sa_name = pod["serviceAccountName"]
            .as_str()
            .expect("serviceAccountName");
        let sa = find(objects, "ServiceAccount", sa_name);
        assert_eq!(sa["automountServiceAccountToken"], json!(false), "{what}");
        for binding in &bindings {
            assert!(
                !binding["subjects"].to_string().contains(sa_name),
                "{what}: the node tier is bound to nothing"
            );
        }
        let update = &ds["spec"]["updateStrategy"]["rollingUpdate"];
        assert_eq!(
            update["maxSurge"],
            json!(1),
            "{what}: surge before stopping"
        );
        assert_eq!(update["maxUnavailable"], json!(0), "{what}");

        let args = args(ds);
        assert_eq!(
            arg_value(&args, "--upstream"),
            Some(case.expected_upstream().as_str()),
            "{what}: --upstream"
        );
        assert_eq!(
            args.iter().any(|a| a == "--upstream-tls"),
            case.upstream_tls(),
            "{what}: --upstream-tls"
        );
        match case.upstream_ca_secret() {
            Some(secret) => {
                assert_eq!(
                    arg_value(&args, "--upstream-ca-path"),
                    Some("/etc/flagd-proxy/upstream-ca/ca.crt"),
                    "{what}"
                );
                assert_secret_mount(
                    what,
                    ds,
                    "upstream-ca",
                    &secret,
                    "/etc/flagd-proxy/upstream-ca",
                );
                // Only the CA bundle, never the central tier's key.
                let volume = pod["volumes"]
                    .as_array()
                    .expect("volumes")
                    .iter()
                    .find(|v| v["name"] == json!("upstream-ca"))
                    .expect("upstream-ca volume");
                assert_eq!(
                    volume["secret"]["items"],
                    json!([{"key": "ca.crt", "path": "ca.crt"}]),
                    "{what}"
                );
            }
            None => assert!(!args.iter().any(|a| a == "--upstream-ca-path"), "{what}"),
        }
        assert_eq!(
            args.iter().any(|a| a == "--server-cert-path"),
            case.node_tls(),
            "{what}: node tier serves TLS"
        );
        if case.node_tls() {
            assert_secret_mount(what, ds, "tls", "flagd-proxy-tls", "/etc/flagd-proxy/tls");
        }

        let service = find(objects, "Service", "flagd-proxy-node");
        assert_eq!(
            service["spec"]["internalTrafficPolicy"],
            json!("Local"),
            "{what}: node Service stays on the node"
        );
        assert_eq!(service["spec"]["ports"][0]["port"], json!(8015), "{what}");
        assert_eq!(service["spec"]["ports"][0]["appProtocol"], json!("grpc"));
        assert!(selects(
            &labels(&service["spec"]["selector"]),
            &pod_labels(ds)
        ));
    }
}

/// cert-manager, Prometheus Operator and the NetworkPolicy.
fn check_extras(case: &Case, objects: &[Value]) {
    let ns = case.ns();
    let what = case.name;
    let deployments = all_of(objects, "Deployment");
    let daemonsets = all_of(objects, "DaemonSet");
    // cert-manager.
    let certificates = all_of(objects, "Certificate");
    if case.cert_manager() {
        assert_eq!(certificates.len(), 1, "{what}: Certificate");
        let certificate = certificates[0];
        assert_eq!(certificate["apiVersion"], json!("cert-manager.io/v1"));
        assert_eq!(certificate["spec"]["secretName"], json!("flagd-proxy-tls"));
        assert_eq!(
            certificate["spec"]["issuerRef"]["name"],
            json!(
                case.value("tls.certManager.issuerRef.name")
                    .expect("issuer")
            ),
            "{what}"
        );
        let names = string_list(&certificate["spec"]["dnsNames"]);
        let central_name = format!("flagd-proxy-svc.{ns}.svc.cluster.local");
        let node_name = format!("flagd-proxy-node.{ns}.svc.cluster.local");
        assert_eq!(
            names.contains(&central_name),
            case.central_tls(),
            "{what}: {names:?}"
        );
        assert_eq!(
            names.contains(&node_name),
            case.node_tls(),
            "{what}: {names:?}"
        );
        if case.node() && case.upstream_tls() {
            // The node tier dials exactly a name the certificate carries.
            let upstream = case.expected_upstream();
            let host = upstream.rsplit_once(':').expect("host:port").0;
            if case.mode == "both" {
                assert!(
                    names.iter().any(|n| n == host),
                    "{what}: {host} in {names:?}"
                );
            }
        }
    } else {
        assert!(certificates.is_empty(), "{what}: no Certificate");
    }

    // Prometheus Operator.
    let monitors = all_of(objects, "ServiceMonitor");
    if case.flag("serviceMonitor.enabled") {
        assert_eq!(monitors.len(), 1, "{what}: ServiceMonitor");
        let monitor = monitors[0];
        assert_eq!(monitor["apiVersion"], json!("monitoring.coreos.com/v1"));
        let metrics = find(objects, "Service", "flagd-proxy-metrics");
        assert!(
            selects(
                &labels(&monitor["spec"]["selector"]["matchLabels"]),
                &labels(&metrics["metadata"]["labels"])
            ),
            "{what}: the ServiceMonitor selects the metrics Service"
        );
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], json!("management"));
        assert_eq!(monitor["spec"]["endpoints"][0]["path"], json!("/metrics"));
        if let Some(release) = case.value("serviceMonitor.labels.release") {
            assert_eq!(monitor["metadata"]["labels"]["release"], json!(release));
        }
    } else {
        assert!(monitors.is_empty(), "{what}: no ServiceMonitor");
    }
    if let Some(metrics) = objects
        .iter()
        .find(|o| kind(o) == "Service" && name(o) == "flagd-proxy-metrics")
    {
        let selector = labels(&metrics["spec"]["selector"]);
        for workload in deployments.iter().chain(&daemonsets) {
            assert!(selects(&selector, &pod_labels(workload)), "{what}: metrics");
        }
        assert_eq!(metrics["spec"]["ports"][0]["port"], json!(8016));
    }

    // Network policy.
    let policies = all_of(objects, "NetworkPolicy");
    if case.value("networkPolicy.enabled") == Some("false") {
        assert!(policies.is_empty(), "{what}: no NetworkPolicy");
    } else {
        assert_eq!(policies.len(), 1, "{what}: NetworkPolicy");
        let policy = policies[0];
        let selector = labels(&policy["spec"]["podSelector"]["matchLabels"]);
        for workload in deployments.iter().chain(&daemonsets) {
            assert!(selects(&selector, &pod_labels(workload)), "{what}: policy");
        }
        let rules = policy["spec"]["ingress"].as_array().expect("ingress");
        let ports_of = |rule: &Value| -> Vec<Value> {
            rule["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .map(|p| p["port"].clone())
                .collect()
        };
        let client_rule = &rules[0];
        assert_eq!(ports_of(client_rule), vec![json!("grpc")], "{what}");
        if let Some(label) =
            case.value("networkPolicy.clients.namespaceSelector.matchLabels.flagd-proxy/clients")
        {
            assert_eq!(
                client_rule["from"][0]["namespaceSelector"]["matchLabels"]["flagd-proxy/clients"],
                json!(label),
                "{what}: client namespaces"
            );
        }
        let monitoring_rule = rules.last().expect("a monitoring rule");
        assert_eq!(
            ports_of(monitoring_rule),
            vec![json!("management")],
            "{what}"
        );
        assert_eq!(
            monitoring_rule["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            json!("monitoring"),
            "{what}"
        );
        if case.mode == "both" {
            let node_rule = rules
                .iter()
                .find(|r| {
                    r["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                        == json!("node")
                })
                .unwrap_or_else(|| panic!("{what}: a rule for the node tier"));
            assert_eq!(ports_of(node_rule), vec![json!("grpc")], "{what}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tests without a cluster

#[test]
fn chart_lints_and_renders_in_every_mode() {
    let Some(helm) = Helm::find_or_skip() else {
        return;
    };
    for case in cases() {
        helm.lint(&case);
        let objects = helm.template(&case);
        check_rendered(&case, &objects);
    }
}

/// The node tier's unix socket is an opt-in: a hostPath directory mounted at the same path, the
/// socket flags, and nothing of it by default.
#[test]
fn node_socket_is_an_opt_in_hostpath() {
    let Some(helm) = Helm::find_or_skip() else {
        return;
    };
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
    assert!(plain["spec"]["template"]["spec"]["volumes"].is_null());

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
                "hostPath": {"path": "/run/flags", "type": "DirectoryOrCreate"}}])
    );
    assert_eq!(
        container(&ds)["volumeMounts"],
        json!([{"name": "sync-socket", "mountPath": "/run/flags"}])
    );
}

#[test]
fn invalid_values_are_refused_with_a_message() {
    let Some(helm) = Helm::find_or_skip() else {
        return;
    };
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
}

// ---------------------------------------------------------------------------------------------
// Against a real API server

/// The API for one rendered object, found by discovery.
async fn api_for(cp: &ControlPlane, object: &Value, ns: &str) -> Api<DynamicObject> {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind(object));
    let client = cp.admin_client();
    let (resource, capabilities) = discovery::pinned_kind(&client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discovering {api_version} {}: {e}", kind(object)));
    match capabilities.scope {
        Scope::Namespaced => Api::namespaced_with(client, ns, &resource),
        Scope::Cluster => Api::all_with(client, &resource),
    }
}

/// Creates namespace `ns`, enforcing the "restricted" Pod Security Standard.
async fn restricted_namespace(cp: &ControlPlane, ns: &str) {
    let namespace = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": ns, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }},
    });
    let api = api_for(cp, &namespace, ns).await;
    let object: DynamicObject = serde_json::from_value(namespace).expect("Namespace");
    api.patch(
        ns,
        &PatchParams::apply(FIELD_MANAGER).validation_strict(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
}

/// A bare Pod with a workload's pod template, to get the Pod Security admission verdict.
fn pod_from_template(workload: &Value, pod_name: &str, ns: &str) -> DynamicObject {
    let template = &workload["spec"]["template"];
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }))
    .expect("a Pod")
}

async fn dry_run_pod(cp: &ControlPlane, ns: &str, pod: &DynamicObject) -> Result<(), kube::Error> {
    let api = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(cp.admin_client(), ns);
    let pod: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(serde_json::to_value(pod).expect("json")).expect("a typed Pod");
    api.create(
        &PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        &pod,
    )
    .await
    .map(|_| ())
}

async fn apply_case(cp: &ControlPlane, case: &Case, objects: &[Value]) {
    let ns = case.ns();
    let what = case.name;
    restricted_namespace(cp, &ns).await;

    for object in objects {
        if CRD_KINDS.contains(&kind(object)) {
            continue;
        }
        let api = api_for(cp, object, &ns).await;
        let typed: DynamicObject = serde_json::from_value(object.clone()).expect("object");
        let object_name = name(object).to_owned();
        let params = PatchParams::apply(FIELD_MANAGER).validation_strict();
        if let Err(error) = api
            .patch(&object_name, &params, &Patch::Apply(&typed))
            .await
        {
            panic!(
                "{what}: the apiserver refused {} {object_name}: {error}",
                kind(object)
            );
        }
        // Read back: the apiserver kept what the chart asked for.
        let stored = api
            .get(&object_name)
            .await
            .unwrap_or_else(|e| panic!("{what}: reading back {} {object_name}: {e}", kind(object)));
        if let Some(want) = object.get("spec") {
            let got = stored.data.get("spec").expect("stored spec");
            assert_subset(
                &format!("{what}: {} {object_name} spec", kind(object)),
                want,
                got,
            );
        }
    }

    // The real Pod Security verdict on each pod template.
    for workload in objects
        .iter()
        .filter(|o| matches!(kind(o), "Deployment" | "DaemonSet"))
    {
        let pod = pod_from_template(workload, &format!("{}-pss", name(workload)), &ns);
        if let Err(error) = dry_run_pod(cp, &ns, &pod).await {
            panic!(
                "{what}: the {} {} pod template is refused in a restricted namespace: {error}",
                kind(workload),
                name(workload)
            );
        }
    }

    // RBAC as the apiserver sees it.
    if case.central() {
        let sa = format!("system:serviceaccount:{ns}:flagd-proxy");
        let group = "core.openfeature.dev";
        for verb in ["get", "list", "watch"] {
            for resource in ["featureflags", "featureflagsources"] {
                eventually(&format!("{what}: {sa} may {verb} {resource}"), || async {
                    if cp
                        .service_account_may(&ns, "flagd-proxy", verb, group, resource, "some-app")
                        .await
                    {
                        Ok(())
                    } else {
                        Err("not yet allowed".to_owned())
                    }
                })
                .await;
            }
        }
        let events = case.value("central.events.enabled") != Some("false");
        for verb in ["create", "patch"] {
            assert_eq!(
                cp.service_account_may(
                    &ns,
                    "flagd-proxy",
                    verb,
                    "events.k8s.io",
                    "events",
                    "some-app"
                )
                .await,
                events,
                "{what}: {sa} may {verb} events"
            );
        }
        for (verb, group, resource) in [
            ("update", group, "featureflags"),
            ("delete", group, "featureflags"),
            ("get", "events.k8s.io", "events"),
            ("list", "events.k8s.io", "events"),
            ("delete", "events.k8s.io", "events"),
            ("create", "", "events"),
            ("get", "", "secrets"),
            ("list", "", "configmaps"),
            ("list", "", "pods"),
        ] {
            assert!(
                !cp.service_account_may(&ns, "flagd-proxy", verb, group, resource, "some-app")
                    .await,
                "{what}: {sa} may {verb} {resource}"
            );
        }
    }
    if case.node() {
        for resource in ["featureflags", "featureflagsources"] {
            assert!(
                !cp.service_account_may(
                    &ns,
                    "flagd-proxy-node",
                    "get",
                    "core.openfeature.dev",
                    resource,
                    "some-app"
                )
                .await,
                "{what}: the node tier may read {resource}"
            );
        }
    }
}

/// Every field of `want` is in `got` with the same value (the apiserver adds defaults).
fn assert_subset(what: &str, want: &Value, got: &Value) {
    match (want, got) {
        (Value::Object(want), Value::Object(got)) => {
            for (key, value) in want {
                let Some(stored) = got.get(key) else {
                    panic!("{what}: field {key} was dropped");
                };
                assert_subset(&format!("{what}.{key}"), value, stored);
            }
        }
        (Value::Array(want), Value::Array(got)) => {
            assert_eq!(want.len(), got.len(), "{what}: list length");
            for (i, (w, g)) in want.iter().zip(got).enumerate() {
                assert_subset(&format!("{what}[{i}]"), w, g);
            }
        }
        // Quantities and int-or-strings may come back normalised; compare as text.
        (Value::String(w), Value::Number(g)) | (Value::Number(g), Value::String(w)) => {
            assert_eq!(w, &g.to_string(), "{what}");
        }
        _ => assert_eq!(want, got, "{what}"),
    }
}

#[tokio::test]
async fn rendered_objects_are_accepted_by_a_real_apiserver() {
    let Some(helm) = Helm::find_or_skip() else {
        return;
    };
    let Some(cp) = control_plane::start_or_skip().await else {
        return;
    };

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
    assert!(
        install.ok,
        "helm install:\n{}\n{}",
        install.stdout, install.stderr
    );
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
    assert!(
        uninstall.ok,
        "helm uninstall:\n{}\n{}",
        uninstall.stdout, uninstall.stderr
    );
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
