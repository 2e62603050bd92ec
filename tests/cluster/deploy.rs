//! The proxy from `deploy/`: restricted pods behind a Service, faults (rollout, pod
//! deletion, API-server restart, a namespace deleted and created again), TLS from a Secret,
//! and an in-process provider pod.

use super::steps::*;
use super::*;
use flagd_proxy_testkit::or_return;

#[test]
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn deploy_kustomization_runs_restricted_and_serves_flagd_through_its_service() {
    let (cluster, flagd_image) = or_return!(with_flagd(cluster_or_skip()));
    let cluster: &Cluster = &cluster;
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
    let flagd = Flagd::from(
        ns,
        "flagd",
        &flagd_image,
        "flagd-proxy-svc.flagd-proxy.svc.cluster.local:8015",
        &format!("core.openfeature.dev/{ns}/demo"),
    );
    cluster.apply(&flagd.manifest());
    cluster.wait_rollout(ns, "flagd");
    flagd_follows_an_edit(cluster, ns, "flagd");
}

#[test]
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn rollout_pod_deletion_and_apiserver_restart_keep_twenty_flagds_serving() {
    // It restarts the API server: no other test may be using the cluster meanwhile.
    let (exclusive, flagd_image) = or_return!(with_flagd(exclusive_cluster_or_skip()));
    let cluster: &Cluster = &exclusive;
    let proxy_ns = install_deploy_overlay(cluster, "faults", &[]);
    let proxy = "flagd-proxy-faults";

    let ns = "cluster-faults";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    const FLAGDS: usize = 20;
    let mut flagds = Flagd::from(
        ns,
        "flagd",
        &flagd_image,
        &format!("flagd-proxy-svc-faults.{proxy_ns}.svc.cluster.local:8015"),
        &format!("core.openfeature.dev/{ns}/demo"),
    );
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
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn a_watched_resources_namespace_deleted_and_created_again_serves_it_again() {
    let (cluster, flagd_image) = or_return!(with_flagd(cluster_or_skip()));
    let cluster: &Cluster = &cluster;
    let proxy_ns = install_deploy_overlay(cluster, "nsgone", &[]);
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

#[test]
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn tls_from_a_secret_serves_flagd_that_verifies_the_service_name() {
    let (cluster, flagd_image) = or_return!(with_flagd(cluster_or_skip()));
    let cluster: &Cluster = &cluster;
    let proxy_ns = "flagd-proxy-tls";
    let service = format!("flagd-proxy-svc-tls.{proxy_ns}.svc.cluster.local");
    // The namespace and the Secret the tls component mounts exist before the proxy starts.
    let ca = namespace_with_tls_secret(cluster, proxy_ns, &service, false);
    install_deploy_overlay(cluster, "tls", &["tls"]);

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
    flagd_follows_an_edit(cluster, ns, "flagd");

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
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn in_process_go_provider_pod_syncs_through_the_service_name() {
    let cluster = or_return!(cluster_or_skip());
    let cluster: &Cluster = &cluster;
    let client_image = or_return!(cluster.interop_go_image());
    cluster.install_crds();
    let proxy_ns = install_deploy_overlay(cluster, "inprocess", &[]);

    // The Go provider does not report READY when its very first connection fails, even after it
    // connects on retry: start it once kube-proxy routes the new Service to a proxy.
    wait_for_proxy_service(cluster, &proxy_ns, "flagd-proxy-svc-inprocess");

    let ns = "cluster-inprocess";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    let env = in_process_client_env(
        &format!("flagd-proxy-svc-inprocess.{proxy_ns}.svc.cluster.local"),
        &format!("core.openfeature.dev/{ns}/demo"),
    );
    cluster.apply(&go_client(ns, "app", &client_image, "default", env, None));
    cluster.wait_rollout(ns, "app");
    wait_for_client_line(cluster, ns, "app", "VALUE red");
    set_default_color(cluster, ns, "demo", "blue");
    wait_for_client_line(cluster, ns, "app", "VALUE blue");
}
