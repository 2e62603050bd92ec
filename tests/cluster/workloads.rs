//! What the cluster tests deploy: flagd and Go-client Deployments, the proxy through a
//! `deploy/` overlay or the Helm chart, and the accounts and certificates they use.

use super::*;

/// The `restricted` container security context.
pub(crate) fn restricted_container() -> Value {
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

/// A Deployment `ns/name` of `replicas` pods made from `template`, selected by all the labels of
/// the template's metadata.
pub(crate) fn deployment(ns: &str, name: &str, replicas: usize, template: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": template["metadata"]["labels"]},
            "template": template
        }
    })
}

/// `from` and `to` are absolute; the relative path from directory `from` to `to` (kustomize
/// refuses absolute paths to bases).
pub(crate) fn relative_path(from: &Path, to: &Path) -> PathBuf {
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

/// Installs `deploy/` a second time with the proxy image under test, as namespace
/// `flagd-proxy-<name>` with names suffixed `-<name>`, through a kustomize overlay (the way
/// docs/kubernetes.md suggests customising it).
pub(crate) fn install_deploy_overlay(cluster: &Cluster, name: &str, components: &[&str]) -> String {
    let image = cluster.proxy_image();
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

/// A CA and a server certificate for `dns_name`, as PEM: (CA cert, server cert, server key).
pub(crate) fn tls_material(dns_name: &str) -> (String, String, String) {
    let (ca_cert, issuer) = support::new_ca("flagd-proxy cluster test CA");
    let params = rcgen::CertificateParams::new(vec![dns_name.to_owned()]).expect("params");
    let key = rcgen::KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &issuer).expect("server cert");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

/// A new `restricted` namespace `ns` holding the Secret `flagd-proxy-tls` that the proxy's TLS
/// mounts: a certificate for `dns_name` (tls.crt, tls.key) and, with `with_ca`, its CA (ca.crt,
/// for the chart's flagd workloads). Returns the CA certificate (PEM).
pub(crate) fn namespace_with_tls_secret(
    cluster: &Cluster,
    ns: &str,
    dns_name: &str,
    with_ca: bool,
) -> String {
    let (ca, cert, key) = tls_material(dns_name);
    let mut data = json!({"tls.crt": cert, "tls.key": key});
    if with_ca {
        data["ca.crt"] = json!(ca);
    }
    cluster.restricted_namespace(ns);
    cluster.apply(
        &json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "flagd-proxy-tls", "namespace": ns},
            "type": "kubernetes.io/tls",
            "stringData": data
        })
        .to_string(),
    );
    ca
}

/// A Deployment of flagd pods (label `app: <name>`) that sync from `sources` (flagd's
/// `--sources`), under the restricted profile.
pub(crate) struct Flagd<'a> {
    pub(crate) ns: &'a str,
    pub(crate) name: &'a str,
    pub(crate) image: &'a str,
    pub(crate) sources: Value,
    pub(crate) replicas: usize,
    pub(crate) account: &'a str,
    /// Seconds between readiness probes of `/readyz`; `None`: no probe (a flagd the proxy refuses
    /// never becomes ready, and a test may still wait for its rollout).
    pub(crate) readiness_period: Option<u32>,
    /// A ConfigMap mounted at `/etc/proxy-ca` (the CA a TLS source names in `certPath`).
    pub(crate) ca_config_map: Option<&'a str>,
}

