//! The flag of what clients may make the proxy hold (`Memory`): the memory budget; it becomes
//! [`MemorySettings`].
use clap::Args;

use crate::budget;
use crate::settings::MemorySettings;

/// What clients may make the proxy hold ([`MemorySettings`]).
#[derive(Debug, Args)]
#[command(next_help_heading = "Memory")]
pub struct MemoryArgs {
    /// The memory budget for what clients can make the proxy hold: versions (once each, while
    /// any stream holds them), connections (with what each keeps of its busiest moment),
    /// streams (with their request message, as large as --max-request-bytes allows, until the
    /// request has arrived) and watches (at what their source's watch holds), at their measured
    /// size. Above it, new connections are closed, new streams and streams that would start a
    /// new watch get RESOURCE_EXHAUSTED, and a burst of new streams that would not fit closes
    /// its connection; sync connections that keep many stream places they do not use are
    /// closed, then (while the budget is full) those with no stream open; established streams
    /// keep being served. Bytes, or with a unit (512Mi, 2Gi): 0 means no limit, otherwise at
    /// least 1Mi. Default: three quarters of what the container's memory limit (cgroup) leaves
    /// above the process's 16 MiB base, else half the machine's memory. Under 192Mi (a memory
    /// limit under about 272Mi) the allocator also gives freed memory back to the system at
    /// once instead of keeping it 10 s for reuse.
    #[arg(long, value_name = "BYTES", env = "FLAGD_PROXY_MEMORY_BUDGET", value_parser = budget::parse_budget)]
    pub memory_budget: Option<usize>,
}

impl From<MemoryArgs> for MemorySettings {
    fn from(args: MemoryArgs) -> Self {
        MemorySettings {
            budget: args.memory_budget.unwrap_or_else(budget::default_limit),
        }
    }
}
