//! What the report of every scenario is made of: the header of a run (machine, load, duration),
//! Markdown tables, rows of figures read off a result, and the latency summary.

pub(crate) mod header;
pub(crate) mod latency;
pub(crate) mod table;
