//! flagd-proxy: serves Kubernetes `FeatureFlag` resources to flagd sidecars and in-process
//! providers over the flagd gRPC sync protocol.
//!
//! Data flows one way: a [`source`] watches a resource on demand, the [`hub`] turns what it sees
//! into shared snapshots, and the [`wire`] streams them to clients.
#![forbid(unsafe_code)]

pub mod app;
pub mod authz;
pub mod backoff;
pub mod cli;
pub mod connection;
pub mod context;
pub mod document;
pub mod hub;
pub mod listener;
pub mod management;
pub mod metrics;
pub mod selector;
pub mod server;
pub mod source;
pub mod tls;
pub mod wire;

#[cfg(test)]
mod testing;
