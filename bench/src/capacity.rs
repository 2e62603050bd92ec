//! The capacity model (docs/capacity.md): from the unit costs that `--costs` measures, what a
//! cluster of a given shape needs from the two tiers (central replicas, memory requests) and
//! costs the API server, and how long an edit of a FeatureFlag takes to reach every sidecar.
//! `--capacity FILE` reads the costs that `--costs --json FILE` wrote and prints the cluster
//! table, the headline and the check against the measured two-tier run (`capacity/report.rs`).
//!
//! Every quantity is a sum of unit costs times counts; the counts come from the cluster's shape
//! and the [`Assumptions`], which docs/capacity.md states.

use crate::costs::UnitCosts;

pub(crate) mod report;

/// What the model takes as given besides the measured costs.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Assumptions {
    /// FeatureFlags followed by some sidecar, cluster-wide.
    pub(crate) resources_in_use: usize,
    /// Cores a central replica has (its CPU limit).
    pub(crate) central_cores: f64,
    /// Cores a node proxy has (its CPU limit).
    pub(crate) node_cores: f64,
    /// Most memory one central replica may be given (MiB); beyond, the model adds replicas.
    pub(crate) central_max_mib: f64,
    /// The propagation p99 the replicas are chosen for (ms).
    pub(crate) target_p99_ms: f64,
    /// p99 over edits of the time until the last subscriber has the version, against that time
    /// for one edit (measured on a quiet machine: 1.21 to 1.22).
    pub(crate) tail: f64,
    /// Network latency one hop adds (ms).
    pub(crate) hop_network_ms: f64,
    /// From the edit until the central has the new object (ms; the API server's watch).
    pub(crate) source_ms: f64,
    /// Copies of a document held per version (the document, its encoding, the source's object),
    /// and two versions while one replaces the other.
    pub(crate) version_copies: f64,
    /// Memory request over the predicted RSS.
    pub(crate) headroom: f64,
    /// Memory limit over the memory request (the memory budget is ¾ of the limit).
    pub(crate) limit_over_request: f64,
    /// Edits of FeatureFlags per second, cluster-wide, in steady state (for the CPU requests).
    pub(crate) edits_per_second: f64,
    /// How long one watch request lasts before it is made again (s; `WATCH_TIMEOUT_SECS`).
    pub(crate) watch_renewal_s: f64,
    pub(crate) min_replicas: usize,
    pub(crate) max_replicas: usize,
}

impl Default for Assumptions {
    fn default() -> Self {
        Assumptions {
            resources_in_use: 100,
            central_cores: 2.0,
            node_cores: 1.0,
            central_max_mib: 4096.0,
            target_p99_ms: 1000.0,
            tail: 1.25,
            hop_network_ms: 1.0,
            source_ms: 20.0,
            version_copies: 6.0,
            headroom: 1.25,
            limit_over_request: 2.0,
            edits_per_second: 1.0,
            watch_renewal_s: 290.0,
            min_replicas: 2,
            max_replicas: 64,
        }
    }
}

/// One cluster: nodes, sidecars (spread evenly over the nodes) and the size of the documents.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub(crate) struct Cluster {
    pub(crate) nodes: usize,
    pub(crate) sidecars: usize,
    pub(crate) document_bytes: usize,
    /// With the node tier (one node proxy per node) or flat (every sidecar on the central).
    pub(crate) node_tier: bool,
}

impl Cluster {
    fn sidecars_per_node(&self) -> f64 {
        self.sidecars as f64 / self.nodes.max(1) as f64
    }

    /// Resources a node proxy follows: the distinct resources its sidecars follow, each sidecar
    /// taken to follow one of the resources in use at random (the expected count).
    fn resources_per_node(&self, a: &Assumptions) -> f64 {
        let resources = a.resources_in_use.max(1) as f64;
        let missed = (1.0 - 1.0 / resources).powf(self.sidecars_per_node());
        (resources * (1.0 - missed)).max(1.0)
    }
}

