//! The load generator: a codec that finds the sequence number without decoding, the
//! connections and streams, and what the subscribers saw.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut};
use flagd_proxy::protocol::client::flagd_sync_v1::SyncFlagsRequest;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Request, Status};

use crate::messages::find_seq;
use crate::{NO_SEQ, SYNC_PATH};

#[derive(Clone, Copy, Default)]
pub(crate) struct SeqCodec;

pub(crate) struct RequestEncoder;
pub(crate) struct SeqDecoder;

impl Codec for SeqCodec {
    type Encode = SyncFlagsRequest;
    type Decode = u64;
    type Encoder = RequestEncoder;
    type Decoder = SeqDecoder;

    fn encoder(&mut self) -> RequestEncoder {
        RequestEncoder
    }

    fn decoder(&mut self) -> SeqDecoder {
        SeqDecoder
    }
}

impl Encoder for RequestEncoder {
    type Item = SyncFlagsRequest;
    type Error = Status;

    fn encode(&mut self, item: SyncFlagsRequest, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let mut bytes = Vec::with_capacity(prost::Message::encoded_len(&item));
        prost::Message::encode(&item, &mut bytes).map_err(|e| Status::internal(e.to_string()))?;
        dst.put_slice(&bytes);
        Ok(())
    }
}

impl Decoder for SeqDecoder {
    type Item = u64;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<u64>, Status> {
        let len = src.remaining();
        // The whole message is one contiguous buffer; search it in place.
        let seq = find_seq(src.chunk()).unwrap_or(NO_SEQ);
        src.advance(len);
        Ok(Some(seq))
    }
}

/// A certificate authority and a server certificate for 127.0.0.1, for `--tls`.
pub(crate) struct BenchTls {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    pub(crate) client: tonic::transport::ClientTlsConfig,
}

impl BenchTls {
    pub(crate) fn new(dir: &Path) -> anyhow::Result<Self> {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "flagd-proxy-bench CA");
        let ca_key = rcgen::KeyPair::generate()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = rcgen::Issuer::new(ca_params, ca_key);
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])?;
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca)?;
        let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server-key.pem"));
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        let client = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca_cert.pem()))
            .domain_name("127.0.0.1");
        Ok(Self {
            cert: cert_path,
            key: key_path,
            client,
        })
    }
}

/// Where and how subscribers connect.
#[derive(Clone)]
pub(crate) struct Dial {
    pub(crate) port: u16,
    pub(crate) tls: Option<tonic::transport::ClientTlsConfig>,
}

impl Dial {
    /// Plaintext HTTP/2 to `port` on loopback.
    pub(crate) fn plain(port: u16) -> Self {
        Dial { port, tls: None }
    }
}

pub(crate) async fn open_channel(dial: &Dial, source: Option<Ipv4Addr>) -> anyhow::Result<Channel> {
    let port = dial.port;
    let scheme = if dial.tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://127.0.0.1:{port}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10));
    if let Some(tls) = &dial.tls {
        endpoint = endpoint.tls_config(tls.clone())?;
    }
    let channel = match source {
        None => endpoint.connect().await?,
        Some(ip) => {
            let connector = tower::service_fn(move |_: Uri| async move {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.bind(SocketAddr::from((ip, 0)))?;
                let stream = socket
                    .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                    .await?;
                stream.set_nodelay(true)?;
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
            });
            endpoint.connect_with_connector(connector).await?
        }
    };
    Ok(channel)
}

/// Whether every stream lists gzip in `grpc-accept-encoding` (`--accept-gzip`); set once, as
/// the run starts, for all the streams of every phase.
pub(crate) static ACCEPT_GZIP: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Opens a `SyncFlags` stream for `selector` (in the request body, which both proxies read).
pub(crate) async fn open_stream(
    channel: Channel,
    selector: &str,
) -> Result<tonic::Streaming<u64>, Status> {
    open_stream_as(channel, selector, None).await
}

/// [`open_stream`], with `authorization` (`Bearer <token>`) in the request's metadata when
/// given.
pub(crate) async fn open_stream_as(
    channel: Channel,
    selector: &str,
    authorization: Option<&tonic::metadata::AsciiMetadataValue>,
) -> Result<tonic::Streaming<u64>, Status> {
    // The decoder gets messages uncompressed, a large one seen before as its version alone
    // (see `messages.rs`).
    let mut grpc = tonic::client::Grpc::new(crate::messages::Received(channel));
    if ACCEPT_GZIP.load(std::sync::atomic::Ordering::Relaxed) {
        // Lists gzip in grpc-accept-encoding.
        grpc = grpc.accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    }
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut request = Request::new(SyncFlagsRequest {
        provider_id: "flagd-proxy-bench".into(),
        selector: selector.to_owned(),
    });
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.clone());
    }
    let path = http::uri::PathAndQuery::from_static(SYNC_PATH);
    Ok(grpc
        .server_streaming(request, path, SeqCodec)
        .await?
        .into_inner())
}

// ---------------------------------------------------------------------------------------------
// What the subscribers saw

/// What went wrong on a crowd's streams: messages without a version, streams that ended in an
/// error, and the last such error.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    unparsed: AtomicU64,
    errors: AtomicU64,
    last: std::sync::Mutex<Option<String>>,
}

