//! HTTP/2 frames written by hand, for clients that misbehave on purpose (streams that never
//! finish their request, windows that overflow); the server's frames are read back by type.
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;

pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const ACK: u8 = 0x1;

/// One frame: header and payload.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("frame size");
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A HEADERS frame for a gRPC POST to `path`; HPACK literals without indexing or Huffman.
pub fn grpc_headers(stream: u32, path: &str, end_stream: bool) -> Vec<u8> {
    grpc_headers_with(stream, path, end_stream, &[])
}

/// [`grpc_headers`] with `extra` headers after the usual ones.
pub fn grpc_headers_with(
    stream: u32,
    path: &str,
    end_stream: bool,
    extra: &[(&str, &str)],
) -> Vec<u8> {
    grpc_headers_for(stream, path, "127.0.0.1", end_stream, extra)
}

/// [`grpc_headers_with`] with `authority` as `:authority`.
pub fn grpc_headers_for(
    stream: u32,
    path: &str,
    authority: &str,
    end_stream: bool,
    extra: &[(&str, &str)],
) -> Vec<u8> {
    let mut block = Vec::new();
    let usual = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    for &(name, value) in usual.iter().chain(extra) {
        block.push(0x00);
        block.push(u8::try_from(name.len()).expect("short name"));
        block.extend_from_slice(name.as_bytes());
        block.push(u8::try_from(value.len()).expect("short value"));
        block.extend_from_slice(value.as_bytes());
    }
    let flags = END_HEADERS | if end_stream { END_STREAM } else { 0 };
    frame(HEADERS, flags, stream, &block)
}

/// A `flagd.sync.v1` `SyncFlagsRequest` with `selector` in its body, as one gRPC message.
pub fn sync_request(selector: &str) -> Vec<u8> {
    let request = crate::client::v1::SyncFlagsRequest {
        provider_id: String::new(),
        selector: selector.to_owned(),
    };
    grpc_message(&prost::Message::encode_to_vec(&request))
}

/// `message` as one gRPC length-prefixed message (not compressed).
pub fn grpc_message(message: &[u8]) -> Vec<u8> {
    let mut body = vec![0];
    body.extend(
        u32::try_from(message.len())
            .expect("message size")
            .to_be_bytes(),
    );
    body.extend_from_slice(message);
    body
}

pub fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

pub fn ping(data: [u8; 8]) -> Vec<u8> {
    frame(PING, 0, 0, &data)
}

/// Connects and sends the preface and empty SETTINGS.
pub async fn connect(port: u16) -> (OwnedReadHalf, OwnedWriteHalf) {
    connect_from(std::net::Ipv4Addr::LOCALHOST, port).await
}

/// Connects from the loopback address `from` (127.0.0.x) and sends the preface and empty
/// SETTINGS.
pub async fn connect_from(from: std::net::Ipv4Addr, port: u16) -> (OwnedReadHalf, OwnedWriteHalf) {
    try_connect_from(from, port)
        .await
        .expect("connect and send the preface")
}

/// [`connect_from`], with the error when the connection or the preface fails.
pub async fn try_connect_from(
    from: std::net::Ipv4Addr,
    port: u16,
) -> std::io::Result<(OwnedReadHalf, OwnedWriteHalf)> {
    let tcp = connect_tcp_from(from.into(), port).await?;
    let (read, mut write) = tcp.into_split();
    let mut start = PREFACE.to_vec();
    start.extend(frame(SETTINGS, 0, 0, &[]));
    write.write_all(&start).await?;
    Ok((read, write))
}

/// A TCP connection from the loopback address `from` to 127.0.0.1:`port`.
pub async fn connect_tcp_from(
    from: std::net::IpAddr,
    port: u16,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((from, 0).into())?;
    socket
        .connect((std::net::Ipv4Addr::LOCALHOST, port).into())
        .await
}

/// An HTTP/2 connection from `from` to 127.0.0.1:`port` that sends its preface and SETTINGS, is
/// admitted (the server's first frame arrives), and then opens no stream; the error when the
/// server closes it first.
pub async fn idle_from(
    from: std::net::IpAddr,
    port: u16,
) -> std::io::Result<tokio::net::TcpStream> {
    let mut tcp = connect_tcp_from(from, port).await?;
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    tcp.write_all(&hello).await?;
    let mut header = [0u8; 9];
    tokio::time::timeout(crate::EVENT_TIMEOUT, tcp.read_exact(&mut header))
        .await
        .map_err(std::io::Error::other)??;
    Ok(tcp)
}

/// A frame the server sent.
#[derive(Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// The next frame, or `None` when the connection ends.
pub async fn read_frame(read: &mut (impl AsyncRead + Unpin)) -> Option<Frame> {
    let mut header = [0u8; 9];
    read.read_exact(&mut header).await.ok()?;
    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let mut payload = vec![0u8; len];
    read.read_exact(&mut payload).await.ok()?;
    Some(Frame {
        kind: header[3],
        flags: header[4],
        stream: u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff,
        payload,
    })
}

/// What a [`FrameTap`] has seen on the wire.
#[derive(Debug, Default)]
pub struct Tapped {
    /// PING frames the client sent (acknowledgements not counted).
    pub client_pings: std::sync::atomic::AtomicUsize,
    /// GOAWAY frames the server sent.
    pub server_goaways: std::sync::atomic::AtomicUsize,
}

/// A relay on 127.0.0.1 in front of the server at 127.0.0.1:`port` that forwards one plaintext
/// HTTP/2 connection frame by frame and counts what crosses it ([`Tapped`]): what a client really
/// sent, seen on the wire rather than taken on trust from its settings. Stops when dropped.
pub struct FrameTap {
    pub port: u16,
    pub tapped: std::sync::Arc<Tapped>,
    task: tokio::task::JoinHandle<()>,
}

impl FrameTap {
    pub async fn start(port: u16) -> FrameTap {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind the frame tap");
        let tap_port = listener.local_addr().expect("the tap's address").port();
        let tapped = std::sync::Arc::new(Tapped::default());
        let seen = tapped.clone();
        let task = tokio::spawn(async move {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let Ok(server) =
                tokio::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)).await
            else {
                return;
            };
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            let upstream = async {
                let mut preface = [0u8; PREFACE.len()];
                if from_client.read_exact(&mut preface).await.is_err()
                    || to_server.write_all(&preface).await.is_err()
                {
                    return;
                }
                while let Some(f) = read_frame(&mut from_client).await {
                    if f.kind == PING && f.flags & ACK == 0 {
                        seen.client_pings.fetch_add(1, SeqCst);
                    }
                    let bytes = frame(f.kind, f.flags, f.stream, &f.payload);
                    if to_server.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
            };
            let downstream = async {
                while let Some(f) = read_frame(&mut from_server).await {
                    if f.kind == GOAWAY {
                        seen.server_goaways.fetch_add(1, SeqCst);
                    }
                    let bytes = frame(f.kind, f.flags, f.stream, &f.payload);
                    if to_client.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
            };
            tokio::join!(upstream, downstream);
        });
        FrameTap {
            port: tap_port,
            tapped,
            task,
        }
    }
}

impl Drop for FrameTap {
    fn drop(&mut self) {
        self.task.abort();
    }
}
