//! The flags of what the sync services add to every message (`Sync protocol`): the
//! `sync_context` entries and gzip compression, which become [`CompressionSettings`].
use clap::Args;

use crate::wire::compression::{self, CompressionMode, CompressionSettings};

/// What the sync services add to every message.
#[derive(Debug, Args)]
#[command(next_help_heading = "Sync protocol")]
pub struct SyncArgs {
    /// An entry for every message's sync_context and for GetMetadata, as flagd's
    /// --context-value: providers merge it into their evaluation context, so targeting rules can
    /// use it (for example region=eu). Repeatable or comma-separated; in the config file a list
    /// of key=value or a mapping. The keys proxy, proxyVersion and selector are the proxy's own,
    /// flagSetId and version each flag set's (refused, as are keys that differ from them only in
    /// case or in characters that look alike, and keys with control or invisible characters); a
    /// key a flag set's own metadata also sets keeps the flag set's value.
    #[arg(long = "context-value", value_name = "KEY=VALUE", env = "FLAGD_PROXY_CONTEXT_VALUES", value_delimiter = ',', value_parser = super::KeyValue(crate::context::parse_entry))]
    pub context_values: Vec<(String, String)>,

    /// gzip for sync messages: `auto` sends the messages of at least --compression-min-bytes
    /// gzipped to every client that lists gzip in grpc-accept-encoding (each version is
    /// compressed once, for all of them); other clients, and smaller messages, go uncompressed.
    /// `off` never compresses.
    #[arg(long, value_name = "MODE", env = "FLAGD_PROXY_COMPRESSION", value_enum, default_value_t = Compression::Auto)]
    pub compression: Compression,

    /// Sync messages smaller than this many bytes are sent uncompressed.
    #[arg(long, value_name = "BYTES", env = "FLAGD_PROXY_COMPRESSION_MIN_BYTES", default_value_t = compression::DEFAULT_MIN_BYTES)]
    pub compression_min_bytes: usize,

    /// gzip level, 1 (fastest) to 9 (smallest).
    #[arg(long, value_name = "LEVEL", env = "FLAGD_PROXY_COMPRESSION_LEVEL", default_value_t = compression::DEFAULT_LEVEL, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub compression_level: u32,
}

/// `--compression`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Compression {
    Auto,
    Off,
}

impl SyncArgs {
    pub fn compression_settings(&self) -> CompressionSettings {
        CompressionSettings {
            mode: match self.compression {
                Compression::Auto => CompressionMode::Auto,
                Compression::Off => CompressionMode::Off,
            },
            min_bytes: self.compression_min_bytes,
            level: self.compression_level,
        }
    }
}
