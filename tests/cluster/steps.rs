//! What the cluster tests do again and again: find the cluster and the flagd image, and check
//! that a flagd follows an edit of its FeatureFlag.

use std::ops::Deref;

use super::*;
use support::cluster::SharedCluster;

/// The cluster a test holds (`cluster_or_skip()` or `exclusive_cluster_or_skip()`) with the
/// FeatureFlag CRD installed, and the flagd image; `None` when either is missing (the calling
/// test is skipped; a failure under `CI`).
pub(crate) fn with_flagd<C: Deref<Target = Cluster>>(cluster: Option<C>) -> Option<(C, String)> {
    let cluster = cluster?;
    let flagd_image = cluster.flagd_image()?;
    cluster.install_crds();
    Some((cluster, flagd_image))
}

/// [`with_flagd`] of the shared cluster, and helm: what the chart's tests need.
pub(crate) fn with_flagd_and_helm() -> Option<(SharedCluster, String, PathBuf)> {
    let (cluster, flagd_image) = with_flagd(cluster_or_skip())?;
    let helm = helm_binary()?;
    Some((cluster, flagd_image, helm))
}

/// The chart installed as release `flagd-proxy` into `ns`, a new `restricted` namespace, with
/// `sets` ([`helm_install`]).
pub(crate) fn install_chart(cluster: &Cluster, helm: &Path, ns: &str, sets: &[String]) {
    cluster.restricted_namespace(ns);
    helm_install(cluster, helm, ns, sets);
}

/// Waits until the one pod with label `app=<app>` in `ns` (a flagd) evaluates `color` to red,
/// changes the default variant of the FeatureFlag `ns/demo` to blue and waits until that flagd
/// evaluates blue.
pub(crate) fn flagd_follows_an_edit(cluster: &Cluster, ns: &str, app: &str) {
    let ip = single_pod_ip(cluster, ns, &format!("app={app}"));
    wait_for_color(cluster, &ip, "red");
    set_default_color(cluster, ns, "demo", "blue");
    wait_for_color(cluster, &ip, "blue");
}
