//! The wire: the gRPC sync services, their messages, and how errors become statuses.
pub mod direct;
pub mod error;
pub mod frame;
pub mod proto;
pub mod sync;

pub use sync::{SELECTOR_HEADER, SyncService};
