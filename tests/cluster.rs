//! The proxy the way users run it: as a container image in pods of a real single-node cluster
//! (`support/cluster.rs`, `scripts/cluster.sh`), deployed by `deploy/` or by the real OpenFeature
//! Operator, reading FeatureFlags with its in-cluster service-account token, probed by the kubelet
//! and reached by flagd through its Service name.
//!
//! One cluster serves every test of this file; each test works in its own namespaces, and a test
//! that disrupts the cluster itself (an API-server restart) has it alone
//! (`exclusive_cluster_or_skip`): the others wait for it or it for them. Without the
//! cluster's dependencies (root, Debian packages, the Go binaries) the tests print what is missing
//! and pass, unless `CI` is set.
use flagd_proxy_testkit as support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use serde_json::{Value, json};
use support::TestCa;
use support::cluster::{
    CLUSTER_TIMEOUT, Cluster, NETNS, build_proxy_image, cluster_or_skip, exclusive_cluster_or_skip,
    operator_binary, required_file, wait_for,
};
use support::control_plane::test_data;

/// A FeatureFlag `ns/name` with one string flag `color` whose default variant is `default`.
fn feature_flag(ns: &str, name: &str, default: &str) -> String {
    json!({
        "apiVersion": "core.openfeature.dev/v1beta1",
        "kind": "FeatureFlag",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"flagSpec": {"flags": {"color": {
            "state": "ENABLED",
            "variants": {"red": "red", "blue": "blue"},
            "defaultVariant": default
        }}}}
    })
    .to_string()
}

/// The `restricted` container security context.
fn restricted_container() -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}
    })
}

/// Evaluates the string flag `color` through flagd's evaluation API at `ip:8013`.
fn evaluate_color(cluster: &Cluster, ip: &str) -> Result<String, String> {
    let body = cluster.http_post_json(
        &format!("http://{ip}:8013/flagd.evaluation.v1.Service/ResolveString"),
        r#"{"flagKey":"color","context":{}}"#,
    )?;
    let answer: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    answer["value"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no value in {body}"))
}

/// Waits until flagd at `ip` evaluates `color` to `want`.
fn wait_for_color(cluster: &Cluster, ip: &str, want: &str) {
    wait_for(
        &format!("flagd at {ip} to evaluate color={want}"),
        CLUSTER_TIMEOUT,
        || {
            let got = evaluate_color(cluster, ip)?;
            if got == want {
                Ok(())
            } else {
                Err(format!("color={got}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Changes the default variant of `color` in the FeatureFlag `ns/name`.
fn set_default_color(cluster: &Cluster, ns: &str, name: &str, default: &str) {
    let patch = json!({"spec": {"flagSpec": {"flags": {"color": {"defaultVariant": default}}}}});
    cluster
        .kubectl(&[
            "-n",
            ns,
            "patch",
            "featureflag",
            name,
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ])
        .unwrap_or_else(|e| panic!("patch FeatureFlag: {e}"));
}

/// The one Running pod's IP for `selector` in `ns`.
fn single_pod_ip(cluster: &Cluster, ns: &str, selector: &str) -> String {
    wait_for(
        &format!("a Running pod {selector} in {ns}"),
        CLUSTER_TIMEOUT,
        || match cluster.pod_ips(ns, selector)?.as_slice() {
            [ip] => Ok(ip.clone()),
            other => Err(format!("pod IPs {other:?}")),
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn deploy_kustomization_runs_restricted_and_serves_flagd_through_its_service() {
    let Some(cluster) = cluster_or_skip() else {
        return;
    };
    let cluster: &Cluster = &cluster;
    let Some(flagd_image) = cluster.flagd_image() else {
        return;
    };
    cluster.install_crds();
    cluster.proxy_image();
    // deploy/ names the placeholder image with IfNotPresent: give the node our image under it.
    cluster.tag_image(
        "localhost/flagd-proxy:test",
        "ghcr.io/open-feature/flagd-proxy-rs:latest",
    );

    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    cluster
        .kubectl(&["apply", "-k", &deploy.display().to_string()])
        .unwrap_or_else(|e| panic!("kubectl apply -k deploy/: {e}"));
    cluster.wait_rollout("flagd-proxy", "flagd-proxy");

    // The namespace enforces `restricted`: the API server admitted the proxy's pods under it.
    let enforce = cluster
        .kubectl(&[
            "get",
            "namespace",
            "flagd-proxy",
            "-o",
            "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
        ])
        .expect("namespace");
    assert_eq!(enforce, "restricted");
    // In-cluster configuration only: no --kube-* flag, no kubeconfig.
    let args = cluster
        .kubectl(&[
            "-n",
            "flagd-proxy",
            "get",
            "deployment",
            "flagd-proxy",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].args}",
        ])
        .expect("deployment args");
    assert!(!args.contains("--kube"), "args: {args}");

    // Probes answered by the kubelet made the pods Ready; the management port answers through
    // each pod IP too.
    let ips = cluster
        .pod_ips("flagd-proxy", "app.kubernetes.io/name=flagd-proxy")
        .expect("proxy pod IPs");
    assert_eq!(ips.len(), 2, "proxy pods: {ips:?}");
    for ip in &ips {
        cluster
            .http_get(&format!("http://{ip}:8016/readyz"))
            .unwrap_or_else(|e| panic!("/readyz of {ip}: {e}"));
        let metrics = cluster
            .http_get(&format!("http://{ip}:8016/metrics"))
            .unwrap_or_else(|e| panic!("/metrics of {ip}: {e}"));
        assert!(metrics.contains("# TYPE"), "metrics of {ip}: {metrics}");
    }

    // flagd in another namespace, `restricted` too, syncs through the Service name.
    let ns = "cluster-kustomize";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    let sources = json!([{
        "uri": "flagd-proxy-svc.flagd-proxy.svc.cluster.local:8015",
        "provider": "grpc",
        "selector": format!("core.openfeature.dev/{ns}/demo"),
    }]);
    cluster.apply(&Flagd::new(ns, "flagd", &flagd_image, sources).manifest());
    cluster.wait_rollout(ns, "flagd");
    let flagd = single_pod_ip(cluster, ns, "app=flagd");
    wait_for_color(cluster, &flagd, "red");
    set_default_color(cluster, ns, "demo", "blue");
    wait_for_color(cluster, &flagd, "blue");
}

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
fn operator_deploys_the_proxy_image_and_injected_flagd_syncs_through_it() {
    let Some(cluster) = cluster_or_skip() else {
        return;
    };
    let cluster: &Cluster = &cluster;
    let Some(operator_binary) = operator_binary() else {
        return;
    };
    let Some(flagd_image) = cluster.flagd_image() else {
        return;
    };
    cluster.install_crds();
    let proxy_image = cluster.proxy_image();

    // What the operator's installation provides besides its manager: its namespace, a Deployment
    // of its own to own the proxy's objects (it need not run), the proxy's RBAC.
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {OPERATOR_NS}\n"
    ));
    cluster.apply(
        &json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "open-feature-operator-controller-manager", "namespace": OPERATOR_NS},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "open-feature-operator"}},
                "template": {
                    "metadata": {"labels": {"app": "open-feature-operator"}},
                    "spec": {"containers": [{"name": "manager", "image": "localhost/pause:1"}]}
                }
            }
        })
        .to_string(),
    );
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
    let workload = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "app", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "app"}},
            "template": {
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
            }
        }
    })
    .to_string();

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
    let app = single_pod_ip(cluster, ns, "app=app");
    wait_for_color(cluster, &app, "red");
    set_default_color(cluster, ns, "demo", "blue");
    wait_for_color(cluster, &app, "blue");
}

