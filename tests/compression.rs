//! gzip over real sockets: clients that list it in `grpc-accept-encoding` get `grpc-encoding:
//! gzip` and compressed messages that decode to the exact document; others get identity; each
//! version is compressed once, however many streams take it; a slow gzip client still skips to
//! the newest version.
use flagd_proxy_testkit as support;

use std::io::Read;

use serde_json::{Value, json};
use support::client::{self, channel, fetch, legacy, next, v1, with_selector};
use support::flag_sets::realistic_flags;
use support::{EVENT_TIMEOUT, Proxy, write_manifest};
use tokio::io::AsyncWriteExt;
use tonic::codec::CompressionEncoding;

const NAME: &str = "flags";
const SELECTOR: &str = "core.openfeature.dev/default/flags";
/// Well above the default --compression-min-bytes.
const LARGE: usize = 200 * 1024;

type GzipClient = v1::flag_sync_service_client::FlagSyncServiceClient<tonic::transport::Channel>;

/// Writes version `seq` of the resource: `bytes` of generated flags, and a flag `seq` whose
/// default variant names the version.
fn write_version(dir: &std::path::Path, seq: u64, bytes: usize) -> Value {
    let mut flags = realistic_flags(seq, bytes);
    flags.insert(
        "seq".into(),
        json!({"state": "ENABLED", "variants": {(format!("v{seq}")): seq}, "defaultVariant": format!("v{seq}")}),
    );
    let flags = Value::Object(flags);
    write_manifest(dir, "default", NAME, flags.clone());
    flags
}

fn flags_of(flag_configuration: &str) -> Value {
    let document: Value = serde_json::from_str(flag_configuration).expect("JSON");
    document["flags"].clone()
}

fn seq_of(flag_configuration: &str) -> String {
    flags_of(flag_configuration)["seq"]["defaultVariant"]
        .as_str()
        .expect("the seq flag")
        .to_owned()
}

async fn start(dir: &std::path::Path, extra: &[&str]) -> Proxy {
    let mut args = vec!["--manifests", dir.to_str().expect("utf-8")];
    args.extend(extra);
    Proxy::start(&args).await
}

async fn client(proxy: &Proxy, gzip: bool) -> GzipClient {
    let client = GzipClient::new(channel(proxy.port).await);
    if gzip {
        client.accept_compressed(CompressionEncoding::Gzip)
    } else {
        client
    }
}

/// Opens a `flagd.sync.v1` stream; its `grpc-encoding` response header and the stream.
async fn open(
    client: &mut GzipClient,
) -> (Option<String>, tonic::Streaming<v1::SyncFlagsResponse>) {
    let request = with_selector(v1::SyncFlagsRequest::default(), SELECTOR);
    let response = tokio::time::timeout(EVENT_TIMEOUT, client.sync_flags(request))
        .await
        .expect("the proxy answers")
        .expect("a stream");
    let encoding = grpc_encoding(&response).map(str::to_owned);
    (encoding, response.into_inner())
}

/// The `grpc-encoding` header of a response.
fn grpc_encoding<T>(response: &tonic::Response<T>) -> Option<&str> {
    response
        .metadata()
        .get("grpc-encoding")
        .map(|v| v.to_str().expect("ascii"))
}

fn sent(encoding: &str) -> String {
    format!("flagd_proxy_sent_bytes_total{{encoding=\"{encoding}\"}}")
}

fn compressed(encoding: &str) -> String {
    format!("flagd_proxy_messages_compressed_total{{encoding=\"{encoding}\"}}")
}

