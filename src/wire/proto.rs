//! Generated protocol types (see `build.rs` and `proto/`).
#![allow(clippy::all, clippy::pedantic, missing_docs)]

/// The server side: `SyncFlagsResponse` is [`crate::wire::frame::Frame`], encoded once per version.
pub mod server {
    pub mod flagd_sync_v1 {
        include!(concat!(env!("OUT_DIR"), "/server/flagd.sync.v1.rs"));
    }
    pub mod sync_v1 {
        include!(concat!(env!("OUT_DIR"), "/server/sync.v1.rs"));
    }
}

/// Ordinary messages and clients, for encoding, tests, benchmarks and chained proxies.
pub mod client {
    pub mod flagd_sync_v1 {
        include!(concat!(env!("OUT_DIR"), "/client/flagd.sync.v1.rs"));
    }
    pub mod sync_v1 {
        include!(concat!(env!("OUT_DIR"), "/client/sync.v1.rs"));
    }
}
