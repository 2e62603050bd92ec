//! The Kubernetes side of authorization: TokenReview, SubjectAccessReview, and which pod owns
//! an address.
//!
//! Pod addresses are answered from a watch over running pods (started only with
//! `--authz-pod-ip`), so a connection costs the API server nothing. With `--authz-pod-node`
//! (the node tier) the watch and the lists cover only the pods scheduled on that node: a pod
//! elsewhere does not identify a client there, and each node proxy watches its own pods only. The watch keeps, per pod,
//! only its namespace, ServiceAccount, uid and addresses. A pod leaves the index when it is
//! deleted, stops running (the watch is limited to `status.phase=Running`, so the API server
//! reports that as a deletion) or starts terminating. Events arrive in the order the API server
//! committed them, so once a pod that reuses an address is seen, the pod that had it before is
//! gone from the index or both are there (an address claimed twice is refused). Until the watch
//! has listed every running pod (at start and after it failed), lookups list pods by address
//! instead.
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;

use crate::authz::{AuthzError, AuthzSettings, Identity, PodOwner, Reviewer};
use crate::backoff::Backoff;
use crate::selector::{GROUP, ResourceKey};

/// Only running pods own an address.
const RUNNING: &str = "status.phase=Running";

/// The field selector of the pods that may own an address: running ones, on `node` if given.
fn pod_fields(node: Option<&str>) -> String {
    match node {
        Some(node) => format!("{RUNNING},spec.nodeName={node}"),
        None => RUNNING.to_owned(),
    }
}

/// [`Reviewer`] backed by the Kubernetes API.
pub struct KubeReviewer {
    client: kube::Client,
    token_audiences: Vec<String>,
    /// The pod index, when pod addresses identify clients.
    pods: Option<Arc<Mutex<PodIndex>>>,
    /// The field selector of the pods watched and listed (see [`pod_fields`]).
    pod_fields: String,
    /// Ends the pod watch when the reviewer goes.
    _watch: Option<AbortOnDrop>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl KubeReviewer {
    /// With `pod_ip` in the settings, starts the pod watch (on the current Tokio runtime).
    pub fn new(client: kube::Client, settings: &AuthzSettings) -> Self {
        let pod_fields = pod_fields(settings.pod_node.as_deref());
        let (pods, watch) = if settings.pod_ip {
            let index = Arc::new(Mutex::new(PodIndex::default()));
            let task = tokio::spawn(watch_pods(
                client.clone(),
                pod_fields.clone(),
                index.clone(),
            ));
            (Some(index), Some(AbortOnDrop(task)))
        } else {
            (None, None)
        };
        Self {
            client,
            token_audiences: settings.token_audiences.clone(),
            pods,
            pod_fields,
            _watch: watch,
        }
    }
}

impl Reviewer for KubeReviewer {
    fn review_token(
        &self,
        token: String,
    ) -> BoxFuture<'static, Result<Result<Identity, String>, AuthzError>> {
        let client = self.client.clone();
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token),
                audiences: (!self.token_audiences.is_empty()).then(|| self.token_audiences.clone()),
            },
            ..TokenReview::default()
        };
        async move {
            let answer = create_review(&client, &review, "TokenReview").await?;
            let status = answer.status.unwrap_or_default();
            Ok(match (status.authenticated, status.user) {
                (Some(true), Some(user)) => {
                    let name = user.username.unwrap_or_default();
                    let namespace = name
                        .strip_prefix("system:serviceaccount:")
                        .and_then(|r| r.split(':').next())
                        .map(str::to_owned);
                    Ok(Identity {
                        user: name,
                        groups: user.groups.unwrap_or_default(),
                        namespace,
                        via: "bearer token",
                    })
                }
                _ => Err(format!(
                    "the bearer token was rejected by the API server{}",
                    status.error.map(|e| format!(": {e}")).unwrap_or_default()
                )),
            })
        }
        .boxed()
    }

    fn review_access(
        &self,
        identity: Identity,
        key: ResourceKey,
    ) -> BoxFuture<'static, Result<Result<(), String>, AuthzError>> {
        let client = self.client.clone();
        async move {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(identity.user),
                    groups: Some(identity.groups),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(GROUP.to_owned()),
                        resource: Some("featureflags".to_owned()),
                        verb: Some("get".to_owned()),
                        namespace: Some(key.namespace.clone()),
                        name: Some(key.name.clone()),
                        ..ResourceAttributes::default()
                    }),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let answer = create_review(&client, &review, "SubjectAccessReview").await?;
            let status = answer.status.unwrap_or_default();
            if status.allowed {
                return Ok(Ok(()));
            }
            let detail = status
                .reason
                .filter(|r| !r.is_empty())
                .map(|r| format!(" ({r})"))
                .unwrap_or_default();
            Ok(Err(format!(
                "RBAC does not allow get on featureflags.{GROUP} {:?} in namespace {:?}{detail}",
                key.name, key.namespace
            )))
        }
        .boxed()
    }

    fn pods_at(&self, ip: IpAddr) -> BoxFuture<'static, Result<Vec<PodOwner>, AuthzError>> {
        if let Some(index) = &self.pods {
            let index = crate::locks::lock(index);
            if index.synced {
                let owners = index.owners(ip);
                return futures::future::ready(Ok(owners)).boxed();
            }
        }
        let client = self.client.clone();
        let fields = format!("{},status.podIP={ip}", self.pod_fields);
        async move {
            let pods = Api::<Pod>::all(client)
                .list(&ListParams::default().fields(&fields))
                .await
                .map_err(|e| {
                    AuthzError::Unavailable(format!("listing pods by address failed: {e}"))
                })?;
            Ok(pods
                .items
                .iter()
                .filter_map(owner)
                .filter(|(_, ips)| ips.contains(&ip))
                .map(|(owner, _)| owner)
                .collect())
        }
        .boxed()
    }
}

