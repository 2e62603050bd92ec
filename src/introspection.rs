//! What a running proxy tells about itself, as one set of types for both ends: the `/status`
//! page the management port writes and `flagd-proxy status`, the tests and the benchmark read
//! ([`page`]); the Prometheus text of `/metrics` read back into samples ([`prometheus`]); and a
//! process' figures read from `/proc` ([`procfs`]). A leaf: it imports nothing of the crate.
pub mod page;
pub mod procfs;
pub mod prometheus;

pub use page::{
    FileProblem, KubernetesStatus, ManifestsStatus, ResourceStatus, SourceStatus, StatusPage,
    UpstreamStatus,
};
pub use procfs::{Fields, Process, TcpSocket};
pub use prometheus::{Sample, Samples};
