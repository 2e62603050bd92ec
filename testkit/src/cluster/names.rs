//! The cluster's fixed names and addresses: its network namespace, the node, its address
//! ranges, the registry and kubelet's cgroup root. A leaf: every part of the cluster reads them.
use std::path::{Path, PathBuf};

/// The network namespace the cluster lives in.
pub const NETNS: &str = "flagd-proxy-cluster";
/// The in-cluster image registry: pods pull `REGISTRY/<name>:<tag>`.
pub const REGISTRY: &str = "10.99.0.1:5000";

/// The node's name.
pub const NODE: &str = "node1";
/// The node's address, on a veth inside the namespace: API server, kubelet, registry.
pub const NODE_IP: &str = "10.99.0.1";
/// Pod addresses (the bridge CNI's range).
pub const POD_CIDR: &str = "10.88.0.0/16";
/// Service addresses.
pub const SVC_CIDR: &str = "10.96.0.0/16";
/// The `kubernetes` Service's address.
pub(crate) const API_SERVICE_IP: &str = "10.96.0.1";
/// The cluster DNS Service's address.
pub const DNS_IP: &str = "10.96.0.10";
/// kubelet's cgroup root: every pod and container of the cluster lives under it, in every
/// cgroup hierarchy, and nothing else does (the machine's own pods, if it is a node, are
/// elsewhere).
pub const CGROUP_ROOT: &str = "flagd-proxy-cluster";

/// Where the cluster's network namespace is mounted.
pub(crate) fn netns_path() -> PathBuf {
    Path::new("/run/netns").join(NETNS)
}
