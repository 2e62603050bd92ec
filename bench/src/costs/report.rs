//! The report of `--costs`: every unit cost with its name and unit, and the probes it comes
//! from.

use super::{Runs, SHARED, UnitCosts};
use crate::kit::header::Header;
use crate::kit::table::Table;

impl UnitCosts {
    /// Every cost with its name and unit, in the order of the report.
    pub(crate) fn named(&self) -> Vec<(&'static str, Option<f64>)> {
        let mut named = self.memory();
        named.extend(self.cpu());
        named
    }

    /// The memory costs.
    fn memory(&self) -> Vec<(&'static str, Option<f64>)> {
        vec![
            (
                "RSS of the process, one resource, no subscriber (MiB)",
                Some(self.base_mib),
            ),
            (
                "RSS per idle subscriber, own connection (KiB)",
                Some(self.kib_per_subscriber),
            ),
            (
                "RSS per extra stream on a shared connection (KiB)",
                Some(self.kib_per_stream),
            ),
            (
                "RSS per connection, without its streams (KiB)",
                Some(self.kib_per_connection),
            ),
            (
                "RSS per idle subscriber, TLS (KiB)",
                self.kib_per_tls_subscriber,
            ),
            (
                "RSS per watched resource, files (KiB)",
                Some(self.kib_per_watch_files),
            ),
            (
                "RSS per watched resource, Kubernetes watch (KiB)",
                self.kib_per_watch_kubernetes,
            ),
        ]
    }

    /// The CPU costs, and the bytes of a delivery.
    fn cpu(&self) -> Vec<(&'static str, Option<f64>)> {
        vec![
            (
                "CPU per version, files, 1 KiB (ms)",
                Some(self.ms_per_version),
            ),
            (
                "CPU per version, Kubernetes, 1 KiB (ms)",
                self.ms_per_version_kubernetes,
            ),
            (
                "CPU per version, files, 100 KiB (ms)",
                self.ms_per_large_version,
            ),
            (
                "CPU per delivery, 1 KiB, own connection (µs)",
                Some(self.us_per_delivery),
            ),
            (
                "CPU per delivery, 1 KiB, shared connection (µs)",
                Some(self.us_per_delivery_shared),
            ),
            (
                "CPU per byte delivered, uncompressed (ns)",
                Some(self.ns_per_byte),
            ),
            (
                "CPU per delivery, 100 KiB, gzip off (µs)",
                Some(self.us_per_large_delivery),
            ),
            (
                "CPU per delivery, 100 KiB, gzip on (µs)",
                Some(self.us_per_large_delivery_gzip),
            ),
            (
                "bytes per delivery, 100 KiB, gzip off",
                Some(self.bytes_per_large_delivery),
            ),
            (
                "bytes per delivery, 100 KiB, gzip on",
                Some(self.bytes_per_large_delivery_gzip),
            ),
            ("CPU per TLS handshake (ms)", self.ms_per_tls_handshake),
            (
                "load generator CPU per delivery, 1 KiB, shared connection (µs)",
                Some(self.us_load_generator_per_delivery),
            ),
        ]
    }
}

/// The Markdown report: the costs, then the probes they come from.
pub(super) fn report(costs: &UnitCosts, runs: &Runs, header: &Header) -> String {
    let mut out = format!("## flagd-proxy unit costs\n\n{}.\n\n", header.sentence());
    let mut table = Table::new(["cost", "value"], "lr");
    for (name, value) in costs.named() {
        table.figure_row(name, &[value], 3);
    }
    out.push_str(&table.markdown());
    let header = "probe | subscribers | streams per connection | document (B) | CPU per update (s) \
         | RSS empty → idle (MiB) | connect CPU (s) | bytes written per update";
    let mut table = Table::of(header, "lr");
    for (name, r) in runs {
        let shared = ["shared", "resources", "large-resources", "watches"].contains(name);
        table.row([
            (*name).to_owned(),
            r.subscribers_connected.to_string(),
            (if shared { SHARED } else { 1 }).to_string(),
            r.document_bytes.to_string(),
            format!("{:.4}", r.cpu_seconds_per_update),
            format!("{:.1} → {:.1}", r.rss_empty_mib, r.rss_idle_mib),
            format!("{:.2}", r.connect_cpu_seconds),
            format!("{:.0}", r.bytes_written_per_update),
        ]);
    }
    out.push('\n');
    out + &table.markdown()
}
