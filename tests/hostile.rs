//! Hostile and broken clients against the proxy binary, over real loopback sockets, while
//! well-behaved subscribers keep receiving every change.
use flagd_proxy_testkit as support;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use flagd_proxy::introspection::{Process, TcpSocket};
use support::attacks::pinned::{PINNED, Pinned};
use support::attacks::streams::{read_ends, subscription, sync_headers};
use support::attacks::unfinished::Unfinished;
use support::client::{Client, assert_status, default_variant, next, open, v1, with_selector};
use support::{EVENT_TIMEOUT, Proxy, write_color, write_manifest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const SELECTOR: &str = "core.openfeature.dev/default/demo";
const MAX_WATCHES: usize = 100;
const MAX_WAITING: usize = 20;
const MAX_PER_ADDRESS: usize = 16;
const MAX_HEADER_BYTES: usize = 8 * 1024;
const MAX_REQUEST_BYTES: usize = 4 * 1024;

/// A proxy serving one resource, and well-behaved subscribers that must see every change.
struct Scene {
    dir: tempfile::TempDir,
    proxy: Proxy,
    subscribers: Vec<tonic::Streaming<v1::SyncFlagsResponse>>,
    version: usize,
}

impl Scene {
    async fn start() -> Scene {
        Self::start_with(&[]).await
    }

    /// Starts with `extra` arguments added.
    async fn start_with(extra: &[&str]) -> Scene {
        let dir = tempfile::tempdir().expect("tempdir");
        write_color(dir.path(), "default", "demo", "v0", &["v0", "other"]);
        let limits = [
            ("--max-watches", MAX_WATCHES),
            ("--max-waiting-resources", MAX_WAITING),
            ("--max-connections-per-address", MAX_PER_ADDRESS),
            ("--max-header-bytes", MAX_HEADER_BYTES),
            ("--max-request-bytes", MAX_REQUEST_BYTES),
        ]
        .map(|(flag, value)| [flag.to_owned(), value.to_string()]);
        let defaults = limits
            .into_iter()
            .chain([["--idle-timeout".to_owned(), "1s".to_owned()]]);
        // A flag in `extra` replaces the scene's own value.
        let mut args: Vec<String> = defaults
            .filter(|[flag, _]| !extra.contains(&flag.as_str()))
            .flatten()
            .collect();
        args.extend(["--manifests".into(), dir.path().display().to_string()]);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy = Proxy::start(&args).await;
        let mut scene = Scene {
            dir,
            proxy,
            subscribers: Vec::new(),
            version: 0,
        };
        for _ in 0..3 {
            scene.subscribe().await;
        }
        scene
    }

    /// Adds a subscriber on a connection of its own, once it has the current version.
    async fn subscribe(&mut self) {
        let mut client = Client::new(self.channel().await);
        let mut stream = open(&mut client, SELECTOR).await.expect("stream");
        let want = format!("v{}", self.version);
        assert_eq!(color(&next(&mut stream).await), want);
        self.subscribers.push(stream);
    }

    /// A scene with a 16 MiB memory budget, no keepalive ping within a test and no idle
    /// timeout (only the budget closes connections), and one subscriber.
    async fn where_only_the_budget_closes() -> Scene {
        let mut scene = Scene::start_with(&[
            "--max-pending-requests-per-address",
            "0",
            "--memory-budget",
            "16Mi",
            "--keepalive-interval",
            "1h",
            "--connection-idle-timeout",
            "0",
        ])
        .await;
        scene.subscribe().await;
        scene
    }

    /// `/healthz` answers 200.
    async fn assert_healthy(&self) {
        assert_eq!(self.probe("/healthz").await, 200);
    }

    /// The status code of a GET on the management port; panics if it does not answer.
    async fn probe(&self, path: &str) -> u16 {
        let answer = tokio::time::timeout(
            EVENT_TIMEOUT,
            support::http_get(self.proxy.management_port, path),
        )
        .await
        .unwrap_or_else(|_| panic!("{path} does not answer"));
        answer.unwrap_or_else(|e| panic!("{path}: {e}")).0
    }

    async fn channel(&self) -> Channel {
        Endpoint::from_shared(self.proxy.endpoint())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect")
    }

    /// Changes the resource and checks that every subscriber ends on the new version.
    async fn change(&mut self) {
        self.version += 1;
        let want = format!("v{}", self.version);
        write_color(self.dir.path(), "default", "demo", &want, &[&want, "other"]);
        for stream in &mut self.subscribers {
            // A subscriber may skip versions, never the newest one.
            while color(&next(stream).await) != want {}
        }
    }

    async fn metric(&self, sample: &str) -> f64 {
        self.proxy.metric(sample).await
    }

    async fn rejected(&self, reason: &str) -> f64 {
        self.metric(&format!(
            "flagd_proxy_rejected_requests_total{{reason=\"{reason}\"}}"
        ))
        .await
    }
}

fn color(response: &v1::SyncFlagsResponse) -> String {
    default_variant(&response.flag_configuration, "color")
}

/// Bytes from a fixed-seed xorshift generator: "random", but the same on every run.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.max(1);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

/// Writes `bytes`, closes the sending side and reads until the proxy closes the connection.
async fn send_and_drain(port: u16, bytes: &[u8]) {
    let mut tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    // The proxy may close while we still write; that is one of the acceptable answers.
    let _ = tcp.write_all(bytes).await;
    let _ = tcp.shutdown().await;
    let mut sink = Vec::new();
    let drained = tokio::time::timeout(EVENT_TIMEOUT, async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) if sink.len() < 1 << 20 => sink.extend_from_slice(&buf[..n]),
                Ok(_) => panic!("the proxy keeps answering garbage"),
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "the proxy left a garbage connection open");
}

#[tokio::test]
async fn garbage_on_the_sync_port_is_dropped() {
    let mut scene = Scene::start().await;
    let port = scene.proxy.port;
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    // Connections that stall in the middle of the preface while others are served.
    let mut stalled = Vec::new();
    for cut in [1, 5, PREFACE.len() - 1] {
        let mut tcp = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        tcp.write_all(&PREFACE[..cut]).await.expect("write");
        stalled.push(tcp);
    }
    scene.change().await;

    let mut cases: Vec<Vec<u8>> = vec![
        noise(1, 1),
        noise(2, 64),
        noise(3, 64 * 1024),
        PREFACE[..10].to_vec(),
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_vec(),
        b"POST /flagd.sync.v1.FlagSyncService/SyncFlags HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
            .to_vec(),
        format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(100_000)).into_bytes(),
    ];
    // A valid preface followed by frames that make no sense.
    for seed in 10..20 {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(noise(seed, 512));
        cases.push(bytes);
    }
    // A valid preface and SETTINGS, then a HEADERS frame whose HPACK block is noise.
    let mut bytes = PREFACE.to_vec();
    bytes.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
    bytes.extend([0, 0, 64, 1, 5, 0, 0, 0, 1]);
    bytes.extend(noise(99, 64));
    cases.push(bytes);

    for (i, case) in cases.iter().enumerate() {
        send_and_drain(port, case).await;
        if i % 5 == 0 {
            scene.change().await;
        }
    }
    drop(stalled);
    scene.change().await;
    scene.assert_healthy().await;
}

