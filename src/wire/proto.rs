//! Generated protocol messages and clients (see `build.rs` and `proto/`). The server side is
//! written by hand in [`crate::wire::routes`]; the clients serve the upstream source, tests and
//! benchmarks.
#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod client {
    pub mod flagd_sync_v1 {
        include!(concat!(env!("OUT_DIR"), "/flagd.sync.v1.rs"));
    }
    pub mod sync_v1 {
        include!(concat!(env!("OUT_DIR"), "/sync.v1.rs"));
    }
}
