//! The real OpenFeature Operator deploying the proxy image and injecting flagd.

use super::steps::*;
use super::*;
use flagd_proxy_testkit::or_return;

/// The operator's manager, run as a process inside the cluster's network namespace the way its
/// repository's `make run` runs it; killed on drop.
struct Operator {
    child: Child,
    _certs: TestCa,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const OPERATOR_NS: &str = "open-feature-operator-system";

/// The operator's own RBAC for its proxy (from the pinned module download), with the names and
/// namespace its kustomization gives them.
fn operator_proxy_rbac() -> String {
    let rbac = test_data("open-feature-operator/config/rbac").unwrap_or_else(|m| panic!("{m}"));
    let read = |file: &str| -> Value {
        let text =
            std::fs::read_to_string(rbac.join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"));
        serde_norway::from_str(&text).unwrap_or_else(|e| panic!("parse {file}: {e}"))
    };
    let prefix = |v: &Value| format!("open-feature-operator-{}", v.as_str().expect("name"));
    let mut account = read("service_account_flagd_proxy.yaml");
    account["metadata"]["name"] = json!(prefix(&account["metadata"]["name"]));
    account["metadata"]["namespace"] = json!(OPERATOR_NS);
    let mut role = read("flagd_kubernetes_sync_clusterrole.yaml");
    role["metadata"]["name"] = json!(prefix(&role["metadata"]["name"]));
    let mut binding = read("flagd_kubernetes_sync_clusterrolebinding.yaml");
    binding["metadata"]["name"] = json!(prefix(&binding["metadata"]["name"]));
    binding["roleRef"]["name"] = json!(prefix(&binding["roleRef"]["name"]));
    binding["roleRef"]["apiGroup"] = json!("rbac.authorization.k8s.io");
    if let Some(subjects) = binding["subjects"].as_array_mut() {
        for subject in subjects {
            subject["name"] = json!(prefix(&subject["name"]));
            subject["namespace"] = json!(OPERATOR_NS);
        }
    }
    json!({"apiVersion": "v1", "kind": "List", "items": [account, role, binding]}).to_string()
}

fn start_operator(
    cluster: &Cluster,
    binary: &Path,
    proxy_image: &str,
    flagd_image: &str,
) -> Operator {
    let certs = TestCa::new();
    let cert_dir = certs.dir.path().join("webhook");
    std::fs::create_dir_all(&cert_dir).expect("cert dir");
    std::fs::copy(&certs.server_cert, cert_dir.join("tls.crt")).expect("tls.crt");
    std::fs::copy(&certs.server_key, cert_dir.join("tls.key")).expect("tls.key");
    let (proxy_repo, proxy_tag) = proxy_image.rsplit_once(':').expect("image:tag");
    let (flagd_repo, flagd_tag) = flagd_image.rsplit_once(':').expect("image:tag");
    let log =
        std::fs::File::create(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("operator.log"))
            .expect("operator log");
    let child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{NETNS}"))
        .arg(binary)
        .args([
            "--metrics-bind-address",
            "127.0.0.1:18080",
            "--health-probe-bind-address",
            "127.0.0.1:18081",
            "--leader-elect=false",
            "--webhook-cert-path",
        ])
        .arg(&cert_dir)
        .env("KUBECONFIG", cluster.kubeconfig())
        .env("POD_NAMESPACE", OPERATOR_NS)
        .env("FLAGD_PROXY_IMAGE", proxy_repo)
        .env("FLAGD_PROXY_TAG", proxy_tag)
        .env("SIDECAR_IMAGE", flagd_repo)
        .env("SIDECAR_TAG", flagd_tag)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start the operator");
    let ca = std::fs::read(&certs.ca_cert).expect("ca");
    let ca = base64_encode(&ca);
    cluster.apply(
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "open-feature-operator-mutating-webhook-configuration"},
            "webhooks": [{
                "name": "mutate.openfeature.dev",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": "https://127.0.0.1:9443/mutate-v1-pod", "caBundle": ca},
                "failurePolicy": "Fail",
                "sideEffects": "NoneOnDryRun",
                "namespaceSelector": {"matchLabels": {"openfeature.dev/test": "operator"}},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                           "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}]
            }]
        })
        .to_string(),
    );
    Operator {
        child,
        _certs: certs,
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn operator_deploys_the_proxy_image_and_injected_flagd_syncs_through_it() {
    let (cluster, flagd_image) = or_return!(with_flagd(cluster_or_skip()));
    let cluster: &Cluster = &cluster;
    let operator_binary = or_return!(operator_binary());
    let proxy_image = cluster.proxy_image();

    // What the operator's installation provides besides its manager: its namespace, a Deployment
    // of its own to own the proxy's objects (it need not run), the proxy's RBAC.
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {OPERATOR_NS}\n"
    ));
    let manager = json!({
        "metadata": {"labels": {"app": "open-feature-operator"}},
        "spec": {"containers": [{"name": "manager", "image": "localhost/pause:1"}]}
    });
    let manager = deployment(
        OPERATOR_NS,
        "open-feature-operator-controller-manager",
        0,
        manager,
    );
    cluster.apply(&manager.to_string());
    cluster.apply(&operator_proxy_rbac());
    let _operator = start_operator(cluster, &operator_binary, &proxy_image, &flagd_image);

    let ns = "cluster-operator";
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    \
         openfeature.dev/test: operator\n    pod-security.kubernetes.io/enforce: restricted\n"
    ));
    cluster.apply(&feature_flag(ns, "demo", "red"));
    cluster.apply(
        &json!({
            "apiVersion": "core.openfeature.dev/v1beta1",
            "kind": "FeatureFlagSource",
            "metadata": {"name": "demo-source", "namespace": ns},
            "spec": {"sources": [{"source": format!("{ns}/demo"), "provider": "flagd-proxy"}]}
        })
        .to_string(),
    );
    let template = json!({
        "metadata": {
            "labels": {"app": "app"},
            "annotations": {
                "openfeature.dev/enabled": "true",
                "openfeature.dev/featureflagsource": "demo-source"
            }
        },
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "app",
                "image": "localhost/pause:1",
                "imagePullPolicy": "Never",
                "securityContext": restricted_container(),
            }]
        }
    });
    let workload = deployment(ns, "app", 1, template).to_string();

    // The operator creates the proxy Deployment from our image once it sees a flagd-proxy source;
    // until that proxy is Ready it refuses the workload's pods, so the workload is applied when
    // the proxy runs.
    wait_for(
        "the operator's flagd-proxy Deployment",
        CLUSTER_TIMEOUT,
        || {
            let image = cluster.kubectl(&[
                "-n",
                OPERATOR_NS,
                "get",
                "deployment",
                "flagd-proxy",
                "-o",
                "jsonpath={.spec.template.spec.containers[0].image}",
            ])?;
            if image == proxy_image {
                Ok(())
            } else {
                Err(format!("image {image:?}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    cluster.wait_rollout(OPERATOR_NS, "flagd-proxy");
    cluster.apply(&workload);
    cluster.wait_rollout(ns, "app");

    // flagd was injected as a sidecar that dials the operator's Service name for the proxy.
    let sidecar = cluster
        .kubectl(&[
            "-n",
            ns,
            "get",
            "pods",
            "-l",
            "app=app",
            "-o",
            "jsonpath={.items[0].spec.initContainers[0].args}",
        ])
        .expect("sidecar args");
    assert!(
        sidecar.contains(&format!(
            "flagd-proxy-svc.{OPERATOR_NS}.svc.cluster.local:8015"
        )),
        "sidecar args: {sidecar}"
    );
    flagd_follows_an_edit(cluster, ns, "app");
}
