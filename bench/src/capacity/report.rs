//! `--capacity FILE`: the capacity model's tables from measured unit costs, the headline, and
//! the check of the model against the measured two-tier run (docs/benchmarks.md, "Two tiers").

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;

use super::{Assumptions, Cluster, plan, version_ms};
use crate::costs::UnitCosts;
use crate::kit::table::{Table, fmt_opt};
use crate::options::SourceKind;

/// The rows of the cluster table: nodes × sidecars × document size.
pub(crate) const NODES: [usize; 3] = [100, 1_000, 5_000];
pub(crate) const SIDECARS: [usize; 2] = [10_000, 100_000];
pub(crate) const DOCUMENTS: [usize; 2] = [1024, 102_400];

/// The measured two-tier runs the model is checked against, both on a quiet machine of 2 cores
/// on 2026-12-02 (docs/benchmarks.md, "Two tiers with manifest files, on a quiet machine" and
/// "Two tiers with Kubernetes and the Go proxy, on a quiet machine"): 50 node proxies × 2,000 subscribers over
/// 20 resources of 1 KiB, 10 streams per subscriber connection, every process on the same
/// machine; each paced update rewrote all 20 resources.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Measured {
    /// How the check's table names the run.
    pub(crate) run: &'static str,
    pub(crate) source: SourceKind,
    /// Node proxies, and subscribers on each.
    pub(crate) nodes: f64,
    pub(crate) per_node: f64,
    pub(crate) central_cpu_s: f64,
    pub(crate) nodes_cpu_s: f64,
    pub(crate) load_generator_cpu_s: Option<f64>,
    pub(crate) central_rss_mib: f64,
    pub(crate) node_rss_mib: f64,
    pub(crate) p99_ms: f64,
}

pub(crate) const MEASURED: [Measured; 2] = [
    // Load average 0.05 before.
    Measured {
        run: "files, 50 × 2,000",
        source: SourceKind::Files,
        nodes: 50.0,
        per_node: 2_000.0,
        central_cpu_s: 0.017,
        nodes_cpu_s: 1.606,
        load_generator_cpu_s: Some(0.734),
        central_rss_mib: 19.3,
        node_rss_mib: 23.9,
        p99_ms: 1353.5,
    },
    // Load average 0.16 before.
    Measured {
        run: "Kubernetes, 50 × 2,000",
        source: SourceKind::Kubernetes,
        nodes: 50.0,
        per_node: 2_000.0,
        central_cpu_s: 0.013,
        nodes_cpu_s: 1.319,
        load_generator_cpu_s: Some(0.629),
        central_rss_mib: 20.7,
        node_rss_mib: 24.0,
        p99_ms: 1207.6,
    },
];

/// The shape of the measured runs besides their node proxies and subscribers.
const CHECK_RESOURCES: f64 = 20.0;
const CHECK_STREAMS_PER_CONNECTION: f64 = 10.0;
const CHECK_CORES: f64 = 2.0;

/// The model's figures for the measured run's shape: CPU per update (s) of the central, the
/// node proxies together and the load generator; RSS (MiB) of the central and of one node
/// proxy; p99 (ms) with every process on `CHECK_CORES` cores.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub(crate) struct Predicted {
    pub(crate) central_cpu_s: f64,
    pub(crate) nodes_cpu_s: f64,
    pub(crate) load_generator_cpu_s: f64,
    pub(crate) central_rss_mib: f64,
    pub(crate) node_rss_mib: f64,
    pub(crate) p99_ms: f64,
}

