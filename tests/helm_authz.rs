//! The chart's `central.authz` values, rendered with `helm template`: the `--authz` flags of the
//! central Deployment and the permissions its ClusterRole gains for them. tests/cluster/ runs
//! `central.authz.mode=rbac` with token audiences in a real cluster.
use flagd_proxy_testkit as support;

use serde_json::{Value, json};
use support::helm::ChartRenderer;

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
    one(objects, "ClusterRole")["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|rule| {
            !matches!(
                rule["apiGroups"][0].as_str(),
                Some("core.openfeature.dev" | "events.k8s.io")
            )
        })
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
fn authz_flags_come_with_exactly_the_permissions_they_need() {
    let Some(helm) = ChartRenderer::find_or_skip() else {
        return;
    };
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
fn authz_values_that_cannot_work_are_refused_with_a_message() {
    let Some(helm) = ChartRenderer::find_or_skip() else {
        return;
    };
    let upstream = "node.upstream.address=flagd-proxy-svc.central.svc.cluster.local:8015";
    let cases: [(&[&str], &str); 5] = [
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
            "needs the central tier",
        ),
        (&["central.authz.mode=everyone"], "mode"),
    ];
    for (sets, want) in cases {
        helm.assert_refused(RELEASE, NS, sets, want);
    }
}
