//! What a new connection on the sync port must pass before it is served: a place among its
//! address's connections and among all of them (at the limit, the one idle the longest makes
//! room), and its memory charged to the budget; the admitted connection gets its preface
//! deadline, its idle close and its end at the drain's.
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ServerOptions, http2_max_header_list_size};
use crate::budget::{self, Charge, Kind, MemoryBudget};
use crate::metrics::Metrics;
use crate::net::connection::{Connection, Stream};
use crate::net::deadlines::PrefaceDeadline;
use crate::net::h2;
use crate::net::limits::{AddressLimit, AddressSlot, TotalLimit, TotalSlot};
use crate::net::room::Room;

/// What a unix socket connection holds: an HTTP/2 connection's, and its [`AuthorityFilter`]'s.
pub(super) const UNIX_CONNECTION_BYTES: usize = budget::CONNECTION_BYTES + h2::FILTER_BYTES;
/// What a TLS connection holds: a plaintext one's, and the TLS session's buffers and state
/// (8.0 KiB more per subscriber measured: 33.9 against 25.9 KiB, `measure_subscribers` in
/// `tests/tls.rs`).
pub(super) const TLS_CONNECTION_BYTES: usize = budget::CONNECTION_BYTES + 8 * 1024;

/// What a new connection must pass before it is served.
pub(super) struct Admission {
    pub(super) per_address: AddressLimit,
    total: TotalLimit,
    /// The open connections, so that at the total limit an idle one makes room.
    pub(super) room: Arc<Room>,
    /// Each connection is charged to it while it is open.
    budget: Arc<MemoryBudget>,
    pub(super) handshake_timeout: Duration,
    idle_timeout: Option<Duration>,
    /// How long writes may make no progress before the connection is closed.
    write_stall: Duration,
    /// What the HTTP/2 layer accepts of a header list (the unix socket's filter keeps to it).
    pub(super) http2_max_header_list_size: usize,
    /// Cancelled at the end of the drain: every connection still open is closed.
    closed: CancellationToken,
}

impl Admission {
    /// The admission of the sync port set up by `options`, charging `budget` and counting in
    /// `metrics`; its connections are closed when `closed` is cancelled.
    pub(super) fn new(
        options: &ServerOptions,
        budget: &Arc<MemoryBudget>,
        metrics: &Arc<Metrics>,
        closed: CancellationToken,
    ) -> Self {
        Self {
            per_address: AddressLimit::new(options.max_connections_per_address, metrics.clone()),
            total: TotalLimit::new(
                options.max_connections,
                "sync",
                "max_connections",
                metrics.clone(),
            ),
            room: Room::new(),
            budget: budget.clone(),
            handshake_timeout: options.handshake_timeout,
            idle_timeout: options.connection_idle_timeout,
            write_stall: options.keepalive_interval + options.keepalive_timeout,
            http2_max_header_list_size: http2_max_header_list_size(options) as usize,
            closed,
        }
    }

    /// A place among all connections for one that holds `bytes`: a free one, or else the one of
    /// the connection idle the longest (no stream open), which is closed. `None` when every
    /// connection has a stream, or when `bytes` do not fit in the memory budget.
    pub(super) fn place(&self, bytes: usize) -> Option<(TotalSlot, Charge)> {
        let memory = self.budget.try_charge(bytes, Kind::Connections)?;
        let place = self.total.admit().or_else(|| self.room.make_room())?;
        Some((place, memory))
    }

    /// An admitted connection, entered in the room.
    pub(super) fn connection(
        &self,
        stream: Stream,
        preface: PrefaceDeadline,
        slot: AddressSlot,
        (total, memory): (TotalSlot, Charge),
    ) -> Connection {
        Connection::new(stream, self.write_stall, slot)
            .with_preface(preface)
            .in_room(self.room.enter(total), self.idle_timeout)
            .closed_by(&self.closed)
            .charged(memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(budget: &Arc<MemoryBudget>, metrics: &Arc<Metrics>) -> Admission {
        Admission {
            per_address: AddressLimit::new(0, metrics.clone()),
            total: TotalLimit::new(0, "sync", "max_connections", metrics.clone()),
            room: Room::new(),
            budget: budget.clone(),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: None,
            write_stall: Duration::from_secs(30),
            http2_max_header_list_size: 16 * 1024,
            closed: CancellationToken::new(),
        }
    }

    /// A unix socket connection is charged its authority filter (HPACK table and read buffer)
    /// besides what any connection holds: where one more TCP connection fits in the budget, one
    /// more unix socket connection does not.
    #[test]
    fn unix_socket_connections_are_charged_their_filter() {
        let metrics = Arc::new(Metrics::new());
        let budget = MemoryBudget::new(
            UNIX_CONNECTION_BYTES + budget::CONNECTION_BYTES,
            metrics.clone(),
        );
        let admission = admission(&budget, &metrics);
        let unix = admission.place(UNIX_CONNECTION_BYTES).expect("room");
        assert_eq!(budget.used(), 18 * 1024 + 4 * 1024 + 8 * 1024);
        assert!(admission.place(UNIX_CONNECTION_BYTES).is_none());
        let tcp = admission.place(budget::CONNECTION_BYTES).expect("room");
        assert_eq!(budget.used(), budget.limit());
        drop((unix, tcp));
        assert_eq!(budget.used(), 0);
    }
}