#[tokio::test]
async fn gzip_clients_get_gzip_and_the_exact_document_and_others_get_identity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let written = write_version(dir.path(), 1, LARGE);
    let proxy = start(dir.path(), &[]).await;

    let (encoding, mut plain) = open(&mut client(&proxy, false).await).await;
    assert_eq!(
        encoding, None,
        "no grpc-encoding for a client that does not list gzip"
    );
    let identity = next(&mut plain).await.flag_configuration;
    assert_eq!(flags_of(&identity), written);
    let identity_bytes = proxy.metric(&sent("identity")).await;
    assert!(identity_bytes > LARGE as f64, "{identity_bytes}");
    assert_eq!(proxy.metric(&sent("gzip")).await, 0.0);

    let mut gzip_client = client(&proxy, true).await;
    let (encoding, mut gzip) = open(&mut gzip_client).await;
    assert_eq!(encoding.as_deref(), Some("gzip"));
    assert_eq!(next(&mut gzip).await.flag_configuration, identity);
    let gzip_bytes = proxy.metric(&sent("gzip")).await;
    assert!(
        gzip_bytes > 0.0 && gzip_bytes * 4.0 < identity_bytes,
        "{gzip_bytes} gzip bytes for {identity_bytes} uncompressed"
    );
    assert_eq!(proxy.metric(&sent("identity")).await, identity_bytes);
    let ratio = proxy
        .metric("flagd_proxy_compression_ratio{namespace=\"default\",name=\"flags\"}")
        .await;
    assert!(ratio > 4.0, "{ratio}");

    // The legacy protocol and FetchAllFlags too.
    let mut legacy_client =
        legacy::flag_sync_service_client::FlagSyncServiceClient::new(channel(proxy.port).await)
            .accept_compressed(CompressionEncoding::Gzip);
    let response = legacy_client
        .sync_flags(with_selector(legacy::SyncFlagsRequest::default(), SELECTOR))
        .await
        .expect("a legacy stream");
    assert_eq!(grpc_encoding(&response), Some("gzip"));
    let mut legacy_stream = response.into_inner();
    assert_eq!(next(&mut legacy_stream).await.flag_configuration, identity);
    let fetched = gzip_client
        .fetch_all_flags(with_selector(v1::FetchAllFlagsRequest::default(), SELECTOR))
        .await
        .expect("FetchAllFlags");
    assert_eq!(grpc_encoding(&fetched), Some("gzip"));
    assert_eq!(fetched.into_inner().flag_configuration, identity);
    let fetched = client(&proxy, false)
        .await
        .fetch_all_flags(with_selector(v1::FetchAllFlagsRequest::default(), SELECTOR))
        .await
        .expect("FetchAllFlags");
    assert_eq!(grpc_encoding(&fetched), None);
    assert_eq!(fetched.into_inner().flag_configuration, identity);
    for encoding in ["flagd.sync.v1+gzip", "sync.v1+gzip", "FetchAllFlags+gzip"] {
        assert_eq!(proxy.metric(&compressed(encoding)).await, 1.0, "{encoding}");
    }
}

#[tokio::test]
async fn small_documents_and_compression_off_send_identity() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_version(dir.path(), 1, 1024);
    let proxy = start(dir.path(), &[]).await;
    let (encoding, mut stream) = open(&mut client(&proxy, true).await).await;
    // The stream may carry gzip; this message is below --compression-min-bytes.
    assert_eq!(encoding.as_deref(), Some("gzip"));
    next(&mut stream).await;
    assert_eq!(proxy.metric(&sent("gzip")).await, 0.0);
    assert!(proxy.metric(&sent("identity")).await > 1024.0);
    assert_eq!(proxy.metric(&compressed("flagd.sync.v1+gzip")).await, 0.0);

    let dir = tempfile::tempdir().expect("tempdir");
    write_version(dir.path(), 1, LARGE);
    let proxy = start(dir.path(), &["--compression", "off"]).await;
    let (encoding, mut stream) = open(&mut client(&proxy, true).await).await;
    assert_eq!(encoding, None);
    next(&mut stream).await;
    assert_eq!(proxy.metric(&sent("gzip")).await, 0.0);
    assert_eq!(proxy.metric(&compressed("flagd.sync.v1+gzip")).await, 0.0);
}

