//! Room on the management port for whoever needs it now. When every place is taken, a new
//! connection takes the place of the one that has been quiet the longest (nothing read from it),
//! which is closed. Idle or slow connections, from however many addresses, cannot keep a health
//! probe out; the number of open connections stays at the limit.
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::server::limits::TotalSlot;

/// The open management connections, by when they were last heard from.
pub(super) struct Room {
    connections: Mutex<HashMap<u64, Entry>>,
    next_id: AtomicU64,
    epoch: Instant,
}

struct Entry {
    /// Milliseconds after the epoch at which something was last read from the connection.
    heard: Arc<AtomicU64>,
    close: CancellationToken,
    place: TotalSlot,
}

impl Room {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            connections: Mutex::default(),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        // Entries are inserted and removed whole: a poisoned map is still consistent.
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enters a connection that holds `place`; it keeps the returned ticket while it runs.
    pub(super) fn enter(self: &Arc<Self>, place: TotalSlot) -> Ticket {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let heard = Arc::new(AtomicU64::new(self.now()));
        let close = CancellationToken::new();
        self.lock().insert(
            id,
            Entry {
                heard: heard.clone(),
                close: close.clone(),
                place,
            },
        );
        Ticket {
            id,
            room: self.clone(),
            heard,
            close,
        }
    }

    /// Closes the connection quiet the longest and hands over its place; `None` when there is
    /// no connection to close.
    pub(super) fn make_room(&self) -> Option<TotalSlot> {
        let mut connections = self.lock();
        let quietest = connections
            .iter()
            .min_by_key(|(_, entry)| entry.heard.load(Ordering::Relaxed))
            .map(|(id, _)| *id)?;
        let entry = connections.remove(&quietest)?;
        entry.close.cancel();
        Some(entry.place)
    }
}

/// A connection's entry in the [`Room`]: leaves it when dropped.
pub(super) struct Ticket {
    id: u64,
    room: Arc<Room>,
    heard: Arc<AtomicU64>,
    close: CancellationToken,
}

impl Ticket {
    /// Completes when the connection has been closed to make room for another.
    pub(super) async fn closed(&self) {
        self.close.cancelled().await;
    }

    /// `io`, noting in this ticket whenever something is read from it.
    pub(super) fn heard<IO>(&self, io: IO) -> Heard<IO> {
        Heard {
            io,
            heard: self.heard.clone(),
            room: self.room.clone(),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.room.lock().remove(&self.id);
    }
}

/// A connection's I/O that notes when it was last read from.
pub(super) struct Heard<IO> {
    io: IO,
    heard: Arc<AtomicU64>,
    room: Arc<Room>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Heard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.heard.store(this.room.now(), Ordering::Relaxed);
        }
        result
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Heard<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::server::limits::TotalLimit;

    #[tokio::test]
    async fn the_connection_quiet_the_longest_makes_room() {
        let metrics = Arc::new(Metrics::new());
        let limit = TotalLimit::new(2, "management", "max_management_connections", metrics);
        let room = Room::new();
        let quiet = room.enter(limit.admit().expect("place"));
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let busy = room.enter(limit.admit().expect("place"));
        assert!(limit.admit().is_none(), "full");
        // The older one is heard from: the other is now the quietest.
        let (mut client, server) = tokio::io::duplex(64);
        let mut heard = quiet.heard(server);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        tokio::io::AsyncWriteExt::write_all(&mut client, b"x")
            .await
            .expect("write");
        let mut byte = [0u8; 1];
        tokio::io::AsyncReadExt::read_exact(&mut heard, &mut byte)
            .await
            .expect("read");
        let place = room.make_room().expect("room made");
        busy.closed().await;
        assert!(
            !quiet.close.is_cancelled(),
            "the connection heard from last stays"
        );
        drop(busy);
        // The place handed over still counts: the limit is still reached.
        assert!(limit.admit().is_none());
        drop(place);
        assert!(limit.admit().is_some());
    }
}
