//! Printing a [`Report`]: as JSON for scripts, or as a table for people (every resource with its
//! state, version and age, then the watches, connections, limits hit, memory and certificate).
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Memory, Report};
use crate::introspection::SourceStatus;
use crate::text::escaped;

impl Memory {
    /// "12.0 MiB charged of 384.0 MiB budget (versions 4.0 MiB, ...)"; without the list when
    /// nothing is charged.
    pub(super) fn summary(&self) -> String {
        let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / 1_048_576.0);
        let used: u64 = self.charged.values().sum();
        let budget = match self.budget {
            0 => "no budget".to_owned(),
            budget => format!("of {} budget", mib(budget)),
        };
        let parts: Vec<String> = self
            .charged
            .iter()
            .map(|(kind, bytes)| format!("{} {}", escaped(kind), mib(*bytes)))
            .collect();
        if parts.is_empty() {
            return format!("{} charged {budget}", mib(used));
        }
        format!("{} charged {budget} ({})", mib(used), parts.join(", "))
    }
}

impl Report {
    /// The report as JSON, for scripts: the same value, with every control or invisible
    /// character in its strings written as a JSON escape (`\u001b`), so that printing it to a
    /// terminal cannot act on it.
    pub fn to_json(&self) -> String {
        let json = serde_json::to_string_pretty(self).expect("a report serializes");
        crate::text::json_escaped(&json).into_owned() + "\n"
    }

    /// The report as text for a terminal; `now` dates the certificate's expiry. Every text from
    /// the wire (and so every file name the proxy reports) is shown with its control and
    /// invisible characters escaped (`\u{1b}`), one line each.
    pub fn to_table(&self, now: SystemTime) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "flagd-proxy at {}: {}, source {}{}",
            escaped(&self.address),
            if self.ready { "ready" } else { "NOT READY" },
            escaped(&self.source),
            source_summary(&self.source_status),
        );
        out.push('\n');
        if self.resources.is_empty() {
            out.push_str("No resource is watched (no client has asked for one).\n");
        } else {
            let rows: Vec<[String; 6]> = self
                .resources
                .iter()
                .map(|r| {
                    [
                        escaped(&r.selector).into_owned(),
                        if r.stale {
                            format!("{}, stale", escaped(&r.state))
                        } else {
                            escaped(&r.state).into_owned()
                        },
                        r.version.map_or("-".into(), |v| v.to_string()),
                        r.version_age_seconds
                            .map_or("-".into(), |s| age(Duration::from_secs_f64(s.max(0.0)))),
                        r.subscribers.to_string(),
                        match (&r.last_error, &r.warnings) {
                            (Some(error), _) => escaped(error).into_owned(),
                            (None, Some(warnings)) => {
                                format!("served with warnings: {}", escaped(warnings))
                            }
                            (None, None) => "-".into(),
                        },
                    ]
                })
                .collect();
            table(
                &mut out,
                [
                    "RESOURCE",
                    "STATE",
                    "VERSION",
                    "AGE",
                    "SUBSCRIBERS",
                    "LAST ERROR",
                ],
                &rows,
            );
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "Watches:      {} active, {} waiting for their resource to exist",
            self.watches.active, self.watches.waiting
        );
        let _ = writeln!(out, "Connections:  {}", listing(&self.connections));
        let _ = writeln!(out, "Limits hit:   {}", listing(&self.limits_hit));
        let _ = writeln!(out, "Memory:       {}", self.memory.summary());
        let _ = writeln!(out, "Refused versions: {}", listing(&self.invalid_versions));
        if let Some(at) = self.certificate_expires_at {
            let at_time = UNIX_EPOCH + Duration::from_secs(at);
            let when = match at_time.duration_since(now) {
                Ok(left) => format!("expires in {}", age(left)),
                Err(past) => format!("EXPIRED {} ago", age(past.duration())),
            };
            let _ = writeln!(out, "Certificate:  {when}");
        }
        for problem in source_problems(&self.source_status) {
            let _ = writeln!(out, "Source problem: {problem}");
        }
        out
    }
}

/// What the source's report adds to the first line.
fn source_summary(status: &SourceStatus) -> String {
    let part = match status {
        SourceStatus::Manifests(manifests) => {
            let noun = if manifests.resources == 1 {
                "resource"
            } else {
                "resources"
            };
            format!("{} {noun} in the files", manifests.resources)
        }
        SourceStatus::Kubernetes(kubernetes) => escaped(&kubernetes.api_server).into_owned(),
        SourceStatus::Upstream(upstream) => escaped(&upstream.upstream).into_owned(),
        SourceStatus::Unreported => return String::new(),
    };
    format!(" ({part})")
}

/// The source's problems (files or directories that cannot be read, files that do not parse),
/// one line each.
fn source_problems(status: &SourceStatus) -> Vec<String> {
    status
        .problems()
        .iter()
        .map(|p| format!("{}: {}", escaped(&p.path), escaped(&p.error)))
        .collect()
}

/// `key value, key value`, or `none`.
fn listing(entries: &BTreeMap<String, u64>) -> String {
    if entries.is_empty() {
        return "none".into();
    }
    entries
        .iter()
        .map(|(key, value)| format!("{} {value}", escaped(key)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A duration in its two largest units: `42s`, `3m12s`, `5h4m`, `13d2h`.
pub(super) fn age(duration: Duration) -> String {
    let s = duration.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// Columns padded to their widest cell; the last column is not padded.
fn table<const N: usize>(out: &mut String, header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
