//! The pool against a TLS server on loopback that the tests steer ([`server`]).
use std::future::Future;
use std::time::Duration;

use http::{Request, Response, StatusCode, Version};
use http_body_util::BodyExt as _;
use kube::client::Body;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::STREAMS_PER_CONNECTION;
use super::placement::{Lifetime, Load};
use super::pool::{CountedBody, Pool, PoolError};
use crate::locks::lock;
use server::{Handshakes, Server};

mod server;

const FULL: usize = STREAMS_PER_CONNECTION;
/// Only a guard against a test that would hang: nothing here takes more than moments.
const GUARD: Duration = Duration::from_secs(30);

async fn guarded<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

fn load(watches: usize, shorts: usize) -> Load {
    Load { watches, shorts }
}

fn loads(pool: &Pool) -> Vec<Load> {
    lock(&pool.shared.state)
        .entries
        .values()
        .map(|entry| entry.load)
        .collect()
}

/// Waits until the pool has `want` connections (entries leave when their connection ends).
async fn entries_become(pool: &Pool, want: usize) {
    guarded(&format!("{want} connections in the pool"), async {
        loop {
            let changed = pool.shared.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if lock(&pool.shared.state).entries.len() == want {
                return;
            }
            changed.await;
        }
    })
    .await;
}

