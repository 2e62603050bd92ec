//! The transport under both ports: listeners (TCP with a backlog, the unix socket), TLS, the
//! accepted connection and the checks on its bytes (`h2`: the HTTP/2 preface and frame headers
//! as they pass, and on the unix socket the `:authority` any client sends made one the HTTP/2
//! server accepts), connection limits, deadlines, and the room that lets a new connection in at
//! the limit. The sync server (`server`) and the management
//! port (`management`) both build on it; neither reaches into the other, and it knows neither:
//! nothing here speaks gRPC (the sync server's request layers and tonic's view of a connection
//! are the server's).
use std::time::Duration;

pub(crate) mod connection;
pub(crate) mod deadlines;
pub(crate) mod h2;
pub mod info;
pub(crate) mod limits;
pub mod listener;
pub(crate) mod room;
pub mod tls;

/// Defaults shared by both ports (and the command line's flags for them).
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
