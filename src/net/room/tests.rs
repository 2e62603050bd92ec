//! Unit tests of the room: making room, shedding at the memory budget, idle closes.
use super::*;
use crate::metrics::Metrics;
use crate::net::limits::TotalLimit;

/// A room whose connections are counted against a limit of two (reason `limit`, on `port`).
fn room_for_two(port: &'static str, limit: &'static str) -> (TotalLimit, Arc<Room>) {
    let metrics = Arc::new(Metrics::new());
    (TotalLimit::new(2, port, limit, metrics), Room::new())
}

#[tokio::test]
async fn the_connection_quiet_the_longest_makes_room() {
    let (limit, room) = room_for_two("management", "max_management_connections");
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

/// At the memory budget, the connections with no stream open are closed; one serving a
/// stream is not.
#[tokio::test]
async fn connections_with_no_stream_are_closed_when_the_budget_refuses_work() {
    let metrics = Arc::new(Metrics::new());
    let limit = TotalLimit::new(0, "sync", "max_connections", metrics.clone());
    let budget = MemoryBudget::new(1, metrics);
    let room = Room::new();
    let serving = room.enter(limit.admit().expect("place"));
    let _stream = serving.activity().open_stream();
    let idle = room.enter(limit.admit().expect("place"));
    // Quiet for longer than the room asks (250 ms) before the budget refuses.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(
        room.clone()
            .close_idle_when_refused(budget.clone(), shutdown.clone()),
    );
    assert!(budget.try_charge(2, crate::budget::Kind::Streams).is_none());
    idle.closed().await;
    assert!(
        !serving.close.is_cancelled(),
        "a connection serving a stream stays"
    );
    shutdown.cancel();
    task.await.expect("the task ends at shutdown");
}

/// A connection with no stream is closed as idle only once it has been quiet for as long as
/// asked: one just heard from may have a request on its way.
#[tokio::test]
async fn only_connections_quiet_for_long_enough_are_closed_as_idle() {
    let metrics = Arc::new(Metrics::new());
    let limit = TotalLimit::new(0, "sync", "max_connections", metrics);
    let room = Room::new();
    let talking = room.enter(limit.admit().expect("place"));
    talking.activity().heard();
    assert_eq!(room.close_idle(Duration::from_secs(3600)), 0);
    assert!(!talking.close.is_cancelled());
    assert_eq!(room.close_idle(Duration::ZERO), 1);
    talking.closed().await;
    assert_eq!(room.close_idle(Duration::ZERO), 0, "closed once");
}

/// At the budget, connections that keep many more stream places than they use go first,
/// the biggest first, even with a stream open; the idle one (an honest poller between its
/// calls) stays while any is left, and goes only after, and only if the budget is full.
#[tokio::test]
async fn hoarders_are_shed_before_idle_connections() {
    let metrics = Arc::new(Metrics::new());
    let limit = TotalLimit::new(0, "sync", "max_connections", metrics.clone());
    let budget = MemoryBudget::unlimited(metrics);
    let room = Room::new();
    let hoarder = |places: usize| {
        let ticket = room.enter(limit.admit().expect("place"));
        let streams: Vec<_> = (0..places)
            .map(|_| ticket.activity().open_stream())
            .collect();
        ticket.activity().retain_peak(places, &budget);
        let kept = ticket.activity().open_stream();
        drop(streams);
        (ticket, kept)
    };
    let (big, _big_stream) = hoarder(HOARDED_PLACES * 2);
    let (small, _small_stream) = hoarder(HOARDED_PLACES + 1);
    let (subscriber, _stream) = hoarder(HOARDED_PLACES);
    let poller = room.enter(limit.admit().expect("place"));
    let quiet = Duration::ZERO;
    assert_eq!(room.shed(quiet, true, true), Shed::Hoarders(2));
    assert!(big.close.is_cancelled() && small.close.is_cancelled());
    assert_eq!(
        room.shed(quiet, true, true),
        Shed::Ending,
        "until they have ended"
    );
    assert_eq!(
        room.shed(quiet, false, false),
        Shed::Nothing,
        "with room left in the budget, no hoarder: nothing"
    );
    assert!(!poller.close.is_cancelled());
    assert_eq!(room.shed(quiet, false, true), Shed::Idle(1));
    assert!(poller.close.is_cancelled());
    assert!(!subscriber.close.is_cancelled(), "few unused places: kept");
    drop((big, small, poller));
    assert_eq!(room.shed(quiet, true, true), Shed::Nothing);
}

#[tokio::test]
async fn a_connection_with_a_stream_open_is_never_closed_to_make_room() {
    let (limit, room) = room_for_two("sync", "max_connections");
    let serving = room.enter(limit.admit().expect("place"));
    let stream = serving.activity().open_stream();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let idle = room.enter(limit.admit().expect("place"));
    // The serving connection is the older one, but it has a stream open.
    let place = room.make_room().expect("room made");
    idle.closed().await;
    assert!(!serving.close.is_cancelled());
    drop(place);
    assert!(room.make_room().is_none(), "only a busy connection is left");
    drop(stream);
    assert!(room.make_room().is_some(), "idle once its stream ended");
    assert!(serving.close.is_cancelled());
}