/// `from` and `to` are absolute; the relative path from directory `from` to `to` (kustomize
/// refuses absolute paths to bases).
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for part in &to[common..] {
        path.push(part);
    }
    path
}

/// Installs `deploy/` a second time, as namespace `flagd-proxy-<name>` with names suffixed
/// `-<name>`, through a kustomize overlay (the way docs/kubernetes.md suggests customising it).
fn install_deploy_overlay(
    cluster: &Cluster,
    name: &str,
    image: &str,
    components: &[&str],
) -> String {
    let overlay = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("cluster-overlays")
        .join(name);
    std::fs::create_dir_all(&overlay).expect("overlay dir");
    let overlay = overlay.canonicalize().expect("canonical overlay dir");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .canonicalize()
        .expect("deploy/");
    let (image_name, image_tag) = image.rsplit_once(':').expect("image:tag");
    let ns = format!("flagd-proxy-{name}");
    let base = relative_path(&overlay, &deploy);
    let mut components_yaml = String::new();
    if !components.is_empty() {
        components_yaml.push_str("components:\n");
        for component in components {
            components_yaml.push_str(&format!(
                "  - {}\n",
                base.join("components").join(component).display()
            ));
        }
    }
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             namespace: {ns}\nnameSuffix: -{name}\nresources:\n  - {base}\n{components_yaml}\
             labels:\n  - pairs: {{flagd-proxy.test/install: {name}}}\n    includeSelectors: true\n\
             images:\n  - name: ghcr.io/open-feature/flagd-proxy-rs\n    newName: {image_name}\n    newTag: {image_tag}\n",
            base = base.display()
        ),
    )
    .expect("write kustomization");
    cluster
        .kubectl(&["apply", "-k", &overlay.display().to_string()])
        .unwrap_or_else(|e| panic!("kubectl apply -k {}: {e}", overlay.display()));
    cluster.wait_rollout(&ns, &format!("flagd-proxy-{name}"));
    ns
}

/// What one evaluation through a flagd pod gave.
enum Evaluation {
    Value(String),
    /// flagd answered with an error (no flag, no configuration): a real failure.
    Refused(String),
    /// No answer at all (the request timed out on a busy machine): says nothing about flagd.
    NoAnswer(String),
}

fn evaluate_once(cluster: &Cluster, ip: &str) -> Evaluation {
    let url = format!("http://{ip}:8013/flagd.evaluation.v1.Service/ResolveString");
    let result = cluster.exec(&[
        "curl",
        "-sS",
        "--max-time",
        "10",
        "-H",
        "Content-Type: application/json",
        "--data",
        r#"{"flagKey":"color","context":{}}"#,
        &url,
    ]);
    match result {
        Err(error) => Evaluation::NoAnswer(error),
        Ok(body) => match serde_json::from_str::<Value>(&body) {
            Ok(answer) => match answer["value"].as_str() {
                Some(value) => Evaluation::Value(value.to_owned()),
                None => Evaluation::Refused(body),
            },
            Err(_) => Evaluation::Refused(body),
        },
    }
}

/// Waits until every flagd in `ips` evaluates `color` to `want`.
fn wait_for_all(cluster: &Cluster, ips: &[String], want: &str) {
    for ip in ips {
        wait_for_color(cluster, ip, want);
    }
}