pub(crate) fn predict(c: &UnitCosts, a: &Assumptions, m: &Measured) -> Predicted {
    let kubernetes = m.source == SourceKind::Kubernetes;
    let (nodes, per_node) = (m.nodes, m.per_node);
    let version = version_ms(c, 1024, kubernetes) / 1e3;
    let node_version = version_ms(c, 1024, true) / 1e3;
    let shared = c.us_per_delivery_shared / 1e6;
    let per_resource = per_node / CHECK_RESOURCES;
    let central_cpu_s = CHECK_RESOURCES * (version + nodes * shared);
    let nodes_cpu_s = nodes * CHECK_RESOURCES * (node_version + per_resource * shared);
    let load_generator_cpu_s = nodes * per_node * c.us_load_generator_per_delivery / 1e6;
    let version_kib = a.version_copies;
    let watch = if kubernetes {
        c.kib_per_watch_kubernetes.unwrap_or(c.kib_per_watch_files)
    } else {
        c.kib_per_watch_files
    };
    let central_kib = nodes * c.kib_per_connection
        + nodes * CHECK_RESOURCES * c.kib_per_stream
        + CHECK_RESOURCES * (watch + version_kib);
    let node_kib = per_node / CHECK_STREAMS_PER_CONNECTION * c.kib_per_connection
        + per_node * c.kib_per_stream
        + CHECK_RESOURCES * (c.kib_per_stream + version_kib)
        + c.kib_per_connection;
    // Files: the source reads a directory again once its renames settle (50 ms).
    let source_ms = if kubernetes { a.source_ms } else { 50.0 };
    // The load generator is the check's test equipment, not part of the model: where its CPU
    // was measured, that is what shares the cores with the proxies.
    let total_cpu_s =
        central_cpu_s + nodes_cpu_s + m.load_generator_cpu_s.unwrap_or(load_generator_cpu_s);
    Predicted {
        central_cpu_s,
        nodes_cpu_s,
        load_generator_cpu_s,
        central_rss_mib: c.base_mib + central_kib / 1024.0,
        node_rss_mib: c.base_mib + node_kib / 1024.0,
        p99_ms: a.tail * (source_ms + total_cpu_s * 1e3 / CHECK_CORES),
    }
}

