//! The header of a run: the machine it ran on, the load average before and after, and how long
//! it took.

use std::time::Instant;

use serde_json::{Value, json};

/// The machine: CPUs, their model, memory (GiB) and kernel.
pub(crate) fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned());
    let memory_kib = flagd_proxy::introspection::procfs::meminfo()
        .ok()
        .and_then(|meminfo| meminfo.number("MemTotal"));
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": model,
        "memory_gib": memory_kib.map(|k| (k as f64 / 1048576.0 * 10.0).round() / 10.0),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
    })
}

/// The machine of [`machine`] in words: CPUs, their model, memory and kernel.
pub(crate) fn machine_line(m: &Value) -> String {
    format!(
        "{} CPUs ({}), {} GiB, Linux {}",
        m["cpus"],
        m["cpu_model"].as_str().unwrap_or("?"),
        m["memory_gib"],
        m["kernel"].as_str().unwrap_or("?"),
    )
}

/// The load average over 1, 5 and 15 minutes, as /proc/loadavg gives it.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A run under way: when it began and the load average then.
pub(crate) struct Clock {
    load_before: String,
    started: Instant,
}

impl Clock {
    pub(crate) fn start() -> Self {
        Clock {
            load_before: loadavg(),
            started: Instant::now(),
        }
    }

    /// When the run began.
    pub(crate) fn began(&self) -> Instant {
        self.started
    }

    /// The header of the run, now that it is over.
    pub(crate) fn stop(self) -> Header {
        Header {
            machine: machine(),
            load_before: self.load_before,
            load_after: loadavg(),
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}

/// What every report says of its run besides the results.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Header {
    machine: Value,
    load_before: String,
    load_after: String,
    /// How long the run took.
    seconds: f64,
}

impl Header {
    /// The machine, the load and the duration in a sentence of the Markdown report.
    pub(crate) fn sentence(&self) -> String {
        format!(
            "Machine: {}. Load average before: {}; after: {}. Duration: {:.0} s",
            machine_line(&self.machine),
            self.load_before,
            self.load_after,
            self.seconds
        )
    }

    /// `report`, a JSON object, with the header's fields (machine, load_before, load_after,
    /// seconds) added.
    pub(crate) fn stamp(&self, mut report: Value) -> Value {
        if let (Value::Object(fields), Ok(Value::Object(header))) =
            (&mut report, serde_json::to_value(self))
        {
            fields.extend(header);
        }
        report
    }
}
