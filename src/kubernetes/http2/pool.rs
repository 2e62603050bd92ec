//! The connections and the requests on them.
//!
//! Each connection is an entry under a stable id, run by a task of its own: the task connects,
//! makes the entry's sender usable, runs the connection, and removes the entry when the
//! connection ends (closed by the server, a GOAWAY, a ping unanswered). A request counts
//! against its entry by id until its response body is dropped, so the requests of a connection
//! that is gone count against nothing. Requests placed on an entry whose connection is still
//! being opened wait for that one connection; if it cannot be opened, each of them fails with
//! the connect error (kube's callers retry with their own backoff) and the next request opens
//! another. Connections left idle for [`IDLE_TIMEOUT`] are closed.
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response};
use hyper::body::Incoming;
use kube::client::Body;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tower::BoxError;

use super::connect::{ConnectError, Connector, Destination, Driver, Protocol, SendError, Sender};
use super::placement::{Lifetime, Load, Placement, place};
use crate::locks::lock;

/// A connection idle (no request in flight) this long is closed by the next request placed.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Tries of a request whose connection closed before it was sent.
const ATTEMPTS: usize = 3;

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("{0} is not an absolute http or https URI")]
    Uri(http::Uri),
    #[error("opening a connection to the API server")]
    Connect(#[source] Arc<ConnectError>),
    #[error("the connection to the API server closed as soon as it opened")]
    Closed,
    #[error("the request to the API server")]
    Request(#[source] hyper::Error),
}

/// The connections, shared by every clone.
#[derive(Clone)]
pub(super) struct Pool {
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Shared {
    connector: Connector,
    pub(super) state: Mutex<State>,
    /// Notified whenever a request ends or a connection is gone: a request waiting for room may
    /// find it now.
    pub(super) changed: Notify,
}

#[derive(Default)]
pub(super) struct State {
    next_id: u64,
    /// By id: the order in which connections were opened, the order requests fill them in.
    pub(super) entries: BTreeMap<u64, Entry>,
    /// What the last TLS handshake chose: what a TLS connection still being opened is expected
    /// to speak.
    tls_protocol: Protocol,
}

pub(super) struct Entry {
    destination: Destination,
    pub(super) load: Load,
    link: Link,
    /// Requests placed on it while it was opened that have taken its sender since.
    claimed: usize,
    /// When it is closed if no request is in flight on it until then (set when its last one
    /// ends).
    pub(super) idle_until: Option<Instant>,
}

/// How a connection went: `None` while it is being opened.
type Opened = Option<Result<(), Arc<ConnectError>>>;

enum Link {
    Opening(watch::Receiver<Opened>),
    Open(Sender),
}

impl Entry {
    fn capacity(&self, tls_protocol: Protocol) -> usize {
        match &self.link {
            Link::Open(sender) => sender.protocol().capacity(),
            Link::Opening(_) if self.destination.tls => tls_protocol.capacity(),
            Link::Opening(_) => Protocol::Http1.capacity(),
        }
    }

    fn expired(&self, now: Instant) -> bool {
        matches!(self.link, Link::Open(_))
            && self.load.total() == 0
            && self.idle_until.is_some_and(|until| now >= until)
    }
}

/// A request's place: counted on its entry; the connection ready, or being opened.
pub(super) struct Placed {
    pub(super) in_flight: InFlight,
    link: PlacedLink,
}

enum PlacedLink {
    Ready(Sender),
    Opening(watch::Receiver<Opened>),
}

/// What an entry gives a request placed on it once its connection opened.
enum Claim {
    Sender(Sender),
    /// More requests were placed on it than it carries (it speaks HTTP/1.1): place again.
    Surplus,
    /// Its connection is gone already.
    Gone,
}

impl Pool {
    pub fn new(connector: Connector) -> Self {
        Self {
            shared: Arc::new(Shared {
                connector,
                state: Mutex::default(),
                changed: Notify::new(),
            }),
        }
    }

    /// Sends `request` on a connection with room, opening one where the placement rules say so.
    pub async fn send(
        &self,
        mut request: Request<Body>,
    ) -> Result<Response<CountedBody>, PoolError> {
        let uri = request.uri().clone();
        let destination = Destination::of(&uri).ok_or_else(|| PoolError::Uri(uri.clone()))?;
        let lifetime = Lifetime::of(&request);
        let mut attempts = 0;
        loop {
            let placed = self.pick(lifetime, &destination).await;
            let id = placed.in_flight.id;
            let sender = match placed.link {
                PlacedLink::Ready(sender) => sender,
                PlacedLink::Opening(mut opened) => {
                    let outcome = opened
                        .wait_for(Option::is_some)
                        .await
                        .ok()
                        .and_then(|o| o.clone());
                    match outcome {
                        Some(Ok(())) => {}
                        Some(Err(error)) => return Err(PoolError::Connect(error)),
                        None => return Err(PoolError::Connect(Arc::new(ConnectError::Abandoned))),
                    }
                    match self.claim(id) {
                        Claim::Sender(sender) => sender,
                        Claim::Surplus => continue,
                        Claim::Gone => {
                            attempts += 1;
                            if attempts >= ATTEMPTS {
                                return Err(PoolError::Closed);
                            }
                            continue;
                        }
                    }
                }
            };
            match sender.send(request).await {
                Ok(response) => {
                    let in_flight = placed.in_flight;
                    return Ok(response.map(|body| CountedBody {
                        body,
                        _in_flight: in_flight,
                    }));
                }
                Err(SendError::Failed(error)) => return Err(PoolError::Request(error)),
                Err(SendError::NotSent(unsent, error)) => {
                    tracing::debug!(connection = id, %error, "connection closed before a request was sent on it");
                    drop(placed.in_flight);
                    self.shared.remove(id);
                    attempts += 1;
                    if attempts >= ATTEMPTS {
                        return Err(PoolError::Request(error));
                    }
                    request = *unsent;
                    *request.uri_mut() = uri.clone();
                }
            }
        }
    }

    /// A place for a request, counted against its connection until the returned guard is
    /// dropped; waits while every connection is full but some only of short requests.
    pub(super) async fn pick(&self, lifetime: Lifetime, destination: &Destination) -> Placed {
        loop {
            let changed = self.shared.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Registered before looking, so a change between the look and the wait is not missed.
            changed.as_mut().enable();
            if let Some(placed) = self.try_pick(lifetime, destination) {
                return placed;
            }
            changed.await;
        }
    }

    fn try_pick(&self, lifetime: Lifetime, destination: &Destination) -> Option<Placed> {
        let mut state = lock(&self.shared.state);
        let now = Instant::now();
        state.entries.retain(|_, entry| !entry.expired(now));
        let tls_protocol = state.tls_protocol;
        let mut ids = Vec::new();
        let mut loads = Vec::new();
        for (id, entry) in &state.entries {
            if entry.destination == *destination {
                ids.push(*id);
                loads.push((entry.load, entry.capacity(tls_protocol)));
            }
        }
        let id = match place(loads) {
            Placement::Use(index) => *ids.get(index)?,
            Placement::Wait => return None,
            Placement::Open => self.open(&mut state, destination),
        };
        let entry = state.entries.get_mut(&id)?;
        entry.load.add(lifetime);
        entry.idle_until = None;
        let link = match &entry.link {
            Link::Open(sender) => PlacedLink::Ready(sender.clone()),
            Link::Opening(opened) => PlacedLink::Opening(opened.clone()),
        };
        Some(Placed {
            in_flight: InFlight {
                shared: self.shared.clone(),
                id,
                lifetime,
            },
            link,
        })
    }

    /// A new entry, its connection opened by a task of its own.
    fn open(&self, state: &mut State, destination: &Destination) -> u64 {
        let id = state.next_id;
        state.next_id += 1;
        let (opened_tx, opened) = watch::channel(None);
        state.entries.insert(
            id,
            Entry {
                destination: destination.clone(),
                load: Load::default(),
                link: Link::Opening(opened),
                claimed: 0,
                idle_until: None,
            },
        );
        tokio::spawn(run(
            Arc::downgrade(&self.shared),
            id,
            self.shared.connector.clone(),
            destination.clone(),
            opened_tx,
        ));
        id
    }

    /// The sender of an entry whose connection has just opened, for a request placed on it
    /// meanwhile: the first ones to claim it, as many as it carries, have it.
    fn claim(&self, id: u64) -> Claim {
        let mut state = lock(&self.shared.state);
        let Some(entry) = state.entries.get_mut(&id) else {
            return Claim::Gone;
        };
        let Link::Open(sender) = &entry.link else {
            return Claim::Gone;
        };
        if entry.claimed < sender.protocol().capacity() {
            entry.claimed += 1;
            Claim::Sender(sender.clone())
        } else {
            Claim::Surplus
        }
    }
}

impl Shared {
    fn remove(&self, id: u64) {
        let removed = lock(&self.state).entries.remove(&id);
        drop(removed);
        self.changed.notify_waiters();
    }

    /// The entry's connection is open; false when the entry is gone.
    fn opened(&self, id: u64, sender: Sender, tls: bool) -> bool {
        let mut state = lock(&self.state);
        if tls {
            state.tls_protocol = sender.protocol();
        }
        let Some(entry) = state.entries.get_mut(&id) else {
            return false;
        };
        entry.link = Link::Open(sender);
        if entry.load.total() == 0 {
            entry.idle_until = Some(Instant::now() + IDLE_TIMEOUT);
        }
        true
    }
}

/// A connection's task: opens it, runs it, removes its entry when it ends.
async fn run(
    shared: Weak<Shared>,
    id: u64,
    connector: Connector,
    destination: Destination,
    opened: watch::Sender<Opened>,
) {
    let connected = connector.connect(&destination).await;
    let Some(pool) = shared.upgrade() else {
        return;
    };
    let driver: Driver = match connected {
        Ok((sender, driver)) => {
            tracing::debug!(connection = id, host = %destination.host, protocol = ?sender.protocol(), "connected to the API server");
            if !pool.opened(id, sender, destination.tls) {
                return;
            }
            opened.send_replace(Some(Ok(())));
            driver
        }
        Err(error) => {
            tracing::debug!(
                connection = id,
                error = &error as &(dyn std::error::Error + 'static),
                "cannot connect to the API server"
            );
            pool.remove(id);
            opened.send_replace(Some(Err(Arc::new(error))));
            return;
        }
    };
    // The connection's senders live in the pool: holding it here would keep them, and so the
    // connection, alive after every client is gone.
    drop(pool);
    match driver.await {
        Ok(()) => tracing::debug!(connection = id, "connection to the API server closed"),
        Err(error) => {
            tracing::info!(
                connection = id,
                error = &error as &(dyn std::error::Error + 'static),
                "connection to the API server lost"
            )
        }
    }
    if let Some(pool) = shared.upgrade() {
        pool.remove(id);
    }
}

/// One request counted against its connection until dropped.
pub(super) struct InFlight {
    shared: Arc<Shared>,
    pub(super) id: u64,
    lifetime: Lifetime,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = lock(&self.shared.state);
        // A connection that is gone has no entry: nothing is counted against it any more.
        if let Some(entry) = state.entries.get_mut(&self.id) {
            entry.load.remove(self.lifetime);
            if entry.load.total() == 0 {
                entry.idle_until = Some(Instant::now() + IDLE_TIMEOUT);
            }
        }
        drop(state);
        // A short request's end makes the room waited for; a watch's end may make room sooner.
        self.shared.changed.notify_waiters();
    }
}

impl tower::Service<Request<Body>> for Pool {
    type Response = Response<CountedBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let pool = self.clone();
        Box::pin(async move { Ok(pool.send(request).await?) })
    }
}

/// A response body that keeps its request counted on the connection while it is read (a
/// watch's body is open as long as the watch).
pub struct CountedBody {
    body: Incoming,
    _in_flight: InFlight,
}

impl http_body::Body for CountedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
