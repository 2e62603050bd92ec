//! Reading what a process exposes: samples of the API server's Prometheus text format, and the
//! TCP connections a process holds (from `/proc`).

/// Sums `apiserver_longrunning_requests` samples with `verb="WATCH"` and the given resource.
pub fn sum_long_running_watches(metrics: &str, resource: &str) -> u64 {
    sum_samples(metrics, "apiserver_longrunning_requests", "WATCH", resource)
}

/// Sum of the samples of the apiserver metric `name` with labels `verb` and `resource`, over all
/// other labels.
pub(crate) fn sum_samples(metrics: &str, name: &str, verb: &str, resource: &str) -> u64 {
    let prefix = format!("{name}{{");
    let mut total = 0.0_f64;
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        let labels = parse_labels(labels);
        let label = |name: &str| {
            labels
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        if label("verb") == Some(verb) && label("resource") == Some(resource) {
            // A sample may carry a timestamp after the value.
            let value = value.split_whitespace().next().unwrap_or("0");
            total += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    total.max(0.0).round() as u64
}

/// The TCP connections process `pid` holds to 127.0.0.1:`port` (from /proc: its socket file
/// descriptors matched against the established connections of its network namespace).
pub fn connections_to(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .filter_map(|link| {
            link.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .collect();
    let remote = format!(":{port:04X}");
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok())
        .map(|text| {
            text.lines()
                .skip(1)
                .filter(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.len() > 9
                        && fields[2].ends_with(&remote)
                        && fields[3] == "01"
                        && inodes.contains(fields[9])
                })
                .count()
        })
        .sum()
}

/// Parses Prometheus text-format labels: `a="x",b="y\"z"`.
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' {
                break;
            }
            name.push(c);
            chars.next();
        }
        if chars.next() != Some('=') || chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                other => value.push(other),
            }
        }
        labels.push((name.trim().to_owned(), value));
    }
    labels
}