#[test]
fn rollout_pod_deletion_and_apiserver_restart_keep_twenty_flagds_serving() {
    // It restarts the API server: no other test may be using the cluster meanwhile.
    let Some(exclusive) = exclusive_cluster_or_skip() else {
        return;
    };
    let cluster: &Cluster = &exclusive;
    let Some(flagd_image) = cluster.flagd_image() else {
        return;
    };
    cluster.install_crds();
    let proxy_image = cluster.proxy_image();
    let proxy_ns = install_deploy_overlay(cluster, "faults", &proxy_image, &[]);
    let proxy = "flagd-proxy-faults";

    let ns = "cluster-faults";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    let sources = json!([{
        "uri": format!("flagd-proxy-svc-faults.{proxy_ns}.svc.cluster.local:8015"),
        "provider": "grpc",
        "selector": format!("core.openfeature.dev/{ns}/demo"),
    }]);
    const FLAGDS: usize = 20;
    let mut flagds = Flagd::new(ns, "flagd", &flagd_image, sources);
    flagds.replicas = FLAGDS;
    flagds.readiness_period = Some(5);
    cluster.apply(&flagds.manifest());
    cluster.wait_rollout(ns, "flagd");
    let ips = wait_for(
        &format!("{FLAGDS} Running flagd pods"),
        CLUSTER_TIMEOUT,
        || {
            let ips = cluster.pod_ips(ns, "app=flagd")?;
            if ips.len() == FLAGDS {
                Ok(ips)
            } else {
                Err(format!("{} pods", ips.len()))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    wait_for_all(cluster, &ips, "red");

    // From here on every flagd is asked again and again; none may ever answer with an error
    // (a lost configuration) while proxies come and go.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let refusals = std::sync::Mutex::new(Vec::<String>::new());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for ip in &ips {
                    match evaluate_once(cluster, ip) {
                        Evaluation::Value(value) if value == "red" || value == "blue" => {}
                        Evaluation::Value(value) => refusals
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("{ip}: value {value}")),
                        Evaluation::Refused(body) => refusals
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("{ip}: {body}")),
                        Evaluation::NoAnswer(error) => eprintln!("{ip}: no answer: {error}"),
                    }
                }
            }
        });
        let steps = || {
            // 1. A rolling restart of the two proxy replicas.
            cluster
                .kubectl(&[
                    "-n",
                    &proxy_ns,
                    "rollout",
                    "restart",
                    &format!("deployment/{proxy}"),
                ])
                .unwrap_or_else(|e| panic!("rollout restart: {e}"));
            cluster.wait_rollout(&proxy_ns, proxy);
            set_default_color(cluster, ns, "demo", "blue");
            wait_for_all(cluster, &ips, "blue");

            // 2. One proxy pod deleted: its ReplicaSet replaces it.
            let before = cluster
                .kubectl(&["-n", &proxy_ns, "get", "pods", "-o", "name"])
                .expect("proxy pods");
            let victim = before.lines().next().expect("a proxy pod").to_owned();
            cluster
                .kubectl(&["-n", &proxy_ns, "delete", &victim, "--wait=true"])
                .unwrap_or_else(|e| panic!("delete {victim}: {e}"));
            wait_for("two Ready proxy replicas again", CLUSTER_TIMEOUT, || {
                let ready = cluster.kubectl(&[
                    "-n",
                    &proxy_ns,
                    "get",
                    "deployment",
                    proxy,
                    "-o",
                    "jsonpath={.status.readyReplicas}",
                ])?;
                if ready == "2" {
                    Ok(())
                } else {
                    Err(format!("readyReplicas={ready}"))
                }
            })
            .unwrap_or_else(|e| panic!("{e}"));
            set_default_color(cluster, ns, "demo", "red");
            wait_for_all(cluster, &ips, "red");

            // 3. The API server restarted: the proxies' watches end and must come back.
            exclusive.restart_apiserver();
            set_default_color(cluster, ns, "demo", "blue");
            wait_for_all(cluster, &ips, "blue");
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(steps));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    });
    let refusals = refusals.into_inner().unwrap_or_else(|e| e.into_inner());
    assert!(
        refusals.is_empty(),
        "flagd answered with errors while the proxies changed: {refusals:#?}"
    );
}

/// The namespace of a watched FeatureFlag is deleted (the namespace controller deletes the
/// FeatureFlag with it) and created again: the flagd that reads the resource through the proxy
/// keeps evaluating its last flags meanwhile, as flagd's own Kubernetes sync does for a deleted
/// resource, and gets the resource once it exists again.
#[test]
fn a_watched_resources_namespace_deleted_and_created_again_serves_it_again() {
    let Some(cluster) = cluster_or_skip() else {
        return;
    };
    let cluster: &Cluster = &cluster;
    let Some(flagd_image) = cluster.flagd_image() else {
        return;
    };
    cluster.install_crds();
    let proxy_image = cluster.proxy_image();
    let proxy_ns = install_deploy_overlay(cluster, "nsgone", &proxy_image, &[]);
    let flags_ns = "cluster-nsgone-flags";
    cluster.restricted_namespace(flags_ns);
    cluster.apply(&feature_flag(flags_ns, "demo", "red"));
    let ns = "cluster-nsgone";
    cluster.restricted_namespace(ns);
    let flagd = Flagd::from(
        ns,
        "flagd",
        &flagd_image,
        &format!("flagd-proxy-svc-nsgone.{proxy_ns}.svc.cluster.local:8015"),
        &format!("core.openfeature.dev/{flags_ns}/demo"),
    );
    cluster.apply(&flagd.manifest());
    cluster.wait_rollout(ns, "flagd");
    let ip = single_pod_ip(cluster, ns, "app=flagd");
    wait_for_color(cluster, &ip, "red");

    cluster
        .kubectl(&[
            "delete",
            "namespace",
            flags_ns,
            "--wait=true",
            "--timeout=180s",
        ])
        .unwrap_or_else(|e| panic!("delete namespace {flags_ns}: {e}"));
    assert_eq!(
        evaluate_color(cluster, &ip).as_deref(),
        Ok("red"),
        "flagd keeps the last flags of a resource that is gone"
    );

    cluster.restricted_namespace(flags_ns);
    cluster.apply(&feature_flag(flags_ns, "demo", "blue"));
    wait_for_color(cluster, &ip, "blue");
}

