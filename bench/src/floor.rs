//! The floor: the least a server can do to get a version to every subscriber.
//!
//! A minimal server, run as a separate process (this program started again with
//! [`FLOOR_COMMAND`]), that speaks just enough HTTP/2 for the load generator's gRPC clients to
//! see a `SyncFlags` response stream: it reads the client preface up to the request's HEADERS
//! frame, answers with SETTINGS, a SETTINGS acknowledgement, the response HEADERS and the
//! current version as a DATA frame, and from then on writes each new version to every
//! connection with exactly one `write` of the DATA frame, from as many threads as the machine
//! has cores. It never reads from a connection again, keeps no HTTP/2 state, and ignores flow
//! control (the client's windows are far larger than the run writes). The parent process sends
//! it the sequence number of each new version on standard input, one per line.
//!
//! Propagation and CPU per update against this server, with the same load generator, are what
//! the kernel and the load generator cost on their own: a proxy's figures divided by these are
//! what the proxy adds.
use std::io::{self, BufRead, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The first argument that makes this program run the floor server:
/// `flagd-proxy-bench __floor-server <port> <payload bytes>`.
pub const FLOOR_COMMAND: &str = "__floor-server";

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_DATA: u8 = 0;
const FRAME_HEADERS: u8 = 1;
const FRAME_SETTINGS: u8 = 4;
const FLAG_ACK: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
/// The largest frame payload a peer must accept without asking for more (RFC 9113, 4.2).
const MAX_FRAME: usize = 16_384;

/// Connections that have had their first version, and the DATA frames of the current version.
struct State {
    connections: Vec<(TcpStream, u32)>,
    message: Vec<u8>,
}

/// Runs the floor server on 127.0.0.1:`port` until standard input closes.
pub fn serve(port: u16, payload: usize) -> io::Result<()> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
    let state = Arc::new(Mutex::new(State {
        connections: Vec::new(),
        message: grpc_message(0, payload),
    }));
    {
        let state = state.clone();
        std::thread::spawn(move || accept(listener, state));
    }
    let writers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    for line in io::stdin().lock().lines() {
        let Ok(seq) = line?.trim().parse::<u64>() else {
            continue;
        };
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        state.message = grpc_message(seq, payload);
        let State {
            connections,
            message,
        } = &mut *state;
        let chunk = connections.len().div_ceil(writers).max(1);
        std::thread::scope(|scope| {
            for part in connections.chunks_mut(chunk) {
                let message = &*message;
                scope.spawn(move || {
                    // Every stream id is usually 1: the frames are made again only when the
                    // id changes.
                    let mut frames = Vec::new();
                    let mut framed_for = None;
                    for (stream, id) in part {
                        if framed_for != Some(*id) {
                            frames.clear();
                            data_frames(&mut frames, *id, message);
                            framed_for = Some(*id);
                        }
                        // One write per connection; a connection that fails is left alone.
                        let _ = stream.write_all(&frames);
                    }
                });
            }
        });
    }
    Ok(())
}

fn accept(listener: TcpListener, state: Arc<Mutex<State>>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let state = state.clone();
        // Set-up is not what the floor measures; a thread each keeps it simple.
        std::thread::spawn(move || {
            let _ = handshake(stream, &state);
        });
    }
}

/// Reads the client's preface up to its first HEADERS frame, answers it and sends the current
/// version; then the connection joins the fan-out.
fn handshake(mut stream: TcpStream, state: &Mutex<State>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut out = Vec::new();
    frame_header(&mut out, 0, FRAME_SETTINGS, 0, 0);
    stream.write_all(&out)?;
    let mut preface = [0u8; PREFACE.len()];
    stream.read_exact(&mut preface)?;
    if preface != PREFACE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no HTTP/2 preface",
        ));
    }
    let id = loop {
        let mut header = [0u8; 9];
        stream.read_exact(&mut header)?;
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload)?;
        if header[3] == FRAME_HEADERS {
            break u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        }
    };
    out.clear();
    frame_header(&mut out, 0, FRAME_SETTINGS, FLAG_ACK, 0);
    // :status 200 (static table index 8), then content-type (static name index 31) as a
    // literal without indexing.
    let mut block = vec![0x88, 0x0f, 0x10, 16];
    block.extend_from_slice(b"application/grpc");
    frame_header(&mut out, block.len(), FRAME_HEADERS, FLAG_END_HEADERS, id);
    out.extend_from_slice(&block);
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    data_frames(&mut out, id, &state.message);
    stream.write_all(&out)?;
    state.connections.push((stream, id));
    Ok(())
}

/// A gRPC length-prefixed `SyncFlagsResponse` carrying version `seq`'s document.
fn grpc_message(seq: u64, payload: usize) -> Vec<u8> {
    let document = crate::documents::document(seq, payload);
    let mut proto = vec![0x0a];
    let mut len = document.len() as u64;
    while len >= 0x80 {
        proto.push((len as u8) | 0x80);
        len >>= 7;
    }
    proto.push(len as u8);
    proto.extend_from_slice(document.as_bytes());
    let mut message = vec![0u8];
    message.extend_from_slice(&(proto.len() as u32).to_be_bytes());
    message.extend_from_slice(&proto);
    message
}

/// `message` as DATA frames of stream `id`, none over the default maximum frame size.
fn data_frames(out: &mut Vec<u8>, id: u32, message: &[u8]) {
    for part in message.chunks(MAX_FRAME) {
        frame_header(out, part.len(), FRAME_DATA, 0, id);
        out.extend_from_slice(part);
    }
}

fn frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, id: u32) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&id.to_be_bytes());
}

/// The arguments that start this program as the floor server.
pub fn args(port: u16, payload: usize) -> Vec<String> {
    vec![
        FLOOR_COMMAND.to_owned(),
        port.to_string(),
        payload.to_string(),
    ]
}
