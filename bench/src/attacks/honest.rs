//! Honest load in a tier's cgroup: subscribers, each on a connection of its own, plaintext or
//! TLS, added until the memory budget refuses one: how many were admitted, and what the kernel
//! saw meanwhile (`--attacks-tiers`).

use std::time::Duration;

use flagd_proxy_testkit::TestCa;
use flagd_proxy_testkit::client::v1;

use super::scene::{Ctx, Measured, Scene, next_within, subscribe, thousands};

/// Subscribers added at once.
const AT_ONCE: usize = 32;
/// At most this many subscribers, whatever the budget.
const MOST: usize = 20_000;
/// How long a subscriber waits for its first version.
const FIRST: Duration = Duration::from_secs(10);

/// The file descriptors the bench and the proxy need for [`MOST`] subscribers.
pub(crate) const FILES: usize = 2 * MOST + 1024;

/// Fills the budget with subscribers, over TLS or not.
pub(crate) async fn subscribers(ctx: &Ctx, tls: bool) -> anyhow::Result<Measured> {
    // Every subscriber comes from 127.0.0.1: lift the per-address cap, as a tier's proxy sees
    // one address per pod.
    let extra = ["--max-connections-per-address", "0"];
    let ca = TestCa::new();
    let scene = if tls {
        let mut args: Vec<String> = ca.proxy_args();
        args.extend(extra.map(str::to_owned));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Scene::start_tls(ctx, &args, &ca).await?
    } else {
        Scene::start(ctx, &extra).await?
    };
    let mut held = Vec::new();
    let refused = loop {
        if held.len() >= MOST {
            break format!("none refused up to {}", thousands(MOST as u64));
        }
        let batch = (0..AT_ONCE).map(|_| subscriber(&scene));
        let mut failed = None;
        for result in futures::future::join_all(batch).await {
            match result {
                Ok(stream) => held.push(stream),
                Err(error) => failed = Some(error),
            }
        }
        if let Some(error) = failed {
            let error: String = error.replace('\n', " ").chars().take(100).collect();
            break format!("then refused: {error}");
        }
    };
    let outcome = format!(
        "{} {} subscribers admitted; {refused}",
        thousands(held.len() as u64),
        if tls { "TLS" } else { "plaintext" },
    );
    let measured = scene.measure(ctx, outcome).await;
    drop(held);
    Ok(measured)
}

/// A subscriber on a connection of its own, once it has its first version; else why not.
async fn subscriber(scene: &Scene) -> Result<tonic::Streaming<v1::SyncFlagsResponse>, String> {
    let mut client = scene.client().await.map_err(|e| format!("{e:#}"))?;
    let mut stream = subscribe(&mut client).await.map_err(|e| format!("{e:#}"))?;
    match next_within(&mut stream, FIRST).await {
        Ok(Some(_)) => Ok(stream),
        Ok(None) => Err(format!("no first version within {} s", FIRST.as_secs())),
        Err(status) => Err(format!("{:?} {}", status.code(), status.message())),
    }
}
