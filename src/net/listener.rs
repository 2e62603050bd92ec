//! Where the sync server listens: a TCP port and/or a unix domain socket.
//!
//! The unix socket is flagd's `--sync-socket-path` shape: no network path, the file's mode is
//! the gate. So the file never exists at its path with any other mode: the socket is bound in a
//! private directory beside it (mode 0700), given its mode there, and moved into place. A socket
//! file left behind by a crash is replaced at start (nothing answers on it); a file that is not a
//! socket, or a socket another process still serves, is never touched. The file is removed when
//! the listener is dropped, if it is still this socket's (the same inode).
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
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
    #[error(
        "{path}: {bytes} bytes, longer than the {MAX_SOCKET_PATH_BYTES} a unix socket path may \
         have (sun_path holds 108 bytes with the final NUL); choose a shorter path"
    )]
    PathTooLong { path: PathBuf, bytes: usize },
    #[error(
        "{path}: the socket is first bound under a temporary name in its folder ({bytes} bytes \
         with the longest such name), longer than the {MAX_SOCKET_PATH_BYTES} a unix socket path \
         may have (sun_path holds 108 bytes with the final NUL); choose a folder with a shorter \
         path"
    )]
    FolderPathTooLong { path: PathBuf, bytes: usize },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Connections the kernel may queue on the sync port before they are accepted. When every
/// client reconnects at once (a restart, a network blip), tokio's default of 1,024 overflows and
/// the kernel drops further SYNs, which clients send again only after a second; Go's listeners
/// take the kernel's maximum, as this does (Linux caps it at `net.core.somaxconn`).
pub const SYNC_BACKLOG: u32 = 65_535;
/// The management port sees probes and scrapes only: tokio's default backlog.
pub const MANAGEMENT_BACKLOG: u32 = 1024;

