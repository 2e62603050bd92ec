//! Attacks on memory: a message doubled by its metadata (1), versions pinned by streams that
//! cannot be written to (2), a burst of requests on idle connections (3), and streams whose
//! request never comes, from many addresses (4).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flagd_proxy_testkit::attacks;
use flagd_proxy_testkit::attacks::pinned::Pinned;
use flagd_proxy_testkit::attacks::streams::{open_from, read_ends, subscription};
use flagd_proxy_testkit::attacks::unfinished::Unfinished;
use flagd_proxy_testkit::client::v1;
use flagd_proxy_testkit::raw_h2;
use tokio::io::AsyncWriteExt;

use super::scene::{Ctx, Measured, SELECTOR, Scene, color, next_within, subscribe, thousands};
use crate::options::Tier;
use crate::sampling::proc_sample;

/// How long a client waits for a version or a status that must come.
const WAIT: Duration = Duration::from_secs(30);

/// Row 1 (`attacks::metadata`): a version whose flag-set metadata, sent again in every
/// `flagd.sync.v1` message's `sync_context`, doubles the message past the 4 MiB a default gRPC
/// client accepts. What a
/// client that accepts any size receives, and what becomes of a default client's stream.
pub(crate) async fn metadata(ctx: &Ctx) -> anyhow::Result<Measured> {
    let scene = Scene::start(ctx, &[]).await?;
    let mut default_client = scene.client().await?;
    let mut default_stream = subscribe(&mut default_client).await?;
    let mut large_client = scene.client().await?.max_decoding_message_size(64 << 20);
    let mut large_stream = subscribe(&mut large_client).await?;
    for stream in [&mut default_stream, &mut large_stream] {
        next_within(stream, WAIT)
            .await?
            .context("no first version")?;
    }
    let manifest = attacks::metadata::manifest("v1", &["v1", "v0"], ctx.sizes.metadata_bytes);
    flagd_proxy_testkit::write_atomically(&scene.manifests.join("default-demo.yaml"), &manifest);
    let sent = large_version(&scene, &mut large_stream).await?;
    scene.change("v2");
    let default = loop {
        match next_within(&mut default_stream, WAIT).await {
            Ok(Some(message)) if color(&message) == "v2" => {
                break "a default client keeps its stream and gets the next version".to_owned();
            }
            Ok(Some(_)) => {}
            Ok(None) => break "a default client gets nothing within 30 s".to_owned(),
            Err(status) => {
                break format!(
                    "a default client's stream fails: {:?} ({})",
                    status.code(),
                    status.message().chars().take(60).collect::<String>()
                );
            }
        }
    };
    let sent = match sent {
        Some(bytes) => format!("the message is {} B", thousands(bytes as u64)),
        None => "the version is refused, not sent".to_owned(),
    };
    drop((default_stream, large_stream));
    Ok(scene.measure(ctx, format!("{sent}; {default}")).await)
}

/// The size of the message carrying version `v1` to a client that accepts any size, or `None`
/// when the proxy refused the version (it logs why).
async fn large_version(
    scene: &Scene,
    stream: &mut tonic::Streaming<v1::SyncFlagsResponse>,
) -> anyhow::Result<Option<usize>> {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if let Some(message) = next_within(stream, Duration::from_millis(200)).await?
            && color(&message) == "v1"
        {
            return Ok(Some(prost::Message::encoded_len(&message) + 5));
        }
        let log = std::fs::read_to_string(&scene.proxy.log).unwrap_or_default();
        if log.contains("sync_context") {
            return Ok(None);
        }
    }
    bail!("the large version was neither sent nor refused within 30 s")
}

/// Row 2: one connection that opens the connection's window but no stream's, and opens a new
/// SyncFlags stream for each version of a large document, written once the one before was
/// published: each stream holds the version it cannot send (the test kit's [`Pinned`]). Then
/// the attacker leaves.
pub(crate) async fn pinned_versions(ctx: &Ctx) -> anyhow::Result<Measured> {
    let scene = Scene::start(ctx, &[]).await?;
    let attack = Pinned {
        versions: ctx.sizes.pinned_versions,
        bytes: ctx.sizes.pinned_bytes,
    };
    let (outcome, attacker) = attack
        .run(
            &scene.manifests,
            scene.proxy.port,
            scene.proxy.management_port,
        )
        .await
        .map_err(anyhow::Error::msg)?;
    let held = proc_sample(scene.proxy.pid).rss_kib;
    let ended = attacker.ended();
    drop(attacker);
    let outcome = format!(
        "{} streams of {} KiB versions ({} published): {ended} refused or ended, {} refused by the budget, {:.0} MiB pinned at most; {} MiB held at the end",
        attack.versions,
        attack.bytes / 1024,
        outcome.published,
        outcome.refused,
        outcome.peak_pinned / 1048576.0,
        held / 1024
    );
    Ok(scene.measure(ctx, outcome).await)
}

