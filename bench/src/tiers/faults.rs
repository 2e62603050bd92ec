//! Tier faults, on a running topology after the burst, every subscriber connected:
//!
//! 1. The central is killed (SIGKILL), a new version is written at the source, and the central
//!    is started again on the same ports after `--tier-outage`. While it is down, no subscriber
//!    stream may end and every subscriber stays on the last good version; a new subscriber on a
//!    node proxy is served that version. Then every subscriber must get the new one: the time
//!    from the central's start (and from the change) until the last has it.
//! 2. One node proxy is killed (SIGKILL): its own subscribers' streams end, no other does. It is
//!    started again on the same port and its subscribers reconnect; the central is back to one
//!    stream per node proxy and resource, and the next version reaches every subscriber.
//! 3. A rollout of the central: a second replica behind the same address (the balancer) starts,
//!    the first is stopped (SIGTERM), a version is written; the first starts again, the second
//!    is stopped, a version is written. Each must reach every subscriber, and no stream ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::topology::{Crowd, Topology, wait_serving};
use super::{FAULT_TIMEOUT, Tier};
use crate::load::{Dial, open_channel, open_stream};
use crate::sampling::ms;

#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct FaultResult {
    pub(crate) outage: Outage,
    pub(crate) node: NodeKill,
    pub(crate) rollout: Rollout,
    pub(crate) problems: Vec<String>,
}

/// Fault 1: the central killed, a version written, the central started again.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct Outage {
    /// How long the central stayed down.
    pub(crate) seconds: f64,
    /// Subscriber streams that ended from the kill until every subscriber had the new version.
    pub(crate) streams_ended: usize,
    /// Subscribers not on the last good version while the central was down.
    pub(crate) not_on_last_good: usize,
    /// A new subscriber on a node proxy while the central was down: what it got.
    pub(crate) new_subscriber: String,
    /// From the central's start until every subscriber has the version written while it was down.
    pub(crate) restart_to_all_ms: Option<f64>,
    /// From that version's write (while the central was down) until every subscriber has it.
    pub(crate) change_to_all_ms: Option<f64>,
}

/// Fault 2: one node proxy killed and started again.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct NodeKill {
    /// Its own subscribers, and how many of their streams ended.
    pub(crate) subscribers: usize,
    pub(crate) streams_ended: usize,
    /// Streams of the other node proxies' subscribers that ended.
    pub(crate) others_ended: usize,
    /// Its subscribers that reconnected and got a snapshot, and how long after its start.
    pub(crate) reconnected: usize,
    pub(crate) restart_to_served_ms: Option<f64>,
    /// Streams at the central once it is back, and what one per node proxy and resource is.
    pub(crate) central_streams_after: Option<f64>,
    pub(crate) central_streams_expected: usize,
    /// The next version: from the change until every subscriber has it.
    pub(crate) next_to_all_ms: Option<f64>,
}

/// Fault 3: the central rolled over to a second replica and back.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct Rollout {
    pub(crate) steps: Vec<RolloutStep>,
    /// Subscriber streams that ended over both steps.
    pub(crate) streams_ended: usize,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct RolloutStep {
    pub(crate) step: String,
    /// From the change, written once the old replica has stopped, until every subscriber has it.
    pub(crate) to_all_ms: Option<f64>,
    /// Subscribers not on it at the end of the step.
    pub(crate) stale: usize,
}

/// The three faults, one after the other; `last` is the newest version.
pub(crate) async fn run(t: &mut Topology<'_>, crowd: &mut Crowd, last: u64) -> FaultResult {
    let mut faults = FaultResult::default();
    faults.node.central_streams_expected = t.shape.nodes * t.shape.per_node.min(t.shape.resources);
    let outcome = async {
        let seq = kill_central(t, crowd, last, &mut faults.outage).await?;
        let seq = kill_node(t, crowd, seq, &mut faults.node).await?;
        rollout(t, crowd, seq, &mut faults.rollout).await
    }
    .await;
    if let Err(error) = outcome {
        faults.problems.push(format!("faults: {error:#}"));
    }
    let mut checks = faults.outage.checks();
    checks.extend(faults.node.checks());
    checks.extend(faults.rollout.checks());
    let judged = checks.into_iter().filter(|(bad, _)| *bad);
    faults
        .problems
        .extend(judged.map(|(_, what)| format!("faults: {what}")));
    faults
}