/// A CA and a server certificate for `dns_name`, as PEM: (CA cert, server cert, server key).
fn tls_material(dns_name: &str) -> (String, String, String) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "flagd-proxy cluster test CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let params = rcgen::CertificateParams::new(vec![dns_name.to_owned()]).expect("params");
    let key = rcgen::KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &issuer).expect("server cert");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

#[test]
fn tls_from_a_secret_serves_flagd_that_verifies_the_service_name() {
    let Some(cluster) = cluster_or_skip() else {
        return;
    };
    let cluster: &Cluster = &cluster;
    let Some(flagd_image) = cluster.flagd_image() else {
        return;
    };
    cluster.install_crds();
    let proxy_image = cluster.proxy_image();
    let proxy_ns = "flagd-proxy-tls";
    let service = format!("flagd-proxy-svc-tls.{proxy_ns}.svc.cluster.local");
    let (ca, cert, key) = tls_material(&service);
    // The namespace and the Secret the tls component mounts exist before the proxy starts.
    cluster.restricted_namespace(proxy_ns);
    cluster.apply(
        &json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "flagd-proxy-tls", "namespace": proxy_ns},
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": cert, "tls.key": key}
        })
        .to_string(),
    );
    install_deploy_overlay(cluster, "tls", &proxy_image, &["tls"]);

    let ns = "cluster-tls";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    cluster.apply(
        &json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "proxy-ca", "namespace": ns},
            "data": {"ca.crt": ca}
        })
        .to_string(),
    );
    let sources = json!([{
        "uri": format!("{service}:8015"),
        "provider": "grpc",
        "tls": true,
        "certPath": "/etc/proxy-ca/ca.crt",
        "selector": format!("core.openfeature.dev/{ns}/demo"),
    }]);
    let mut flagd = Flagd::new(ns, "flagd", &flagd_image, sources);
    flagd.ca_config_map = Some("proxy-ca");
    cluster.apply(&flagd.manifest());
    cluster.wait_rollout(ns, "flagd");
    let flagd = single_pod_ip(cluster, ns, "app=flagd");
    wait_for_color(cluster, &flagd, "red");
    set_default_color(cluster, ns, "demo", "blue");
    wait_for_color(cluster, &flagd, "blue");

    // The sync port speaks TLS only: a plaintext gRPC request gets no HTTP/2 answer.
    let proxy_ip = cluster
        .pod_ips(proxy_ns, "app.kubernetes.io/name=flagd-proxy")
        .expect("proxy pod IPs")
        .into_iter()
        .next()
        .expect("a proxy pod");
    let plaintext = cluster.exec(&[
        "curl",
        "-sS",
        "--max-time",
        "5",
        "--http2-prior-knowledge",
        &format!("http://{proxy_ip}:8015/"),
    ]);
    assert!(plaintext.is_err(), "plaintext answered: {plaintext:?}");
}

#[test]
fn build_image_is_reproducible() {
    const REPRO_REFERENCE: &str = "localhost/flagd-proxy:repro";
    let dir = tempfile::tempdir().expect("tempdir");
    let first = build_proxy_image(&dir.path().join("a.tar"), REPRO_REFERENCE);
    let second = build_proxy_image(&dir.path().join("b.tar"), REPRO_REFERENCE);
    assert!(first.starts_with("sha256:"), "digest: {first}");
    assert_eq!(first, second);
    let a = std::fs::read(dir.path().join("a.tar")).expect("a.tar");
    let b = std::fs::read(dir.path().join("b.tar")).expect("b.tar");
    assert!(a == b, "the two archives differ");
}

/// The Dockerfile and scripts/build-image.sh make one image layout: both assemble the root
/// filesystem with scripts/image-rootfs.sh, and the runtime stage adds nothing to it but the
/// same user, entrypoint and command as the archive's config.
#[test]
fn dockerfile_assembles_the_same_root_filesystem_as_build_image() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    let script = std::fs::read_to_string(root.join("scripts/build-image.sh")).expect("script");
    let instructions: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(
        instructions.contains(&"RUN scripts/image-rootfs.sh /out/flagd-proxy /rootfs"),
        "the build stage must assemble /rootfs with scripts/image-rootfs.sh"
    );
    let runtime: Vec<&str> = instructions
        .iter()
        .skip_while(|l| **l != "FROM scratch")
        .copied()
        .collect();
    assert!(
        !runtime.is_empty(),
        "the runtime stage must be FROM scratch"
    );
    let adds: Vec<&&str> = runtime
        .iter()
        .filter(|l| l.starts_with("COPY") || l.starts_with("ADD") || l.starts_with("RUN"))
        .collect();
    assert_eq!(adds, [&"COPY --from=builder /rootfs/ /"]);
    assert!(runtime.contains(&"USER 65532:65532"));
    assert!(runtime.contains(&"ENTRYPOINT [\"/flagd-proxy\"]"));
    assert!(runtime.contains(&"CMD [\"start\"]"));
    assert!(script.contains("scripts/image-rootfs.sh \"$binary\" \"$rootfs\""));
    assert!(script.contains("'[\"/flagd-proxy\"]' '[\"start\"]' 65532:65532"));
}

/// A Deployment of flagd pods (label `app: <name>`) that sync from `sources` (flagd's
/// `--sources`), under the restricted profile.
struct Flagd<'a> {
    ns: &'a str,
    name: &'a str,
    image: &'a str,
    sources: Value,
    replicas: usize,
    account: &'a str,
    /// Seconds between readiness probes of `/readyz`; `None`: no probe (a flagd the proxy refuses
    /// never becomes ready, and a test may still wait for its rollout).
    readiness_period: Option<u32>,
    /// A ConfigMap mounted at `/etc/proxy-ca` (the CA a TLS source names in `certPath`).
    ca_config_map: Option<&'a str>,
}

