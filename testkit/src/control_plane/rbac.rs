//! RBAC for the proxy identity: the grants tests give it (cluster-wide or per namespace), their
//! revocation, and SubjectAccessReviews that wait until RBAC honours a change.

use anyhow::Context;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use super::{ControlPlane, GROUP, PROXY_BINDING, PROXY_CLUSTER_ROLE, PROXY_GROUPS, PROXY_USER};

impl ControlPlane {
    /// Binds the proxy ClusterRole to the proxy identity cluster-wide and waits until RBAC
    /// honours it.
    pub async fn grant_proxy_cluster_wide(&self) {
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": { "name": PROXY_BINDING },
            "roleRef": proxy_role_ref(),
            "subjects": [proxy_subject()],
        }))
        .expect("building the ClusterRoleBinding");
        Api::<ClusterRoleBinding>::all(self.admin_client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("creating the proxy's ClusterRoleBinding");
        self.wait_for_access(None, |allowed, _| allowed)
            .await
            .expect("waiting for the cluster-wide grant to take effect");
    }

    /// Removes the cluster-wide binding and waits until RBAC no longer uses it.
    pub async fn revoke_proxy_cluster_wide(&self) {
        Api::<ClusterRoleBinding>::all(self.admin_client.clone())
            .delete(PROXY_BINDING, &DeleteParams::default())
            .await
            .expect("deleting the proxy's ClusterRoleBinding");
        let marker = format!("ClusterRoleBinding \"{PROXY_BINDING}\"");
        self.wait_for_access(None, |allowed, reason| {
            !(allowed && reason.contains(&marker))
        })
        .await
        .expect("waiting for the cluster-wide revocation to take effect");
    }

    /// Binds the proxy ClusterRole to the proxy identity in namespace `ns` (a RoleBinding) and
    /// waits until RBAC honours it.
    pub async fn grant_proxy_namespace(&self, ns: &str) {
        let binding: RoleBinding = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": { "name": PROXY_BINDING, "namespace": ns },
            "roleRef": proxy_role_ref(),
            "subjects": [proxy_subject()],
        }))
        .expect("building the RoleBinding");
        Api::<RoleBinding>::namespaced(self.admin_client.clone(), ns)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("creating the proxy's RoleBinding in {ns}: {e}"));
        // Allowed by anything (this binding, or a cluster-wide one) is all a test needs.
        self.wait_for_access(Some(ns), |allowed, _| allowed)
            .await
            .unwrap_or_else(|e| panic!("waiting for the grant in {ns} to take effect: {e:#}"));
    }

    /// Deletes the RoleBinding in `ns` and waits until RBAC no longer uses it.
    pub async fn revoke_proxy_namespace(&self, ns: &str) {
        Api::<RoleBinding>::namespaced(self.admin_client.clone(), ns)
            .delete(PROXY_BINDING, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting the proxy's RoleBinding in {ns}: {e}"));
        let marker = format!("RoleBinding \"{PROXY_BINDING}/{ns}\"");
        self.wait_for_access(Some(ns), |allowed, reason| {
            !(allowed && reason.contains(&marker))
        })
        .await
        .unwrap_or_else(|e| panic!("waiting for the revocation in {ns} to take effect: {e:#}"));
    }

    /// Asks the API server (SubjectAccessReview) whether the ServiceAccount `name` of namespace
    /// `sa_ns` may `verb` `resource` (of API group `group`, "" for the core group) in namespace
    /// `ns`, with the groups a token of that ServiceAccount carries.
    pub async fn service_account_may(
        &self,
        sa_ns: &str,
        name: &str,
        verb: &str,
        group: &str,
        resource: &str,
        ns: &str,
    ) -> bool {
        let review: SubjectAccessReview = serde_json::from_value(json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": format!("system:serviceaccount:{sa_ns}:{name}"),
                "groups": [
                    "system:serviceaccounts",
                    format!("system:serviceaccounts:{sa_ns}"),
                    "system:authenticated",
                ],
                "resourceAttributes": {"group": group, "resource": resource, "verb": verb, "namespace": ns},
            },
        }))
        .expect("building a SubjectAccessReview");
        Api::<SubjectAccessReview>::all(self.admin_client.clone())
            .create(&PostParams::default(), &review)
            .await
            .expect("SubjectAccessReview")
            .status
            .is_some_and(|s| s.allowed)
    }

    /// Asks the apiserver (SubjectAccessReview) whether the proxy identity may list featureflags
    /// in `ns` (or cluster-wide) until `done(allowed, reason)` holds.
    async fn wait_for_access(
        &self,
        ns: Option<&str>,
        done: impl Fn(bool, &str) -> bool,
    ) -> anyhow::Result<()> {
        let api: Api<SubjectAccessReview> = Api::all(self.admin_client.clone());
        let review: SubjectAccessReview = serde_json::from_value(json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": PROXY_USER,
                "groups": PROXY_GROUPS,
                "resourceAttributes": {
                    "group": GROUP,
                    "resource": "featureflags",
                    "verb": "list",
                    "namespace": ns.unwrap_or(""),
                },
            },
        }))
        .context("building a SubjectAccessReview")?;
        self.wait_until("RBAC to reflect the change", || async {
            let answer = api.create(&PostParams::default(), &review).await?;
            let status = answer.status.unwrap_or_default();
            let reason = status.reason.unwrap_or_default();
            if done(status.allowed, &reason) {
                anyhow::Ok(Ok(()))
            } else {
                anyhow::Ok(Err(format!(
                    "allowed={}, reason={reason:?}",
                    status.allowed
                )))
            }
        })
        .await
    }
}

pub(super) fn proxy_role_ref() -> serde_json::Value {
    json!({
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": PROXY_CLUSTER_ROLE,
    })
}

pub(super) fn proxy_subject() -> serde_json::Value {
    json!({ "kind": "ServiceAccount", "name": "proxy", "namespace": "flagd" })
}
