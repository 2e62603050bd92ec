//! JSON over HTTP/1.1 on a unix socket: how tests ask flagd's evaluation API (`--socket-path`).
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

/// One HTTP/1.1 JSON POST over the unix socket `socket`: the response body parsed as JSON (a
/// chunked body joined first). Gives up after 10 s (a hang guard).
pub async fn post_json(socket: &Path, path: &str, body: &str) -> Result<Value, String> {
    let request = async {
        let mut stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| e.to_string())?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream
            .write_all(format!("{head}{body}").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(String::from_utf8_lossy(&response).into_owned())
    };
    let text = timeout(Duration::from_secs(10), request)
        .await
        .map_err(|_| "no HTTP answer".to_owned())??;
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP body")?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
}

/// The body of a chunked HTTP/1.1 response.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}
