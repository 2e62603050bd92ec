//! What the services can learn about the connection a request came on. A leaf: the listener
//! fills it in, authorization and the wire read it.
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use futures::task::AtomicWaker;

/// The client's address and certificate chain, as seen when the connection was accepted.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    pub remote_addr: Option<SocketAddr>,
    /// The client certificate chain, when the client presented one.
    pub peer_certificates: Option<Arc<Vec<rustls_pki_types::CertificateDer<'static>>>>,
    /// The connection's streams, when the server counts them.
    pub activity: Option<Arc<Activity>>,
}

/// What a connection is doing, for the limits that close idle connections: the streams open on
/// it and when it was last busy. The server keeps one per connection and hands it to every
/// request in its [`ConnectionInfo`]; each request holds an [`OpenStream`] while it runs.
#[derive(Debug)]
pub struct Activity {
    streams: AtomicUsize,
    /// [`clock_ms`] when the connection last did something (opened, was read from, or saw its
    /// last stream end).
    heard: AtomicU64,
    /// Woken when the last stream ends, so the connection can start counting its idle time.
    idle: AtomicWaker,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            streams: AtomicUsize::new(0),
            heard: AtomicU64::new(clock_ms()),
            idle: AtomicWaker::new(),
        }
    }
}

impl Activity {
    /// Counts a stream as open until the returned guard is dropped.
    pub fn open_stream(self: &Arc<Self>) -> OpenStream {
        self.streams.fetch_add(1, Ordering::SeqCst);
        OpenStream(self.clone())
    }

    /// Streams open now.
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::SeqCst)
    }

    /// Notes that the connection did something now.
    pub fn heard(&self) {
        self.heard.store(clock_ms(), Ordering::Relaxed);
    }

    /// [`clock_ms`] when the connection last did something.
    pub fn last_heard(&self) -> u64 {
        self.heard.load(Ordering::Relaxed)
    }

    /// Wakes `waker` when the connection's last stream ends.
    pub fn wake_when_idle(&self, waker: &std::task::Waker) {
        self.idle.register(waker);
    }
}

/// One open stream of a connection (see [`Activity::open_stream`]).
#[derive(Debug)]
pub struct OpenStream(Arc<Activity>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.heard();
        if self.0.streams.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.wake();
        }
    }
}

/// Milliseconds on a monotonic clock shared by the whole process.
pub fn clock_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}
