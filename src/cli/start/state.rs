//! The flags of the state directory (`State`): where the last version of each resource is kept
//! across restarts, and how much room it may take; they become [`StateSettings`] when a
//! directory is given.
use std::path::PathBuf;

use clap::Args;

use crate::budget;
use crate::state::{self, StateSettings};

/// The state directory ([`StateSettings`]); off without `--state-dir`.
#[derive(Debug, Args)]
#[command(next_help_heading = "State")]
pub struct StateArgs {
    /// Keep the last version of every resource served in this directory (created if missing),
    /// one file each, written atomically and checksummed, and read at start: a resource whose
    /// source (the upstream or the Kubernetes API) has not delivered it 500 ms after a client
    /// asked, or is unreachable, is served from there at once, marked stale (/status, the
    /// flagd_proxy_stale_resources metric), until the source delivers a fresh version. A file
    /// that does not read back is ignored with a warning. Off when not set.
    #[arg(long, value_name = "DIR", env = "FLAGD_PROXY_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// The most bytes the files of --state-dir take together; a version that would go over is
    /// not kept (with a warning). Bytes, or with a unit (512Ki, 64Mi).
    #[arg(long, value_name = "BYTES", env = "FLAGD_PROXY_STATE_DIR_MAX_BYTES", default_value_t = state::DEFAULT_MAX_BYTES, value_parser = budget::parse_bytes, requires = "state_dir")]
    pub state_dir_max_bytes: usize,
}

impl StateArgs {
    /// The state directory's settings, when one is given.
    pub fn into_settings(self) -> Option<StateSettings> {
        let max_bytes = self.state_dir_max_bytes;
        self.state_dir.map(|dir| StateSettings { dir, max_bytes })
    }
}