impl Failures {
    pub(crate) fn unparsed_message(&self) {
        self.unparsed.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream ended with `error`; `who` names its subscriber in the last error, if need be.
    pub(crate) fn stream_failed(&self, who: Option<&str>, error: &Status) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let text = format!("{:?}: {}", error.code(), error.message());
        let text = match who {
            Some(who) => format!("{who}: {text}"),
            None => text,
        };
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
    }

    pub(crate) fn unparsed(&self) -> u64 {
        self.unparsed.load(Ordering::Relaxed)
    }

    pub(crate) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub(crate) fn last(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Shared by all subscriber tasks: each one's newest version, and per version how many
/// subscribers have it (or a newer one) and when the first and the last got it.
pub(crate) struct Tracker {
    pub(crate) base: Instant,
    /// Subscribers that must reach a version for it to count as delivered.
    pub(crate) target: AtomicUsize,
    pub(crate) latest: Vec<AtomicU64>,
    pub(crate) reached: Vec<AtomicU32>,
    pub(crate) first_at: Vec<AtomicU64>,
    pub(crate) all_at: Vec<AtomicU64>,
    pub(crate) connected: AtomicUsize,
    pub(crate) messages: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) failures: Failures,
    /// Streams reopened after their deadline whose first snapshot was older than the version the
    /// subscriber already had (see `churn.rs`).
    pub(crate) behind: AtomicU64,
}

impl Tracker {
    pub(crate) fn new(subscribers: usize, versions: usize) -> Self {
        let vec64 = |n: usize, v: u64| (0..n).map(|_| AtomicU64::new(v)).collect::<Vec<_>>();
        Self {
            base: Instant::now(),
            target: AtomicUsize::new(subscribers),
            latest: vec64(subscribers, NO_SEQ),
            reached: (0..versions).map(|_| AtomicU32::new(0)).collect(),
            first_at: vec64(versions, 0),
            all_at: vec64(versions, 0),
            connected: AtomicUsize::new(0),
            messages: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            failures: Failures::default(),
            behind: AtomicU64::new(0),
        }
    }

    /// Nanoseconds since the tracker was made; never 0.
    pub(crate) fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64 + 1
    }

    pub(crate) fn record(&self, slot: usize, seq: u64) {
        self.messages.fetch_add(1, Ordering::Relaxed);
        if seq == NO_SEQ {
            self.failures.unparsed_message();
            return;
        }
        let previous = self.latest[slot].load(Ordering::Relaxed);
        let from = if previous == NO_SEQ {
            self.connected.fetch_add(1, Ordering::Relaxed);
            0
        } else if seq <= previous {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
            return;
        } else {
            previous + 1
        };
        self.latest[slot].store(seq, Ordering::Relaxed);
        let target = self.target.load(Ordering::Relaxed) as u32;
        let last = (seq as usize).min(self.reached.len().saturating_sub(1)) as u64;
        for version in from..=last {
            let v = version as usize;
            let count = self.reached[v].fetch_add(1, Ordering::AcqRel) + 1;
            if count == 1 {
                self.first_at[v].store(self.now(), Ordering::Release);
            }
            if count == target {
                self.all_at[v].store(self.now(), Ordering::Release);
            }
        }
    }

    /// [`Tracker::record`] for a message of subscriber `slot`'s stream; `reopened`: the first
    /// of a stream reopened after its deadline, whose snapshot may be the version the subscriber
    /// already has (not a duplicate), and must not be an older one.
    pub(crate) fn record_from(&self, slot: usize, seq: u64, reopened: bool) {
        let previous = self.latest[slot].load(Ordering::Relaxed);
        if reopened && seq != NO_SEQ && previous != NO_SEQ && seq <= previous {
            if seq < previous {
                self.behind.fetch_add(1, Ordering::Relaxed);
            }
            self.messages.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.record(slot, seq);
    }

    pub(crate) fn all_at(&self, version: u64) -> Option<u64> {
        match self.all_at[version as usize].load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    pub(crate) fn first_at(&self, version: u64) -> Option<u64> {
        match self.first_at[version as usize].load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    /// Subscribers (among the first `n`) whose newest version is not `version`.
    pub(crate) fn not_on(&self, version: u64, n: usize) -> usize {
        self.latest[..n]
            .iter()
            .filter(|v| v.load(Ordering::Relaxed) != version)
            .count()
    }

    /// Waits until every subscriber has `version` or `timeout` has passed.
    pub(crate) async fn wait_all(&self, version: u64, timeout: Duration) -> Option<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = self.all_at(version) {
                return Some(at);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Opens a stream for `selector` and hands each version's sequence number to `record` until the
/// stream ends; how it ended.
pub(crate) async fn follow(
    channel: Channel,
    selector: &str,
    mut record: impl FnMut(u64),
) -> Status {
    let result = async {
        let mut stream = open_stream(channel, selector).await?;
        while let Some(seq) = stream.message().await? {
            record(seq);
        }
        Ok::<(), Status>(())
    }
    .await;
    result
        .err()
        .unwrap_or_else(|| Status::unknown("stream ended"))
}
