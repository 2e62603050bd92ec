//! A TCP relay on loopback between a client and a server, with the network faults a test needs:
//! the path works ([`Relay::pass`]), drops every packet without closing anything
//! ([`Relay::blackhole`]: connections stay open and nothing arrives, as when a node or a network
//! policy drops traffic), or is cut ([`Relay::cut`]: every connection is reset and new ones are
//! refused). It forwards bytes only; TLS goes through it end to end.
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The state of the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Bytes flow both ways.
    Pass,
    /// Nothing flows; connections stay open (held bytes flow again on [`Path::Pass`]).
    Blackhole,
    /// Connections are reset; new ones are accepted and reset at once.
    Cut,
}

/// A relay from `127.0.0.1:<port>` to a target address; stops when dropped.
pub struct Relay {
    address: SocketAddr,
    path: watch::Sender<Path>,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Starts relaying to `target`, passing traffic.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let address = listener.local_addr().expect("the relay's address");
        let (path, paths) = watch::channel(Path::Pass);
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(relay(client, target, paths.clone()));
            }
        });
        Relay {
            address,
            path,
            accepted,
            task,
        }
    }

    /// The address clients connect to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    pub fn pass(&self) {
        self.path.send_replace(Path::Pass);
    }

    pub fn blackhole(&self) {
        self.path.send_replace(Path::Blackhole);
    }

    pub fn cut(&self) {
        self.path.send_replace(Path::Cut);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.path.send_replace(Path::Cut);
        self.task.abort();
    }
}

/// Relays one connection until either side closes or the path is cut.
async fn relay(client: TcpStream, target: SocketAddr, mut paths: watch::Receiver<Path>) {
    if *paths.borrow_and_update() == Path::Cut {
        reset(client);
        return;
    }
    let Ok(server) = TcpStream::connect(target).await else {
        reset(client);
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut up = [0u8; 16 * 1024];
    let mut down = [0u8; 16 * 1024];
    loop {
        let path = *paths.borrow_and_update();
        match path {
            Path::Cut => break,
            Path::Blackhole => {
                // Hold everything: read nothing, write nothing, until the path changes.
                if paths.changed().await.is_err() {
                    break;
                }
            }
            Path::Pass => {
                tokio::select! {
                    read = client_read.read(&mut up) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => if server_write.write_all(&up[..n]).await.is_err() { break },
                    },
                    read = server_read.read(&mut down) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => if client_write.write_all(&down[..n]).await.is_err() { break },
                    },
                    changed = paths.changed() => if changed.is_err() { break },
                }
            }
        }
    }
    // Reset rather than close, as a broken path looks to both ends.
    if let Ok(client) = client_read.reunite(client_write) {
        reset(client);
    }
    if let Ok(server) = server_read.reunite(server_write) {
        reset(server);
    }
}

/// Closes a connection with a reset (RST) instead of an orderly close.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}