/// Asks the API server for a review (`kind` names it in the error).
async fn create_review<K>(client: &kube::Client, review: &K, kind: &str) -> Result<K, AuthzError>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    Api::<K>::all(client.clone())
        .create(&PostParams::default(), review)
        .await
        .map_err(|e| AuthzError::Unavailable(format!("{kind} failed: {e}")))
}

/// The identity and addresses of a pod that may own an address: running, not terminating, not
/// on the host's network, with a uid and at least one address.
fn owner(pod: &Pod) -> Option<(PodOwner, Vec<IpAddr>)> {
    let spec = pod.spec.as_ref()?;
    let status = pod.status.as_ref()?;
    if spec.host_network == Some(true)
        || status.phase.as_deref() != Some("Running")
        || pod.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .chain(status.pod_ip.as_deref())
        .filter_map(|ip| ip.parse().ok())
        .collect();
    ips.sort_unstable();
    ips.dedup();
    if ips.is_empty() {
        return None;
    }
    let owner = PodOwner {
        uid: pod.metadata.uid.clone()?,
        namespace: pod.metadata.namespace.clone()?,
        service_account: spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into()),
    };
    Some((owner, ips))
}

/// Running pods by address, as last seen by the watch.
#[derive(Default)]
struct PodIndex {
    /// Whether the watch has listed every running pod since it (re)started.
    synced: bool,
    pods: HashMap<String, (PodOwner, Vec<IpAddr>)>,
    by_ip: HashMap<IpAddr, Vec<String>>,
    /// The index being rebuilt by a (re)list, swapped in when it completes.
    relisting: Option<Box<PodIndex>>,
}

impl PodIndex {
    fn owners(&self, ip: IpAddr) -> Vec<PodOwner> {
        self.by_ip
            .get(&ip)
            .into_iter()
            .flatten()
            .filter_map(|uid| self.pods.get(uid))
            .map(|(owner, _)| owner.clone())
            .collect()
    }

    fn event(&mut self, event: watcher::Event<Pod>) {
        match event {
            watcher::Event::Apply(pod) => self.apply(&pod),
            watcher::Event::Delete(pod) => {
                if let Some(uid) = &pod.metadata.uid {
                    self.remove(uid);
                }
            }
            watcher::Event::Init => {
                // A (re)list: events may have been missed, so the index is not used until done.
                self.synced = false;
                self.relisting = Some(Box::default());
            }
            watcher::Event::InitApply(pod) => {
                if let Some(next) = &mut self.relisting {
                    next.apply(&pod);
                }
            }
            watcher::Event::InitDone => {
                if let Some(next) = self.relisting.take() {
                    self.pods = next.pods;
                    self.by_ip = next.by_ip;
                    self.synced = true;
                }
            }
        }
    }

    /// The watch failed: events may be missing until it has listed again.
    fn lost(&mut self) {
        self.synced = false;
        self.relisting = None;
    }

    fn apply(&mut self, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            self.remove(uid);
        }
        if let Some((owner, ips)) = owner(pod) {
            for ip in &ips {
                self.by_ip.entry(*ip).or_default().push(owner.uid.clone());
            }
            self.pods.insert(owner.uid.clone(), (owner, ips));
        }
    }

    fn remove(&mut self, uid: &str) {
        let Some((_, ips)) = self.pods.remove(uid) else {
            return;
        };
        for ip in ips {
            if let Some(uids) = self.by_ip.get_mut(&ip) {
                uids.retain(|u| u != uid);
                if uids.is_empty() {
                    self.by_ip.remove(&ip);
                }
            }
        }
    }
}