/// `--capacity FILE`: prints (and with `--markdown`, writes) the model's tables.
pub(crate) fn main(path: &Path, markdown: Option<&Path>) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let costs: UnitCosts = serde_json::from_value(json["costs"].clone()).with_context(|| {
        format!(
            "{}: no unit costs (write them with --costs --json)",
            path.display()
        )
    })?;
    let report = render(&costs, &Assumptions::default());
    println!("{report}");
    if let Some(out) = markdown {
        std::fs::write(out, &report).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn render(c: &UnitCosts, a: &Assumptions) -> String {
    let mut out = String::from("## Capacity model\n\n");
    out.push_str(&cluster_table(c, a));
    out.push_str(&headline(c, a));
    out.push_str(&check_table(c, a));
    out
}

fn kib(bytes: usize) -> String {
    format!("{} KiB", bytes / 1024)
}

/// The cluster table: every row of nodes × sidecars × document, with the node tier.
pub(crate) fn cluster_table(c: &UnitCosts, a: &Assumptions) -> String {
    let header = "row | nodes | sidecars | document | central replicas | streams per replica \
         | central memory request | node memory request | API watches \
         | API requests/s, steady | API requests, central rollout | central hop | node hop \
         | p99";
    let mut table = Table::of(header, "lrrlr");
    let mut row = 0;
    for nodes in NODES {
        for sidecars in SIDECARS {
            for document_bytes in DOCUMENTS {
                row += 1;
                let cluster = Cluster {
                    nodes,
                    sidecars,
                    document_bytes,
                    node_tier: true,
                };
                let p = plan(c, a, cluster);
                let bound = p
                    .bound
                    .as_ref()
                    .map_or(String::new(), |b| format!(" ({b})"));
                table.row([
                    format!("C{row}"),
                    nodes.to_string(),
                    sidecars.to_string(),
                    kib(document_bytes),
                    format!("{}{bound}", p.central_replicas),
                    format!("{:.0}", p.central_streams),
                    format!("{:.0} MiB", p.central_request_mib),
                    format!("{:.0} MiB", p.node_request_mib),
                    p.watches.to_string(),
                    format!("{:.2}", p.api_requests_per_second),
                    p.api_requests_central_rollout.to_string(),
                    format!("{:.1} ms", p.central_hop_ms),
                    format!("{:.1} ms", p.node_hop_ms),
                    format!("{:.0} ms", p.p99_ms),
                ]);
            }
        }
    }
    table.markdown() + "\n"
}

/// The headline: 100,000 sidecars on 5,000 nodes, with the node tier and flat.
fn headline(c: &UnitCosts, a: &Assumptions) -> String {
    let header = "5,000 nodes, 100,000 sidecars | document | central replicas \
         | CPU per edit at a replica | p99 | RSS per replica | in the way";
    let mut table = Table::of(header, "llrrrrl");
    for node_tier in [true, false] {
        for document_bytes in DOCUMENTS {
            let cluster = Cluster {
                nodes: 5_000,
                sidecars: 100_000,
                document_bytes,
                node_tier,
            };
            let p = plan(c, a, cluster);
            table.row([
                (if node_tier { "node tier" } else { "flat" }).to_owned(),
                kib(document_bytes),
                p.central_replicas.to_string(),
                format!("{:.0} ms", p.central_cpu_ms),
                format!("{:.0} ms", p.p99_ms),
                format!("{:.0} MiB", p.central_rss_mib),
                p.bound.as_deref().unwrap_or("nothing").to_owned(),
            ]);
        }
    }
    table.markdown() + "\n"
}

/// Predicted against measured, for the two-tier run's shape.
pub(crate) fn check_table(c: &UnitCosts, a: &Assumptions) -> String {
    let header = "run | quantity | predicted | measured | predicted / measured";
    let mut table = Table::of(header, "llr");
    for m in MEASURED {
        let p = predict(c, a, &m);
        let rows = [
            (
                "central CPU per update (s)",
                p.central_cpu_s,
                Some(m.central_cpu_s),
                3,
            ),
            (
                "node proxies' CPU per update, together (s)",
                p.nodes_cpu_s,
                Some(m.nodes_cpu_s),
                3,
            ),
            (
                "central RSS idle (MiB)",
                p.central_rss_mib,
                Some(m.central_rss_mib),
                1,
            ),
            (
                "node proxy RSS idle (MiB)",
                p.node_rss_mib,
                Some(m.node_rss_mib),
                1,
            ),
            (
                "propagation p99, 2 cores for every process (ms)",
                p.p99_ms,
                Some(m.p99_ms),
                0,
            ),
        ];
        for (name, predicted, measured, digits) in rows {
            table.row([
                m.run.to_owned(),
                name.to_owned(),
                format!("{predicted:.digits$}"),
                fmt_opt(measured, digits),
                fmt_opt(measured.map(|m| predicted / m), 2),
            ]);
        }
    }
    table.markdown() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_table_has_every_row() {
        let table = cluster_table(&super::super::tests::costs(), &Assumptions::default());
        assert_eq!(table.lines().filter(|l| l.starts_with("| C")).count(), 12);
        assert!(
            table.contains("| C12 | 5000 | 100000 | 100 KiB |"),
            "{table}"
        );
    }

    /// docs/capacity.md shows the tables the model makes of the costs it was measured with.
    #[test]
    fn the_documented_tables_are_the_models() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
        let read = |name: &str| {
            std::fs::read_to_string(docs.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let json: Value = serde_json::from_str(&read("capacity-costs.json")).expect("JSON");
        let costs: UnitCosts = serde_json::from_value(json["costs"].clone()).expect("costs");
        let page = read("capacity.md");
        let a = Assumptions::default();
        let tables = [
            cluster_table(&costs, &a),
            headline(&costs, &a),
            check_table(&costs, &a),
        ];
        for line in tables
            .iter()
            .flat_map(|t| t.lines())
            .filter(|l| !l.is_empty())
        {
            assert!(page.contains(line), "docs/capacity.md lacks {line:?}");
        }
    }

    #[test]
    fn the_check_predicts_more_cpu_at_the_node_tier_than_at_the_central() {
        let p = predict(
            &super::super::tests::costs(),
            &Assumptions::default(),
            &MEASURED[0],
        );
        // 1,000 versions × 100 deliveries against 20 versions × 50 deliveries.
        assert!(p.nodes_cpu_s > 20.0 * p.central_cpu_s, "{p:?}");
        assert!(p.node_rss_mib > p.central_rss_mib, "{p:?}");
    }
}
