//! Authorization in the cluster: by pod address and by projected service-account token, and both
//! tiers of the chart authorizing together.

use super::steps::*;
use super::*;
use flagd_proxy_testkit::or_return;

#[test]
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn authz_rbac_by_pod_ip_serves_the_allowed_account_and_refuses_its_neighbour() {
    let (cluster, flagd_image) = or_return!(with_flagd(cluster_or_skip()));
    let cluster: &Cluster = &cluster;
    let proxy_ns = install_deploy_overlay(cluster, "authz", &["authz-rbac", "authz-pod-ip"]);

    // Two service accounts; RBAC lets only `reader` get the FeatureFlag.
    let ns = "cluster-authz";
    cluster.restricted_namespace(ns);
    cluster.apply(&feature_flag(ns, "demo", "red"));
    reader_and_stranger(cluster, ns);
    let uri = format!("flagd-proxy-svc-authz.{proxy_ns}.svc.cluster.local:8015");
    let selector = format!("core.openfeature.dev/{ns}/demo");
    only_the_allowed_flagd_syncs(
        cluster,
        &flagd_image,
        &proxy_ns,
        (&uri, &selector),
        (ns, "reader", "reader"),
        (ns, "stranger", "stranger"),
    );
}

/// Unprobed flagds syncing `selector` from the proxy at `uri`, one allowed and one refused, each
/// `(namespace, name, service account)`: once both run, the allowed one evaluates `color` to red
/// and the proxies in `proxy_ns` refuse more requests as unauthorized than before (the refused one
/// retries, so the count grows); after an edit of the allowed namespace's FeatureFlag `demo` the
/// allowed one evaluates blue while the refused one still has no flag to evaluate.
fn only_the_allowed_flagd_syncs(
    cluster: &Cluster,
    flagd_image: &str,
    proxy_ns: &str,
    (uri, selector): (&str, &str),
    allowed: (&str, &str, &str),
    refused: (&str, &str, &str),
) {
    let before = rejections_so_far(cluster, proxy_ns);
    for (ns, name, account) in [allowed, refused] {
        cluster.apply(&unprobed_flagd(
            ns,
            name,
            account,
            flagd_image,
            uri,
            selector,
        ));
    }
    for (ns, name, _) in [allowed, refused] {
        cluster.wait_rollout(ns, name);
    }

    let reader = single_pod_ip(cluster, allowed.0, &format!("app={}", allowed.1));
    wait_for_color(cluster, &reader, "red");
    // The refused flagd's requests are refused as unauthorized (it retries, so the count
    // grows) ...
    wait_for_rejections_beyond(cluster, proxy_ns, before);
    // ... and it has no flag to evaluate, while the allowed one follows an edit.
    let stranger = single_pod_ip(cluster, refused.0, &format!("app={}", refused.1));
    set_default_color(cluster, allowed.0, "demo", "blue");
    wait_for_color(cluster, &reader, "blue");
    match evaluate_once(cluster, &stranger) {
        Evaluation::Value(value) => panic!("{refused:?} evaluated color={value}"),
        Evaluation::Refused(_) | Evaluation::NoAnswer(_) => {}
    }
}

#[test]
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn authz_rbac_by_projected_token_serves_the_allowed_account_and_refuses_its_neighbour() {
    let cluster = or_return!(cluster_or_skip());
    let cluster: &Cluster = &cluster;
    let helm = or_return!(helm_binary());
    let client_image = or_return!(cluster.interop_go_image());
    cluster.install_crds();
    // The chart's central tier with --authz rbac, accepting only tokens issued for the audience
    // (TokenReview with the audience).
    let audience = "flagd-proxy";
    let proxy_ns = "flagd-proxy-tokens";
    install_chart(
        cluster,
        &helm,
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

    let env = in_process_client_env(
        &format!("flagd-proxy-svc.{proxy_ns}.svc.cluster.local"),
        &format!("core.openfeature.dev/{ns}/demo"),
    );
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
#[ignore = "needs root and the cluster's binaries: scripts/test installs the binaries"]
fn node_tier_authorizes_the_pods_of_its_node_while_the_central_trusts_it() {
    let (cluster, flagd_image, helm) = or_return!(with_flagd_and_helm());
    let cluster: &Cluster = &cluster;
    // Both tiers authorize by pod address: the central lets the node proxies (their
    // ServiceAccount may get FeatureFlags) read for their pods, and each node proxy lets a pod
    // of its node read its own namespace.
    let proxy_ns = "flagd-proxy-node-authz";
    install_chart(
        cluster,
        &helm,
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
    // The pod of the other namespace is refused by its node proxy, and never has the flag.
    only_the_allowed_flagd_syncs(
        cluster,
        &flagd_image,
        proxy_ns,
        (&uri, &selector),
        (own, "flagd", "default"),
        (other, "flagd", "default"),
    );
}
