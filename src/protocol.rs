//! The sync protocols both sides speak, a leaf: the generated messages and clients (see
//! `build.rs` and `proto/`) and the metadata header the selector travels in. The server side is
//! written by hand in the wire ([`crate::wire::routes`]); the clients serve the upstream source,
//! tests and benchmarks.

/// The metadata header flagd providers send the selector in.
pub const SELECTOR_HEADER: &str = "flagd-selector";

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod client {
    pub mod flagd_sync_v1 {
        include!(concat!(env!("OUT_DIR"), "/flagd.sync.v1.rs"));
    }
    pub mod sync_v1 {
        include!(concat!(env!("OUT_DIR"), "/sync.v1.rs"));
    }
}
