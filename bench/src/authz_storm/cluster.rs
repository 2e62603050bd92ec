//! The control plane of the authorization storm: namespaces with a FeatureFlag each, the
//! identities (a ServiceAccount with a token and a running pod at a loopback address each), and
//! the RBAC that lets each identity read its own namespace's FeatureFlag.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;
use tonic::metadata::AsciiMetadataValue;

use flagd_proxy_testkit::control_plane::{
    ControlPlane, GROUP, feature_flag_object, feature_flag_resource,
};
use flagd_proxy_testkit::identities::{
    grant_flag_reading, grant_review_permissions, running_pod, service_account_token,
};

/// Namespaces the identities are spread over, at most.
const MAX_NAMESPACES: usize = 4;
/// The first identity's address is 127.0.0.(`FIRST_HOST`).
const FIRST_HOST: u8 = 10;
/// How long RBAC and the pod watch may take to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// One client identity.
pub(crate) struct Identity {
    /// The address of its pod; its clients connect from there.
    pub(crate) address: Ipv4Addr,
    /// `Bearer <token>` of its ServiceAccount.
    pub(crate) authorization: AsciiMetadataValue,
    /// Its namespace's FeatureFlag, which it may read.
    pub(crate) selector: Arc<str>,
    namespace: String,
    account: String,
}

/// The control plane with the identities on it.
pub(crate) struct Cluster {
    pub(crate) cp: ControlPlane,
    pub(crate) identities: Vec<Identity>,
    pub(crate) namespaces: usize,
}

impl Cluster {
    /// Starts the control plane and creates `identities` identities over up to four namespaces.
    pub(crate) async fn start(identities: usize) -> anyhow::Result<Self> {
        let cp = ControlPlane::start().await.map_err(|error| {
            anyhow::anyhow!(
                "starting the test control plane: {error} (scripts/build-control-plane.sh builds it)"
            )
        })?;
        grant_review_permissions(&cp).await;
        let namespaces: Vec<String> = (0..identities.min(MAX_NAMESPACES))
            .map(|k| format!("storm-{k}"))
            .collect();
        for ns in &namespaces {
            namespace_with_flag(&cp, ns).await?;
        }
        let mut made = Vec::with_capacity(identities);
        for i in 0..identities {
            let namespace = namespaces[i % namespaces.len()].clone();
            let account = format!("client-{i}");
            let host = FIRST_HOST
                .checked_add(u8::try_from(i)?)
                .context("too many identities for 127.0.0.x")?;
            let address = Ipv4Addr::new(127, 0, 0, host);
            let token = service_account_token(&cp, &namespace, &account).await;
            running_pod(&cp, &namespace, &account, &account, &address.to_string()).await;
            made.push(Identity {
                address,
                authorization: format!("Bearer {token}").parse()?,
                selector: Arc::from(format!("core.openfeature.dev/{namespace}/flags")),
                namespace,
                account,
            });
        }
        let cluster = Cluster {
            cp,
            identities: made,
            namespaces: namespaces.len(),
        };
        cluster.wait_for_rbac().await?;
        Ok(cluster)
    }

    /// Waits until RBAC lets every identity get its namespace's FeatureFlags.
    async fn wait_for_rbac(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        for identity in &self.identities {
            let (ns, account) = (&identity.namespace, &identity.account);
            while !self
                .cp
                .service_account_may(ns, account, "get", GROUP, "featureflags", ns)
                .await
            {
                if Instant::now() >= deadline {
                    bail!("RBAC never let {ns}/{account} read the FeatureFlags of {ns}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The pod watches open at the API server (its own informers hold one).
    pub(crate) async fn pod_watches(&self) -> u64 {
        self.cp.open_watches("pods").await
    }

    /// Waits until the number of pod watches open at the API server satisfies `done` (`what`
    /// names that in the error): a proxy's pod watch is open once it has listed every running
    /// pod, and a stopped proxy's is gone once the API server has seen its connection close.
    pub(crate) async fn wait_for_pod_watches(
        &self,
        what: &str,
        done: impl Fn(u64) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let open = self.pod_watches().await;
            if done(open) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{what}: the API server has {open} pod watches open");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Creates namespace `ns` with the FeatureFlag `flags` (a document of about 1 KiB), and lets
/// every ServiceAccount of `ns` get the FeatureFlags there.
async fn namespace_with_flag(cp: &ControlPlane, ns: &str) -> anyhow::Result<()> {
    cp.create_namespace(ns).await;
    let flags = serde_json::Value::Object(crate::documents::flags(0, 1024));
    Api::<DynamicObject>::namespaced_with(cp.admin_client(), ns, &feature_flag_resource())
        .create(
            &PostParams::default(),
            &feature_flag_object(ns, "flags", flags),
        )
        .await
        .with_context(|| format!("creating the FeatureFlag {ns}/flags"))?;
    let group = json!({
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Group",
        "name": format!("system:serviceaccounts:{ns}"),
    });
    grant_flag_reading(cp, ns, "workloads-read-flags", group).await;
    Ok(())
}
