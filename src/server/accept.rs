//! Accepting the sync port's connections: on every TCP listener (TLS handshakes done off the
//! accept path) and on the unix socket, each admitted (see `admission`) before the server gets
//! it.
use std::io;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::admission::{Admission, TLS_CONNECTION_BYTES, UNIX_CONNECTION_BYTES};
use super::{Phases, ServerOptions};
use crate::budget::{self, MemoryBudget};
use crate::metrics::Metrics;
use crate::net::connection::{Connection, Stream};
use crate::net::deadlines::PrefaceDeadline;
use crate::net::h2::AuthorityFilter;
use crate::net::limits::AddressSlot;
use crate::net::listener::{SyncListener, UnixSocket, next_accepted};
use crate::net::tls::{self, ReloadingTls};

/// Starts accepting on every listener; the accepted connections, admitted and with their TLS
/// handshakes done, come out of the returned stream.
pub(super) fn accept_all(
    listeners: Vec<SyncListener>,
    tls: Option<Arc<ReloadingTls>>,
    options: &ServerOptions,
    budget: &Arc<MemoryBudget>,
    metrics: &Arc<Metrics>,
    phases: &Phases,
    tasks: &TaskTracker,
) -> ReceiverStream<io::Result<Connection>> {
    let (tx, rx) = mpsc::channel(128);
    let closed = phases.drain_end.clone();
    let shutdown = &phases.accepting_end;
    let admission = Arc::new(Admission::new(options, budget, metrics, closed));
    tasks.spawn(
        admission
            .room
            .clone()
            .close_idle_when_refused(budget.clone(), shutdown.clone()),
    );
    for listener in listeners {
        let (tx, admission) = (tx.clone(), admission.clone());
        match listener {
            SyncListener::Tcp(listener) => {
                let tls = tls.clone();
                tasks.spawn(accept(
                    listener,
                    tls,
                    tx,
                    admission,
                    shutdown.clone(),
                    tasks.clone(),
                ));
            }
            SyncListener::Unix(socket) => {
                tasks.spawn(accept_unix(socket, tx, admission, shutdown.clone()));
            }
        }
    }
    ReceiverStream::new(rx)
}

/// Accepts TCP connections and completes TLS handshakes off the accept path (on `tasks`).
async fn accept(
    listener: TcpListener,
    tls: Option<Arc<ReloadingTls>>,
    tx: mpsc::Sender<io::Result<Connection>>,
    admission: Arc<Admission>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let per_address = &admission.per_address;
    while let Some((tcp, peer)) = next_accepted(&shutdown, "sync", || listener.accept()).await {
        let Some(slot) = per_address.admit(peer.ip()) else {
            tracing::debug!(%peer, "connection closed: too many connections from this address");
            drop(tcp);
            continue;
        };
        let bytes = match tls {
            None => budget::CONNECTION_BYTES,
            Some(_) => TLS_CONNECTION_BYTES,
        };
        let Some(total) = admission.place(bytes) else {
            tracing::debug!(%peer, "connection closed: --max-connections or --memory-budget reached");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let deadline = admission.handshake_timeout;
        match &tls {
            None => {
                let (tx, admission) = (tx.clone(), admission.clone());
                tasks.spawn(async move {
                    // The preface is checked as it is read, under the deadline: a peer that
                    // closes early frees its place at once, and nothing polls for it.
                    let connection = admission.connection(
                        Stream::Plain(tcp),
                        PrefaceDeadline::new(deadline),
                        slot,
                        total,
                    );
                    let _ = tx.send(Ok(connection)).await;
                });
            }
            Some(tls) => {
                let acceptor = tls.acceptor();
                let (tx, admission) = (tx.clone(), admission.clone());
                tasks.spawn(async move {
                    // One deadline for the handshake and the preface together.
                    match tls::handshake(&acceptor, tcp, deadline).await {
                        Ok((stream, preface_deadline)) => {
                            let connection = admission.connection(
                                Stream::Tls(Box::new(stream)),
                                preface_deadline,
                                slot,
                                total,
                            );
                            let _ = tx.send(Ok(connection)).await;
                        }
                        Err(error) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                    }
                });
            }
        }
    }
}

/// Accepts unix socket connections (plain: the socket file's mode is the gate, and there is no
/// client address to count per address, so only the total limit applies; the preface deadline is
/// read-based). Its bytes are read through [`AuthorityFilter`]: any `:authority` a client
/// sends names nothing here. The socket file is removed when this ends.
async fn accept_unix(
    socket: UnixSocket,
    tx: mpsc::Sender<io::Result<Connection>>,
    admission: Arc<Admission>,
    shutdown: CancellationToken,
) {
    let path = socket.path().display().to_string();
    while let Some((stream, _)) =
        next_accepted(&shutdown, &path, || socket.listener().accept()).await
    {
        let Some(total) = admission.place(UNIX_CONNECTION_BYTES) else {
            tracing::debug!(
                "unix socket connection closed: --max-connections or --memory-budget reached"
            );
            continue;
        };
        let stream = Box::new(AuthorityFilter::new(
            stream,
            admission.http2_max_header_list_size,
        ));
        let connection = admission.connection(
            Stream::Unix(stream),
            PrefaceDeadline::new(admission.handshake_timeout),
            AddressSlot::none(),
            total,
        );
        if tx.send(Ok(connection)).await.is_err() {
            return;
        }
    }
}
