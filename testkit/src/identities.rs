//! Client identities on a [`ControlPlane`] for the authorization tests and benchmark: the
//! proxy's permission to review them, ServiceAccounts with tokens, and pods that own an
//! address. There is no controller manager or kubelet: tokens are minted with TokenRequest and
//! a pod's status is written as the kubelet would report it.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::control_plane::{ControlPlane, GROUP};

/// Gives the proxy identity the extra permissions of the API-based modes (as
/// deploy/components/authz grants: create TokenReviews and SubjectAccessReviews, list and watch
/// pods) and the cluster-wide read of FeatureFlags, and waits until RBAC honours the latter.
pub async fn grant_review_permissions(cp: &ControlPlane) {
    grant_proxy_cluster_role(
        cp,
        "flagd-proxy-authz-test",
        json!([
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
        ]),
    )
    .await;
    cp.grant_proxy_cluster_wide().await;
}

/// Creates the ClusterRole `name` with `rules` and binds it to the proxy's identity, the
/// ServiceAccount `flagd/proxy`.
pub async fn grant_proxy_cluster_role(cp: &ControlPlane, name: &str, rules: Value) {
    let client = cp.admin_client();
    let role: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).expect("role");
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "namespace": "flagd", "name": "proxy"}]
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(client)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");
}

/// Creates the ServiceAccount `ns/name` and returns a token of it (valid for an hour).
pub async fn service_account_token(cp: &ControlPlane, ns: &str, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(cp.admin_client(), ns);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("sa");
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("create ServiceAccount");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let issued = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("token");
    issued.status.expect("status").token
}

/// Creates a pod in `ns` running as ServiceAccount `account` with the address `ip`, the way the
/// kubelet would report it.
pub async fn running_pod(cp: &ControlPlane, ns: &str, name: &str, account: &str, ip: &str) {
    running_pod_on(cp, None, ns, name, account, ip).await;
}

/// [`running_pod`], scheduled on `node` when given.
pub async fn running_pod_on(
    cp: &ControlPlane,
    node: Option<&str>,
    ns: &str,
    name: &str,
    account: &str,
    ip: &str,
) {
    let pods: Api<Pod> = Api::namespaced(cp.admin_client(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": account,
            "nodeName": node,
            "containers": [{"name": "app", "image": "example.invalid/app"}]
        }
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("pod status");
}

/// Lets `subject` (a RoleBinding subject, such as
/// `{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:serviceaccounts:ns"}`)
/// get the FeatureFlags of namespace `ns`: a Role `read-flags` there (created unless it exists)
/// and the RoleBinding `binding` to it. RBAC takes effect a moment later.
pub async fn grant_flag_reading(cp: &ControlPlane, ns: &str, binding: &str, subject: Value) {
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "read-flags"},
        "rules": [{"apiGroups": [GROUP], "resources": ["featureflags"], "verbs": ["get"]}]
    }))
    .expect("role");
    match Api::<Role>::namespaced(cp.admin_client(), ns)
        .create(&PostParams::default(), &role)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("creating the Role {ns}/read-flags: {e}"),
    }
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-flags"},
        "subjects": [subject]
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(cp.admin_client(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap_or_else(|e| panic!("creating a RoleBinding in {ns}: {e}"));
}
