//! The connections to the upstream proxy: as many HTTP/2 connections as the streams need, each
//! carrying at most a set number of them.
//!
//! The upstream caps the streams one connection may have open at once (its
//! `--max-streams-per-connection`, 1,000 by default); a stream over that cap waits in the HTTP/2
//! layer until another ends, and a watch's stream stays open for as long as the resource is in
//! use. With one connection for the whole node tier, one client asking for as many resources as
//! the cap left every other client's new resource waiting. So each stream takes a place on the
//! first connection with fewer than `per_connection` streams, a connection is opened when every
//! one is full, and a connection is closed once its last stream has ended.
use std::sync::{Arc, Mutex};

use tonic::transport::{Channel, Endpoint};

use crate::locks::lock;
use crate::metrics::Metrics;

/// Connections to the upstream. Cheap to clone.
#[derive(Clone)]
pub(super) struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    endpoint: Endpoint,
    per_connection: usize,
    metrics: Arc<Metrics>,
    connections: Mutex<Connections>,
}

#[derive(Default)]
struct Connections {
    open: Vec<Connection>,
    /// The id of the next connection opened.
    next_id: u64,
}

struct Connection {
    id: u64,
    /// One HTTP/2 connection, made when its first request goes out; closed once this and every
    /// clone (each stream's) are dropped.
    channel: Channel,
    streams: usize,
}

/// Where a new stream goes: the first connection with room, else a new one (`None`).
fn place(streams: impl IntoIterator<Item = usize>, per_connection: usize) -> Option<usize> {
    streams.into_iter().position(|n| n < per_connection)
}

impl Pool {
    /// Connections to `endpoint`, each carrying at most `per_connection` streams (at least one).
    pub(super) fn new(endpoint: Endpoint, per_connection: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            shared: Arc::new(Shared {
                endpoint,
                per_connection: per_connection.max(1),
                metrics,
                connections: Mutex::default(),
            }),
        }
    }

    /// A place for one stream, on a connection with room (opened when none has any); the place
    /// is given back when the returned lease is dropped.
    pub(super) fn lease(&self) -> Lease {
        let shared = &self.shared;
        let mut connections = lock(&shared.connections);
        let index = match place(
            connections.open.iter().map(|c| c.streams),
            shared.per_connection,
        ) {
            Some(index) => index,
            None => {
                let id = connections.next_id;
                connections.next_id += 1;
                connections.open.push(Connection {
                    id,
                    channel: shared.endpoint.connect_lazy(),
                    streams: 0,
                });
                shared.metrics.upstream_connections.inc();
                tracing::debug!(
                    connection = id,
                    open = connections.open.len(),
                    "upstream connection opened"
                );
                connections.open.len() - 1
            }
        };
        let connection = &mut connections.open[index];
        connection.streams += 1;
        Lease {
            shared: shared.clone(),
            id: connection.id,
            channel: connection.channel.clone(),
        }
    }

    /// The streams of each open connection, in order.
    #[cfg(test)]
    fn loads(&self) -> Vec<usize> {
        let connections = lock(&self.shared.connections);
        connections.open.iter().map(|c| c.streams).collect()
    }
}

/// One stream's place on a connection.
pub(super) struct Lease {
    shared: Arc<Shared>,
    id: u64,
    channel: Channel,
}

impl Lease {
    /// The connection to open the stream on.
    pub(super) fn channel(&self) -> Channel {
        self.channel.clone()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut connections = lock(&self.shared.connections);
        let Some(index) = connections.open.iter().position(|c| c.id == self.id) else {
            return;
        };
        let connection = &mut connections.open[index];
        connection.streams = connection.streams.saturating_sub(1);
        if connection.streams == 0 {
            // Its last stream has ended: the connection closes once the streams' own clones of
            // its channel are gone too.
            connections.open.remove(index);
            self.shared.metrics.upstream_connections.dec();
            tracing::debug!(
                connection = self.id,
                open = connections.open.len(),
                "upstream connection closed: no stream left"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_goes_to_the_first_connection_with_room() {
        assert_eq!(place([], 3), None);
        assert_eq!(place([3, 3], 3), None);
        assert_eq!(place([3, 2, 0], 3), Some(1));
        assert_eq!(place([0], 3), Some(0));
    }

    fn pool(per_connection: usize) -> (Pool, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let endpoint = Endpoint::from_static("http://127.0.0.1:1");
        (
            Pool::new(endpoint, per_connection, metrics.clone()),
            metrics,
        )
    }

    /// Streams fill a connection before another is opened; a connection goes with its last
    /// stream, and the next stream finds room where there is some.
    #[tokio::test]
    async fn connections_are_opened_as_streams_need_and_closed_when_empty() {
        let (pool, metrics) = pool(3);
        let mut leases: Vec<Lease> = (0..7).map(|_| pool.lease()).collect();
        assert_eq!(pool.loads(), [3, 3, 1]);
        assert_eq!(metrics.upstream_connections.get(), 3);

        // The second connection's streams end: it is closed.
        let second: Vec<Lease> = leases.drain(3..6).collect();
        assert!(second.iter().all(|lease| lease.id == 1));
        drop(second);
        assert_eq!(pool.loads(), [3, 1]);
        assert_eq!(metrics.upstream_connections.get(), 2);

        // A new stream goes where there is room, not to a new connection.
        leases.push(pool.lease());
        assert_eq!(pool.loads(), [3, 2]);
        drop(leases);
        assert_eq!(pool.loads(), Vec::<usize>::new());
        assert_eq!(metrics.upstream_connections.get(), 0);
    }

    /// Five thousand streams at 500 a connection take ten connections, never one.
    #[tokio::test]
    async fn many_streams_spread_over_connections() {
        let (pool, metrics) = pool(500);
        let leases: Vec<Lease> = (0..5_000).map(|_| pool.lease()).collect();
        assert_eq!(pool.loads(), [500; 10]);
        assert_eq!(metrics.upstream_connections.get(), 10);
        drop(leases);
        assert_eq!(metrics.upstream_connections.get(), 0);
    }
}
