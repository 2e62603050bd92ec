//! The Kubernetes adapter: everything that talks to the API server, in one place.
//!
//! [`client`] builds the one shared [`kube::Client`] (configuration, token files) on the HTTP/2
//! stack of [`http2`]; [`watch`] is the source of `FeatureFlag` resources (one watch per
//! requested resource, reported to the hub); [`events`] writes Kubernetes Events on the
//! resources served; [`reviews`] answers the authorization port (TokenReview,
//! SubjectAccessReview, which pod owns an address).
pub mod client;
pub mod events;
pub mod http2;
pub mod reviews;
pub mod watch;

pub use client::{KubeError, KubeSettings};
pub use watch::KubernetesSource;
