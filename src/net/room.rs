//! Room on a port for whoever needs it now. When every place is taken, a new connection takes
//! the place of the one that has been quiet the longest, which is closed. Idle or slow
//! connections, from however many addresses, cannot keep a new client out; the number of open
//! connections stays at the limit.
//!
//! What "quiet" means is the port's: on the management port, nothing read from the connection;
//! on the sync port, no stream open on it (a connection with a stream is never closed to make
//! room: it is serving someone).
//!
//! At the memory budget the sync port sheds ([`Room::shed`]) the connections that hold the most
//! for the least service first: those that keep many more stream places than they have streams
//! open (a burst, then idle or one stream held), however busy that stream; only when there are
//! none, the connections with no stream open. An honest client that polls (a connection with no stream
//! between its calls) is so never closed while a hoarder is left.
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::budget::MemoryBudget;
use crate::net::info::{Activity, clock_ms};
use crate::net::limits::TotalSlot;

/// The open connections of one port, by when they were last heard from.
pub(crate) struct Room {
    connections: Mutex<HashMap<u64, Entry>>,
    next_id: AtomicU64,
}

struct Entry {
    activity: Arc<Activity>,
    close: CancellationToken,
    place: TotalSlot,
}

impl Entry {
    /// No stream open, and nothing heard since `since` ([`clock_ms`]).
    fn is_idle_since(&self, since: u64) -> bool {
        self.activity.streams() == 0 && self.activity.last_heard() <= since
    }
}

/// The [`clock_ms`] before which a connection heard from last has been quiet for `quiet`.
fn quiet_since(quiet: Duration) -> u64 {
    clock_ms().saturating_sub(u64::try_from(quiet.as_millis()).unwrap_or(0))
}

impl Room {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            connections: Mutex::default(),
            next_id: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        // Entries are inserted and removed whole: a poisoned map is still consistent.
        crate::locks::lock(&self.connections)
    }

    /// Enters a connection that holds `place`; it keeps the returned ticket while it runs.
    pub(crate) fn enter(self: &Arc<Self>, place: TotalSlot) -> Ticket {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::default());
        let close = CancellationToken::new();
        self.lock().insert(
            id,
            Entry {
                activity: activity.clone(),
                close: close.clone(),
                place,
            },
        );
        Ticket {
            id,
            room: self.clone(),
            activity,
            close,
        }
    }

    /// Closes the connection quiet the longest (among those with no stream open) and hands
    /// over its place; `None` when there is no such connection.
    pub(crate) fn make_room(&self) -> Option<TotalSlot> {
        let mut connections = self.lock();
        let quietest = connections
            .iter()
            .filter(|(_, entry)| entry.activity.streams() == 0)
            .min_by_key(|(_, entry)| entry.activity.last_heard())
            .map(|(id, _)| *id)?;
        let entry = connections.remove(&quietest)?;
        entry.close.cancel();
        Some(entry.place)
    }

    /// Sheds connections for the memory budget: every hoarder (a connection that keeps at least
    /// [`HOARDED_PLACES`] stream places it does not use) with no stream open that has been quiet
    /// for `quiet`, and the [`SHED_AT_ONCE`] other hoarders that keep the most; when there is no
    /// hoarder and the budget is `full`, every connection with no stream open that has been
    /// quiet for `quiet` (a refusal with room left, of a burst too big for it, sheds hoarders
    /// only). With `wait_for_ending`, nothing while connections closed before are still ending:
    /// what they give back may be enough.
    pub(crate) fn shed(&self, quiet: Duration, wait_for_ending: bool, full: bool) -> Shed {
        let connections = self.lock();
        if wait_for_ending && connections.values().any(|entry| entry.close.is_cancelled()) {
            return Shed::Ending;
        }
        let since = quiet_since(quiet);
        let (mut idle, mut busy): (Vec<&Entry>, Vec<&Entry>) = connections
            .values()
            .filter(|entry| {
                entry.activity.unused_places() >= HOARDED_PLACES && !entry.close.is_cancelled()
            })
            .partition(|entry| entry.is_idle_since(since));
        busy.sort_by_key(|entry| std::cmp::Reverse(entry.activity.unused_places()));
        busy.truncate(SHED_AT_ONCE);
        idle.append(&mut busy);
        if !idle.is_empty() {
            return Shed::Hoarders(idle.into_iter().map(|entry| entry.close.cancel()).count());
        }
        drop(connections);
        if !full {
            return Shed::Nothing;
        }
        match self.close_idle(quiet) {
            0 => Shed::Nothing,
            closed => Shed::Idle(closed),
        }
    }

    /// Closes every connection with no stream open that has been quiet for `quiet` (so not one
    /// whose client is sending a request right now); returns how many. They serve no one, and
    /// what they keep goes back with them (each leaves the room once it has closed).
    pub(crate) fn close_idle(&self, quiet: Duration) -> usize {
        let since = quiet_since(quiet);
        let connections = self.lock();
        let idle = connections
            .values()
            .filter(|entry| entry.is_idle_since(since) && !entry.close.is_cancelled());
        idle.map(|entry| entry.close.cancel()).count()
    }

    /// Whenever the memory budget refuses new work, sheds connections ([`Room::shed`]; what
    /// they keep, see [`Activity::retain_burst`], is charged to the budget) every `PAUSE`, until
    /// no hoarder is left and the budget has room for a new client again, or nothing is left to
    /// shed; until `shutdown`.
    pub(crate) async fn close_idle_when_refused(
        self: Arc<Self>,
        budget: Arc<MemoryBudget>,
        shutdown: CancellationToken,
    ) {
        const PAUSE: Duration = Duration::from_millis(250);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = budget.refused() => {}
            }
            let mut waited = 0;
            loop {
                let full = !budget.has_room(ROOM_FOR_A_CLIENT);
                let pass = self.shed(PAUSE, waited < MOST_PASSES_WAITED, full);
                waited = if pass == Shed::Ending { waited + 1 } else { 0 };
                match pass {
                    Shed::Nothing => break,
                    Shed::Ending => {}
                    Shed::Hoarders(closed) => tracing::warn!(
                        closed,
                        "at the memory budget (--memory-budget): closing the connections that keep the most stream places they do not use"
                    ),
                    Shed::Idle(closed) => tracing::warn!(
                        closed,
                        "at the memory budget (--memory-budget): closing the connections with no stream open"
                    ),
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(PAUSE) => {}
                }
            }
        }
    }
}