/// Waits until the requests placed add up to `shorts` (placing a request wakes nobody, so this
/// looks again after every other task has run).
async fn placed_shorts_become(pool: &Pool, shorts: usize) {
    guarded("requests placed", async {
        while loads(pool).iter().map(|l| l.shorts).sum::<usize>() != shorts {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Waits for every request to fail.
async fn all_fail(requests: Vec<JoinHandle<Result<Response<CountedBody>, PoolError>>>) {
    for request in requests {
        let answer = guarded("the request fails", request)
            .await
            .expect("the task");
        assert!(answer.is_err(), "a request on a closed connection fails");
    }
}

fn send(
    pool: &Pool,
    request: Request<Body>,
) -> JoinHandle<Result<Response<CountedBody>, PoolError>> {
    let pool = pool.clone();
    tokio::spawn(async move { pool.send(request).await })
}

/// Requests hang on a connection, some with their response bodies open; the server closes it.
/// Every one of them fails, the connection leaves the pool, the next request opens a new one,
/// and the old requests' bodies, dropped then, count against nothing.
#[tokio::test]
async fn a_lost_connection_is_replaced_and_its_entry_removed() {
    let mut server = Server::start(true).await;
    let pool = server.pool();
    let hanging: Vec<_> = (0..3).map(|_| send(&pool, server.get("/hang"))).collect();
    let streaming: Vec<_> = (0..3).map(|_| send(&pool, server.get("/stream"))).collect();
    for _ in 0..3 {
        assert_eq!(server.arrived().await, Version::HTTP_2);
    }
    let mut bodies = Vec::new();
    for response in streaming {
        let response = guarded("a response", response).await.expect("the task");
        bodies.push(response.expect("a response").into_body());
    }
    assert_eq!(
        server.accepted(),
        1,
        "six requests at once share one socket"
    );
    assert_eq!(loads(&pool), [load(0, 6)]);

    server.close_connections();
    all_fail(hanging).await;
    for body in &mut bodies {
        let frame = guarded("the body fails", body.frame()).await;
        assert!(
            matches!(frame, Some(Err(_))),
            "a body on a closed connection fails"
        );
    }
    entries_become(&pool, 0).await;

    let fresh = guarded("a new request", pool.send(server.get("/stream")))
        .await
        .expect("a response on a new connection");
    assert_eq!(server.accepted(), 2, "a new connection");
    assert_eq!(loads(&pool), [load(0, 1)]);
    drop(bodies);
    assert_eq!(
        loads(&pool),
        [load(0, 1)],
        "the requests of the lost connection count against nothing"
    );
    drop(fresh);
    assert_eq!(loads(&pool), [load(0, 0)]);
}

/// Requests arriving while a connection opens wait for it, one socket for all; the request that
/// opened it, cancelled meanwhile, takes nothing with it.
#[tokio::test]
async fn requests_wait_for_the_connection_being_opened() {
    let mut server = Server::start(true).await;
    server.handshakes.send_replace(Handshakes::Hold);
    let pool = server.pool();
    let first = send(&pool, server.get("/ok"));
    server.until_accepted(1).await;
    let others: Vec<_> = (0..4).map(|_| send(&pool, server.get("/ok"))).collect();
    placed_shorts_become(&pool, 5).await;
    first.abort();
    assert!(first.await.is_err_and(|e| e.is_cancelled()));
    assert_eq!(loads(&pool), [load(0, 4)]);

    server.handshakes.send_replace(Handshakes::Go);
    for request in others {
        let answer = guarded("an answer", request).await.expect("the task");
        assert_eq!(answer.expect("an answer").status(), StatusCode::OK);
    }
    assert_eq!(server.accepted(), 1, "one socket");
    let again = guarded("an answer", pool.send(server.get("/ok"))).await;
    assert_eq!(again.expect("an answer").status(), StatusCode::OK);
    assert_eq!(server.accepted(), 1, "the same connection");
}

/// A connection that cannot be opened fails every request waiting for it (each with the
/// connect error), leaves the pool, and the next request opens another.
#[tokio::test]
async fn a_failed_connect_fails_every_request_waiting_for_it() {
    let mut server = Server::start(true).await;
    server.handshakes.send_replace(Handshakes::Hold);
    let pool = server.pool();
    let waiting: Vec<_> = (0..5).map(|_| send(&pool, server.get("/ok"))).collect();
    server.until_accepted(1).await;
    placed_shorts_become(&pool, 5).await;
    server.handshakes.send_replace(Handshakes::Fail);
    for request in waiting {
        let answer = guarded("the request fails", request)
            .await
            .expect("the task");
        assert!(
            matches!(answer, Err(PoolError::Connect(_))),
            "the connect error"
        );
    }
    entries_become(&pool, 0).await;
    assert_eq!(server.accepted(), 1, "one socket for the five");

    server.handshakes.send_replace(Handshakes::Go);
    let answer = guarded("an answer", pool.send(server.get("/ok"))).await;
    assert_eq!(answer.expect("an answer").status(), StatusCode::OK);
    assert_eq!(server.accepted(), 2);
}

/// Where ALPN does not choose `h2`, a connection carries one request at a time: requests at once
/// take a socket each, a connection whose request ended carries the next, and every request is
/// sent in origin form with a `Host` header.
#[tokio::test]
async fn http1_connections_carry_one_request_at_a_time() {
    let mut server = Server::start(false).await;
    let pool = server.pool();
    let hanging: Vec<_> = (0..3).map(|_| send(&pool, server.get("/hang"))).collect();
    for _ in 0..3 {
        assert_eq!(server.arrived().await, Version::HTTP_11);
    }
    assert_eq!(server.accepted(), 3, "a socket each");
    assert_eq!(loads(&pool), [load(0, 1); 3]);
    server.close_connections();
    all_fail(hanging).await;
    entries_become(&pool, 0).await;

    for _ in 0..2 {
        let answer = guarded("an answer", pool.send(server.get("/ok")))
            .await
            .expect("an answer");
        assert_eq!(answer.status(), StatusCode::OK);
        let body = guarded("the body", answer.into_body().collect()).await;
        assert_eq!(body.expect("the body").to_bytes(), "ok");
    }
    assert_eq!(
        server.accepted(),
        4,
        "the second request reuses the connection"
    );
}

/// A connection idle for the idle timeout is closed by the next request, which opens another.
#[tokio::test]
async fn an_idle_connection_is_closed() {
    let server = Server::start(true).await;
    let pool = server.pool();
    let answer = guarded("an answer", pool.send(server.get("/ok")))
        .await
        .expect("an answer");
    guarded("the body", answer.into_body().collect())
        .await
        .expect("the body");
    assert_eq!(loads(&pool), [load(0, 0)]);
    // Its deadline set by its last request's end, then moved: far off (however long the
    // machine took so far), then to now.
    let set_deadline = |deadline: Instant| {
        for entry in lock(&pool.shared.state).entries.values_mut() {
            assert!(entry.idle_until.is_some(), "idle");
            entry.idle_until = Some(deadline);
        }
    };
    set_deadline(Instant::now() + Duration::from_secs(3600));
    let again = guarded("an answer", pool.send(server.get("/ok"))).await;
    drop(again.expect("an answer"));
    assert_eq!(
        server.accepted(),
        1,
        "a connection before its idle deadline is kept"
    );
    set_deadline(Instant::now());
    let answer = guarded("an answer", pool.send(server.get("/ok"))).await;
    drop(answer.expect("an answer"));
    assert_eq!(server.accepted(), 2, "a new connection");
    assert_eq!(loads(&pool), [load(0, 0)], "the idle one is gone");
}

/// 250 watches, each after its list, and other short requests among them (reviews, events):
/// the watches pack 100 a connection.
#[tokio::test]
async fn short_requests_do_not_spread_watches() {
    let server = Server::start(true).await;
    let pool = server.pool();
    let destination =
        super::connect::Destination::of(server.get("/").uri()).expect("a destination");
    let short = |pool: &Pool, takes: usize| {
        let pool = pool.clone();
        let destination = destination.clone();
        async move {
            let request = pool.pick(Lifetime::Short, &destination).await;
            for _ in 0..takes {
                tokio::task::yield_now().await;
            }
            drop(request);
        }
    };
    let (held, mut watches) = mpsc::unbounded_channel();
    let mut others = Vec::new();
    for i in 0..250 {
        let list = short(&pool, 3);
        let watcher = pool.clone();
        let held = held.clone();
        let destination = destination.clone();
        tokio::spawn(async move {
            list.await;
            let _ = held.send(watcher.pick(Lifetime::Watch, &destination).await);
        });
        if i >= 150 {
            others.push(tokio::spawn(short(&pool, 100)));
        }
        tokio::task::yield_now().await;
    }
    let mut open = Vec::new();
    while open.len() < 250 {
        open.push(
            guarded("a watch placed", watches.recv())
                .await
                .expect("every watch is placed"),
        );
    }
    for other in others {
        guarded("a short request", other)
            .await
            .expect("the short request ends");
    }
    assert_eq!(
        loads(&pool),
        [load(FULL, 0), load(FULL, 0), load(50, 0)],
        "250 watches"
    );
    drop(open);
}