/// A check of a fault: whether it went wrong, and what then.
type Check = (bool, String);

impl Outage {
    /// No stream ends, every subscriber keeps the last good version, a new one gets it, and the
    /// version written meanwhile reaches all.
    fn checks(&self) -> Vec<Check> {
        vec![
            (
                self.streams_ended > 0,
                format!(
                    "{} stream(s) ended when the central was killed",
                    self.streams_ended
                ),
            ),
            (
                self.not_on_last_good > 0,
                format!(
                    "{} subscriber(s) not on the last good version while the central was down",
                    self.not_on_last_good
                ),
            ),
            (
                !self.new_subscriber.starts_with("version"),
                format!(
                    "a new subscriber while the central was down got {}",
                    self.new_subscriber
                ),
            ),
            (
                self.restart_to_all_ms.is_none(),
                "the version written while the central was down did not reach every subscriber"
                    .into(),
            ),
        ]
    }
}

impl NodeKill {
    /// The others' streams stay, its subscribers are served again, and the next version
    /// reaches all.
    fn checks(&self) -> Vec<Check> {
        vec![
            (
                self.others_ended > 0,
                format!(
                    "{} stream(s) of other node proxies ended when one was killed",
                    self.others_ended
                ),
            ),
            (
                self.reconnected < self.subscribers,
                format!(
                    "{} of {} subscribers of the killed node proxy were served again",
                    self.reconnected, self.subscribers
                ),
            ),
            (
                self.next_to_all_ms.is_none(),
                "the version after the node proxy came back did not reach every subscriber".into(),
            ),
        ]
    }
}

impl Rollout {
    /// No stream ends, and each step's version reaches every subscriber.
    fn checks(&self) -> Vec<Check> {
        let ended = (
            self.streams_ended > 0,
            format!("{} stream(s) ended during the rollout", self.streams_ended),
        );
        let steps = self.steps.iter().map(|step| {
            (
                step.to_all_ms.is_none() || step.stale > 0,
                format!("rollout, {}: {} subscriber(s) stale", step.step, step.stale),
            )
        });
        std::iter::once(ended).chain(steps).collect()
    }
}

/// Writes version `seq` and waits until every subscriber has it: from the write, in ms.
async fn deliver(t: &Topology<'_>, crowd: &Crowd, seq: u64) -> anyhow::Result<Option<f64>> {
    let (written, at) = t
        .sources
        .deliver(seq, &crowd.tracker, FAULT_TIMEOUT)
        .await?;
    Ok(at.map(|at| ms(at - written)))
}

/// Fault 1: the central killed and started again; the new version.
async fn kill_central(
    t: &mut Topology<'_>,
    crowd: &Crowd,
    last: u64,
    f: &mut Outage,
) -> anyhow::Result<u64> {
    let n = t.shape.subscribers();
    let ended_before = crowd.ended_in(0..n);
    let (tracker, seq) = (&crowd.tracker, last + 1);
    eprintln!("  faults: the central killed for {:?}", t.args.tier_outage);
    let down = Instant::now();
    t.central.kill();
    let mut written = 0;
    t.sources.write(seq, || written = tracker.now()).await?;
    let selector = t.sources.selectors[0].clone();
    let probe = tokio::time::timeout(Duration::from_secs(10), wait_once(&t.nodes[0], &selector));
    f.new_subscriber = match probe.await {
        Ok(Ok(version)) if version == last => format!("version {version} (the last good one)"),
        Ok(Ok(version)) => format!("version {version}, expected {last}"),
        Ok(Err(error)) => format!("an error: {error:#}"),
        Err(_) => "nothing within 10 s".to_owned(),
    };
    tokio::time::sleep(t.args.tier_outage.saturating_sub(down.elapsed())).await;
    f.not_on_last_good = tracker.not_on(last, n);
    f.seconds = down.elapsed().as_secs_f64();
    let restarted = tracker.now();
    t.central.start()?;
    let at = tracker.wait_all(seq, FAULT_TIMEOUT).await;
    f.restart_to_all_ms = at.map(|at| ms(at.saturating_sub(restarted)));
    f.change_to_all_ms = at.map(|at| ms(at - written));
    f.streams_ended = crowd.ended_in(0..n) - ended_before;
    Ok(seq)
}