/// A flagd without a readiness probe, running as service account `account`.
pub(crate) fn unprobed_flagd(
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
    pub(crate) fn new(ns: &'a str, name: &'a str, image: &'a str, sources: Value) -> Self {
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
    pub(crate) fn from(
        ns: &'a str,
        name: &'a str,
        image: &'a str,
        uri: &str,
        selector: &str,
    ) -> Self {
        let sources = json!([{"uri": uri, "provider": "grpc", "selector": selector}]);
        Self::new(ns, name, image, sources)
    }

    pub(crate) fn manifest(&self) -> String {
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
        let template = json!({"metadata": {"labels": {"app": self.name}}, "spec": pod});
        deployment(self.ns, self.name, self.replicas, template).to_string()
    }
}

/// `flagd_proxy_rejected_requests_total{reason="unauthorized"}` summed over the proxy pods.
pub(crate) fn unauthorized_rejections(cluster: &Cluster, proxy_ns: &str) -> Result<u64, String> {
    let mut total = 0;
    for ip in cluster.pod_ips(proxy_ns, "app.kubernetes.io/name=flagd-proxy")? {
        let metrics = cluster.http_get(&format!("http://{ip}:8016/metrics"))?;
        total += flagd_proxy::introspection::Samples::parse(&metrics)
            .get("flagd_proxy_rejected_requests_total{reason=\"unauthorized\"}")
            .map_or(0, |value| value as u64);
    }
    Ok(total)
}

/// How many requests the proxies in `proxy_ns` have refused as unauthorized so far (once their
/// metrics answer).
pub(crate) fn rejections_so_far(cluster: &Cluster, proxy_ns: &str) -> u64 {
    wait_for("the proxies' metrics", CLUSTER_TIMEOUT, || {
        unauthorized_rejections(cluster, proxy_ns)
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Waits until the proxies in `proxy_ns` have refused more requests as unauthorized than
/// `before` (a refused client retries, so the count grows).
pub(crate) fn wait_for_rejections_beyond(cluster: &Cluster, proxy_ns: &str, before: u64) {
    wait_for("an unauthorized rejection", CLUSTER_TIMEOUT, || {
        let now = unauthorized_rejections(cluster, proxy_ns)?;
        if now > before {
            Ok(())
        } else {
            Err(format!("rejected {now}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// `helm install flagd-proxy charts/flagd-proxy` into `ns` with the proxy image under test and
/// `sets`, waiting until every workload is ready.
pub(crate) fn helm_install(cluster: &Cluster, helm: &Path, ns: &str, sets: &[String]) {
    let release = "flagd-proxy";
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
pub(crate) fn go_client(
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
    let template = json!({"metadata": {"labels": {"app": name}}, "spec": pod});
    deployment(ns, name, 1, template).to_string()
}

/// The Go client's environment for evaluating `color` in RPC mode through flagd at `host:8013`.
pub(crate) fn rpc_client_env(host: &str) -> Vec<Value> {
    vec![
        json!({"name": "INTEROP_RESOLVER", "value": "rpc"}),
        json!({"name": "FLAGD_HOST", "value": host}),
        json!({"name": "FLAGD_PORT", "value": "8013"}),
        json!({"name": "INTEROP_FLAG_KEY", "value": "color"}),
    ]
}

/// The Go client's environment for evaluating `color` in-process, syncing `selector` from the
/// proxy at `host:8015`.
pub(crate) fn in_process_client_env(host: &str, selector: &str) -> Vec<Value> {
    vec![
        json!({"name": "FLAGD_HOST", "value": host}),
        json!({"name": "FLAGD_PORT", "value": "8015"}),
        json!({"name": "FLAGD_SOURCE_SELECTOR", "value": selector}),
        json!({"name": "INTEROP_FLAG_KEY", "value": "color"}),
    ]
}

/// The log of Deployment `ns/name` (the Go client) so far.
pub(crate) fn client_log(cluster: &Cluster, ns: &str, name: &str) -> Result<String, String> {
    cluster.kubectl(&["-n", ns, "logs", &format!("deployment/{name}")])
}

/// Waits until the Go client Deployment `ns/name` prints the line `want`.
pub(crate) fn wait_for_client_line(cluster: &Cluster, ns: &str, name: &str, want: &str) {
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
pub(crate) fn cluster_ip(cluster: &Cluster, ns: &str, name: &str) -> String {
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

/// The name of the node tier's Service of the chart's release in `ns` (installed with
/// `mode=both`).
pub(crate) fn node_service(cluster: &Cluster, ns: &str) -> String {
    let services = cluster
        .kubectl(&["-n", ns, "get", "services", "-o", "name"])
        .expect("services");
    services
        .lines()
        .filter_map(|l| l.strip_prefix("service/"))
        .find(|name| name.ends_with("-node"))
        .unwrap_or_else(|| panic!("no node Service in {services}"))
        .to_owned()
}

/// helm (the test kit's one rule), or the calling test is skipped (a failure under `CI`).
pub(crate) fn helm_binary() -> Option<PathBuf> {
    support::skip::require(support::helm::find())
}

/// Service accounts `reader` and `stranger` in `ns`; a Role lets only `reader` get the
/// FeatureFlag `demo`.
pub(crate) fn reader_and_stranger(cluster: &Cluster, ns: &str) {
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
pub(crate) fn wait_for_proxy_service(cluster: &Cluster, ns: &str, name: &str) {
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

/// A map of labels as a `kubectl -l` selector.
pub(crate) fn label_selector(labels: &Value) -> String {
    let labels = labels.as_object().expect("a map of labels");
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().expect("a label value")))
        .collect();
    pairs.join(",")
}

/// `kubectl ARGS -o json`, parsed.
pub(crate) fn kubectl_json(cluster: &Cluster, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["-o", "json"]);
    let out = cluster
        .kubectl(&args)
        .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}: {out}"))
}
