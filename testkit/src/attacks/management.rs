//! Row 5: idle HTTP/2 connections filling the management port from several addresses, and the
//! health probes that must still get in.

use std::net::IpAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::raw_h2;

/// What filling the port left: the connections admitted (held open while this lives) and how
/// many were refused.
pub struct Filled {
    pub held: Vec<TcpStream>,
    pub refused: usize,
}

/// `per_address` HTTP/2 connections from each of `addresses` loopback addresses (127.0.0.2 on),
/// each finishing its preface and then opening no stream.
pub async fn fill(port: u16, addresses: u8, per_address: usize) -> Filled {
    let mut filled = Filled {
        held: Vec::new(),
        refused: 0,
    };
    for host in 2..2 + addresses {
        for _ in 0..per_address {
            match raw_h2::idle_from(IpAddr::from([127, 0, 0, host]), port).await {
                Ok(tcp) => filled.held.push(tcp),
                Err(_) => filled.refused += 1,
            }
        }
    }
    filled
}

/// `count` health probes, `/healthz` and `/readyz` in turn: how many got 200 within `within`
/// each.
pub async fn probes(port: u16, count: usize, within: Duration) -> usize {
    let mut answered = 0;
    for i in 0..count {
        let path = if i % 2 == 0 { "/healthz" } else { "/readyz" };
        let probe = crate::http_get(port, path);
        if let Ok(Ok((200, _))) = tokio::time::timeout(within, probe).await {
            answered += 1;
        }
    }
    answered
}
