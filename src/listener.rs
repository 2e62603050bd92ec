//! Where the sync server listens: a TCP port and/or a unix domain socket.
//!
//! The unix socket is flagd's `--sync-socket-path` shape: no network path, the file's mode is
//! the gate. A socket file left behind by a crash is replaced at start (nothing answers on it);
//! a file that is not a socket, or a socket another process still serves, is never touched. The
//! file is removed when the listener is dropped.
use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

/// A listener of the sync server.
pub enum SyncListener {
    Tcp(TcpListener),
    Unix(UnixSocket),
}

/// The next connection `accept` gives, or `None` once `shutdown` is cancelled. A failed accept
/// (out of file descriptors and the like) is logged with `listener` and retried after a pause
/// instead of spinning.
pub async fn next_accepted<T, F>(
    shutdown: &CancellationToken,
    listener: &str,
    mut accept: impl FnMut() -> F,
) -> Option<T>
where
    F: Future<Output = io::Result<T>>,
{
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return None,
            accepted = accept() => match accepted {
                Ok(connection) => return Some(connection),
                Err(error) => {
                    tracing::warn!(%error, listener, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// Why the unix socket cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("{path}: a file that is not a socket is in the way; remove it or choose another path")]
    NotASocket { path: PathBuf },
    #[error("{path}: another process is serving this socket")]
    InUse { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A bound unix socket whose file is removed on drop.
pub struct UnixSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl UnixSocket {
    /// Binds `path` with permission bits `mode`, replacing a stale socket file.
    pub fn bind(path: &Path, mode: u32) -> Result<Self, SocketError> {
        let io_error = |source| SocketError::Io {
            path: path.to_owned(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(SocketError::NotASocket {
                    path: path.to_owned(),
                });
            }
            Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => {
                    return Err(SocketError::InUse {
                        path: path.to_owned(),
                    });
                }
                Err(_) => {
                    tracing::info!(path = %path.display(), "removing a stale socket file");
                    std::fs::remove_file(path).map_err(io_error)?;
                }
            },
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error(error)),
        }
        let listener = UnixListener::bind(path).map_err(io_error)?;
        let socket = Self {
            listener,
            path: path.to_owned(),
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_error)?;
        Ok(socket)
    }

    pub fn listener(&self) -> &UnixListener {
        &self.listener
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        // Only our own socket: if another process replaced the file since, it is theirs.
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|meta| meta.file_type().is_socket());
        if ours && let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), %error, "cannot remove the socket file");
        }
    }
}

/// Parses permission bits given in octal (`0660`, `660`, `0o660`).
pub fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.trim().trim_start_matches("0o");
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!(
            "expected permission bits in octal such as 0660, found {text:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_in_octal() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert_eq!(parse_mode("0o777"), Ok(0o777));
        for bad in ["", "8", "1777", "rw"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn stale_sockets_are_replaced_and_others_are_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sync.sock");
        // A socket file nobody serves, as a crash leaves it.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        assert!(path.exists());
        let socket = UnixSocket::bind(&path, 0o600).expect("a stale socket is replaced");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A live socket is not taken over.
        let err = UnixSocket::bind(&path, 0o600).err().expect("in use");
        assert!(matches!(err, SocketError::InUse { .. }), "{err}");
        drop(socket);
        assert!(!path.exists(), "removed on drop");
        // A regular file is never removed.
        std::fs::write(&path, "data").expect("write");
        let err = UnixSocket::bind(&path, 0o600).err().expect("not a socket");
        assert!(matches!(err, SocketError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "data");
    }
}
