//! The flags of the watches and what they may hold (`Watches`): idle timeout, watch and
//! waiting-resource counts and document size; they become [`HubOptions`].
use std::time::Duration;

use clap::Args;

use super::duration_text;
use crate::hub::{self, HubOptions};

/// Watches and what they may hold ([`HubOptions`]).
#[derive(Debug, Args)]
#[command(next_help_heading = "Watches")]
pub struct HubArgs {
    /// How long a resource stays watched after its last client has gone.
    #[arg(long, value_name = "DURATION", env = "FLAGD_PROXY_IDLE_TIMEOUT", default_value = duration_text(hub::DEFAULT_IDLE_TIMEOUT), value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// The most resources watched at once; requests for further resources get RESOURCE_EXHAUSTED.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_WATCHES",
        default_value_t = hub::DEFAULT_MAX_WATCHES
    )]
    pub max_watches: usize,

    /// The largest flag configuration sent, in bytes, its flag-set metadata counted again (it is
    /// repeated in every message's sync_context). Larger resources are not pushed (clients
    /// refuse messages over 4 MiB); subscribers keep the last good version.
    #[arg(long, value_name = "BYTES", env = "FLAGD_PROXY_MAX_DOCUMENT_BYTES", default_value_t = hub::DEFAULT_MAX_DOCUMENT_BYTES)]
    pub max_document_bytes: usize,

    /// The most resources waited on that do not exist yet (the source reports them absent and
    /// they never had a version). Streams for a further such resource end with
    /// RESOURCE_EXHAUSTED and its watch stops at once; resources that exist are not affected.
    #[arg(
        long,
        value_name = "N",
        env = "FLAGD_PROXY_MAX_WAITING_RESOURCES",
        default_value_t = hub::DEFAULT_MAX_WAITING_RESOURCES
    )]
    pub max_waiting_resources: usize,
}

impl From<HubArgs> for HubOptions {
    fn from(args: HubArgs) -> Self {
        HubOptions {
            idle_timeout: args.idle_timeout,
            max_watches: args.max_watches,
            max_document_bytes: args.max_document_bytes,
            max_waiting_resources: args.max_waiting_resources,
        }
    }
}