/// What the model says a cluster needs and gets.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub(crate) struct Plan {
    pub(crate) central_replicas: usize,
    /// Streams and connections each central replica serves.
    pub(crate) central_streams: f64,
    pub(crate) central_connections: f64,
    pub(crate) central_rss_mib: f64,
    pub(crate) central_request_mib: f64,
    pub(crate) node_rss_mib: f64,
    pub(crate) node_request_mib: f64,
    /// Watches at the API server, all replicas together.
    pub(crate) watches: usize,
    pub(crate) api_requests_per_second: f64,
    /// API requests when every central replica is replaced (a list and a watch per resource).
    pub(crate) api_requests_central_rollout: usize,
    /// CPU of one edit at one central replica and at one node proxy (ms).
    pub(crate) central_cpu_ms: f64,
    pub(crate) node_cpu_ms: f64,
    /// CPU in steady state at the assumed edit rate (millicores), each edit taken to be followed
    /// by every sidecar.
    pub(crate) central_millicores: f64,
    pub(crate) node_millicores: f64,
    /// Until the last node proxy, then the last sidecar, has an edit (ms), and the p99.
    pub(crate) central_hop_ms: f64,
    pub(crate) node_hop_ms: f64,
    pub(crate) p99_ms: f64,
    /// Why the target p99 is not met with the most replicas allowed, if it is not.
    pub(crate) bound: Option<String>,
}

/// CPU per delivery of a document of `bytes` (µs): the measured 1 KiB and 100 KiB costs, and
/// the cost per byte between and beyond them. `shared`: the connection carries other streams
/// (node proxies to the central). `gzip`: documents of 16 KiB and more go gzipped (the node
/// proxies accept gzip; sidecars are taken not to).
pub(crate) fn delivery_us(c: &UnitCosts, bytes: usize, shared: bool, gzip: bool) -> f64 {
    let small = if shared {
        c.us_per_delivery_shared
    } else {
        c.us_per_delivery
    };
    if bytes < 16 * 1024 {
        return small + bytes.saturating_sub(1024) as f64 * c.ns_per_byte / 1e3;
    }
    let large = if gzip {
        c.us_per_large_delivery_gzip
    } else {
        c.us_per_large_delivery
    };
    // Above and below the measured document, per byte (gzip: per byte of the document, in the
    // measured proportion).
    let per_byte = (large - c.us_per_delivery) / (c.large_document_bytes - 1024.0).max(1.0);
    small + (bytes as f64 - 1024.0) * per_byte
}

/// CPU per version of a document of `bytes` (ms): from the API server (`kubernetes`; a node
/// proxy, which decodes and validates an object that arrives on a stream as the Kubernetes
/// source does, is taken to pay the same) or from manifest files (also read and parsed).
fn version_ms(c: &UnitCosts, bytes: usize, kubernetes: bool) -> f64 {
    let small = match (kubernetes, c.ms_per_version_kubernetes) {
        (true, Some(ms)) => ms,
        _ => c.ms_per_version,
    };
    let per_kib = c.ms_per_large_version.map_or(0.0, |large| {
        (large - c.ms_per_version).max(0.0) / (c.large_document_bytes / 1024.0 - 1.0).max(1.0)
    });
    small + (bytes as f64 / 1024.0 - 1.0).max(0.0) * per_kib
}

/// The model for one cluster.
pub(crate) fn plan(c: &UnitCosts, a: &Assumptions, cluster: Cluster) -> Plan {
    let mut chosen = None;
    for replicas in a.min_replicas..=a.max_replicas.max(a.min_replicas) {
        let plan = plan_with(c, a, cluster, replicas);
        let fits = plan.p99_ms <= a.target_p99_ms && plan.central_rss_mib <= a.central_max_mib;
        chosen = Some(plan);
        if fits {
            break;
        }
    }
    let mut plan = chosen.unwrap_or_default();
    if plan.p99_ms > a.target_p99_ms || plan.central_rss_mib > a.central_max_mib {
        plan.bound = Some(bound(&plan, a));
    }
    plan
}

