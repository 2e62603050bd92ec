//! The wire, the proxy's inbound adapter: the gRPC sync services and their messages.
//!
//! [`routes`] routes each protocol's methods to the [`SyncService`] (what every method does,
//! whatever the protocol); [`stream`] is one open `SyncFlags` stream; [`body`] the bytes of a
//! streaming call on the wire; [`frame`] the snapshot encodings; [`compression`] the
//! gzip ones; [`error`] the one mapping from
//! errors to gRPC statuses; `clients` the bound on the resources one client names.
pub mod body;
mod clients;
pub mod compression;
pub mod error;
pub mod frame;
pub mod routes;
pub mod service;
pub mod stream;

pub use compression::{CompressionMode, CompressionSettings};
pub use routes::{FlagdSyncV1, LegacySyncV1, SyncRoutes};
pub use service::SyncService;
