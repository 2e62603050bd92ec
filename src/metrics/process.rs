//! The process' own metrics under the names every Prometheus client uses
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`), read from `/proc/self` when
//! scraped.

/// Clock ticks per second of the CPU times in `/proc/self/stat` (`USER_HZ`: 100 on every Linux
/// architecture, whatever the kernel's own tick rate).
const USER_HZ: f64 = 100.0;

/// The process' CPU time and resident memory, read from `/proc/self` when scraped, under the
/// names every Prometheus client uses (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`), so the usual dashboards and alerts work without cAdvisor.
/// Nothing is exported where `/proc` cannot be read.
#[derive(Debug)]
pub(super) struct ProcessCollector;

impl ProcessCollector {
    /// User plus system CPU seconds, from `/proc/self/stat`.
    fn cpu_seconds() -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) may hold spaces; the fields after it start past its ')'.
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
        let utime: f64 = fields.get(11)?.parse().ok()?;
        let stime: f64 = fields.get(12)?.parse().ok()?;
        Some((utime + stime) / USER_HZ)
    }

    /// Resident memory in bytes, from `VmRSS` in `/proc/self/status`.
    fn resident_bytes() -> Option<i64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        if let Some(seconds) = Self::cpu_seconds() {
            let help = "User and system CPU time of the proxy process, in seconds";
            encode_one(
                &mut encoder,
                "process_cpu_seconds",
                help,
                ConstCounter::new(seconds),
            )?;
        }
        if let Some(bytes) = Self::resident_bytes() {
            let help = "Resident memory of the proxy process, in bytes";
            encode_one(
                &mut encoder,
                "process_resident_memory_bytes",
                help,
                ConstGauge::new(bytes),
            )?;
        }
        Ok(())
    }
}

/// Encodes one metric without labels under `name`.
fn encode_one(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    name: &str,
    help: &str,
    metric: impl prometheus_client::encoding::EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}
