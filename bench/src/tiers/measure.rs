//! The measured phases of a topology with every subscriber connected: idle (memory, streams and
//! connections at the central, API-server watches), paced updates (propagation through both
//! tiers, CPU of each tier) and the burst.

use super::Tier;
use super::topology::{Crowd, Topology};
use crate::kit::latency::Stats;
use crate::load::Tracker;
use crate::pacing::paced;
use crate::sampling::{mib, proc_sample};

impl Topology<'_> {
    /// The process ids of the node proxies that run.
    fn node_pids(&self) -> Vec<u32> {
        self.nodes.iter().filter_map(Tier::pid).collect()
    }

    /// CPU seconds of the central, of every node proxy together, and of this program.
    pub(crate) fn cpu(&self) -> (f64, f64, f64) {
        let central = self
            .central
            .pid()
            .map_or(0.0, |p| proc_sample(p).cpu_seconds);
        let nodes = self
            .node_pids()
            .into_iter()
            .map(|p| proc_sample(p).cpu_seconds)
            .sum();
        (central, nodes, proc_sample(std::process::id()).cpu_seconds)
    }

    /// Idle, every subscriber connected: RSS of each tier, the central's streams, connections
    /// and watches, the node proxies' streams, and the API server's watches.
    pub(crate) async fn idle(&mut self) {
        tokio::time::sleep(self.args.idle).await;
        let node_rss: Vec<f64> = self
            .node_pids()
            .into_iter()
            .map(|p| mib(proc_sample(p).rss_kib))
            .collect();
        let central = self.central.metrics().await;
        let mut node_streams = 0.0;
        for node in &self.nodes {
            node_streams += node
                .metrics()
                .await
                .get("sync_active_streams")
                .unwrap_or(0.0);
        }
        let result = &mut self.result;
        result.central_rss_mib = self
            .central
            .pid()
            .map_or(0.0, |p| mib(proc_sample(p).rss_kib));
        if !node_rss.is_empty() {
            result.node_rss_mib_mean = Some(node_rss.iter().sum::<f64>() / node_rss.len() as f64);
            result.node_rss_mib_max = node_rss.iter().copied().reduce(f64::max);
        }
        result.central_streams = central.get("sync_active_streams");
        result.central_connections = central.get("flagd_proxy_open_connections{port=\"sync\"}");
        result.central_watches = central.get("flagd_proxy_upstream_watches");
        result.node_streams = Some(node_streams);
        if let Some(cluster) = &self.cluster {
            result.apiserver_watches = Some(cluster.open_watches("featureflags").await);
        }
    }

    /// Paced updates: each is written once the previous one reached every subscriber; the
    /// propagation to all and the CPU per update of each tier.
    pub(crate) async fn paced(&mut self, tracker: &Tracker) -> anyhow::Result<()> {
        let before = self.cpu();
        let paced = paced(self.args, &self.sources, tracker, || None, |_| {}).await?;
        let (after, applied) = (self.cpu(), paced.applied);
        let result = &mut self.result;
        result.updates_incomplete += paced.incomplete;
        result.propagation = Stats::of(paced.propagation);
        if applied > 0 {
            let per = |a: f64, b: f64| (a - b) / applied as f64;
            result.central_cpu_per_update = per(after.0, before.0);
            result.nodes_cpu_per_update = Some(per(after.1, before.1));
            result.load_generator_cpu_per_update = per(after.2, before.2);
        }
        Ok(())
    }

    /// Steady reconnects (`--churn`) from version `last` + 1; the last version written.
    pub(crate) async fn churn(
        &mut self,
        crowd: &Crowd,
        churn: &crate::churn::Churn,
        last: u64,
    ) -> anyhow::Result<u64> {
        let n = self.shape.subscribers();
        let cpu = || {
            let (central, nodes, _) = self.cpu();
            vec![central, nodes]
        };
        let phase = crate::churn::Phase {
            args: self.args,
            sources: &self.sources,
            tracker: &crowd.tracker,
            churn,
            subscribers: n,
            per_second: crate::churn::rate(self.args, n).unwrap_or_default(),
            processes: &["central", "node proxies"],
            cpu: &cpu,
            cluster: self.cluster.as_ref(),
        };
        let (result, last) = phase.run(last + 1).await?;
        self.result.churn = Some(result);
        Ok(last)
    }

    /// Burst: updates back to back, then every subscriber must end on the final one; which
    /// that is.
    pub(crate) async fn burst(&mut self, crowd: &Crowd) -> anyhow::Result<u64> {
        let (args, tracker) = (self.args, &crowd.tracker);
        let last = args.updates + args.burst;
        for seq in args.updates + 1..=last {
            self.sources.write(seq, || {}).await?;
            tokio::time::sleep(args.burst_gap).await;
        }
        tracker.wait_all(last, args.settle).await;
        let n = self.shape.subscribers();
        let result = &mut self.result;
        result.stale_after_burst = tracker.not_on(last, n).saturating_sub(n - result.connected);
        result.stream_errors = tracker.failures.errors();
        Ok(last)
    }
}