#[tokio::test]
async fn oversized_headers_and_requests_are_refused() {
    let mut scene = Scene::start().await;
    let mut client = Client::new(scene.channel().await);

    // Over the limit but under twice it: a gRPC status, counted.
    let big = format!(
        "core.openfeature.dev/default/{}",
        "a".repeat(MAX_HEADER_BYTES + 100)
    );
    let status = client
        .sync_flags(with_selector(v1::SyncFlagsRequest::default(), &big))
        .await
        .expect_err("refused");
    assert_status(&status, Code::ResourceExhausted, "--max-header-bytes");
    assert_eq!(scene.rejected("max_header_bytes").await, 1.0);
    scene.change().await;

    // Far over it (64 KiB): refused by the HTTP/2 layer or the client's own checks, whichever
    // comes first; the proxy stays up.
    let huge = format!("core.openfeature.dev/default/{}", "a".repeat(64 * 1024));
    let refused = client
        .sync_flags(with_selector(v1::SyncFlagsRequest::default(), &huge))
        .await;
    let status = refused.expect_err("refused");
    assert_ne!(status.code(), Code::Ok);
    scene.change().await;

    // A request message over the limit is refused before it is read.
    for _ in 0..3 {
        let mut client = Client::new(scene.channel().await);
        let status = client
            .sync_flags(with_selector(
                v1::SyncFlagsRequest {
                    provider_id: "x".repeat(MAX_REQUEST_BYTES + 1),
                    selector: String::new(),
                },
                SELECTOR,
            ))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
        let status = client
            .fetch_all_flags(v1::FetchAllFlagsRequest {
                provider_id: String::new(),
                selector: "x".repeat(64 * 1024),
            })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    }
    assert_eq!(scene.rejected("max_request_bytes").await, 6.0);

    // The connection that sent the oversized header still works, within the limits.
    let mut stream = open(&mut client, SELECTOR)
        .await
        .expect("a request within the limits is served");
    next(&mut stream).await;
    scene.subscribers.push(stream);
    scene.change().await;
}

