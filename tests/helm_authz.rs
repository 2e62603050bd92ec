//! The chart's `central.authz` and `node.authz` values, rendered with `helm template`: the
//! `--authz` flags of each tier and the permissions its ClusterRole gains for them. tests/cluster/
//! runs `central.authz.mode=rbac` with token audiences, and both tiers authorizing, in a real
//! cluster.
use flagd_proxy_testkit as support;

use serde_json::{Value, json};
use support::helm::ChartRenderer;
use support::or_return;

const RELEASE: &str = "flagd-proxy";
const NS: &str = "flags";

fn render(helm: &ChartRenderer, sets: &[&str]) -> Vec<Value> {
    helm.render(RELEASE, NS, sets)
}

fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == json!(kind))
        .collect();
    assert_eq!(found.len(), 1, "one {kind}");
    found[0]
}

/// The central container's arguments from `--authz` on (empty without it).
fn authz_args(objects: &[Value]) -> Vec<String> {
    let args: Vec<String> = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        ["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_owned())
        .collect();
    args.iter()
        .skip_while(|a| !a.starts_with("--authz"))
        .cloned()
        .collect()
}

/// The ClusterRole's rules beyond reading FeatureFlags and writing Events, as
/// `group/resource:verbs`.
fn authz_rules(objects: &[Value]) -> Vec<String> {
    rules(one(objects, "ClusterRole"))
        .into_iter()
        .filter(|rule| !rule.starts_with("core.openfeature.dev/") && !rule.starts_with("events"))
        .collect()
}

/// A ClusterRole's rules as `group/resource:verbs`.
fn rules(role: &Value) -> Vec<String> {
    role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|rule| {
            let verbs: Vec<&str> = rule["verbs"]
                .as_array()
                .expect("verbs")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            format!(
                "{}/{}:{}",
                rule["apiGroups"][0].as_str().expect("group"),
                rule["resources"][0].as_str().expect("resource"),
                verbs.join(",")
            )
        })
        .collect()
}

#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn authz_flags_come_with_exactly_the_permissions_they_need() {
    let helm = or_return!(ChartRenderer::find_or_skip());
    let cases: [(&[&str], &[&str], &[&str]); 4] = [
        (&[], &[], &[]),
        (
            &[
                "central.authz.mode=namespace",
                "central.authz.allowNamespaces={shared,common}",
            ],
            &[
                "--authz",
                "namespace",
                "--authz-allow-namespaces",
                "shared,common",
            ],
            &["authentication.k8s.io/tokenreviews:create"],
        ),
        (
            &[
                "central.authz.mode=rbac",
                "central.authz.tokenAudiences={flagd-proxy}",
            ],
            &["--authz", "rbac", "--authz-token-audiences", "flagd-proxy"],
            &[
                "authentication.k8s.io/tokenreviews:create",
                "authorization.k8s.io/subjectaccessreviews:create",
            ],
        ),
        (
            &["central.authz.mode=rbac", "central.authz.podIP=true"],
            &["--authz", "rbac", "--authz-pod-ip"],
            &[
                "authentication.k8s.io/tokenreviews:create",
                "authorization.k8s.io/subjectaccessreviews:create",
                "/pods:list,watch",
            ],
        ),
    ];
    for (sets, want_args, want_rules) in cases {
        let objects = render(&helm, sets);
        assert_eq!(authz_args(&objects), want_args, "{sets:?}: arguments");
        assert_eq!(
            authz_rules(&objects),
            want_rules,
            "{sets:?}: ClusterRole rules"
        );
    }
}

#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn authz_values_that_cannot_work_are_refused_with_a_message() {
    let helm = or_return!(ChartRenderer::find_or_skip());
    let upstream = "node.upstream.address=flagd-proxy-svc.central.svc.cluster.local:8015";
    let cases: [(&[&str], &str); 9] = [
        (&["central.authz.podIP=true"], "need central.authz.mode"),
        (
            &["central.authz.tokenAudiences={flagd-proxy}"],
            "need central.authz.mode",
        ),
        (
            &[
                "central.authz.mode=rbac",
                "central.authz.allowNamespaces={a}",
            ],
            "allowNamespaces is for central.authz.mode=namespace",
        ),
        (
            &["mode=node", upstream, "central.authz.mode=rbac"],
            "central.authz is for the central tier",
        ),
        (
            &["node.authz.mode=namespace"],
            "node.authz is for the node tier",
        ),
        (
            &[
                "mode=both",
                "central.authz.mode=rbac",
                "central.authz.podIP=true",
            ],
            "needs node.authz too",
        ),
        (
            &[
                "mode=both",
                "central.authz.mode=namespace",
                "central.authz.podIP=true",
                "node.authz.mode=namespace",
            ],
            "use central.authz.mode=rbac",
        ),
        (
            &[
                "mode=both",
                "central.authz.mode=rbac",
                "node.authz.mode=rbac",
            ],
            "needs central.authz.podIP",
        ),
        (&["central.authz.mode=everyone"], "mode"),
    ];
    for (sets, want) in cases {
        helm.assert_refused(RELEASE, NS, sets, want);
    }
}

/// In `mode=both` with authorization, each node proxy authorizes the pods of its own node
/// (docs/security.md, "The node tier"): it gets a token, the review permissions, a watch of its
/// node's pods, and the central lets it get every FeatureFlag.
#[test]
#[ignore = "needs helm: scripts/test installs it"]
fn the_node_tier_authorizes_the_pods_of_its_node() {
    let helm = or_return!(ChartRenderer::find_or_skip());
    let objects = render(
        &helm,
        &[
            "mode=both",
            "central.authz.mode=rbac",
            "central.authz.podIP=true",
            "node.authz.mode=namespace",
            "node.authz.podIP=true",
        ],
    );
    let daemonset = one(&objects, "DaemonSet");
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], json!(true));
    let container = &pod["containers"][0];
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_owned())
        .collect();
    let cli =
        flagd_proxy::cli::parse_from(std::iter::once("flagd-proxy".to_owned()).chain(args.clone()))
            .unwrap_or_else(|e| panic!("the proxy refuses {args:?}: {e}"));
    let flagd_proxy::cli::Command::Start(start) = cli.command else {
        panic!("{args:?} is not start");
    };
    let authz = flagd_proxy::authz::AuthzSettings::from(start.authz);
    assert_eq!(authz.mode, flagd_proxy::authz::AuthzMode::Namespace);
    assert!(authz.pod_ip);
    // Kubernetes expands $(NODE_NAME) from the downward API.
    assert_eq!(authz.pod_node.as_deref(), Some("$(NODE_NAME)"));
    assert!(
        container["env"].as_array().expect("env").contains(
            &json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
        ),
        "{container}"
    );

    let node_account = pod["serviceAccountName"].as_str().expect("account");
    let roles: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == json!("ClusterRole"))
        .collect();
    let node_role = roles
        .iter()
        .find(|r| r["metadata"]["labels"]["app.kubernetes.io/component"] == json!("node"))
        .expect("the node tier's ClusterRole");
    assert_eq!(
        rules(node_role),
        [
            "authentication.k8s.io/tokenreviews:create",
            "/pods:list,watch",
            "core.openfeature.dev/featureflags:get",
        ]
    );
    let binding = objects
        .iter()
        .find(|o| {
            o["kind"] == json!("ClusterRoleBinding")
                && o["roleRef"]["name"] == node_role["metadata"]["name"]
        })
        .expect("the node tier's binding");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": node_account, "namespace": NS}])
    );
}
