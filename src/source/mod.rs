//! Sources: the adapters that fetch resources from a backend (manifest files, another proxy;
//! the Kubernetes one lives with the rest of the Kubernetes adapter in [`crate::kubernetes`]) and
//! report them to the hub through its [`Source`] port.
//!
//! Sources depend on the hub; the hub knows none of them.
pub use crate::hub::Source;

pub mod manifests;
pub mod upstream;