/// Which cost stands in the way of the target with the most replicas.
fn bound(plan: &Plan, a: &Assumptions) -> String {
    if plan.central_rss_mib > a.central_max_mib {
        return format!(
            "central memory: {:.0} streams per replica need {:.0} MiB",
            plan.central_streams, plan.central_rss_mib
        );
    }
    if plan.node_hop_ms > plan.central_hop_ms {
        format!(
            "the node proxy's CPU: {:.0} ms per edit on {} core(s)",
            plan.node_cpu_ms, a.node_cores
        )
    } else {
        format!(
            "the central's CPU per delivery: {:.0} ms per edit per replica on {} cores",
            plan.central_cpu_ms, a.central_cores
        )
    }
}

/// The model for one cluster with `replicas` central replicas.
pub(crate) fn plan_with(c: &UnitCosts, a: &Assumptions, cluster: Cluster, replicas: usize) -> Plan {
    let r = replicas as f64;
    let bytes = cluster.document_bytes;
    let resources = a.resources_in_use.min(cluster.sidecars).max(1);
    let version_kib = a.version_copies * bytes as f64 / 1024.0;
    let watch_kib = c.kib_per_watch_kubernetes.unwrap_or(c.kib_per_watch_files);
    let per_node = cluster.sidecars_per_node();
    let node_resources = cluster.resources_per_node(a);
    let mut plan = Plan {
        central_replicas: replicas,
        watches: resources * replicas,
        api_requests_per_second: (resources * replicas) as f64 / a.watch_renewal_s,
        api_requests_central_rollout: 2 * resources * replicas,
        ..Plan::default()
    };
    // An edit of a resource every sidecar follows: the worst case.
    if cluster.node_tier {
        plan.central_connections = cluster.nodes as f64 / r;
        plan.central_streams = cluster.nodes as f64 * node_resources / r;
        plan.central_rss_mib = c.base_mib
            + (plan.central_connections * c.kib_per_connection
                + plan.central_streams * c.kib_per_stream)
                / 1024.0;
        plan.central_cpu_ms = version_ms(c, bytes, true)
            + plan.central_connections * delivery_us(c, bytes, true, true) / 1e3;
        plan.node_rss_mib = c.base_mib
            + (per_node * c.kib_per_subscriber
                + node_resources * (c.kib_per_stream + version_kib)
                + c.kib_per_connection)
                / 1024.0;
        plan.node_cpu_ms =
            version_ms(c, bytes, true) + per_node * delivery_us(c, bytes, false, false) / 1e3;
        plan.node_hop_ms = hop_ms(c, bytes, plan.node_cpu_ms, a.node_cores) + a.hop_network_ms;
    } else {
        plan.central_connections = cluster.sidecars as f64 / r;
        plan.central_streams = plan.central_connections;
        plan.central_rss_mib =
            c.base_mib + plan.central_connections * c.kib_per_subscriber / 1024.0;
        plan.central_cpu_ms = version_ms(c, bytes, true)
            + plan.central_connections * delivery_us(c, bytes, false, false) / 1e3;
    }
    plan.central_rss_mib += resources as f64 * (watch_kib + version_kib) / 1024.0;
    plan.central_hop_ms = hop_ms(c, bytes, plan.central_cpu_ms, a.central_cores) + a.hop_network_ms;
    plan.p99_ms = a.tail * (a.source_ms + plan.central_hop_ms + plan.node_hop_ms);
    plan.central_request_mib = request_mib(plan.central_rss_mib, a);
    plan.central_millicores = a.edits_per_second * plan.central_cpu_ms;
    plan.node_millicores = a.edits_per_second * plan.node_cpu_ms;
    if cluster.node_tier {
        plan.node_request_mib = request_mib(plan.node_rss_mib, a);
    }
    plan
}

/// Time for one process to send a version to all its streams (ms): the work per version runs
/// once, on one core; the deliveries spread over the cores.
fn hop_ms(c: &UnitCosts, bytes: usize, cpu_ms: f64, cores: f64) -> f64 {
    let version = version_ms(c, bytes, true);
    version + (cpu_ms - version) / cores.max(0.1)
}