#[tokio::test]
async fn a_version_is_compressed_once_however_many_streams_take_it() {
    const STREAMS: usize = 20;
    let dir = tempfile::tempdir().expect("tempdir");
    write_version(dir.path(), 1, LARGE);
    let proxy = start(dir.path(), &[]).await;
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let (_, stream) = open(&mut client(&proxy, true).await).await;
        streams.push(stream);
    }
    for stream in &mut streams {
        assert_eq!(seq_of(&next(stream).await.flag_configuration), "v1");
    }
    write_version(dir.path(), 2, LARGE);
    for stream in &mut streams {
        assert_eq!(seq_of(&next(stream).await.flag_configuration), "v2");
    }
    assert_eq!(
        proxy.metric("flagd_proxy_versions_published_total").await,
        2.0
    );
    assert_eq!(proxy.metric(&compressed("flagd.sync.v1+gzip")).await, 2.0);
    assert_eq!(
        proxy
            .metric("flagd_proxy_updates_sent_total{protocol=\"flagd.sync.v1\"}")
            .await,
        (2 * STREAMS) as f64
    );
}

/// A client that lists gzip and stops reading: HTTP/2 flow control holds the proxy back once
/// the client's 64 KiB window is full, the versions published meanwhile are skipped, and when
/// the client reads again it gets the newest one (each message gzip, each whole).
#[tokio::test]
async fn a_slow_gzip_client_skips_to_the_newest_version() {
    use support::raw_h2::{self, DATA, END_STREAM};
    const VERSIONS: u64 = 8;
    let dir = tempfile::tempdir().expect("tempdir");
    // 80 KiB of random hex digits: gzip halves them, so one message (about 40 KiB) fits the
    // client's 64 KiB window and two do not.
    let padded = |seq: u64| {
        let mut flags = realistic_flags(seq, 0);
        let mut state = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let pad: String = (0..80 * 1024)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                char::from_digit((state % 16) as u32, 16).expect("a digit")
            })
            .collect();
        flags.insert(
            "seq".into(),
            json!({"state": "ENABLED", "variants": {(format!("v{seq}")): pad}, "defaultVariant": format!("v{seq}")}),
        );
        write_manifest(dir.path(), "default", NAME, Value::Object(flags));
    };
    padded(1);
    let proxy = start(dir.path(), &[]).await;

    let (mut read, mut write) = raw_h2::connect(proxy.port).await;
    let body = raw_h2::sync_request(SELECTOR);
    let mut bytes = raw_h2::grpc_headers_with(
        1,
        "/flagd.sync.v1.FlagSyncService/SyncFlags",
        false,
        &[("grpc-accept-encoding", "gzip")],
    );
    bytes.extend(raw_h2::frame(DATA, END_STREAM, 1, &body));
    write.write_all(&bytes).await.expect("request");

    let mut messages = Messages::default();
    assert_eq!(messages.next(&mut read).await, "v1");
    for seq in 2..=VERSIONS {
        padded(seq);
        proxy
            .wait_for_metric("flagd_proxy_versions_published_total", seq as f64)
            .await;
    }
    // Read again: open the stream's and the connection's windows.
    let mut more = raw_h2::window_update(0, 1 << 30);
    more.extend(raw_h2::window_update(1, 1 << 30));
    write.write_all(&more).await.expect("window update");
    let mut seen = vec!["v1".to_owned()];
    while seen.last().map(String::as_str) != Some(&format!("v{VERSIONS}")) {
        seen.push(messages.next(&mut read).await);
    }
    assert!(
        seen.len() < VERSIONS as usize,
        "the slow client was sent every version: {seen:?}"
    );
    assert!(proxy.metric("flagd_proxy_versions_skipped_total").await > 0.0);
}

/// The gRPC messages of stream 1 read from raw HTTP/2 frames: each must be gzip-compressed.
#[derive(Default)]
struct Messages {
    buffer: Vec<u8>,
}