/// Keeps `index` current. A failed watch is started over (after a backoff) with a fresh list, and
/// until that list is complete the index is not used.
async fn watch_pods(client: kube::Client, fields: String, index: Arc<Mutex<PodIndex>>) {
    let api = Api::<Pod>::all(client);
    let mut backoff = Backoff::new();
    loop {
        let mut events = std::pin::pin!(watcher(
            api.clone(),
            watcher::Config::default().fields(&fields)
        ));
        while let Some(event) = events.next().await {
            let mut index = crate::locks::lock(&index);
            match event {
                Ok(event) => {
                    let was_synced = index.synced;
                    index.event(event);
                    if index.synced && !was_synced {
                        tracing::info!(
                            pods = index.pods.len(),
                            "pod addresses are answered from the pod watch"
                        );
                    }
                    backoff.reset();
                }
                Err(error) => {
                    index.lost();
                    tracing::warn!(%error, "the pod watch for --authz-pod-ip failed; pods are listed by address until it is back");
                    break;
                }
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, ns: &str, sa: &str, ip: &str, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": ns, "uid": uid},
            "spec": {"serviceAccountName": sa, "containers": []},
            "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]},
        }))
        .expect("pod")
    }

    fn accounts(index: &PodIndex, ip: &str) -> Vec<String> {
        index
            .owners(ip.parse().expect("ip"))
            .into_iter()
            .map(|o| format!("{}/{}", o.namespace, o.service_account))
            .collect()
    }

    fn synced(pods: &[Pod]) -> PodIndex {
        let mut index = PodIndex::default();
        index.event(watcher::Event::Init);
        for p in pods {
            index.event(watcher::Event::InitApply(p.clone()));
        }
        index.event(watcher::Event::InitDone);
        assert!(index.synced);
        index
    }

    #[test]
    fn the_node_tier_watches_only_the_running_pods_of_its_node() {
        assert_eq!(pod_fields(None), "status.phase=Running");
        assert_eq!(
            pod_fields(Some("node-7")),
            "status.phase=Running,spec.nodeName=node-7"
        );
    }

    #[test]
    fn an_address_reused_after_deletion_belongs_to_the_new_pod_only() {
        let a = pod("a", "team-a", "web", "10.0.0.7", "Running");
        let mut index = synced(std::slice::from_ref(&a));
        assert_eq!(accounts(&index, "10.0.0.7"), ["team-a/web"]);
        index.event(watcher::Event::Delete(a));
        assert!(accounts(&index, "10.0.0.7").is_empty());
        index.event(watcher::Event::Apply(pod(
            "b", "team-b", "db", "10.0.0.7", "Running",
        )));
        assert_eq!(accounts(&index, "10.0.0.7"), ["team-b/db"]);
    }

    #[test]
    fn a_pod_that_stops_running_or_terminates_owns_no_address() {
        let a = pod("a", "team-a", "web", "10.0.0.7", "Running");
        let mut index = synced(std::slice::from_ref(&a));
        index.event(watcher::Event::Apply(pod(
            "a",
            "team-a",
            "web",
            "10.0.0.7",
            "Succeeded",
        )));
        assert!(accounts(&index, "10.0.0.7").is_empty());
        let mut terminating = a.clone();
        terminating.metadata.deletion_timestamp =
            Some(serde_json::from_value(serde_json::json!("2026-01-01T00:00:00Z")).expect("time"));
        index.event(watcher::Event::Apply(a));
        assert_eq!(accounts(&index, "10.0.0.7"), ["team-a/web"]);
        index.event(watcher::Event::Apply(terminating));
        assert!(accounts(&index, "10.0.0.7").is_empty());
    }

    #[test]
    fn an_address_claimed_twice_has_both_owners_and_a_moved_pod_leaves_its_old_one() {
        let mut index = synced(&[
            pod("a", "team-a", "web", "10.0.0.7", "Running"),
            pod("b", "team-b", "db", "10.0.0.7", "Running"),
        ]);
        assert_eq!(accounts(&index, "10.0.0.7").len(), 2);
        index.event(watcher::Event::Apply(pod(
            "a", "team-a", "web", "10.0.0.8", "Running",
        )));
        assert_eq!(accounts(&index, "10.0.0.7"), ["team-b/db"]);
        assert_eq!(accounts(&index, "10.0.0.8"), ["team-a/web"]);
    }

    #[test]
    fn a_relist_replaces_the_index_and_a_lost_watch_unsyncs_it() {
        let mut index = synced(&[pod("a", "team-a", "web", "10.0.0.7", "Running")]);
        index.event(watcher::Event::Init);
        index.event(watcher::Event::InitApply(pod(
            "b", "team-b", "db", "10.0.0.9", "Running",
        )));
        assert!(!index.synced, "not used while listing");
        index.event(watcher::Event::InitDone);
        assert!(
            accounts(&index, "10.0.0.7").is_empty(),
            "deleted while the watch was down"
        );
        assert_eq!(accounts(&index, "10.0.0.9"), ["team-b/db"]);
        index.lost();
        assert!(!index.synced);
    }
}