/// Row 3: connections from 4 addresses, each with a burst of requests that end at once (their
/// HEADERS carry END_STREAM, no message), answered; then the connections stay open, idle, for
/// the quiet time (what is held then is in the outcome), and close together.
pub(crate) async fn burst(ctx: &Ctx) -> anyhow::Result<Measured> {
    let scene = Scene::start(ctx, &[]).await?;
    let port = scene.proxy.port;
    let requests = ctx.sizes.burst_requests;
    let (leave, left) = tokio::sync::watch::channel(false);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut attackers = tokio::task::JoinSet::new();
    for host in 2..6u8 {
        for _ in 0..ctx.sizes.burst_connections {
            let (tx, mut left) = (tx.clone(), left.clone());
            attackers.spawn(async move {
                let from = Ipv4Addr::new(127, 0, 0, host);
                let Ok((mut read, _write)) = open_from(from, port, requests, true).await else {
                    let _ = tx.send(None);
                    return;
                };
                let ends = AtomicU32::new(0);
                let _ = read_ends(&mut read, requests, &ends).await;
                let _ = tx.send(Some(ends.into_inner()));
                // Idle, connected, until every attacker leaves together.
                let _ = left.wait_for(|leave| *leave).await;
            });
        }
    }
    drop(tx);
    let connections = 4 * ctx.sizes.burst_connections;
    let (mut answered, mut refused) = (0u64, 0);
    for _ in 0..connections {
        match rx.recv().await {
            Some(Some(ends)) => answered += u64::from(ends),
            Some(None) => refused += 1,
            None => break,
        }
    }
    // Held while the connections stay open and idle: read after the quiet time, as "after" is,
    // so that freed pages the allocator has not returned yet are not counted.
    tokio::time::sleep(ctx.quiet).await;
    let held = proc_sample(scene.proxy.pid).rss_kib;
    let _ = leave.send(true);
    while attackers.join_next().await.is_some() {}
    let outcome = format!(
        "{connections} connections × {} requests: {} answered, {refused} connections refused; {} MiB held while idle and connected",
        thousands(u64::from(requests)),
        thousands(answered),
        held / 1024
    );
    Ok(scene.measure(ctx, outcome).await)
}

/// Row 15: connections from one address, each sending a burst of requests that end at once and
/// then holding one subscription open (read, so it is served), one connection after the
/// other; the connections stay while the proxy is judged, so a new client must get in beside
/// them. The outcome says how many the proxy closed (shed) by then.
pub(crate) async fn burst_then_hold(ctx: &Ctx) -> anyhow::Result<Measured> {
    let scene = Scene::start(ctx, &[]).await?;
    let (port, requests) = (scene.proxy.port, ctx.sizes.hold_requests);
    let connections = match &ctx.tier {
        Some((Tier::Node, _)) => ctx.sizes.hold_connections_node,
        _ => ctx.sizes.hold_connections,
    };
    let shed = Arc::new(AtomicU32::new(0));
    let (mut answered, mut refused, mut holders) = (0u64, 0, tokio::task::JoinSet::new());
    for _ in 0..connections {
        let Ok((mut read, mut write)) = open_from(HOARDER, port, requests, true).await else {
            refused += 1;
            continue;
        };
        let ends = AtomicU32::new(0);
        let served = read_ends(&mut read, requests, &ends).await == Ok(true);
        answered += u64::from(ends.into_inner());
        if !served
            || write
                .write_all(&subscription(2 * requests + 1, SELECTOR))
                .await
                .is_err()
        {
            refused += 1;
            continue;
        }
        let shed = shed.clone();
        holders.spawn(async move {
            while raw_h2::read_frame(&mut read).await.is_some() {}
            shed.fetch_add(1, Ordering::Relaxed);
            drop(write);
        });
    }
    let outcome = format!(
        "{connections} connections × {} requests from one address, each then holding a stream: {} answered, {refused} refused or closed during their burst, {} closed while holding",
        thousands(u64::from(requests)),
        thousands(answered),
        shed.load(Ordering::Relaxed),
    );
    let measured = scene.measure(ctx, outcome).await;
    holders.abort_all();
    Ok(measured)
}

/// The address row 15's connections come from.
const HOARDER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Row 4: one connection from each of many addresses opens streams whose request never comes
/// (the test kit's [`Unfinished`]); they are held until the proxy ends them (at
/// `--request-timeout`, or refused at once).
pub(crate) async fn unfinished(ctx: &Ctx) -> anyhow::Result<Measured> {
    let scene = Scene::start(ctx, &[]).await?;
    let attack = Unfinished {
        addresses: ctx.sizes.unfinished_addresses,
        streams: ctx.sizes.unfinished_streams,
    };
    let outcome = attack
        .run(scene.proxy.port, scene.proxy.management_port)
        .await
        .map_err(anyhow::Error::msg)?;
    let outcome = format!(
        "{} addresses × {} streams: {} ended by the proxy, {} connections closed first, {} refused by the budget (streams charged at most {} MiB), {} requests refused (all reasons)",
        attack.addresses,
        thousands(u64::from(attack.streams)),
        thousands(outcome.ended),
        outcome.closed,
        thousands(outcome.refused as u64),
        (outcome.peak_streams_charged / 1048576.0).round(),
        thousands(scene.rejected().await as u64)
    );
    Ok(scene.measure(ctx, outcome).await)
}
