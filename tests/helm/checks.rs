//! What each case must render: the common objects, the central tier, the node tier and the
//! optional extras.

use super::*;

/// Checks a rendered case against what its values ask for.
pub(crate) fn check_rendered(case: &Case, objects: &[Value]) {
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

    let (deployments, daemonsets) = deployments_and_daemonsets(objects);
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
        for (value, flag) in [
            ("compression.mode", "--compression"),
            ("compression.minBytes", "--compression-min-bytes"),
            ("compression.level", "--compression-level"),
        ] {
            assert_eq!(arg_value(&args, flag), case.value(value), "{label}: {flag}");
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
pub(crate) fn check_central(case: &Case, objects: &[Value]) {
    let ns = case.ns();
    let what = case.name;
    let (deployments, daemonsets) = deployments_and_daemonsets(objects);
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
            // Only the OTLP collector's CA, when it is given, and the state directory.
            let volumes: Vec<&Value> = pod["volumes"].as_array().into_iter().flatten().collect();
            assert!(
                volumes
                    .iter()
                    .all(|v| v["name"] == "otlp-ca" || v["name"] == "state"),
                "{what}: no volumes without TLS but the collector's CA and the state directory: {volumes:?}"
            );
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
            container(deployment)["env"][0],
            json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
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
pub(crate) fn check_node(case: &Case, objects: &[Value]) {
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
        // A deleted node pod's replacement is Ready before the old one's streams end.
        assert_eq!(
            arg_value(&args, "--drain-delay"),
            Some("20s"),
            "{what}: --drain-delay"
        );
        assert_eq!(
            ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
            json!(40),
            "{what}: the drain and the shutdown timeout fit the grace period"
        );
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
pub(crate) fn check_extras(case: &Case, objects: &[Value]) {
    let ns = case.ns();
    let what = case.name;
    let (deployments, daemonsets) = deployments_and_daemonsets(objects);
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
    check_alerts_and_dashboard(case, objects);
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

/// The PrometheusRule carries the rules of `files/alerts.yaml` as they are, and the dashboard
/// ConfigMap `files/dashboard.json` byte for byte, under the sidecar's label.
fn check_alerts_and_dashboard(case: &Case, objects: &[Value]) {
    let what = case.name;
    let chart = support::repo_root().join("charts/flagd-proxy/files");
    let rules = all_of(objects, "PrometheusRule");
    if case.flag("prometheusRule.enabled") {
        assert_eq!(rules.len(), 1, "{what}: PrometheusRule");
        let text = std::fs::read_to_string(chart.join("alerts.yaml")).expect("alerts.yaml");
        let file: Value = serde_norway::from_str(&text).expect("alerts.yaml parses");
        assert_eq!(rules[0]["apiVersion"], json!("monitoring.coreos.com/v1"));
        assert_eq!(
            rules[0]["spec"],
            json!({"groups": file["groups"]}),
            "{what}: the rules of files/alerts.yaml"
        );
        if let Some(release) = case.value("prometheusRule.labels.release") {
            assert_eq!(rules[0]["metadata"]["labels"]["release"], json!(release));
        }
    } else {
        assert!(rules.is_empty(), "{what}: no PrometheusRule");
    }
    let dashboards: Vec<&Value> = all_of(objects, "ConfigMap")
        .into_iter()
        .filter(|c| c["metadata"]["labels"]["grafana_dashboard"] == json!("1"))
        .collect();
    if case.flag("dashboard.enabled") {
        assert_eq!(dashboards.len(), 1, "{what}: dashboard ConfigMap");
        let json_text = std::fs::read_to_string(chart.join("dashboard.json")).expect("dashboard");
        assert_eq!(
            dashboards[0]["data"]["flagd-proxy.json"].as_str(),
            Some(json_text.trim_end()),
            "{what}: the dashboard is files/dashboard.json"
        );
    } else {
        assert!(dashboards.is_empty(), "{what}: no dashboard");
    }
}