/// A flagd without a readiness probe, running as service account `account`.
fn unprobed_flagd(
    ns: &str,
    name: &str,
    account: &str,
    image: &str,
    uri: &str,
    selector: &str,
) -> String {
    let mut flagd = Flagd::from(ns, name, image, uri, selector);
    flagd.account = account;
    flagd.readiness_period = None;
    flagd.manifest()
}

impl<'a> Flagd<'a> {
    fn new(ns: &'a str, name: &'a str, image: &'a str, sources: Value) -> Self {
        Self {
            ns,
            name,
            image,
            sources,
            replicas: 1,
            account: "default",
            readiness_period: Some(2),
            ca_config_map: None,
        }
    }

    /// One flagd syncing `selector` from the proxy at `uri`.
    fn from(ns: &'a str, name: &'a str, image: &'a str, uri: &str, selector: &str) -> Self {
        let sources = json!([{"uri": uri, "provider": "grpc", "selector": selector}]);
        Self::new(ns, name, image, sources)
    }

    fn manifest(&self) -> String {
        let mut container = json!({
            "name": "flagd",
            "image": self.image,
            "imagePullPolicy": "IfNotPresent",
            "args": ["start", "--port", "8013", "--management-port", "8014",
                     "--sources", self.sources.to_string()],
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
            "securityContext": restricted_container(),
        });
        let mut pod = json!({
            "serviceAccountName": self.account,
            "automountServiceAccountToken": false,
        });
        if let Some(period) = self.readiness_period {
            container["readinessProbe"] =
                json!({"httpGet": {"path": "/readyz", "port": 8014}, "periodSeconds": period});
        }
        if let Some(config_map) = self.ca_config_map {
            container["volumeMounts"] =
                json!([{"name": "ca", "mountPath": "/etc/proxy-ca", "readOnly": true}]);
            pod["volumes"] = json!([{"name": "ca", "configMap": {"name": config_map}}]);
        }
        pod["containers"] = json!([container]);
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": self.name, "namespace": self.ns},
            "spec": {
                "replicas": self.replicas,
                "selector": {"matchLabels": {"app": self.name}},
                "template": {"metadata": {"labels": {"app": self.name}}, "spec": pod}
            }
        })
        .to_string()
    }
}

