//! The central tier's one address: a TCP forwarder, run as a process of its own, that hands each
//! new connection to the first of its backends that accepts it, starting with the next one in
//! turn. It models a Kubernetes Service in front of the central replicas (kube-proxy picks a
//! ready backend per connection; a connection lives and dies with its backend), which loopback
//! cannot give two processes on one port otherwise. A replica that is down refuses connections
//! and is skipped.
//!
//! Usage (started by the tiers scenario): `flagd-proxy-bench __tiers-balancer PORT BACKEND...`,
//! every port on 127.0.0.1. It runs until it is killed.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};

/// Serves `PORT BACKEND...` (the arguments after the command).
pub(crate) fn serve(argv: &[String]) -> anyhow::Result<()> {
    let ports = argv
        .iter()
        .map(|p| p.parse::<u16>().with_context(|| format!("port {p:?}")))
        .collect::<anyhow::Result<Vec<u16>>>()?;
    let (&port, backends) = ports.split_first().context("balancer: no port")?;
    anyhow::ensure!(!backends.is_empty(), "balancer: no backend");
    let backends: Arc<[u16]> = backends.into();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
        let turn = AtomicUsize::new(0);
        loop {
            let (inbound, _) = listener.accept().await?;
            let first = turn.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(forward(inbound, backends.clone(), first));
        }
    })
}

/// Pipes `inbound` to the first backend, from `first` on, that accepts a connection; closes it
/// when none does.
async fn forward(mut inbound: TcpStream, backends: Arc<[u16]>, first: usize) {
    for i in 0..backends.len() {
        let port = backends[(first + i) % backends.len()];
        if let Ok(mut outbound) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await {
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            return;
        }
    }
}