/// A memory request (MiB) for a predicted RSS: with headroom, rounded up to 16 MiB.
fn request_mib(rss_mib: f64, a: &Assumptions) -> f64 {
    (rss_mib * a.headroom / 16.0).ceil() * 16.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round costs, near what the proxy measured.
    pub(crate) fn costs() -> UnitCosts {
        UnitCosts {
            base_mib: 10.0,
            kib_per_subscriber: 24.0,
            kib_per_stream: 8.0,
            kib_per_connection: 16.0,
            kib_per_watch_files: 20.0,
            kib_per_watch_kubernetes: Some(20.0),
            ms_per_version: 1.0,
            ms_per_version_kubernetes: Some(0.5),
            ms_per_large_version: Some(5.0),
            us_per_delivery: 15.0,
            us_per_delivery_shared: 10.0,
            ns_per_byte: 0.7,
            us_per_large_delivery: 80.0,
            us_per_large_delivery_gzip: 40.0,
            large_document_bytes: 102_400.0,
            ..UnitCosts::default()
        }
    }

    fn cluster(nodes: usize, sidecars: usize, document_bytes: usize) -> Cluster {
        Cluster {
            nodes,
            sidecars,
            document_bytes,
            node_tier: true,
        }
    }

    #[test]
    fn deliveries_cost_more_for_larger_documents_and_less_gzipped() {
        let c = costs();
        assert_eq!(delivery_us(&c, 1024, false, false), 15.0);
        assert_eq!(delivery_us(&c, 1024, true, false), 10.0);
        assert!((delivery_us(&c, 102_400, false, false) - 80.0).abs() < 1e-9);
        assert!(delivery_us(&c, 102_400, false, true) < delivery_us(&c, 102_400, false, false));
        assert!(delivery_us(&c, 8 * 1024, false, false) > 15.0);
    }

    #[test]
    fn the_central_serves_node_proxies_not_sidecars() {
        let (c, a) = (costs(), Assumptions::default());
        let tiered = plan_with(&c, &a, cluster(5_000, 100_000, 1024), 2);
        // 2,500 node proxies per replica, 20 sidecars each following 18.2 of 100 resources.
        assert_eq!(tiered.central_connections, 2_500.0);
        let distinct = 100.0 * (1.0 - 0.99_f64.powi(20));
        assert!((tiered.central_streams - 2_500.0 * distinct).abs() < 1e-6);
        assert_eq!(tiered.watches, 200);
        let flat = plan_with(
            &c,
            &a,
            Cluster {
                node_tier: false,
                ..cluster(5_000, 100_000, 1024)
            },
            2,
        );
        assert_eq!(flat.central_streams, 50_000.0);
        assert!(flat.central_cpu_ms > 10.0 * tiered.central_cpu_ms);
        assert_eq!(flat.node_request_mib, 0.0);
    }

    #[test]
    fn replicas_are_added_until_the_target_is_met() {
        let (c, a) = (costs(), Assumptions::default());
        let flat = |bytes| Cluster {
            node_tier: false,
            ..cluster(5_000, 100_000, bytes)
        };
        let small = plan(&c, &a, flat(1024));
        assert!(small.p99_ms <= a.target_p99_ms, "{small:?}");
        let large = plan(&c, &a, flat(102_400));
        assert!(large.central_replicas > small.central_replicas, "{large:?}");
        assert!(large.p99_ms <= a.target_p99_ms, "{large:?}");
        assert!(plan_with(&c, &a, flat(102_400), large.central_replicas - 1).p99_ms > 1000.0);
        assert_eq!(large.bound, None);
    }

    #[test]
    fn an_unreachable_target_names_the_cost_in_the_way() {
        let c = costs();
        let a = Assumptions {
            node_cores: 0.001,
            ..Assumptions::default()
        };
        let plan = plan(&c, &a, cluster(100, 100_000, 102_400));
        assert_eq!(plan.central_replicas, a.max_replicas);
        assert!(
            plan.bound.as_deref().unwrap_or("").contains("node proxy"),
            "{plan:?}"
        );
    }

    #[test]
    fn memory_requests_have_headroom_and_grow_with_sidecars() {
        let (c, a) = (costs(), Assumptions::default());
        let few = plan(&c, &a, cluster(1_000, 10_000, 1024));
        let many = plan(&c, &a, cluster(1_000, 100_000, 1024));
        assert!(few.node_request_mib >= few.node_rss_mib * a.headroom);
        assert!(many.node_request_mib > few.node_request_mib);
        assert_eq!(few.node_request_mib % 16.0, 0.0);
    }
}
