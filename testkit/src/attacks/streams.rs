//! Raw HTTP/2 SyncFlags streams, as the attacks open them: many at once on one connection,
//! their requests ended at once (a burst) or never (unfinished), and the server's frames read
//! until they have ended.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::EVENT_TIMEOUT;
use crate::raw_h2::{self, DATA, END_STREAM, HEADERS, RST_STREAM};

/// The SyncFlags method's path.
pub const SYNC_PATH: &str = "/flagd.sync.v1.FlagSyncService/SyncFlags";

/// HEADERS frames opening `streams` SyncFlags streams (odd ids from 1), each ended at once
/// (`end_stream`: no message, answered as soon as it is read) or left open (its request never
/// comes).
pub fn sync_headers(streams: u32, end_stream: bool) -> Vec<u8> {
    (0..streams)
        .flat_map(|i| raw_h2::grpc_headers(2 * i + 1, SYNC_PATH, end_stream))
        .collect()
}

/// A SyncFlags stream `id` for `selector`, its request sent whole and ended: a subscription
/// (rows 3 and 15: what a connection holds after its burst).
pub fn subscription(id: u32, selector: &str) -> Vec<u8> {
    let mut stream = raw_h2::grpc_headers(id, SYNC_PATH, false);
    stream.extend(raw_h2::frame(
        DATA,
        END_STREAM,
        id,
        &raw_h2::sync_request(selector),
    ));
    stream
}

/// A connection from `from` that opens `streams` SyncFlags streams at once ([`sync_headers`]);
/// the error when the proxy refused the connection.
pub async fn open_from(
    from: Ipv4Addr,
    port: u16,
    streams: u32,
    end_stream: bool,
) -> std::io::Result<(OwnedReadHalf, OwnedWriteHalf)> {
    let (read, mut write) = raw_h2::try_connect_from(from, port).await?;
    write.write_all(&sync_headers(streams, end_stream)).await?;
    Ok((read, write))
}

/// Reads the server's frames until `want` streams have ended (trailers, a frame with
/// END_STREAM, or a reset), counting them in `ended` as they end: `Ok(true)` when they have,
/// `Ok(false)` when the connection ended first, the error when no frame came for
/// [`EVENT_TIMEOUT`].
pub async fn read_ends(
    read: &mut OwnedReadHalf,
    want: u32,
    ended: &AtomicU32,
) -> Result<bool, String> {
    let mut seen = HashSet::new();
    while seen.len() < want as usize {
        let Some(frame) = tokio::time::timeout(EVENT_TIMEOUT, raw_h2::read_frame(read))
            .await
            .map_err(|_| format!("only {} of {want} streams ended", seen.len()))?
        else {
            return Ok(false);
        };
        let ends = frame.kind == RST_STREAM
            || matches!(frame.kind, DATA | HEADERS) && frame.flags & END_STREAM != 0;
        if ends && frame.stream != 0 && seen.insert(frame.stream) {
            ended.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(true)
}