/// `flagd_proxy_rejected_requests_total{reason="unauthorized"}` summed over the proxy pods.
fn unauthorized_rejections(cluster: &Cluster, proxy_ns: &str) -> Result<u64, String> {
    let mut total = 0;
    for ip in cluster.pod_ips(proxy_ns, "app.kubernetes.io/name=flagd-proxy")? {
        let metrics = cluster.http_get(&format!("http://{ip}:8016/metrics"))?;
        total += metrics
            .lines()
            .filter(|l| {
                l.starts_with("flagd_proxy_rejected_requests_total{reason=\"unauthorized\"}")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(total)
}

#[test]
fn authz_rbac_by_pod_ip_serves_the_allowed_account_and_refuses_its_neighbour() {
    let Some(cluster) = cluster_or_skip() else {
        return;
    };
    let cluster: &Cluster = &cluster;
    let Some(flagd_image) = cluster.flagd_image() else {
        return;
    };
    cluster.install_crds();
    let proxy_image = cluster.proxy_image();
    let proxy_ns = install_deploy_overlay(
        cluster,
        "authz",
        &proxy_image,
        &["authz-rbac", "authz-pod-ip"],
    );

    // Two service accounts; RBAC lets only `reader` get the FeatureFlag.
    let ns = "cluster-authz";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    reader_and_stranger(cluster, ns);
    let uri = format!("flagd-proxy-svc-authz.{proxy_ns}.svc.cluster.local:8015");
    let selector = format!("core.openfeature.dev/{ns}/demo");
    let before = wait_for("the proxies' metrics", CLUSTER_TIMEOUT, || {
        unauthorized_rejections(cluster, &proxy_ns)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    cluster.apply(&unprobed_flagd(
        ns,
        "reader",
        "reader",
        &flagd_image,
        &uri,
        &selector,
    ));
    cluster.apply(&unprobed_flagd(
        ns,
        "stranger",
        "stranger",
        &flagd_image,
        &uri,
        &selector,
    ));
    cluster.wait_rollout(ns, "reader");
    cluster.wait_rollout(ns, "stranger");

    let reader = single_pod_ip(cluster, ns, "app=reader");
    wait_for_color(cluster, &reader, "red");
    // The stranger's requests are refused as unauthorized (it retries, so the count grows) ...
    wait_for("an unauthorized rejection", CLUSTER_TIMEOUT, || {
        let now = unauthorized_rejections(cluster, &proxy_ns)?;
        if now > before {
            Ok(())
        } else {
            Err(format!("rejected {now}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // ... and it has no flag to evaluate, while its neighbour follows an edit.
    let stranger = single_pod_ip(cluster, ns, "app=stranger");
    set_default_color(cluster, ns, "demo", "blue");
    wait_for_color(cluster, &reader, "blue");
    match evaluate_once(cluster, &stranger) {
        Evaluation::Value(value) => panic!("the stranger evaluated color={value}"),
        Evaluation::Refused(_) | Evaluation::NoAnswer(_) => {}
    }
}

#[test]
fn in_process_go_provider_pod_syncs_through_the_service_name() {
    let Some(cluster) = cluster_or_skip() else {
        return;
    };
    let cluster: &Cluster = &cluster;
    let Some(client_image) = cluster.interop_go_image() else {
        return;
    };
    cluster.install_crds();
    let proxy_image = cluster.proxy_image();
    let proxy_ns = install_deploy_overlay(cluster, "inprocess", &proxy_image, &[]);

    // The Go provider does not report READY when its very first connection fails, even after it
    // connects on retry: start it once kube-proxy routes the new Service to a proxy.
    wait_for_proxy_service(cluster, &proxy_ns, "flagd-proxy-svc-inprocess");

    let ns = "cluster-inprocess";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    let env = vec![
        json!({"name": "FLAGD_HOST",
               "value": format!("flagd-proxy-svc-inprocess.{proxy_ns}.svc.cluster.local")}),
        json!({"name": "FLAGD_PORT", "value": "8015"}),
        json!({"name": "FLAGD_SOURCE_SELECTOR",
               "value": format!("core.openfeature.dev/{ns}/demo")}),
        json!({"name": "INTEROP_FLAG_KEY", "value": "color"}),
    ];
    cluster.apply(&go_client(ns, "app", &client_image, "default", env, None));
    cluster.wait_rollout(ns, "app");
    wait_for_client_line(cluster, ns, "app", "VALUE red");
    set_default_color(cluster, ns, "demo", "blue");
    wait_for_client_line(cluster, ns, "app", "VALUE blue");
}

#[test]
fn helm_chart_in_both_mode_serves_flagd_through_the_central_and_the_node_service() {
    let Some(cluster) = cluster_or_skip() else {
        return;
    };
    let cluster: &Cluster = &cluster;
    let Some(helm) = helm_binary() else {
        return;
    };
    let Some(flagd_image) = cluster.flagd_image() else {
        return;
    };
    cluster.install_crds();

    // mode=both: central proxies (Deployment) and a node-local tier (DaemonSet, Service with
    // internalTrafficPolicy: Local) chained to them.
    let proxy_ns = "flagd-proxy-helm";
    cluster.restricted_namespace(proxy_ns);
    helm_install(
        cluster,
        &helm,
        "flagd-proxy",
        proxy_ns,
        &["mode=both".to_owned()],
    );
    let services = cluster
        .kubectl(&["-n", proxy_ns, "get", "services", "-o", "name"])
        .expect("services");
    let node_service = services
        .lines()
        .filter_map(|l| l.strip_prefix("service/"))
        .find(|name| name.ends_with("-node"))
        .unwrap_or_else(|| panic!("no node Service in {services}"))
        .to_owned();

    let ns = "cluster-helm";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    let selector = format!("core.openfeature.dev/{ns}/demo");
    let through = [
        (
            "central",
            format!("flagd-proxy-svc.{proxy_ns}.svc.cluster.local:8015"),
        ),
        (
            "node",
            format!("{node_service}.{proxy_ns}.svc.cluster.local:8015"),
        ),
    ];
    for (name, uri) in &through {
        cluster.apply(&unprobed_flagd(
            ns,
            name,
            "default",
            &flagd_image,
            uri,
            &selector,
        ));
    }
    let mut ips = Vec::new();
    for (name, _) in &through {
        cluster.wait_rollout(ns, name);
        ips.push(single_pod_ip(cluster, ns, &format!("app={name}")));
    }
    wait_for_all(cluster, &ips, "red");
    set_default_color(cluster, ns, "demo", "blue");
    wait_for_all(cluster, &ips, "blue");
}

/// `helm install RELEASE charts/flagd-proxy` into `ns` with the proxy image under test and
/// `sets`, waiting until every workload is ready.
fn helm_install(cluster: &Cluster, helm: &Path, release: &str, ns: &str, sets: &[String]) {
    let (repository, tag) = cluster
        .proxy_image()
        .rsplit_once(':')
        .map(|(r, t)| (r.to_owned(), t.to_owned()))
        .expect("image:tag");
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/flagd-proxy");
    let kubeconfig = format!("KUBECONFIG={}", cluster.kubeconfig());
    let mut args = vec![
        "env".to_owned(),
        kubeconfig,
        helm.display().to_string(),
        "install".to_owned(),
        release.to_owned(),
        chart.display().to_string(),
        "--namespace".to_owned(),
        ns.to_owned(),
        "--set".to_owned(),
        format!("image.repository={repository}"),
        "--set".to_owned(),
        format!("image.tag={tag}"),
        "--wait".to_owned(),
        "--timeout".to_owned(),
        "4m".to_owned(),
    ];
    for set in sets {
        args.push("--set".to_owned());
        args.push(set.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    if let Err(error) = cluster.exec(&args) {
        let pods = cluster
            .kubectl(&["-n", ns, "get", "pods", "-o", "wide"])
            .unwrap_or_default();
        panic!("helm install {release} in {ns}: {error}\npods:\n{pods}");
    }
}

/// A Deployment `ns/name` of the Go provider client (interop/go) with `env`, running as
/// service account `account`; with `token_audience`, the pod has a projected service-account
/// token for that audience at /var/run/secrets/flagd-proxy/token and the client sends it.
fn go_client(
    ns: &str,
    name: &str,
    image: &str,
    account: &str,
    mut env: Vec<Value>,
    token_audience: Option<&str>,
) -> String {
    let mut container = json!({
        "name": "app",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        // The client exits when its stdin ends: keep it open.
        "stdin": true,
        "securityContext": restricted_container(),
    });
    let mut pod = json!({
        "serviceAccountName": account,
        "automountServiceAccountToken": false,
        "securityContext": {"fsGroup": 65532},
    });
    if let Some(audience) = token_audience {
        env.push(
            json!({"name": "INTEROP_TOKEN_PATH", "value": "/var/run/secrets/flagd-proxy/token"}),
        );
        container["volumeMounts"] = json!([{"name": "token", "mountPath": "/var/run/secrets/flagd-proxy", "readOnly": true}]);
        pod["volumes"] = json!([{"name": "token", "projected": {"sources": [
            {"serviceAccountToken": {"audience": audience, "expirationSeconds": 600, "path": "token"}}
        ]}}]);
    }
    container["env"] = Value::Array(env);
    pod["containers"] = json!([container]);
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod}
        }
    })
    .to_string()
}

/// The Go client's environment for evaluating `color` in RPC mode through flagd at `host:8013`.
fn rpc_client_env(host: &str) -> Vec<Value> {
    vec![
        json!({"name": "INTEROP_RESOLVER", "value": "rpc"}),
        json!({"name": "FLAGD_HOST", "value": host}),
        json!({"name": "FLAGD_PORT", "value": "8013"}),
        json!({"name": "INTEROP_FLAG_KEY", "value": "color"}),
    ]
}

/// The log of Deployment `ns/name` (the Go client) so far.
fn client_log(cluster: &Cluster, ns: &str, name: &str) -> Result<String, String> {
    cluster.kubectl(&["-n", ns, "logs", &format!("deployment/{name}")])
}

/// Waits until the Go client Deployment `ns/name` prints the line `want`.
fn wait_for_client_line(cluster: &Cluster, ns: &str, name: &str, want: &str) {
    wait_for(
        &format!("{ns}/{name} to print {want}"),
        CLUSTER_TIMEOUT,
        || {
            let out = client_log(cluster, ns, name)?;
            if out.lines().any(|l| l.trim() == want) {
                Ok(())
            } else {
                Err(format!("output: {out:?}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The ClusterIP of Service `ns/name`.
fn cluster_ip(cluster: &Cluster, ns: &str, name: &str) -> String {
    cluster
        .kubectl(&[
            "-n",
            ns,
            "get",
            "service",
            name,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .unwrap_or_else(|e| panic!("address of Service {ns}/{name}: {e}"))
}

#[test]
fn helm_chart_central_and_node_modes_serve_flagd_shapes_and_rpc_providers() {
    let Some(cluster) = cluster_or_skip() else {
        return;
    };
    let cluster: &Cluster = &cluster;
    let Some(helm) = helm_binary() else {
        return;
    };
    let Some(flagd_image) = cluster.flagd_image() else {
        return;
    };
    let Some(client_image) = cluster.interop_go_image() else {
        return;
    };
    cluster.install_crds();
    let (flagd_repository, flagd_tag) = flagd_image.rsplit_once(':').expect("image:tag");

    let ns = "cluster-modes";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    let flagd_values = |shapes: &[&str]| {
        let mut sets = vec![
            format!("flagd.featureFlags={{{ns}/demo}}"),
            format!("flagd.image.repository={flagd_repository}"),
            format!("flagd.image.tag={flagd_tag}"),
            "flagd.deployment.replicas=1".to_owned(),
        ];
        sets.extend(shapes.iter().map(|s| format!("flagd.{s}.enabled=true")));
        sets
    };

    // mode=central alone, serving TLS with a certificate for its Service name from the Secret
    // the chart mounts (tls.crt, tls.key, and ca.crt for the flagd workloads), with both flagd
    // shapes: the Deployment's flagd and the DaemonSet's both sync from the central Service
    // over TLS and verify its name against that CA.
    let central_ns = "flagd-proxy-central";
    let central_service = format!("flagd-proxy-svc.{central_ns}.svc.cluster.local");
    let (ca, cert, key) = tls_material(&central_service);
    cluster.restricted_namespace(central_ns);
    cluster.apply(
        &json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "flagd-proxy-tls", "namespace": central_ns},
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": cert, "tls.key": key, "ca.crt": ca}
        })
        .to_string(),
    );
    let mut sets = vec![
        "mode=central".to_owned(),
        "central.replicas=1".to_owned(),
        "tls.enabled=true".to_owned(),
    ];
    sets.extend(flagd_values(&["deployment", "daemonset"]));
    helm_install(cluster, &helm, "flagd-proxy", central_ns, &sets);

    // mode=node alone, chained over TLS to that central tier (the CA from a Secret of its own
    // namespace), with a flagd Deployment that syncs from the node Service.
    let node_ns = "flagd-proxy-node";
    cluster.restricted_namespace(node_ns);
    cluster.apply(
        &json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "central-ca", "namespace": node_ns},
            "stringData": {"ca.crt": ca}
        })
        .to_string(),
    );
    let mut sets = vec![
        "mode=node".to_owned(),
        format!("node.upstream.address={central_service}:8015"),
        "node.upstream.tls=true".to_owned(),
        "node.upstream.ca.secretName=central-ca".to_owned(),
    ];
    sets.extend(flagd_values(&["deployment"]));
    helm_install(cluster, &helm, "flagd-proxy", node_ns, &sets);

    let flagd_pods = [
        (central_ns, "flagd-deployment"),
        (central_ns, "flagd-daemonset"),
        (node_ns, "flagd-deployment"),
    ];
    let ips: Vec<String> = flagd_pods
        .iter()
        .map(|(proxy_ns, component)| {
            single_pod_ip(
                cluster,
                proxy_ns,
                &format!("app.kubernetes.io/name=flagd,app.kubernetes.io/component={component}"),
            )
        })
        .collect();
    wait_for_all(cluster, &ips, "red");

    // RPC-mode providers through the flagd Deployment's Service, the DaemonSet's node-local
    // Service, and the node-mode release's flagd. The Go provider does not recover from a
    // failed first connection: start each once its Service answers.
    let services = [
        ("rpc-deployment", central_ns, "flagd-proxy-flagd"),
        ("rpc-daemonset", central_ns, "flagd-proxy-flagd-node"),
        ("rpc-node-mode", node_ns, "flagd-proxy-flagd"),
    ];
    for (client, proxy_ns, service) in services {
        wait_for_color(cluster, &cluster_ip(cluster, proxy_ns, service), "red");
        let host = format!("{service}.{proxy_ns}.svc.cluster.local");
        cluster.apply(&go_client(
            ns,
            client,
            &client_image,
            "default",
            rpc_client_env(&host),
            None,
        ));
    }
    for (client, _, _) in services {
        cluster.wait_rollout(ns, client);
        wait_for_client_line(cluster, ns, client, "VALUE red");
    }

    set_default_color(cluster, ns, "demo", "blue");
    wait_for_all(cluster, &ips, "blue");
    for (client, _, _) in services {
        wait_for_client_line(cluster, ns, client, "VALUE blue");
    }
}

#[test]
fn authz_rbac_by_projected_token_serves_the_allowed_account_and_refuses_its_neighbour() {
    let Some(cluster) = cluster_or_skip() else {
        return;
    };
    let cluster: &Cluster = &cluster;
    let Some(helm) = helm_binary() else {
        return;
    };
    let Some(client_image) = cluster.interop_go_image() else {
        return;
    };
    cluster.install_crds();
    // The chart's central tier with --authz rbac, accepting only tokens issued for the audience
    // (TokenReview with the audience).
    let audience = "flagd-proxy";
    let proxy_ns = "flagd-proxy-tokens";
    cluster.restricted_namespace(proxy_ns);
    helm_install(
        cluster,
        &helm,
        "flagd-proxy",
        proxy_ns,
        &[
            "central.replicas=1".to_owned(),
            "central.authz.mode=rbac".to_owned(),
            format!("central.authz.tokenAudiences={{{audience}}}"),
        ],
    );

    let ns = "cluster-tokens";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    reader_and_stranger(cluster, ns);

    // The Go provider does not recover from a failed first connection: start the clients once
    // the Service routes to a proxy.
    wait_for_proxy_service(cluster, proxy_ns, "flagd-proxy-svc");
    let before = wait_for("the proxies' metrics", CLUSTER_TIMEOUT, || {
        unauthorized_rejections(cluster, proxy_ns)
    })
    .unwrap_or_else(|e| panic!("{e}"));

    let env = vec![
        json!({"name": "FLAGD_HOST",
               "value": format!("flagd-proxy-svc.{proxy_ns}.svc.cluster.local")}),
        json!({"name": "FLAGD_PORT", "value": "8015"}),
        json!({"name": "FLAGD_SOURCE_SELECTOR", "value": format!("core.openfeature.dev/{ns}/demo")}),
        json!({"name": "INTEROP_FLAG_KEY", "value": "color"}),
    ];
    for account in ["reader", "stranger"] {
        cluster.apply(&go_client(
            ns,
            account,
            &client_image,
            account,
            env.clone(),
            Some(audience),
        ));
    }
    cluster.wait_rollout(ns, "reader");
    cluster.wait_rollout(ns, "stranger");
    wait_for_client_line(cluster, ns, "reader", "VALUE red");
    // The stranger's token authenticates, but its account may not get the FeatureFlag: refused
    // as unauthorized (it retries, so the count grows) ...
    wait_for("an unauthorized rejection", CLUSTER_TIMEOUT, || {
        let now = unauthorized_rejections(cluster, proxy_ns)?;
        if now > before {
            Ok(())
        } else {
            Err(format!("rejected {now}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // A token of the allowed account issued for another audience does not authenticate.
    cluster.apply(&go_client(
        ns,
        "other-audience",
        &client_image,
        "reader",
        env.clone(),
        Some("another-service"),
    ));
    cluster.wait_rollout(ns, "other-audience");
    wait_for("the proxy to reject a token", CLUSTER_TIMEOUT, || {
        let log = cluster.kubectl(&["-n", proxy_ns, "logs", "deployment/flagd-proxy"])?;
        if log.contains("the bearer token was rejected by the API server") {
            Ok(())
        } else {
            Err("no token rejection logged yet".to_owned())
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // Neither ever syncs, while the reader follows an edit.
    set_default_color(cluster, ns, "demo", "blue");
    wait_for_client_line(cluster, ns, "reader", "VALUE blue");
    for refused in ["stranger", "other-audience"] {
        let log = client_log(cluster, ns, refused).expect("client log");
        assert!(
            !log.lines()
                .any(|l| l.starts_with("READY") || l.starts_with("VALUE")),
            "{refused} synced: {log}"
        );
    }
}

/// helm (`scripts/install-helm.sh`): `None` with a notice, or a panic under `CI`, without it.
fn helm_binary() -> Option<PathBuf> {
    required_file(
        &support::control_plane::bin_dir().join("helm"),
        "scripts/install-helm.sh builds it",
    )
}

/// Service accounts `reader` and `stranger` in `ns`; a Role lets only `reader` get the
/// FeatureFlag `demo`.
fn reader_and_stranger(cluster: &Cluster, ns: &str) {
    cluster.apply(&format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: reader, namespace: {ns}}}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: stranger, namespace: {ns}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: read-demo, namespace: {ns}}}\n\
         rules:\n- {{apiGroups: [core.openfeature.dev], resources: [featureflags], resourceNames: [demo], verbs: [get]}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: read-demo, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-demo}}\n\
         subjects: [{{kind: ServiceAccount, name: reader, namespace: {ns}}}]\n"
    ));
}

/// Waits until the proxy Service `ns/name` answers HTTP/2 on 8015 from the node (kube-proxy
/// routes it to a proxy).
fn wait_for_proxy_service(cluster: &Cluster, ns: &str, name: &str) {
    let ip = cluster_ip(cluster, ns, name);
    wait_for("the Service to route to a proxy", CLUSTER_TIMEOUT, || {
        cluster.exec(&[
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "--max-time",
            "5",
            "--http2-prior-knowledge",
            &format!("http://{ip}:8015/"),
        ])
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
