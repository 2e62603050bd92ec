//! The process' own metrics under the names every Prometheus client uses
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`), read from `/proc/self` when
//! scraped.

use crate::introspection::Process;

/// The process' CPU time and resident memory, read from `/proc/self` when scraped, under the
/// names every Prometheus client uses (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`), so the usual dashboards and alerts work without cAdvisor.
/// Nothing is exported where `/proc` cannot be read.
#[derive(Debug)]
pub(super) struct ProcessCollector;

impl ProcessCollector {
    /// User plus system CPU seconds, from `/proc/self/stat`.
    fn cpu_seconds() -> Option<f64> {
        Process::This.cpu_seconds()
    }

    /// Resident memory in bytes, from `VmRSS` in `/proc/self/status`.
    fn resident_bytes() -> Option<i64> {
        let kib = Process::This.status().ok()?.number("VmRSS")?;
        i64::try_from(kib).ok()?.checked_mul(1024)
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