/// What a pass of [`Room::shed`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shed {
    /// Closed this many connections that keep many unused stream places.
    Hoarders(usize),
    /// Closed this many connections with no stream open.
    Idle(usize),
    /// Connections closed before are still ending.
    Ending,
    /// Nothing to shed.
    Nothing,
}

/// Unused stream places ([`Activity::unused_places`]) that make a connection a hoarder: 96 KiB
/// kept for nothing, four subscribers' worth. Real clients open their streams a few at a time.
pub(crate) const HOARDED_PLACES: usize = 64;
/// How many passes shedding waits for closed connections to end before it goes on without
/// them (a connection ends as soon as it is next read from, which is at once for a live one).
const MOST_PASSES_WAITED: u32 = 8;
/// The most hoarders one pass closes: the biggest first, and the budget is looked at again.
const SHED_AT_ONCE: usize = 16;
/// What the budget must have room for before shedding stops: a new client's connection, stream
/// and request, with room to spare.
const ROOM_FOR_A_CLIENT: usize = 64 * 1024;

/// A connection's entry in the [`Room`]: leaves it when dropped.
pub(crate) struct Ticket {
    id: u64,
    room: Arc<Room>,
    activity: Arc<Activity>,
    close: CancellationToken,
}

impl Ticket {
    /// Completes when the connection has been closed to make room for another.
    pub(crate) async fn closed(&self) {
        self.close.cancelled().await;
    }

    /// `io`, noting in this ticket whenever something is read from it.
    pub(crate) fn heard<IO>(&self, io: IO) -> Heard<IO> {
        Heard {
            io,
            activity: self.activity.clone(),
        }
    }

    /// The connection's streams, as requests count them.
    pub(crate) fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// Ends the connection when it is closed to make room, or when it has had no stream open
    /// for `idle_timeout` (if given).
    pub(crate) fn until_idle(self, idle_timeout: Option<Duration>) -> IdleClose {
        IdleClose {
            closed: Box::pin(self.close.clone().cancelled_owned()),
            idle_timeout,
            timer: None,
            _ticket: self,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.room.lock().remove(&self.id);
    }
}

/// Fails a connection's reads once it has been closed to make room or has been idle (no stream
/// open) for too long. A connection with no stream serves no one: closing it loses nothing, and
/// its client connects again when it has something to ask.
pub(crate) struct IdleClose {
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    idle_timeout: Option<Duration>,
    /// The idle deadline, and the "last heard" it was counted from.
    timer: Option<(u64, Pin<Box<tokio::time::Sleep>>)>,
    _ticket: Ticket,
}

impl IdleClose {
    /// Passes a read's `result` on, or the error that ends the connection.
    pub(crate) fn check(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<std::io::Result<()>>,
    ) -> Poll<std::io::Result<()>> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::other(
                "closed to make room for a new connection (--max-connections)",
            )));
        }
        let Some(limit) = self.idle_timeout else {
            return result;
        };
        let activity = &self._ticket.activity;
        activity.wake_when_idle(cx.waker());
        if activity.streams() > 0 {
            self.timer = None;
            return result;
        }
        // Counted from when the connection was last busy: a stream that came and went since
        // the timer was set starts it again.
        let heard = activity.last_heard();
        if self.timer.as_ref().is_none_or(|(from, _)| *from != heard) {
            let idle_for = Duration::from_millis(clock_ms().saturating_sub(heard));
            let timer = Box::pin(tokio::time::sleep(limit.saturating_sub(idle_for)));
            self.timer = Some((heard, timer));
        }
        let Some((_, timer)) = self.timer.as_mut() else {
            return result;
        };
        crate::net::deadlines::unless_timed_out(
            cx,
            timer.as_mut(),
            result,
            "no stream open for too long (--connection-idle-timeout)",
        )
    }
}

/// A connection's I/O that notes when it was last read from.
pub(crate) struct Heard<IO> {
    io: IO,
    activity: Arc<Activity>,
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
            this.activity.heard();
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
mod tests;
