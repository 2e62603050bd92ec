//! The Helm chart installed in every mode, reached by flagd and the RPC providers.

use super::steps::*;
use super::*;
use flagd_proxy_testkit::or_return;

#[test]
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn helm_chart_in_both_mode_serves_flagd_through_the_central_and_the_node_service() {
    let (cluster, flagd_image, helm) = or_return!(with_flagd_and_helm());
    let cluster: &Cluster = &cluster;

    // mode=both: central proxies (Deployment) and a node-local tier (DaemonSet, Service with
    // internalTrafficPolicy: Local) chained to them.
    let proxy_ns = "flagd-proxy-helm";
    install_chart(cluster, &helm, proxy_ns, &["mode=both".to_owned()]);
    let node_service = node_service(cluster, proxy_ns);

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

    service_monitor_scrapes_every_proxy_pod(cluster, proxy_ns, &["mode=both"]);
}

/// The chart's ServiceMonitor, rendered with the values the release in `ns` was installed with,
/// selects the live metrics Service, names one of its ports, and what Prometheus would scrape
/// through it (every endpoint of that Service, and the Service's own address) is each proxy
/// pod's `/metrics`, both tiers labelled apart by the label it copies to the series.
fn service_monitor_scrapes_every_proxy_pod(cluster: &Cluster, ns: &str, sets: &[&str]) {
    let renderer = or_return!(support::helm::ChartRenderer::find_or_skip());
    let mut sets = sets.to_vec();
    sets.push("serviceMonitor.enabled=true");
    let rendered = renderer.render("flagd-proxy", ns, &sets);
    let monitor = rendered
        .iter()
        .find(|o| o["kind"] == "ServiceMonitor")
        .expect("the chart renders a ServiceMonitor");
    let spec = &monitor["spec"];
    assert_eq!(spec["namespaceSelector"]["matchNames"], json!([ns]));
    let selector = label_selector(&spec["selector"]["matchLabels"]);
    let endpoint = &spec["endpoints"][0];
    let port_name = endpoint["port"].as_str().expect("endpoint port");
    let path = endpoint["path"].as_str().expect("endpoint path");

    let services: Value = kubectl_json(cluster, &["-n", ns, "get", "services", "-l", &selector]);
    let services = services["items"].as_array().expect("items");
    assert_eq!(
        services.len(),
        1,
        "Services matching {selector}: {services:?}"
    );
    let service = &services[0];
    let name = service["metadata"]["name"].as_str().expect("name");
    let port = support::helm::service_port(service, port_name);
    let service_port = port["port"].as_u64().expect("port");

    // The pods the Service selects: both tiers, each with the label the monitor copies.
    let pod_selector = label_selector(&service["spec"]["selector"]);
    let pods: Value = kubectl_json(cluster, &["-n", ns, "get", "pods", "-l", &pod_selector]);
    let pods = pods["items"].as_array().expect("items");
    let mut components = std::collections::BTreeSet::new();
    for label in spec["podTargetLabels"].as_array().expect("podTargetLabels") {
        let label = label.as_str().expect("a label name");
        for pod in pods {
            let value = pod["metadata"]["labels"][label].as_str();
            let value = value.unwrap_or_else(|| panic!("a proxy pod without {label}: {pod}"));
            components.insert(value.to_owned());
        }
    }
    assert_eq!(components.len(), 2, "both tiers told apart: {components:?}");

    // What Prometheus scrapes: each ready endpoint of the Service, on the port's target.
    let addresses = wait_for("the metrics Service's endpoints", CLUSTER_TIMEOUT, || {
        let slices = kubectl_json(
            cluster,
            &[
                "-n",
                ns,
                "get",
                "endpointslices",
                "-l",
                &format!("kubernetes.io/service-name={name}"),
            ],
        );
        let mut found = Vec::new();
        for slice in slices["items"].as_array().into_iter().flatten() {
            let port = slice["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == port_name)
                .and_then(|p| p["port"].as_u64());
            for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
                if endpoint["conditions"]["ready"] != json!(true) {
                    continue;
                }
                for address in endpoint["addresses"].as_array().into_iter().flatten() {
                    let address = address.as_str().unwrap_or_default();
                    found.push(format!("{address}:{}", port.unwrap_or(0)));
                }
            }
        }
        if found.len() == pods.len() {
            Ok(found)
        } else {
            Err(format!(
                "{} ready endpoints for {} pods: {found:?}",
                found.len(),
                pods.len()
            ))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let cluster_ip = cluster_ip(cluster, ns, name);
    for target in addresses
        .iter()
        .cloned()
        .chain([format!("{cluster_ip}:{service_port}")])
    {
        let metrics = cluster
            .http_get(&format!("http://{target}{path}"))
            .unwrap_or_else(|e| panic!("scraping {target}{path}: {e}"));
        assert!(
            metrics.contains("\nflagd_proxy_ready 1"),
            "{target}{path} is not a ready proxy's metrics:\n{metrics}"
        );
    }
}

#[test]
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn helm_chart_central_and_node_modes_serve_flagd_shapes_and_rpc_providers() {
    let (cluster, flagd_image, helm) = or_return!(with_flagd_and_helm());
    let cluster: &Cluster = &cluster;
    let client_image = or_return!(cluster.interop_go_image());
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
    let ca = namespace_with_tls_secret(cluster, central_ns, &central_service, true);
    let mut sets = vec![
        "mode=central".to_owned(),
        "central.replicas=1".to_owned(),
        "tls.enabled=true".to_owned(),
    ];
    sets.extend(flagd_values(&["deployment", "daemonset"]));
    helm_install(cluster, &helm, central_ns, &sets);

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
    helm_install(cluster, &helm, node_ns, &sets);

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
