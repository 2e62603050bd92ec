//! A latency summary: how many samples, their median, 99th percentile and maximum (ms).

use super::table::{Figure, figure};

/// A point of a latency summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    P50,
    P99,
    Max,
}

/// The summary of a set of latencies in milliseconds; `None` where there is no sample.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct Stats {
    pub(crate) samples: usize,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) max_ms: Option<f64>,
}

impl Stats {
    /// The summary of `values` (nearest rank).
    pub(crate) fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        let pick = |p: f64| {
            if values.is_empty() {
                None
            } else {
                let rank = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
                Some(values[rank - 1])
            }
        };
        Stats {
            samples: values.len(),
            p50_ms: pick(0.50),
            p99_ms: pick(0.99),
            max_ms: values.last().copied(),
        }
    }

    /// The rows "`name` p50 (ms)" and so on of the `points`, shown with `digits`.
    pub(crate) fn figures(&self, name: &str, digits: usize, points: &[Point]) -> Vec<Figure> {
        let point = |point: &Point| match point {
            Point::P50 => ("p50", self.p50_ms),
            Point::P99 => ("p99", self.p99_ms),
            Point::Max => ("max", self.max_ms),
        };
        points
            .iter()
            .map(point)
            .map(|(label, value)| figure(&format!("{name} {label} (ms)"), value, digits))
            .collect()
    }
}
