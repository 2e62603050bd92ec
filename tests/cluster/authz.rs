//! Authorization in the cluster: by pod address and by projected service-account token, and both
//! tiers of the chart authorizing together.

use super::*;

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
    let before = rejections_so_far(cluster, &proxy_ns);
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
    wait_for_rejections_beyond(cluster, &proxy_ns, before);
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
    let before = rejections_so_far(cluster, proxy_ns);

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
    wait_for_rejections_beyond(cluster, proxy_ns, before);
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

#[test]
fn node_tier_authorizes_the_pods_of_its_node_while_the_central_trusts_it() {
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
    // Both tiers authorize by pod address: the central lets the node proxies (their
    // ServiceAccount may get FeatureFlags) read for their pods, and each node proxy lets a pod
    // of its node read its own namespace.
    let proxy_ns = "flagd-proxy-node-authz";
    cluster.restricted_namespace(proxy_ns);
    helm_install(
        cluster,
        &helm,
        "flagd-proxy",
        proxy_ns,
        &[
            "mode=both",
            "central.replicas=1",
            "central.authz.mode=rbac",
            "central.authz.podIP=true",
            "node.authz.mode=namespace",
            "node.authz.podIP=true",
        ]
        .map(str::to_owned),
    );
    let (own, other) = ("cluster-node-own", "cluster-node-other");
    for ns in [own, other] {
        cluster.restricted_namespace(ns);
    }
    cluster.apply(&feature_flag(own, "demo", "red"));
    let uri = format!("flagd-proxy-node.{proxy_ns}.svc.cluster.local:8015");
    let selector = format!("core.openfeature.dev/{own}/demo");
    let before = rejections_so_far(cluster, proxy_ns);
    for ns in [own, other] {
        cluster.apply(&unprobed_flagd(
            ns,
            "flagd",
            "default",
            &flagd_image,
            &uri,
            &selector,
        ));
    }
    cluster.wait_rollout(own, "flagd");
    cluster.wait_rollout(other, "flagd");

    let reader = single_pod_ip(cluster, own, "app=flagd");
    wait_for_color(cluster, &reader, "red");
    // The pod of the other namespace is refused by its node proxy ...
    wait_for_rejections_beyond(cluster, proxy_ns, before);
    // ... and never has the flag, while the pod of the namespace follows an edit.
    let stranger = single_pod_ip(cluster, other, "app=flagd");
    set_default_color(cluster, own, "demo", "blue");
    wait_for_color(cluster, &reader, "blue");
    match evaluate_once(cluster, &stranger) {
        Evaluation::Value(value) => panic!("the other namespace's pod evaluated color={value}"),
        Evaluation::Refused(_) | Evaluation::NoAnswer(_) => {}
    }
}
