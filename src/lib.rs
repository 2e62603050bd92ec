//! flagd-proxy: serves Kubernetes `FeatureFlag` resources to flagd sidecars and in-process
//! providers over the flagd gRPC sync protocol.
//!
//! A core with ports. The [`hub`] is the core: subscriptions, fan-out and shared snapshots. It
//! owns its ports ([`hub::Source`], [`hub::EventSink`], [`hub::SpanSink`]) and imports no
//! adapter. The [`source`]s are the outbound adapters: each watches a resource on demand and
//! reports through a [`hub::Publisher`]. The [`wire`], with the [`server`] on the transport in [`net`] that accepts
//! connections, is the inbound adapter that streams snapshots to clients. Data flows one way:
//! source → hub → wire. [`telemetry`] exports the metrics and the spans over OTLP, when asked
//! to. `tests/architecture.rs` checks the imports.
#![forbid(unsafe_code)]

pub mod app;
pub mod authz;
pub mod backoff;
pub mod budget;
pub mod cli;
pub mod context;
pub mod document;
pub mod hub;
pub mod introspection;
pub mod kubernetes;
pub mod locks;
pub mod management;
pub mod metrics;
pub mod net;
pub mod protocol;
pub mod random;
pub mod selector;
pub mod server;
pub mod settings;
pub mod signals;
pub mod source;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod text;
pub mod wire;

#[cfg(test)]
mod testing;