/// A listener on `addr` like `TcpListener::bind`, with `backlog` pending connections.
pub fn listen_tcp(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// The most bytes a unix socket's path may take on Linux: `sun_path` holds 108, the last of them
/// the terminating NUL. A longer path cannot be bound or connected to.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// The longest temporary name the socket is bound under in its folder ([`bind_with_mode`]):
/// the largest process id Linux gives (`pid_max` is at most 2^22) and the last attempt.
const LONGEST_STAGED_NAME: &str = ".fp4194304-100/s";

/// Refuses a socket path that is too long to be served: the path itself, or the temporary path
/// the socket is bound under before it is moved to it.
pub fn check_socket_path(path: &Path) -> Result<(), SocketError> {
    let bytes = path.as_os_str().len();
    if bytes > MAX_SOCKET_PATH_BYTES {
        return Err(SocketError::PathTooLong {
            path: path.to_owned(),
            bytes,
        });
    }
    let staged = staging_folder(path).join(LONGEST_STAGED_NAME);
    let bytes = staged.as_os_str().len();
    if bytes > MAX_SOCKET_PATH_BYTES {
        return Err(SocketError::FolderPathTooLong {
            path: path.to_owned(),
            bytes,
        });
    }
    Ok(())
}

/// The folder the socket at `path` is bound in before it is moved to `path`: `path`'s own.
fn staging_folder(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// A bound unix socket whose file is removed on drop.
pub struct UnixSocket {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's device and inode: only that file is removed.
    file: (u64, u64),
}

impl UnixSocket {
    /// Binds `path` with permission bits `mode`, replacing a stale socket file.
    pub fn bind(path: &Path, mode: u32) -> Result<Self, SocketError> {
        check_socket_path(path)?;
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
        let listener = bind_with_mode(path, mode).map_err(io_error)?;
        let meta = std::fs::symlink_metadata(path).map_err(io_error)?;
        Ok(Self {
            listener,
            path: path.to_owned(),
            file: (meta.dev(), meta.ino()),
        })
    }

    pub fn listener(&self) -> &UnixListener {
        &self.listener
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Binds a socket at `path` whose file has permission bits `mode` from the moment it exists
/// there: bound in a private directory beside `path`, given `mode`, then renamed into place.
fn bind_with_mode(path: &Path, mode: u32) -> io::Result<UnixListener> {
    let parent = staging_folder(path);
    // Short, so the staged path stays within the length a socket path may have (checked with
    // the longest such name, LONGEST_STAGED_NAME); another name when one is taken (left by a
    // crashed process that had this pid, say).
    let mut attempt = 0;
    let private = loop {
        let private = parent.join(format!(".fp{}-{attempt}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&private) {
            Ok(()) => break private,
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => {
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    };
    let staged = private.join("s");
    let bound = UnixListener::bind(&staged).and_then(|listener| {
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&staged, path)?;
        Ok(listener)
    });
    if bound.is_err() {
        let _ = std::fs::remove_file(&staged);
    }
    let _ = std::fs::remove_dir(&private);
    bound
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        // Only our own socket: if another process replaced the file since, it is theirs.
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.file);
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

    /// A path the kernel cannot take is refused before anything is bound, with the limit named;
    /// one at the limit is served and can be connected to. The limit is the platform's: the
    /// standard library refuses an address one byte longer.
    #[tokio::test]
    async fn socket_paths_longer_than_the_platform_allows_are_refused() {
        use std::os::unix::net::SocketAddr as UnixAddr;
        let dir = tempfile::tempdir().expect("tempdir");
        let at_length = |bytes: usize| {
            let folder = dir.path().as_os_str().len() + 1;
            dir.path().join("s".repeat(bytes - folder))
        };
        let longest = at_length(MAX_SOCKET_PATH_BYTES);
        let too_long = at_length(MAX_SOCKET_PATH_BYTES + 1);
        assert!(UnixAddr::from_pathname(&longest).is_ok());
        assert!(UnixAddr::from_pathname(&too_long).is_err());

        let socket = UnixSocket::bind(&longest, 0o600).expect("the longest path is served");
        std::os::unix::net::UnixStream::connect(&longest).expect("and reached");
        drop(socket);

        let error = UnixSocket::bind(&too_long, 0o600)
            .err()
            .expect("one byte more is refused");
        assert!(
            matches!(error, SocketError::PathTooLong { bytes: 108, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("longer than the 107"), "{error}");
        assert!(!too_long.exists());

        // A short name in a deep folder: the temporary name it is bound under would not fit.
        let mut folder = dir.path().to_path_buf();
        while folder.as_os_str().len() < 100 {
            folder.push("deep");
        }
        std::fs::create_dir_all(&folder).expect("a deep folder");
        let short_name = folder.join("s");
        assert!(short_name.as_os_str().len() <= MAX_SOCKET_PATH_BYTES);
        let error = check_socket_path(&short_name).expect_err("no room for the staged name");
        assert!(
            matches!(error, SocketError::FolderPathTooLong { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("shorter path"), "{error}");
    }

    /// The socket file is never at its path with a mode other than the one asked for: it
    /// arrives there by a rename, already with its mode (it is not created there, where the
    /// process's umask would decide its mode until a chmod).
    #[tokio::test]
    async fn the_socket_file_appears_with_its_final_mode() {
        use notify::{EventKind, RecursiveMode, Watcher, event::CreateKind};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sync.sock");
        let (tx, events) = std::sync::mpsc::channel();
        let mut watcher = notify::recommended_watcher(move |event| {
            let _ = tx.send(event);
        })
        .expect("a watcher");
        watcher
            .watch(dir.path(), RecursiveMode::NonRecursive)
            .expect("watch the folder");
        let socket = UnixSocket::bind(&path, 0o600).expect("bind");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Every event up to the socket's arrival at its path.
        let mut seen = Vec::new();
        loop {
            let event = events
                .recv_timeout(Duration::from_secs(30))
                .expect("the socket's arrival is seen")
                .expect("a watch event");
            let at_path = event.paths.iter().any(|p| p == &path);
            seen.push(event.kind);
            assert!(
                !(at_path
                    && matches!(
                        event.kind,
                        EventKind::Create(CreateKind::Any | CreateKind::File | CreateKind::Other)
                    )),
                "the socket file was created at its path: {seen:?}"
            );
            if at_path {
                break;
            }
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            left,
            [std::ffi::OsString::from("sync.sock")],
            "nothing else left"
        );
        drop(socket);
    }

    /// At shutdown only this socket's own file is removed: one that replaced it since stays.
    #[tokio::test]
    async fn only_its_own_socket_file_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sync.sock");
        let socket = UnixSocket::bind(&path, 0o600).expect("bind");
        std::fs::remove_file(&path).expect("remove");
        let _other = std::os::unix::net::UnixListener::bind(&path).expect("another socket");
        drop(socket);
        assert!(path.exists(), "another process's socket is left alone");
    }
}