/// One stream on `tier` for `selector`: the first version it gets.
async fn wait_once(tier: &Tier, selector: &str) -> anyhow::Result<u64> {
    let dial = Dial::plain(tier.port);
    let channel = open_channel(&dial, None).await?;
    let mut stream = open_stream(channel, selector).await?;
    stream.message().await?.context("stream ended")
}

/// Polls `done` every 10 ms until it holds or `FAULT_TIMEOUT` passes; whether it held.
async fn until(done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + FAULT_TIMEOUT;
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// Fault 2: the last node proxy killed and started again; its subscribers reconnect.
async fn kill_node(
    t: &mut Topology<'_>,
    crowd: &mut Crowd,
    last: u64,
    f: &mut NodeKill,
) -> anyhow::Result<u64> {
    let (k, per) = (t.nodes.len() - 1, t.shape.per_node);
    let (own, others) = (k * per..(k + 1) * per, 0..k * per);
    let others_before = crowd.ended_in(others.clone());
    eprintln!("  faults: node proxy {k} killed");
    f.subscribers = per;
    t.nodes[k].kill();
    until(|| crowd.ended_in(own.clone()) == per).await;
    f.streams_ended = crowd.ended_in(own.clone());
    for slot in own.clone() {
        crowd.ended[slot].store(false, Ordering::Relaxed);
    }
    let restarted = Instant::now();
    t.nodes[k].start()?;
    wait_serving(&t.nodes[k], &t.sources.selectors[0]).await?;
    let served = Arc::new(AtomicUsize::new(0));
    t.open(crowd, k..k + 1, Some(served.clone())).await;
    if until(|| served.load(Ordering::Relaxed) == per).await {
        f.restart_to_served_ms = Some(restarted.elapsed().as_secs_f64() * 1e3);
    }
    f.reconnected = served.load(Ordering::Relaxed);
    let expected = f.central_streams_expected as f64;
    let deadline = Instant::now() + FAULT_TIMEOUT;
    loop {
        let streams = t.central.metrics().await.get("sync_active_streams");
        f.central_streams_after = streams;
        if streams == Some(expected) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    f.next_to_all_ms = deliver(t, crowd, last + 1).await?;
    f.others_ended = crowd.ended_in(others) - others_before;
    Ok(last + 1)
}

/// Fault 3: the central rolled over to a second replica behind the same address and back.
async fn rollout(
    t: &mut Topology<'_>,
    crowd: &Crowd,
    last: u64,
    f: &mut Rollout,
) -> anyhow::Result<()> {
    let n = t.shape.subscribers();
    let ended_before = crowd.ended_in(0..n);
    let selector = t.sources.selectors[0].clone();
    eprintln!("  faults: rollout of the central");
    t.replica.start()?;
    wait_serving(&t.replica, &selector).await?;
    t.central.stop().await;
    let to_all_ms = deliver(t, crowd, last + 1).await?;
    f.steps.push(RolloutStep {
        step: "second replica started, first stopped (SIGTERM)".to_owned(),
        to_all_ms,
        stale: crowd.tracker.not_on(last + 1, n),
    });
    t.central.start()?;
    wait_serving(&t.central, &selector).await?;
    t.replica.stop().await;
    let to_all_ms = deliver(t, crowd, last + 2).await?;
    f.steps.push(RolloutStep {
        step: "first started again, second stopped (SIGTERM)".to_owned(),
        to_all_ms,
        stale: crowd.tracker.not_on(last + 2, n),
    });
    f.streams_ended = crowd.ended_in(0..n) - ended_before;
    Ok(())
}
