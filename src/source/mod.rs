//! Sources: the adapters that fetch resources from a backend (Kubernetes, manifest files,
//! another proxy) and report them to the hub through its [`Source`] port.
//!
//! Sources depend on the hub; the hub knows none of them.
pub use crate::hub::Source;

pub mod events;
pub mod kube_http2;
pub mod kubernetes;
pub mod manifests;
pub mod upstream;
