//! Looking at rendered objects: kinds, names, labels, containers, arguments, and the checks
//! every pod template passes.

use super::*;

pub(crate) fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

pub(crate) fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

pub(crate) fn all_of<'a>(objects: &'a [Value], wanted: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| kind(o) == wanted).collect()
}

/// The Deployments and the DaemonSets of `objects`.
pub(crate) fn deployments_and_daemonsets(objects: &[Value]) -> (Vec<&Value>, Vec<&Value>) {
    (all_of(objects, "Deployment"), all_of(objects, "DaemonSet"))
}

pub(crate) fn one_of<'a>(objects: &'a [Value], wanted: &str) -> &'a Value {
    let found = all_of(objects, wanted);
    assert_eq!(
        found.len(),
        1,
        "expected one {wanted}, found {}",
        found.len()
    );
    found[0]
}

pub(crate) fn find<'a>(objects: &'a [Value], wanted: &str, wanted_name: &str) -> &'a Value {
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

pub(crate) fn string_list(value: &Value) -> Vec<String> {
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

pub(crate) fn labels(value: &Value) -> BTreeMap<String, String> {
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
pub(crate) fn selects(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

pub(crate) fn pod_labels(workload: &Value) -> BTreeMap<String, String> {
    labels(&workload["spec"]["template"]["metadata"]["labels"])
}

pub(crate) fn container(workload: &Value) -> &Value {
    let containers = workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1, "{}: one container", name(workload));
    &containers[0]
}

pub(crate) fn args(workload: &Value) -> Vec<String> {
    string_list(&container(workload)["args"])
}

/// The workload's arguments as the proxy's own command line parses them (`start`).
pub(crate) fn start_args(workload: &Value) -> flagd_proxy::cli::StartArgs {
    let args = args(workload);
    let cli =
        flagd_proxy::cli::parse_from(std::iter::once("flagd-proxy".to_owned()).chain(args.clone()))
            .unwrap_or_else(|e| panic!("the proxy refuses {args:?}: {e}"));
    let flagd_proxy::cli::Command::Start(start) = cli.command else {
        panic!("{args:?} is not start");
    };
    *start
}

/// The value after `flag` in `args`.
pub(crate) fn arg_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The fields the "restricted" Pod Security Standard looks at, checked on a pod spec.
pub(crate) fn assert_restricted(what: &str, pod: &Value) {
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

pub(crate) fn assert_probes(what: &str, c: &Value) {
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
pub(crate) fn assert_secret_mount(
    what: &str,
    workload: &Value,
    volume: &str,
    secret: &str,
    path: &str,
) {
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
