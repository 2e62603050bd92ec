//! Attacks on connections: idle HTTP/2 connections filling the management port (5) and the
//! sync port (6), the `:authority` gRPC clients send on the unix socket (10), and a TLS client that spends
//! the handshake deadline twice (11).

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use flagd_proxy_testkit::attacks;
use flagd_proxy_testkit::attacks::socket_authority::{self, Outcome};
use flagd_proxy_testkit::client::v1;
use flagd_proxy_testkit::raw_h2;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::scene::{self, Ctx, Measured, Scene, next_within, subscribe};

/// Health probes sent while the management port is full.
const PROBES: usize = 20;

/// Row 5: 8 addresses × 32 HTTP/2 connections that finish their preface and idle, the default
/// limits of the management port (256 in total, 32 per address); then health probes.
pub(crate) async fn management(ctx: &Ctx) -> anyhow::Result<Measured> {
    let scene = Scene::start(ctx, &[]).await?;
    let port = scene.proxy.management_port;
    let filled = attacks::management::fill(port, 8, 32).await;
    let answered = attacks::management::probes(port, PROBES, Duration::from_secs(1)).await;
    let outcome = format!(
        "{} idle connections admitted, {} refused; probes answered: {answered} of {PROBES}",
        filled.held.len(),
        filled.refused
    );
    drop(filled);
    Ok(scene.measure(ctx, outcome).await)
}

/// Row 6: idle HTTP/2 connections from 4 addresses fill `--max-connections`, each connecting
/// again 200 ms after it is closed or refused; then as many new clients, 10 at a time, each asking for a
/// stream and its first version within 2 s (kept open once served).
pub(crate) async fn idle_reconnects(ctx: &Ctx) -> anyhow::Result<Measured> {
    let limit = ctx.sizes.max_connections;
    let scene = Scene::start(ctx, &["--max-connections", &limit.to_string()]).await?;
    let port = scene.proxy.port;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let connected = Arc::new(AtomicUsize::new(0));
    let mut attackers = tokio::task::JoinSet::new();
    for i in 0..limit {
        let from = IpAddr::from([127, 0, 0, 2 + (i % 4) as u8]);
        let (mut stopped, connected) = (stopped.clone(), connected.clone());
        attackers.spawn(async move {
            while !*stopped.borrow() {
                if let Ok(mut tcp) = raw_h2::idle_from(from, port).await {
                    connected.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        () = until_closed(&mut tcp) => {}
                        _ = stopped.wait_for(|stop| *stop) => return,
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while connected.load(Ordering::Relaxed) < limit && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut served = Vec::new();
    for _ in 0..limit.div_ceil(10) {
        let group = (0..10).map(|_| new_client(&scene));
        for client in futures::future::join_all(group).await.into_iter().flatten() {
            served.push(client);
        }
    }
    let outcome = format!(
        "{} of {limit} new clients served (`--max-connections {limit}`, {limit} idle connections reconnecting)",
        served.len()
    );
    let _ = stop.send(true);
    while attackers.join_next().await.is_some() {}
    drop(served);
    Ok(scene.measure(ctx, outcome).await)
}

/// A new client with its stream, when it got its first version within 2 s.
async fn new_client(
    scene: &Scene,
) -> Option<(
    flagd_proxy_testkit::client::Client,
    tonic::Streaming<v1::SyncFlagsResponse>,
)> {
    let within = Duration::from_secs(2);
    let attempt = async {
        let mut client = scene.client().await.ok()?;
        let mut stream = subscribe(&mut client).await.ok()?;
        next_within(&mut stream, within).await.ok()??;
        Some((client, stream))
    };
    tokio::time::timeout(within, attempt).await.ok()?
}

/// Reads until the peer closes.
async fn until_closed(stream: &mut (impl AsyncRead + Unpin)) {
    let mut buf = [0u8; 1024];
    while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Row 10: SyncFlags calls on the unix socket with the `:authority` values gRPC C-core and
/// grpc-java send there (`attacks::socket_authority`).
pub(crate) async fn c_core_authority(ctx: &Ctx) -> anyhow::Result<Measured> {
    let socket = ctx.dir.join("sync.sock");
    let path = socket.to_str().context("a UTF-8 socket path")?.to_owned();
    let scene = Scene::start(ctx, &["--sync-socket-path", &path]).await?;
    let within = Duration::from_secs(10);
    let outcome = match socket_authority::attempt(&socket, scene::SELECTOR, within).await? {
        Outcome::Served(streams) => format!("served ({} streams)", streams.len()),
        Outcome::Refused(what) => format!("refused: {what}"),
        Outcome::Ended(what) => format!("not served: {what}"),
        Outcome::Undecided => "no answer within 10 s".to_owned(),
    };
    Ok(scene.measure(ctx, outcome).await)
}

/// Row 11: with `--handshake-timeout 2s`, a client that finishes TLS 1.5 s after connecting
/// and sends the preface 1.5 s later: past the deadline, but within a fresh one counted from
/// the handshake.
pub(crate) async fn late_tls(ctx: &Ctx) -> anyhow::Result<Measured> {
    use attacks::late_tls::Outcome;
    const STEP: Duration = Duration::from_millis(1500);
    let ca = flagd_proxy_testkit::TestCa::new();
    let mut extra = ca.proxy_args();
    extra.extend(["--handshake-timeout", "2s", "--keepalive-interval", "1h"].map(String::from));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let scene = Scene::start_tls(ctx, &extra, &ca).await?;
    let within = Duration::from_secs(10);
    let outcome =
        match attacks::late_tls::attempt(&ca, scene.proxy.port, STEP, STEP, within).await? {
            Outcome::HandshakeFailed(error) => format!("TLS handshake failed: {error}"),
            Outcome::Served => "served: the preface 3 s after connecting was answered".to_owned(),
            Outcome::Closed => "closed at the deadline, never served".to_owned(),
            Outcome::Undecided => "neither served nor closed within 10 s".to_owned(),
        };
    Ok(scene.measure(ctx, outcome).await)
}