#[tokio::test]
async fn invented_selectors_are_bounded_and_let_go() {
    const STREAMS: usize = 3_000;
    const CONNECTIONS: usize = 4;
    let mut scene = Scene::start().await;
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(Client::new(scene.channel().await));
    }
    let ended = Arc::new(AtomicUsize::new(0));
    let unexpected = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut readers = tokio::task::JoinSet::new();
    let max_watches_seen = Arc::new(AtomicUsize::new(0));

    let mut opened = 0;
    for batch in 0..STREAMS / 100 {
        let mut calls = tokio::task::JoinSet::new();
        for i in batch * 100..(batch + 1) * 100 {
            let mut client = clients[i % CONNECTIONS].clone();
            calls.spawn(async move {
                let selector = format!("core.openfeature.dev/ns/rand-{i}");
                client
                    .sync_flags(with_selector(v1::SyncFlagsRequest::default(), &selector))
                    .await
            });
        }
        while let Some(call) = calls.join_next().await {
            match call.expect("join") {
                Err(status) if status.code() == Code::ResourceExhausted => {
                    ended.fetch_add(1, Ordering::SeqCst);
                }
                Err(status) => unexpected.lock().expect("lock").push(status.to_string()),
                Ok(response) => {
                    opened += 1;
                    let mut stream = response.into_inner();
                    let ended = ended.clone();
                    let unexpected = unexpected.clone();
                    readers.spawn(async move {
                        match stream.message().await {
                            Err(status)
                                if status.code() == Code::ResourceExhausted
                                    && status.message().contains("--max-waiting-resources") =>
                            {
                                ended.fetch_add(1, Ordering::SeqCst);
                            }
                            other => unexpected.lock().expect("lock").push(format!("{other:?}")),
                        }
                    });
                }
            }
        }
        let watches = scene.metric("flagd_proxy_upstream_watches").await as usize;
        max_watches_seen.fetch_max(watches, Ordering::SeqCst);
        if batch % 10 == 0 {
            scene.change().await;
        }
    }
    assert!(opened > 0, "some streams were opened");

    // Every stream ends with RESOURCE_EXHAUSTED except the few that got a place to wait.
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    while ended.load(Ordering::SeqCst) < STREAMS - MAX_WAITING {
        assert!(
            unexpected.lock().expect("lock").is_empty(),
            "{:?}",
            unexpected.lock().expect("lock")
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {STREAMS} streams ended",
            ended.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    scene.change().await;
    assert!(
        unexpected.lock().expect("lock").is_empty(),
        "{:?}",
        unexpected.lock().expect("lock")
    );
    assert_eq!(ended.load(Ordering::SeqCst), STREAMS - MAX_WAITING);
    assert_eq!(
        scene.metric("flagd_proxy_waiting_resources").await,
        MAX_WAITING as f64
    );
    let watches = scene.metric("flagd_proxy_upstream_watches").await as usize;
    max_watches_seen.fetch_max(watches, Ordering::SeqCst);
    assert!(
        max_watches_seen.load(Ordering::SeqCst) <= MAX_WATCHES,
        "{max_watches_seen:?}"
    );
    // The refused resources' watches are gone already; the waiting ones and the real one stay.
    assert_eq!(watches, MAX_WAITING + 1);
    assert_eq!(
        scene.rejected("max_waiting_resources").await + scene.rejected("max_watches").await,
        (STREAMS - MAX_WAITING) as f64
    );

    // Once the clients go, the proxy lets go of the waiting watches too.
    readers.shutdown().await;
    drop(clients);
    scene
        .proxy
        .wait_for_metric("flagd_proxy_waiting_resources", 0.0)
        .await;
    scene
        .proxy
        .wait_for_metric("flagd_proxy_upstream_watches", 1.0)
        .await;
    scene.change().await;
}

#[tokio::test]
async fn connections_beyond_the_per_address_limit_are_closed() {
    let mut scene = Scene::start().await;
    // Another loopback address, so the subscribers' own connections do not count.
    let address: IpAddr = "127.0.0.2".parse().expect("ip");
    let endpoint = Endpoint::from_shared(scene.proxy.endpoint())
        .expect("endpoint")
        .local_address(Some(address));
    let call = |channel: Channel| async move {
        Client::new(channel)
            .get_metadata(v1::GetMetadataRequest {})
            .await
    };

    let mut admitted = Vec::new();
    for _ in 0..MAX_PER_ADDRESS {
        let channel = endpoint.connect().await.expect("connect");
        call(channel.clone()).await.expect("served");
        admitted.push(channel);
    }
    const EXCESS: usize = 4;
    for _ in 0..EXCESS {
        // One TCP connection each (a gRPC channel would retry): closed at once, unread.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind((address, 0).into())
            .expect("bind a second loopback address");
        let mut tcp = socket
            .connect(("127.0.0.1".parse::<IpAddr>().expect("ip"), scene.proxy.port).into())
            .await
            .expect("the kernel accepts the connection");
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(EVENT_TIMEOUT, tcp.read(&mut buf))
            .await
            .expect("closed without waiting for the client");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
    assert_eq!(
        scene.rejected("max_connections_per_address").await,
        EXCESS as f64
    );
    scene.change().await;

    // The admitted connections still work, and a closed one frees its place.
    for channel in &admitted {
        call(channel.clone()).await.expect("still served");
    }
    admitted.pop();
    let mut attempts = 0;
    let replacement = loop {
        attempts += 1;
        assert!(attempts <= 500, "no place came free");
        if let Ok(channel) = endpoint.connect().await
            && call(channel.clone()).await.is_ok()
        {
            break channel;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    admitted.push(replacement);
    scene.change().await;
}

/// Reads the server's frames until `streams` streams have ended (trailers or a reset).
async fn all_streams_end(read: &mut tokio::net::tcp::OwnedReadHalf, streams: u32) {
    assert!(
        streams_end_or_connection_closes(read, streams).await,
        "the connection stays open"
    );
}

/// Reads until `streams` streams have ended (true), or the proxy closes the connection (false);
/// panics when no frame comes for [`EVENT_TIMEOUT`].
async fn streams_end_or_connection_closes(
    read: &mut tokio::net::tcp::OwnedReadHalf,
    streams: u32,
) -> bool {
    read_ends(read, streams, &AtomicU32::new(0))
        .await
        .unwrap_or_else(|error| panic!("{error}"))
}

/// HEADERS frames opening `streams` SyncFlags streams whose request never comes.
fn unfinished_sync_streams(streams: u32) -> Vec<u8> {
    sync_headers(streams, false)
}

/// A request is charged to the memory budget for the message it may still send (as large as
/// --max-request-bytes allows) from its first frame until its message has arrived; then only its
/// stream is. Requests whose message stops half-way hold that charge.
#[tokio::test]
async fn unfinished_requests_are_charged_for_their_message_until_it_arrives() {
    use flagd_proxy::budget::STREAM_BYTES;
    use support::raw_h2::{self, DATA};
    const STREAMS: u32 = 10;
    const STREAMS_HELD: &str = "flagd_proxy_memory_charged_bytes{kind=\"streams\"}";
    let mut scene = Scene::start().await;
    let base = scene.metric(STREAMS_HELD).await;
    let (mut read, mut write) = raw_h2::connect(scene.proxy.port).await;
    // Each request's message up to its middle.
    let message = raw_h2::sync_request(SELECTOR);
    let (first, rest) = message.split_at(message.len() / 2);
    let mut bytes = unfinished_sync_streams(STREAMS);
    for i in 0..STREAMS {
        bytes.extend(raw_h2::frame(DATA, 0, 2 * i + 1, first));
    }
    bytes.extend(raw_h2::ping(*b"settled!"));
    write.write_all(&bytes).await.expect("open the streams");
    settled(&mut read).await;
    let request = (MAX_REQUEST_BYTES + 5) as f64;
    let proxy = &scene.proxy;
    let charged = |streams: f64| async move {
        let held = proxy.metric(STREAMS_HELD).await - base;
        if held == streams {
            Ok(())
        } else {
            Err(format!(
                "{held} bytes charged for the streams, not {streams}"
            ))
        }
    };
    let unfinished = f64::from(STREAMS) * (STREAM_BYTES as f64 + request);
    support::eventually("unfinished requests charged", || charged(unfinished)).await;
    // The messages arrive whole: the streams are served, and charged for themselves only.
    let ends: Vec<u8> = (0..STREAMS)
        .flat_map(|i| raw_h2::frame(DATA, 0, 2 * i + 1, rest))
        .collect();
    write.write_all(&ends).await.expect("finish the messages");
    let open = f64::from(STREAMS) * STREAM_BYTES as f64;
    support::eventually("finished requests let go of", || charged(open)).await;
    drop((read, write));
    support::eventually("closed streams let go of", || charged(0.0)).await;
    scene.change().await;
}

/// The frames of `connections` raw HTTP/2 clients that each open `streams` SyncFlags streams
/// and never finish their requests: every stream must end (at --request-timeout), memory must
/// stay bounded meanwhile, and the probes and subscribers must be served.
#[tokio::test]
async fn streams_that_never_finish_their_request_end_at_the_deadline() {
    use support::raw_h2;
    const CONNECTIONS: usize = 8;
    const STREAMS: u32 = 1_000;
    /// At most 1,000 unfinished streams from one address at a time (a few KiB each), on top of
    /// the proxy's own memory (a debug build: about 40 MiB measured).
    const RSS_BOUND: u64 = 128 * 1024 * 1024;
    let mut scene = Scene::start_with(&["--request-timeout", "2s"]).await;
    let port = scene.proxy.port;
    let before = scene.proxy.rss_bytes();
    let mut attackers = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        attackers.spawn(async move {
            let (mut read, mut write) = raw_h2::connect(port).await;
            let bytes = unfinished_sync_streams(STREAMS);
            tokio::io::AsyncWriteExt::write_all(&mut write, &bytes)
                .await
                .expect("open the streams");
            all_streams_end(&mut read, STREAMS).await;
            drop(write);
        });
    }
    let mut peak = 0;
    let mut probes = 0;
    while !attackers.is_empty() {
        peak = peak.max(scene.proxy.rss_bytes());
        scene.assert_healthy().await;
        probes += 1;
        if let Ok(Some(done)) =
            tokio::time::timeout(Duration::from_millis(200), attackers.join_next()).await
        {
            done.expect("attacker");
        }
    }
    eprintln!(
        "RSS {} MiB before, peak {} MiB over {probes} probes",
        before >> 20,
        peak >> 20
    );
    assert!(peak < RSS_BOUND, "peak RSS {peak} bytes");
    // One address may hold at most 1,000 (the default) such streams at a time.
    assert!(scene.rejected("max_pending_requests_per_address").await > 0.0);
    scene.change().await;
}

/// Streams whose request never comes, from many addresses at once (each under its own
/// per-address limit): the memory budget bounds them all together. Streams beyond it are refused
/// at once, every stream ends (or its connection, once it has none open, is closed to give back
/// what its burst keeps), and established subscribers keep being served.
#[tokio::test]
async fn unfinished_streams_from_many_addresses_are_bounded_by_the_memory_budget() {
    const BUDGET: f64 = 4.0 * 1024.0 * 1024.0;
    let mut scene = Scene::start_with(&["--request-timeout", "2s", "--memory-budget", "4Mi"]).await;
    let attack = Unfinished {
        addresses: 8,
        streams: 500,
    };
    let outcome = attack
        .run(scene.proxy.port, scene.proxy.management_port)
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    if let Err(error) = outcome.bounded_by(BUDGET) {
        panic!("{error}: {outcome:?}");
    }
    scene.change().await;
}

/// What a connection keeps after a burst of requests (the HTTP/2 stream store grows to the
/// most streams it held at once and never shrinks; a burst that arrives together is held at
/// once, however quickly each request is answered) is charged to the memory budget for as long
/// as the connection stays open: connections from several addresses that each send a burst and
/// then sit idle reach the budget, new work is refused there, and the idle connections are
/// closed, which gives the budget back. Established subscribers are served throughout.
#[tokio::test]
async fn what_connections_keep_after_a_burst_is_charged_and_let_go_at_the_budget() {
    use support::raw_h2;
    const CONNECTIONS_HELD: &str = "flagd_proxy_memory_charged_bytes{kind=\"connections\"}";
    let mut scene = Scene::where_only_the_budget_closes().await;
    let mut idle = bursts_until_refused(&scene, false).await;
    // The idle connections are closed; what they kept goes back to the budget.
    for (read, _write) in &mut idle {
        let closed = async {
            while let Some(frame) = raw_h2::read_frame(read).await {
                if frame.kind == raw_h2::GOAWAY {
                    break;
                }
            }
        };
        tokio::time::timeout(EVENT_TIMEOUT, closed)
            .await
            .expect("the idle connection is closed");
    }
    // Closed at this end too, as a client does when its connection ends.
    drop(idle);
    support::eventually("the budget is given back", || async {
        let held = scene.metric(CONNECTIONS_HELD).await;
        if held < f64::from(REQUESTS) * 1024.0 {
            Ok(())
        } else {
            Err(format!("{held} bytes still charged to connections"))
        }
    })
    .await;
    scene.change().await;
}

/// The requests of a burst: each keeps 750 KiB charged to the connection once answered, so the
/// 16 MiB budget of [`Scene::where_only_the_budget_closes`] is reached after about 20 bursts.
const REQUESTS: u32 = 500;
/// The most connections a test sends a burst on before the budget must have refused.
const MOST_CONNECTIONS: u8 = 64;

/// Connections from four addresses, each sending a burst of [`REQUESTS`] (and, with
/// `hold_a_stream`, then opening one stream of [`SELECTOR`] that stays open), until the memory
/// budget refuses; the connections, both halves.
async fn bursts_until_refused(
    scene: &Scene,
    hold_a_stream: bool,
) -> Vec<(
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
)> {
    use support::raw_h2;
    let burst = burst_of(REQUESTS);
    let held = 2 * REQUESTS + 1;
    let stream = subscription(held, SELECTOR);
    let mut connections = Vec::new();
    for i in 0..MOST_CONNECTIONS {
        let from = std::net::Ipv4Addr::new(127, 0, 0, 2 + i % 4);
        let (mut read, mut write) = raw_h2::connect_from(from, scene.proxy.port).await;
        write.write_all(&burst).await.expect("send the burst");
        // Answered (or, once the budget refused, possibly closed already).
        let answered = streams_end_or_connection_closes(&mut read, REQUESTS).await;
        if answered && hold_a_stream {
            let _ = write.write_all(&stream).await;
        }
        connections.push((read, write));
        if scene.rejected("memory_budget").await > 0.0 {
            return connections;
        }
    }
    panic!(
        "{MOST_CONNECTIONS} connections sent bursts of {REQUESTS} requests, and the budget never refused"
    );
}

/// `requests` SyncFlags requests that end at once (no message): each is answered as soon as it
/// is read.
fn burst_of(requests: u32) -> Vec<u8> {
    sync_headers(requests, true)
}

/// Connections from several addresses that each send a burst of requests and then hold one
/// stream open (their stream stores keep the burst's places, charged to the budget, for one
/// subscriber) reach the memory budget. They are shed first, however busy that one stream is,
/// while an honest client that polls (its connection has no stream open between its calls) keeps
/// its connection; new clients are served again, and established subscribers get the next
/// version.
#[tokio::test]
async fn connections_holding_a_burst_for_one_stream_are_shed_before_a_polling_client() {
    use support::raw_h2::{self, ACK, GOAWAY, PING};
    const SYNC: &str = "/flagd.sync.v1.FlagSyncService/SyncFlags";
    let mut scene = Scene::where_only_the_budget_closes().await;
    let port = scene.proxy.port;
    // The poller: one call, answered; its connection then has no stream open.
    let (mut poll_read, mut poll_write) =
        raw_h2::connect_from(std::net::Ipv4Addr::new(127, 0, 0, 9), port).await;
    let call = raw_h2::grpc_headers(1, SYNC, true);
    poll_write.write_all(&call).await.expect("a call");
    all_streams_end(&mut poll_read, 1).await;

    let mut hoarders = bursts_until_refused(&scene, true).await;
    // New clients get in again: hoarders were shed.
    support::eventually("a new subscriber", || async {
        let mut client = Client::new(scene.channel().await);
        match open(&mut client, SELECTOR).await {
            Ok(mut stream) => support::client::next_message(&mut stream).await.map(|_| ()),
            Err(status) => Err(status),
        }
    })
    .await;
    one_closed(&mut hoarders).await;
    // The poller's connection is still open: it answers a PING, and no GOAWAY came first.
    poll_write
        .write_all(&raw_h2::ping(*b"pollster"))
        .await
        .expect("ping");
    loop {
        let frame = tokio::time::timeout(EVENT_TIMEOUT, raw_h2::read_frame(&mut poll_read))
            .await
            .expect("a frame")
            .expect("the polling client's connection is open");
        assert_ne!(frame.kind, GOAWAY, "the polling client was shed");
        if frame.kind == PING && frame.flags & ACK != 0 {
            break;
        }
    }
    drop(hoarders);
    scene.change().await;
}

/// Waits until the proxy has closed one of `connections` (GOAWAY, or the end of its bytes).
async fn one_closed(
    connections: &mut [(
        tokio::net::tcp::OwnedReadHalf,
        tokio::net::tcp::OwnedWriteHalf,
    )],
) {
    use support::raw_h2::{self, GOAWAY};
    let ends = connections.iter_mut().map(|(read, _)| {
        Box::pin(async move {
            while let Some(frame) = raw_h2::read_frame(read).await {
                if frame.kind == GOAWAY {
                    break;
                }
            }
        })
    });
    tokio::time::timeout(EVENT_TIMEOUT, futures::future::select_all(ends))
        .await
        .expect("a hoarding connection is closed");
}

/// The "MadeYouReset" pattern: streams the client makes the server reset (here by overflowing
/// each stream's flow-control window) are counted, and the connection gets GOAWAY.
#[tokio::test]
async fn streams_the_client_makes_the_server_reset_get_a_goaway() {
    use support::raw_h2::{self, GOAWAY, PING};
    let mut scene = Scene::start().await;
    let (mut read, mut write) = raw_h2::connect(scene.proxy.port).await;
    let reader = tokio::spawn(async move {
        let mut goaway = false;
        while let Some(frame) = raw_h2::read_frame(&mut read).await {
            match frame.kind {
                GOAWAY => goaway = true,
                PING if frame.flags & raw_h2::ACK != 0 && frame.payload == *b"finished" => break,
                _ => {}
            }
        }
        goaway
    });
    for i in 0..2_000u32 {
        let stream = 2 * i + 1;
        let mut bytes =
            raw_h2::grpc_headers(stream, "/flagd.sync.v1.FlagSyncService/SyncFlags", false);
        bytes.extend(raw_h2::window_update(stream, 0x7fff_ffff));
        if tokio::io::AsyncWriteExt::write_all(&mut write, &bytes)
            .await
            .is_err()
        {
            break;
        }
    }
    // Answered only if the connection is still served after all of it.
    let _ = tokio::io::AsyncWriteExt::write_all(&mut write, &raw_h2::ping(*b"finished")).await;
    let goaway = tokio::time::timeout(EVENT_TIMEOUT, reader)
        .await
        .expect("the reader ends")
        .expect("join");
    assert!(goaway, "2,000 server-side resets without a GOAWAY");
    scene.change().await;
}

/// Reads until the proxy closes the connection; panics if it stays open.
async fn wait_closed(tcp: &mut TcpStream) {
    support::wait_closed(tcp, "the proxy kept the connection open").await;
}

#[tokio::test]
async fn idle_and_dripping_connections_are_closed_after_their_deadline() {
    let mut scene = Scene::start_with(&["--handshake-timeout", "1s"]).await;
    let mut idle = Vec::new();
    for port in [scene.proxy.port, scene.proxy.management_port] {
        for _ in 0..20 {
            idle.push(
                TcpStream::connect(("127.0.0.1", port))
                    .await
                    .expect("connect"),
            );
        }
    }
    // One byte of the preface at a time, slower than the deadline allows for all of them.
    let mut drippers = tokio::task::JoinSet::new();
    for port in [scene.proxy.port, scene.proxy.management_port] {
        drippers.spawn(async move {
            let mut tcp = TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect");
            let (mut read, mut write) = tcp.split();
            let drip = async {
                for byte in support::raw_h2::PREFACE.iter().cycle() {
                    if write.write_all(&[*byte]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            };
            let mut buf = [0u8; 64];
            tokio::select! {
                () = drip => {}
                read = tokio::time::timeout(EVENT_TIMEOUT, read.read(&mut buf)) => {
                    let read = read.expect("the proxy closed the dripping connection");
                    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
                }
            }
        });
    }
    for tcp in &mut idle {
        wait_closed(tcp).await;
    }
    while let Some(done) = drippers.join_next().await {
        done.expect("dripper");
    }
    scene.change().await;
    // Connections that speak in time are served as before.
    scene.assert_healthy().await;
}

#[tokio::test]
async fn idle_management_connections_cannot_starve_the_probes_or_the_sync_port() {
    const IDLE: usize = 2_100;
    let mut scene = Scene::start().await;
    // The file-descriptor limit the attack was first seen with.
    let limited = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &scene.proxy.pid().to_string(),
            "--nofile=2048:2048",
        ])
        .status()
        .expect("prlimit");
    assert!(limited.success(), "prlimit");
    let attacker: IpAddr = "127.0.0.2".parse().expect("ip");
    let mut held = Vec::new();
    for _ in 0..IDLE {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind((attacker, 0).into()).expect("bind 127.0.0.2");
        let target = (
            "127.0.0.1".parse::<IpAddr>().expect("ip"),
            scene.proxy.management_port,
        );
        if let Ok(tcp) = socket.connect(target.into()).await {
            held.push(tcp);
        }
    }
    for _ in 0..5 {
        assert_eq!(scene.probe("/healthz").await, 200);
        assert_eq!(scene.probe("/readyz").await, 200);
    }
    assert!(
        scene
            .rejected("max_management_connections_per_address")
            .await
            > 0.0
    );
    // New subscribers still connect, and updates still flow.
    scene.subscribe().await;
    scene.change().await;
    drop(held);
}

/// HTTP/2 connections that finish their preface and then idle, from several addresses, fill
/// the management port's connection limit: health probes still get in (the connection quiet the
/// longest makes room for each), every time.
#[tokio::test]
async fn idle_http2_management_connections_from_many_addresses_cannot_lock_out_probes() {
    const ADDRESSES: u8 = 4;
    const PER_ADDRESS: usize = 4;
    let total = (usize::from(ADDRESSES) * PER_ADDRESS).to_string();
    let per_address = PER_ADDRESS.to_string();
    let scene = Scene::start_with(&[
        "--max-management-connections",
        &total,
        "--max-management-connections-per-address",
        &per_address,
    ])
    .await;
    let port = scene.proxy.management_port;
    let filled = support::attacks::management::fill(port, ADDRESSES, PER_ADDRESS).await;
    assert_eq!(
        filled.refused, 0,
        "every idle connection is admitted at first"
    );
    const PROBES: usize = 10;
    let answered = support::attacks::management::probes(port, PROBES, EVENT_TIMEOUT).await;
    assert_eq!(answered, PROBES, "every probe gets in");
    assert!(scene.rejected("max_management_connections").await > 0.0);
    drop(filled);
}

/// An HTTP/2 connection from `address` to `port` that is admitted and then opens no stream.
async fn idle_http2(address: IpAddr, port: u16) -> TcpStream {
    support::raw_h2::idle_from(address, port)
        .await
        .expect("admitted")
}

/// Idle HTTP/2 connections (preface sent, no stream) from several addresses fill
/// `--max-connections`: each new subscriber takes the place of an idle one, a connection with a
/// stream is never closed to make room, and once every connection has a stream, new ones are
/// refused.
#[tokio::test]
async fn idle_sync_connections_from_many_addresses_cannot_lock_out_subscribers() {
    const OPEN: &str = "flagd_proxy_open_connections{port=\"sync\"}";
    const LIMIT: usize = 12;
    // No idle timeout, no keepalive ping within the test and no preface deadline: only the
    // connection limit closes a connection here.
    let mut scene = Scene::start_with(&[
        "--max-connections",
        &LIMIT.to_string(),
        "--connection-idle-timeout",
        "0",
        "--keepalive-interval",
        "1h",
        "--handshake-timeout",
        "1h",
    ])
    .await;
    let free = LIMIT - scene.subscribers.len();
    let mut idle = Vec::new();
    for i in 0..free {
        let address = IpAddr::from([127, 0, 0, 2 + (i % 3) as u8]);
        idle.push(idle_http2(address, scene.proxy.port).await);
    }
    scene.proxy.wait_for_metric(OPEN, LIMIT as f64).await;
    // Every idle connection gives way to a subscriber, and the first subscribers stay.
    for _ in 0..free {
        scene.subscribe().await;
    }
    for tcp in &mut idle {
        wait_closed(tcp).await;
    }
    scene.change().await;
    assert_eq!(scene.metric(OPEN).await, LIMIT as f64);
    // Every connection serves a stream now: a new one is refused, and no subscriber is lost.
    let mut refused = TcpStream::connect(("127.0.0.1", scene.proxy.port))
        .await
        .expect("connect");
    wait_closed(&mut refused).await;
    scene.change().await;
}

/// A sync connection with no stream is closed after `--connection-idle-timeout`; connections
/// with a stream open stay however long they are quiet. Keepalive pings (which this client
/// would leave unanswered) go out only after an hour: nothing else closes the connection.
#[tokio::test]
async fn sync_connections_with_no_stream_are_closed_after_the_idle_timeout() {
    let mut scene = Scene::start_with(&[
        "--connection-idle-timeout",
        "1s",
        "--keepalive-interval",
        "1h",
    ])
    .await;
    let mut idle = idle_http2(IpAddr::from([127, 0, 0, 2]), scene.proxy.port).await;
    wait_closed(&mut idle).await;
    scene.change().await;
}

/// Connections that send one byte of the preface and close give their place in
/// `--max-connections` back at once, not when `--handshake-timeout` runs out (an hour here):
/// new clients are served.
#[tokio::test]
async fn a_peer_that_closes_before_its_preface_frees_its_place_at_once() {
    const OPEN: &str = "flagd_proxy_open_connections{port=\"sync\"}";
    let mut scene =
        Scene::start_with(&["--max-connections", "6", "--handshake-timeout", "1h"]).await;
    let before = scene.metric(OPEN).await;
    let free = 6 - before as usize;
    let mut held = Vec::new();
    for _ in 0..free {
        let mut tcp = TcpStream::connect(("127.0.0.1", scene.proxy.port))
            .await
            .expect("connect");
        tcp.write_all(&support::raw_h2::PREFACE[..1])
            .await
            .expect("one byte");
        held.push(tcp);
    }
    // Every place is taken; then the peers close.
    scene.proxy.wait_for_metric(OPEN, 6.0).await;
    drop(held);
    scene.proxy.wait_for_metric(OPEN, before).await;
    for _ in 0..free {
        scene.subscribe().await;
    }
    scene.change().await;
}

#[tokio::test]
async fn fetch_all_flags_for_missing_resources_holds_no_waiting_place() {
    // Watches of resources that exist stay long after their last client; these must not.
    let mut scene = Scene::start_with(&["--idle-timeout", "10m"]).await;
    let mut client = Client::new(scene.channel().await);
    for i in 0..MAX_WAITING * 3 {
        let status = client
            .fetch_all_flags(v1::FetchAllFlagsRequest {
                provider_id: String::new(),
                selector: format!("core.openfeature.dev/default/missing-{i}"),
            })
            .await
            .expect_err("does not exist");
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }
    // A client waiting for a resource about to be created gets a place, and its flags.
    let mut waiting = open(&mut client, "core.openfeature.dev/default/soon")
        .await
        .expect("a place to wait");
    scene
        .proxy
        .wait_for_metric("flagd_proxy_waiting_resources", 1.0)
        .await;
    write_color(scene.dir.path(), "default", "soon", "new", &["new"]);
    assert_eq!(color(&next(&mut waiting).await), "new");
    scene.change().await;
}

#[tokio::test]
async fn hostile_files_in_the_manifests_directory_do_not_stop_other_files() {
    let mut scene = Scene::start().await;
    let dir = scene.dir.path().to_owned();
    let fifo = dir.join("fifo.yaml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    scene.change().await;
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.yaml")).expect("symlink");
    scene.change().await;
    std::fs::create_dir(dir.join("loop")).expect("mkdir");
    std::os::unix::fs::symlink(&dir, dir.join("loop/up")).expect("symlink");
    std::os::unix::fs::symlink(dir.join("loop"), dir.join("loop/again")).expect("symlink");
    scene.change().await;

    // A megabyte of nested flow mappings, and one of nested JSON arrays.
    let nested = |open: &str, close: &str, inner: &str| {
        let depth = 1024 * 1024 / (open.len() + close.len());
        format!("{}{inner}{}", open.repeat(depth), close.repeat(depth))
    };
    std::fs::write(dir.join("flow.yaml"), nested("{a: ", "}", "1")).expect("write");
    scene.change().await;
    std::fs::write(dir.join("deep.json"), nested("[", "]", "1")).expect("write");
    std::fs::write(dir.join("deep.yaml"), nested("[", "]", "1")).expect("write");
    scene.change().await;
    // Each file is reported once its parse is done (other files' edits do not wait for it).
    wait_for_problems(
        &scene,
        &[
            "fifo.yaml",
            "zero.yaml",
            "flow.yaml",
            "deep.json",
            "deep.yaml",
        ],
    )
    .await;
    scene.assert_healthy().await;
}

/// Waits until `/status` reports a problem for each of the files `names`.
async fn wait_for_problems(scene: &Scene, names: &[&str]) {
    let deadline = std::time::Instant::now() + support::EVENT_TIMEOUT;
    loop {
        let page = scene.proxy.status_page().await;
        let problems: Vec<&str> = page
            .source_status
            .problems()
            .iter()
            .map(|p| p.path.as_str())
            .collect();
        let missing: Vec<&&str> = names
            .iter()
            .filter(|name| !problems.iter().any(|p| p.ends_with(**name)))
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{missing:?} not reported: {problems:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A field of /proc/<pid>/status in KiB.
fn proc_status_kib(pid: u32, field: &str) -> u64 {
    Process::Id(pid)
        .status()
        .expect("status")
        .number(field)
        .expect("field")
}

/// CPU time (user + system) of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    Process::Id(pid).cpu_ticks().expect("stat")
}

/// YAML that would cost memory or time out of proportion to its size is refused before it is
/// deserialized: one 100 KB anchor referenced 20,000 times (2 GB expanded) and 800 KB of flow
/// mappings nested through quoted scalars that hold closing brackets. Both are reported, the
/// proxy's peak memory and CPU time stay small, and another file's edit is served meanwhile.
#[tokio::test]
async fn yaml_aliases_and_brackets_in_quoted_scalars_cost_nothing_out_of_proportion() {
    use support::attacks::yaml;
    let mut scene = Scene::start().await;
    let dir = scene.dir.path().to_owned();
    let pid = scene.proxy.pid();
    let ticks_before = cpu_ticks(pid);
    let aliases = yaml::aliases(100 * 1024, 20_000);
    std::fs::write(dir.join("aliases.yaml"), aliases).expect("write");
    let quoted = yaml::quoted_brackets(800 * 1024);
    std::fs::write(dir.join("quoted.yaml"), quoted).expect("write");
    scene.change().await;
    wait_for_problems(&scene, &["aliases.yaml", "quoted.yaml"]).await;
    scene.change().await;
    // Expanded, the aliases alone are 2 GB; parsed, the nesting took tens of CPU seconds.
    let peak_mib = proc_status_kib(pid, "VmHWM") / 1024;
    assert!(peak_mib < yaml::PEAK_MIB_AT_MOST, "peak RSS {peak_mib} MiB");
    let cpu_seconds = (cpu_ticks(pid) - ticks_before) / 100;
    assert!(
        cpu_seconds < yaml::CPU_SECONDS_AT_MOST,
        "{cpu_seconds} s of CPU"
    );
    scene.assert_healthy().await;
}

#[tokio::test]
async fn a_manifests_directory_swapped_by_symlink_is_followed() {
    let root = tempfile::tempdir().expect("tempdir");
    let revision = |n: usize, color: &str| {
        let dir = root.path().join(format!("rev-{n}"));
        std::fs::create_dir(&dir).expect("mkdir");
        write_color(&dir, "default", "demo", color, &[color]);
        dir
    };
    let current = root.path().join("current");
    // Publishes a revision the way git-sync does: a new symlink renamed over the old one.
    let publish = |target: &std::path::Path| {
        let tmp = root.path().join("current.tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp).expect("symlink");
        std::fs::rename(&tmp, &current).expect("swap");
    };
    publish(&revision(1, "one"));
    let proxy = Proxy::start(&["--manifests", &current.display().to_string()]).await;
    let channel = Endpoint::from_shared(proxy.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut stream = Client::new(channel)
        .sync_flags(with_selector(v1::SyncFlagsRequest::default(), SELECTOR))
        .await
        .expect("stream")
        .into_inner();
    assert_eq!(color(&next(&mut stream).await), "one");
    for (n, want) in [(2, "two"), (3, "three")] {
        let old = std::fs::read_link(&current).expect("link");
        publish(&revision(n, want));
        std::fs::remove_dir_all(old).expect("remove the old revision");
        while color(&next(&mut stream).await) != want {}
    }
    // Deleted and created again.
    let target = std::fs::read_link(&current).expect("link");
    std::fs::remove_file(&current).expect("remove the link");
    std::fs::remove_dir_all(&target).expect("remove");
    publish(&revision(4, "four"));
    while color(&next(&mut stream).await) != "four" {}
}

#[tokio::test]
async fn sighup_leaves_the_proxy_serving_and_sigquit_drains() {
    let mut scene = Scene::start().await;
    for _ in 0..3 {
        scene.proxy.signal("HUP");
        scene.proxy.signal("USR1");
        scene
            .proxy
            .wait_for_log("signal received and ignored")
            .await;
        scene.change().await;
    }
    assert!(scene.proxy.running());
    scene.proxy.signal("QUIT");
    for stream in &mut scene.subscribers {
        let ended = tokio::time::timeout(EVENT_TIMEOUT, stream.message())
            .await
            .expect("the stream ends");
        let status = ended.expect_err("ended with a status");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    }
    let exit = scene.proxy.wait_exit().await;
    assert!(exit.success(), "{exit:?}");
}

/// Not a check: prints the memory an unfinished stream and an idle connection cost, for the
/// budgets in docs/security.md. Run with
/// `cargo test --release --test hostile measure_budgets -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a measurement, not a check"]
async fn measure_budgets() {
    use support::raw_h2;
    const CONNECTIONS: usize = 8;
    const STREAMS: u32 = 1_000;
    let scene = Scene::start_with(&[
        "--request-timeout",
        "10m",
        "--max-pending-requests-per-address",
        "0",
        "--max-connections-per-address",
        "2000",
    ])
    .await;
    let port = scene.proxy.port;
    let settle = || tokio::time::sleep(Duration::from_secs(2));
    settle().await;
    let base = scene.proxy.rss_bytes();

    let mut idle = Vec::new();
    for _ in 0..1_000 {
        let (mut read, mut write) = raw_h2::connect(port).await;
        write
            .write_all(&raw_h2::ping(*b"settled!"))
            .await
            .expect("ping");
        settled(&mut read).await;
        idle.push((read, write));
    }
    settle().await;
    let with_idle = scene.proxy.rss_bytes();
    eprintln!(
        "1,000 idle HTTP/2 connections: {} KiB each",
        with_idle.saturating_sub(base) / 1_000 / 1024
    );

    let mut held = Vec::new();
    for _ in 0..CONNECTIONS {
        let (mut read, mut write) = raw_h2::connect(port).await;
        let mut bytes = unfinished_sync_streams(STREAMS);
        bytes.extend(raw_h2::ping(*b"settled!"));
        write.write_all(&bytes).await.expect("streams");
        settled(&mut read).await;
        held.push((read, write));
    }
    settle().await;
    let with_streams = scene.proxy.rss_bytes();
    let streams = u64::from(STREAMS) * CONNECTIONS as u64;
    eprintln!(
        "{streams} unfinished streams: {} KiB each; RSS {} MiB before, {} MiB with them",
        with_streams.saturating_sub(with_idle) / streams / 1024,
        base >> 20,
        with_streams >> 20
    );
    // What the connections keep once every stream has ended (their requests end without a
    // message) and they sit idle.
    let ends: Vec<u8> = (0..STREAMS)
        .flat_map(|i| raw_h2::frame(raw_h2::DATA, raw_h2::END_STREAM, 2 * i + 1, &[]))
        .collect();
    for (read, write) in &mut held {
        write.write_all(&ends).await.expect("end the streams");
        all_streams_end(read, STREAMS).await;
    }
    settle().await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let ended = scene.proxy.rss_bytes();
    eprintln!(
        "once they ended, kept while the connections stay open: {} bytes per stream of their busiest moment",
        ended.saturating_sub(with_idle) / streams
    );
    // What is given back to the system once the clients have gone.
    drop(held);
    drop(idle);
    scene
        .proxy
        .wait_for_metric("flagd_proxy_open_connections{port=\"sync\"}", 3.0)
        .await;
    // Allocators give memory back after a decay time (jemalloc: 10 s by default).
    tokio::time::sleep(Duration::from_secs(25)).await;
    eprintln!(
        "after the clients left: RSS {} MiB ({} MiB kept of {} MiB taken)",
        scene.proxy.rss_bytes() >> 20,
        scene.proxy.rss_bytes().saturating_sub(base) >> 20,
        with_streams.saturating_sub(base) >> 20
    );
}

/// Reads a connection's frames until the ACK of a PING sent after everything else: the server
/// has read what came before it.
async fn settled(read: &mut tokio::net::tcp::OwnedReadHalf) {
    use support::raw_h2::{self, ACK, PING};
    while let Some(frame) = raw_h2::read_frame(read).await {
        if frame.kind == PING && frame.flags & ACK != 0 {
            return;
        }
    }
    panic!("the connection closed");
}

/// After a burst of clients has gone, the memory it took goes back to the system (the
/// allocator's background thread returns freed pages within its decay time; the system
/// allocator kept nearly all of it: 48 of 51 MiB). Half given back is asked for; jemalloc
/// gives back nearly all.
#[tokio::test]
async fn memory_taken_by_a_burst_of_clients_goes_back_once_they_leave() {
    use support::raw_h2;
    // 4,000 streams, charged about 32 MiB: under the node tier's budget (36 MiB), so that the
    // test runs the same in a memory cgroup at that tier's limit.
    const CONNECTIONS: usize = 4;
    const STREAMS: u32 = 1_000;
    const OPEN: &str = "flagd_proxy_open_connections{port=\"sync\"}";
    let scene = Scene::start_with(&[
        "--request-timeout",
        "10m",
        "--max-pending-requests-per-address",
        "0",
    ])
    .await;
    let open = scene.metric(OPEN).await;
    let base = scene.proxy.rss_bytes();
    let mut held = Vec::new();
    for _ in 0..CONNECTIONS {
        let (mut read, mut write) = raw_h2::connect(scene.proxy.port).await;
        let mut bytes = unfinished_sync_streams(STREAMS);
        bytes.extend(raw_h2::ping(*b"settled!"));
        write.write_all(&bytes).await.expect("streams");
        settled(&mut read).await;
        held.push((read, write));
    }
    // 8,000 streams at a few KiB each measured 31-51 MiB (debug build), so for these 4,000 only
    // a floor well under half that is asked for; the check is the share given back.
    let taken = scene.proxy.rss_bytes().saturating_sub(base);
    assert!(taken > 8 << 20, "the burst took only {} MiB", taken >> 20);
    drop(held);
    scene.proxy.wait_for_metric(OPEN, open).await;
    support::eventually("the memory goes back", || async {
        let kept = scene.proxy.rss_bytes().saturating_sub(base);
        if kept < taken / 2 {
            Ok(())
        } else {
            Err(format!("{} of {} MiB kept", kept >> 20, taken >> 20))
        }
    })
    .await;
}

/// A client that stops reading (and so cannot answer pings either) while the proxy has megabytes
/// to send it: the connection itself is closed, not only its streams.
#[tokio::test]
async fn a_client_that_stops_reading_is_disconnected() {
    use support::raw_h2::{self, SETTINGS};
    const RESOURCES: usize = 8;
    let scene =
        Scene::start_with(&["--keepalive-interval", "1s", "--keepalive-timeout", "1s"]).await;
    // Eight resources of about 1 MiB each (one variant's value): more than the kernel buffers
    // between the two ends.
    let big = "x".repeat(1024 * 1024);
    for i in 0..RESOURCES {
        let flags = serde_json::json!({"color": {
            "state": "ENABLED",
            "variants": {"big": big},
            "defaultVariant": "big",
        }});
        write_manifest(scene.dir.path(), "default", &format!("big-{i}"), flags);
    }
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .set_recv_buffer_size(4096)
        .expect("small receive buffer");
    let tcp = socket
        .connect(("127.0.0.1".parse::<IpAddr>().expect("ip"), scene.proxy.port).into())
        .await
        .expect("connect");
    let ours = tcp.local_addr().expect("local address").port();
    let (_read, mut write) = tcp.into_split();
    let mut bytes = raw_h2::PREFACE.to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE = 2^31 - 1, and as much for the connection: flow control
    // never holds the proxy back, only the socket does.
    let mut settings = vec![0, 4];
    settings.extend(0x7fff_ffffu32.to_be_bytes());
    bytes.extend(raw_h2::frame(SETTINGS, 0, 0, &settings));
    bytes.extend(raw_h2::window_update(0, 0x7fff_ffff - 65_535));
    for i in 0..RESOURCES {
        let stream = 2 * u32::try_from(i).expect("small") + 1;
        let selector = format!("core.openfeature.dev/default/big-{i}");
        bytes.extend(subscription(stream, &selector));
    }
    write.write_all(&bytes).await.expect("requests");
    // Never read: the proxy's writes stall, its pings go unanswered, and it hangs up. Its end of
    // this connection, as the kernel lists it, leaves ESTABLISHED once it does (what it still
    // has to send keeps it from reaching this end). Watched per connection: the open-connection
    // gauge also counts the scene's subscribers, which the one-second keepalive may cut too
    // on a busy machine.
    support::eventually(
        "the proxy hangs up on the client that stopped reading",
        || async {
            match proxy_side_state(scene.proxy.port, ours) {
                Some(TcpSocket::ESTABLISHED) => Err("its end is still established"),
                _ => Ok(()),
            }
        },
    )
    .await;
    scene.assert_healthy().await;
}

/// The kernel's state (`/proc/net/tcp`'s `st`) of the proxy's end of the loopback connection
/// between its port `proxy_port` and the test's port `client_port`; `None` once the kernel no
/// longer lists it.
fn proxy_side_state(proxy_port: u16, client_port: u16) -> Option<u8> {
    Process::This
        .tcp()
        .into_iter()
        .find(|socket| socket.local_port == proxy_port && socket.remote_port == client_port)
        .map(|socket| socket.state)
}

/// Opens a call on `path` whose request headers go out but whose message never does, and
/// returns the status it ends with (in its response headers or in its trailers).
async fn call_without_its_message(channel: Channel, path: &'static str) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("the channel is ready");
    let request = tonic::Request::new(futures::stream::pending::<v1::SyncFlagsRequest>());
    let call = async {
        let response = grpc
            .streaming(
                request,
                http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::<v1::SyncFlagsRequest, v1::SyncFlagsResponse>::default(),
            )
            .await;
        match response {
            Err(status) => status,
            Ok(response) => match response.into_inner().message().await {
                Err(status) => status,
                Ok(message) => panic!("{path} answered a call without a request: {message:?}"),
            },
        }
    };
    tokio::time::timeout(EVENT_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| panic!("{path}: a call whose request never came did not end"))
}

/// A call whose request message never arrives ends at --request-timeout with DEADLINE_EXCEEDED
/// and a message naming the limit: SyncFlags of both protocols, and a unary method; the
/// subscribers are served meanwhile and after.
#[tokio::test]
async fn a_request_message_that_never_arrives_ends_with_deadline_exceeded() {
    let mut scene = Scene::start_with(&["--request-timeout", "1s"]).await;
    for path in [
        "/flagd.sync.v1.FlagSyncService/SyncFlags",
        "/sync.v1.FlagSyncService/SyncFlags",
        "/flagd.sync.v1.FlagSyncService/FetchAllFlags",
    ] {
        let status = call_without_its_message(scene.channel().await, path).await;
        assert_status(
            &status,
            Code::DeadlineExceeded,
            "the request message did not arrive within 1s (--request-timeout)",
        );
        scene.change().await;
    }
    scene.assert_healthy().await;
}

/// A FeatureFlag whose flag-set metadata is large: `flagd.sync.v1` sends it again in every
/// message's `sync_context`, so a document under `--max-document-bytes` made a message of twice
/// its size, over the 4 MiB every default gRPC client accepts (they failed the stream with
/// RESOURCE_EXHAUSTED and reconnected in a loop). The whole message counts against the limit:
/// such a version is refused with the reason, and a default client keeps its stream and its last
/// version, then gets the next valid one.
#[tokio::test]
async fn metadata_that_would_double_a_message_past_the_clients_limit_is_refused() {
    use support::attacks::metadata::{NOTES_BYTES, manifest};
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |default: &str, notes_bytes: usize| {
        support::write_atomically(
            &dir.path().join("default-demo.yaml"),
            &manifest(default, &["red", "blue", "green"], notes_bytes),
        );
    };
    write("red", 0);
    let manifests = dir.path().to_str().expect("utf-8").to_owned();
    let proxy = Proxy::start(&["--manifests", &manifests]).await;
    let mut client = support::client::client(&proxy).await;
    let mut stream = open(&mut client, "core.openfeature.dev/default/demo")
        .await
        .expect("stream");
    assert_eq!(color(&next(&mut stream).await), "red");

    // 2.3 MB of metadata: the document is under the limit, the message would not be.
    write("blue", NOTES_BYTES);
    proxy
        .wait_for_log("sent again in every message's sync_context")
        .await;
    write("green", 0);
    assert_eq!(
        color(&next(&mut stream).await),
        "green",
        "the stream stays healthy and skips the refused version"
    );
}

/// One connection opens the connection's window but never a stream's, and opens a new
/// SyncFlags stream for every version of a 1 MiB document: each stream pins the version it
/// cannot send. The memory budget bounds them: once pinned versions fill it, new streams are
/// refused, what is held stays near the budget, and reading subscribers keep being served.
#[tokio::test]
async fn streams_that_pin_versions_they_cannot_send_are_bounded_by_the_memory_budget() {
    const MIB: f64 = 1024.0 * 1024.0;
    let mut scene = Scene::start_with(&["--memory-budget", "16Mi"]).await;
    let attack = Pinned {
        versions: 40,
        bytes: 1024 * 1024,
    };
    let (outcome, attacker) = attack
        .run(
            scene.dir.path(),
            scene.proxy.port,
            scene.proxy.management_port,
        )
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    if let Err(error) = outcome.bounded_by(16.0) {
        panic!("{error}: {outcome:?}");
    }
    // Established subscribers are served at the budget; new ones are let in once the attacker
    // has gone and its pinned versions with it.
    scene.change().await;
    drop(attacker);
    support::eventually("the attacker's versions are let go", || async {
        let pinned = scene.metric(PINNED).await;
        if pinned < 4.0 * MIB {
            Ok(())
        } else {
            Err(format!("{} MiB pinned", pinned / MIB))
        }
    })
    .await;
    scene.subscribe().await;
    scene.change().await;
}

/// An HTTP/2 connection whose streams' windows open only as the test reads (the connection's
/// window is as large as HTTP/2 allows, so one stream that is behind holds no other back).
async fn held_connection(port: u16) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(65_535)
        .initial_connection_window_size(0x7fff_ffff)
        .handshake(tcp)
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(connection);
    send
}

/// Opens a `flagd.sync.v1` stream of `selector` and reads its data until its window is full:
/// the proxy has more to send that the client has not taken.
async fn stream_behind(
    send: &mut h2::client::SendRequest<bytes::Bytes>,
    selector: &str,
) -> (h2::RecvStream, Vec<u8>) {
    let request = http::Request::post("http://127.0.0.1/flagd.sync.v1.FlagSyncService/SyncFlags")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let body = support::raw_h2::sync_request(selector);
    *send = send.clone().ready().await.expect("ready");
    let (response, mut request_body) = send.send_request(request, false).expect("send request");
    request_body
        .send_data(body.into(), true)
        .expect("request message");
    let response = tokio::time::timeout(EVENT_TIMEOUT, response)
        .await
        .expect("response headers")
        .expect("response");
    assert_eq!(response.status(), 200);
    let mut data = response.into_body();
    let mut received = Vec::new();
    while received.len() < 65_535 {
        let chunk = tokio::time::timeout(EVENT_TIMEOUT, data.data())
            .await
            .expect("the first window of data")
            .expect("more data")
            .expect("data");
        received.extend_from_slice(&chunk);
    }
    (data, received)
}

/// How a stream ended: the whole messages it carried and its `grpc-status` (if its trailers
/// came).
#[derive(Debug, PartialEq)]
struct Ended {
    messages: usize,
    status: Option<String>,
}

/// Reads the rest of a stream (`taken` is what was read of it without opening its window again),
/// opening its window as it goes.
async fn read_to_end((mut data, mut taken): (h2::RecvStream, Vec<u8>)) -> Ended {
    let _ = data.flow_control().release_capacity(taken.len());
    while let Some(Ok(chunk)) = data.data().await {
        let _ = data.flow_control().release_capacity(chunk.len());
        taken.extend_from_slice(&chunk);
    }
    let mut messages = 0;
    let mut rest = taken.as_slice();
    while rest.len() >= 5 {
        let length = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if rest.len() < 5 + length {
            break;
        }
        messages += 1;
        rest = &rest[5 + length..];
    }
    let status = match data.trailers().await {
        Ok(Some(trailers)) => trailers
            .get("grpc-status")
            .and_then(|s| s.to_str().ok())
            .map(str::to_owned),
        _ => None,
    };
    Ended { messages, status }
}

/// Subscribers that are behind when the proxy is told to stop (it has written data that they
/// have not taken: their flow-control windows are full), some of a resource with a newer version
/// since: once they read again, every stream ends with UNAVAILABLE right after the message it
/// was receiving (a newer version is not queued behind a message the client has not taken, so
/// it does not stand between the client and the status; the client gets it as it reconnects).
#[tokio::test]
async fn streams_behind_at_shutdown_end_with_unavailable_once_read() {
    const CONNECTIONS: usize = 4;
    const STREAMS: usize = 50;
    let dir = tempfile::tempdir().expect("tempdir");
    // Each version is larger than a stream's initial window (64 KiB).
    let big = |version: &str| format!("{version}{}", "x".repeat(200 * 1024));
    for name in ["steady", "changing"] {
        write_color(dir.path(), "default", name, &big("v1"), &[&big("v1")]);
    }
    let dir_arg = dir.path().display().to_string();
    // A drain bound the test never reaches: it counts statuses, it does not time them.
    let mut proxy = Proxy::start(&[
        "--manifests",
        &dir_arg,
        "--shutdown-timeout",
        "10m",
        "--max-connections-per-address",
        "64",
    ])
    .await;
    let mut streams = Vec::new();
    // The clients' connections stay open for as long as the test runs (an HTTP/2 client whose
    // last handle is dropped starts closing its connection).
    let mut connections = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut send = held_connection(proxy.port).await;
        for i in 0..STREAMS {
            let name = if i % 2 == 0 { "steady" } else { "changing" };
            let selector = format!("core.openfeature.dev/default/{name}");
            streams.push(stream_behind(&mut send, &selector).await);
        }
        connections.push(send);
    }
    // A subscriber that keeps up sees the newer version: the streams that are behind could
    // take it now.
    let channel = Endpoint::from_shared(proxy.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = Client::new(channel);
    let mut current = open(&mut client, "core.openfeature.dev/default/changing")
        .await
        .expect("stream");
    next(&mut current).await;
    write_color(dir.path(), "default", "changing", &big("v2"), &[&big("v2")]);
    assert!(color(&next(&mut current).await).starts_with("v2"));

    proxy.signal("TERM");
    proxy.wait_for_log("shutting down: ending streams").await;
    let ended = futures::future::join_all(streams.into_iter().map(read_to_end)).await;
    let want = Ended {
        messages: 1,
        status: Some("14".to_owned()),
    };
    let others: Vec<&Ended> = ended.iter().filter(|e| **e != want).collect();
    assert!(
        others.is_empty(),
        "{} of {} streams ended otherwise than with their one message and UNAVAILABLE: {others:?}\nthe proxy's last lines:\n{}",
        others.len(),
        ended.len(),
        proxy.last_log_lines(40)
    );
    drop(connections);
    let exit = proxy.wait_exit().await;
    assert!(exit.success(), "{exit:?}");
}