impl Messages {
    /// The `seq` variant of the next message.
    async fn next(&mut self, read: &mut tokio::net::tcp::OwnedReadHalf) -> String {
        use support::raw_h2::{self, DATA};
        loop {
            if self.buffer.len() >= 5 {
                let length = u32::from_be_bytes(self.buffer[1..5].try_into().expect("4")) as usize;
                if self.buffer.len() >= 5 + length {
                    assert_eq!(self.buffer[0], 1, "a compressed message");
                    let rest = self.buffer.split_off(5 + length);
                    let message = std::mem::replace(&mut self.buffer, rest);
                    let mut decoded = Vec::new();
                    flate2::read::GzDecoder::new(&message[5..])
                        .read_to_end(&mut decoded)
                        .expect("gzip");
                    let response: v1::SyncFlagsResponse =
                        prost::Message::decode(&decoded[..]).expect("a SyncFlagsResponse");
                    return seq_of(&response.flag_configuration);
                }
            }
            let frame = tokio::time::timeout(EVENT_TIMEOUT, raw_h2::read_frame(read))
                .await
                .expect("a frame in time")
                .expect("the connection stays open");
            if frame.kind == DATA && frame.stream == 1 {
                self.buffer.extend(frame.payload);
            }
        }
    }
}

/// Resources of about 259 KiB, each asked for in every form a client can ask for it: both
/// protocols' streams and `FetchAllFlags`, each plain and with gzip. What the proxy charges for
/// their versions is each document once, its one deflated copy (which every gzip message
/// shares) and a little around them, not a copy per form (4.5 times the documents here before).
/// Run in a memory cgroup (`FLAGD_PROXY_TEST_MEMORY_CGROUP`), the kernel judges what is held.
#[tokio::test]
async fn a_version_asked_for_in_every_form_is_held_once() {
    const RESOURCES: usize = 24;
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..RESOURCES {
        let flags = Value::Object(realistic_flags(i as u64, 259 * 1024));
        write_manifest(dir.path(), "default", &format!("large-{i}"), flags);
    }
    let proxy = start(dir.path(), &[]).await;
    let channel = channel(proxy.port).await;
    let mut held = Vec::new();
    for i in 0..RESOURCES {
        let selector = format!("core.openfeature.dev/default/large-{i}");
        for gzip in [false, true] {
            let mut v1 = v1::flag_sync_service_client::FlagSyncServiceClient::new(channel.clone());
            let mut legacy =
                legacy::flag_sync_service_client::FlagSyncServiceClient::new(channel.clone());
            if gzip {
                v1 = v1.accept_compressed(CompressionEncoding::Gzip);
                legacy = legacy.accept_compressed(CompressionEncoding::Gzip);
            }
            let mut stream = client::open(&mut v1, &selector)
                .await
                .expect("a flagd.sync.v1 stream");
            let document = next(&mut stream).await.flag_configuration;
            held.push(Box::new(stream) as Box<dyn Send>);
            let mut stream = legacy
                .sync_flags(with_selector(
                    legacy::SyncFlagsRequest::default(),
                    &selector,
                ))
                .await
                .expect("a sync.v1 stream")
                .into_inner();
            assert_eq!(next(&mut stream).await.flag_configuration, document);
            held.push(Box::new(stream));
            let fetched = fetch(&mut v1, &selector).await.expect("FetchAllFlags");
            assert_eq!(fetched.flag_configuration, document);
        }
    }
    let page = proxy.status_page().await;
    let documents: u64 = page.resources.iter().filter_map(|r| r.bytes).sum();
    assert_eq!(page.resources.len(), RESOURCES);
    let charged = proxy
        .metric("flagd_proxy_memory_charged_bytes{kind=\"versions\"}")
        .await;
    // The generated flag sets deflate to about a sixth; a copy per form would be 4.5 times.
    let ratio = charged / documents as f64;
    eprintln!("{charged} charged for {documents} bytes of documents ({ratio:.2} times)");
    assert!(
        (1.0..1.5).contains(&ratio),
        "{charged} charged for {documents} bytes of documents ({ratio:.2} times)"
    );
    drop(held);
}
