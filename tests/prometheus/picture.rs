//! `docs/dashboard.svg`: the dashboard's panels drawn from what the test's Prometheus answers to
//! their queries over the run (`query_range`), laid out as the dashboard lays them out. Line
//! charts for every panel, the last value for stat panels. Not Grafana: the same queries, the
//! same data, drawn plainly.
use std::fmt::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::{DASHBOARD, concrete, root};
use crate::support::prometheus::Prometheus;

const COLUMN: f64 = 42.0;
const ROW: f64 = 30.0;
const COLORS: [&str; 8] = [
    "#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0",
];

/// One series of a panel: its legend and (time, value) points.
struct Series {
    legend: String,
    points: Vec<(f64, f64)>,
}

pub async fn draw(prometheus: &Prometheus, since: SystemTime, out: &Path) {
    let seconds = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64()
    };
    let (start, end) = (seconds(since), seconds(SystemTime::now()));
    let text = std::fs::read_to_string(root().join(DASHBOARD)).expect("dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let bottom = panels
        .iter()
        .map(|p| {
            p["gridPos"]["y"].as_f64().unwrap_or(0.0) + p["gridPos"]["h"].as_f64().unwrap_or(8.0)
        })
        .fold(0.0, f64::max);
    let (width, height) = (24.0 * COLUMN, bottom * ROW + 40.0);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="#111217"/>
<text x="8" y="24" fill="#d8d9da" font-size="16">flagd-proxy — drawn from a real Prometheus scraping a loaded proxy ({:.0} s)</text>
"##,
        end - start
    );
    for panel in panels {
        let mut series = Vec::new();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = concrete(target["expr"].as_str().unwrap_or_default());
            let legend = target["legendFormat"].as_str().unwrap_or_default();
            let data = prometheus
                .api(
                    "query_range",
                    &[
                        ("query", &expr),
                        ("start", &format!("{start:.3}")),
                        ("end", &format!("{end:.3}")),
                        ("step", "2"),
                    ],
                )
                .await
                .unwrap_or_else(|e| panic!("{expr}: {e}"));
            for result in data["result"].as_array().into_iter().flatten() {
                let points = result["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| {
                        let t = v[0].as_f64()?;
                        let y: f64 = v[1].as_str()?.parse().ok()?;
                        y.is_finite().then_some((t, y))
                    })
                    .collect();
                series.push(Series {
                    legend: fill_legend(legend, &result["metric"]),
                    points,
                });
            }
        }
        panel_svg(&mut svg, panel, &series, (start, end));
    }
    svg.push_str("</svg>\n");
    std::fs::write(out, svg).expect("write the picture");
    eprintln!("drew {}", out.display());
}

/// `{{label}}` in a legend replaced by the series' label values.
fn fill_legend(legend: &str, metric: &Value) -> String {
    let mut text = legend.to_owned();
    if let Some(labels) = metric.as_object() {
        for (key, value) in labels {
            text = text.replace(
                &format!("{{{{{key}}}}}"),
                value.as_str().unwrap_or_default(),
            );
        }
    }
    text
}

fn panel_svg(svg: &mut String, panel: &Value, series: &[Series], (start, end): (f64, f64)) {
    let grid = &panel["gridPos"];
    let x = grid["x"].as_f64().unwrap_or(0.0) * COLUMN + 4.0;
    let y = grid["y"].as_f64().unwrap_or(0.0) * ROW + 40.0;
    let w = grid["w"].as_f64().unwrap_or(12.0) * COLUMN - 8.0;
    let h = grid["h"].as_f64().unwrap_or(8.0) * ROW - 8.0;
    let title = escape(panel["title"].as_str().unwrap_or_default());
    let unit = panel["fieldConfig"]["defaults"]["unit"]
        .as_str()
        .unwrap_or("short");
    let _ = writeln!(
        svg,
        r##"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="#181b1f" stroke="#2c3235"/>
<text x="{}" y="{}" fill="#d8d9da" font-size="13">{title}</text>"##,
        x + 8.0,
        y + 18.0
    );
    if panel["type"] == "stat" {
        for (i, s) in series.iter().enumerate() {
            let last = s.points.last().map_or(f64::NAN, |p| p.1);
            let _ = writeln!(
                svg,
                r##"<text x="{}" y="{}" fill="#73bf69" font-size="28">{}</text><text x="{}" y="{}" fill="#9fa7b3">{}</text>"##,
                x + 16.0,
                y + 70.0 + 50.0 * i as f64,
                escape(&format_value(last, unit)),
                x + 16.0,
                y + 88.0 + 50.0 * i as f64,
                escape(&s.legend)
            );
        }
        return;
    }
    let legend_rows = series.len().min(4) as f64;
    let (left, top) = (x + 56.0, y + 28.0);
    let (plot_w, plot_h) = (w - 64.0, h - 44.0 - 14.0 * legend_rows);
    let max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let max = if max > 0.0 { max * 1.1 } else { 1.0 };
    for tick in [0.0, 0.5, 1.0] {
        let ty = top + plot_h * (1.0 - tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{ty:.1}" x2="{}" y2="{ty:.1}" stroke="#2c3235"/><text x="{}" y="{:.1}" fill="#9fa7b3" text-anchor="end">{}</text>"##,
            left + plot_w,
            left - 4.0,
            ty + 4.0,
            escape(&format_value(max * tick, unit))
        );
    }
    let span = (end - start).max(1.0);
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = s
            .points
            .iter()
            .map(|(t, v)| {
                format!(
                    "{:.1},{:.1}",
                    left + plot_w * (t - start) / span,
                    top + plot_h * (1.0 - v / max)
                )
            })
            .collect();
        let _ = writeln!(
            svg,
            r##"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"##,
            points.join(" ")
        );
        if i < 4 {
            let ly = top + plot_h + 16.0 + 14.0 * i as f64;
            let more = if i == 3 && series.len() > 4 {
                format!(" (and {} more)", series.len() - 4)
            } else {
                String::new()
            };
            let _ = writeln!(
                svg,
                r##"<rect x="{left}" y="{:.1}" width="10" height="3" fill="{color}"/><text x="{}" y="{ly:.1}" fill="#9fa7b3">{}{more}</text>"##,
                ly - 4.0,
                left + 14.0,
                escape(&s.legend)
            );
        }
    }
}

/// A value in the panel's unit, briefly.
fn format_value(value: f64, unit: &str) -> String {
    if !value.is_finite() {
        return "-".into();
    }
    match unit {
        "bytes" => format!("{:.0} MiB", value / 1_048_576.0),
        "s" if value >= 86_400.0 => format!("{:.1} days", value / 86_400.0),
        "s" if value >= 1.0 => format!("{value:.1} s"),
        "s" => format!("{:.1} ms", value * 1000.0),
        "ops" => format!("{value:.2}/s"),
        _ if value >= 100.0 => format!("{value:.0}"),
        _ => format!("{value:.2}"),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
