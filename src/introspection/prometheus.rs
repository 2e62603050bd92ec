//! Samples read back from the Prometheus text format (what `/metrics` serves, and what the
//! Kubernetes API server serves): one [`Sample`] a line, comments skipped.
//!
//! Label values are read with their escapes (`\\`, `\"`, `\n`), so a quote or a comma inside
//! one is part of the value. A timestamp after the value is ignored. A line that does not read
//! as a sample is skipped: what a port answers is not trusted to be well formed.

/// Label names and values, in the order written.
pub type Labels = Vec<(String, String)>;

/// One sample: the metric's name, its labels in the order written, and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Labels,
    pub value: f64,
}

impl Sample {
    /// The value of the label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Reads one line: `name{label="value",...} number [timestamp]`.
    fn parse(line: &str) -> Option<Self> {
        let (name, labels, rest) = series(line)?;
        let value = rest.split_whitespace().next()?.parse().ok()?;
        Some(Self {
            name: name.to_owned(),
            labels,
            value,
        })
    }
}

/// The samples of one exposition, in the order written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples(Vec<Sample>);

impl Samples {
    pub fn parse(text: &str) -> Self {
        Self(
            text.lines()
                .filter(|line| !line.starts_with('#'))
                .filter_map(Sample::parse)
                .collect(),
        )
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Sample> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The samples of the metric `name`, whatever their labels.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |sample| sample.name == name)
    }

    /// The value of the sample `series`, written as in the text (`name` or
    /// `name{label="value",...}`); the labels must be the same, in any order.
    pub fn get(&self, series_text: &str) -> Option<f64> {
        let (name, mut labels, _) = series(series_text)?;
        labels.sort_unstable();
        self.named(name)
            .find(|sample| {
                let mut theirs = sample.labels.clone();
                theirs.sort_unstable();
                theirs == labels
            })
            .map(|sample| sample.value)
    }

    /// The sum of the samples of the metric `name` (0 when there is none).
    pub fn sum(&self, name: &str) -> f64 {
        self.named(name).map(|sample| sample.value).sum()
    }
}

/// The name and labels at the start of `text`, and what follows them.
fn series(text: &str) -> Option<(&str, Labels, &str)> {
    let text = text.trim_start();
    let end = text
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(text.len());
    let (name, rest) = text.split_at(end);
    if name.is_empty() {
        return None;
    }
    match rest.strip_prefix('{') {
        Some(inside) => {
            let (labels, rest) = labels(inside)?;
            Some((name, labels, rest))
        }
        None => Some((name, Vec::new(), rest)),
    }
}

/// Reads `a="x",b="y\"z"}` (after the opening brace): the labels, and what follows the brace.
fn labels(text: &str) -> Option<(Labels, &str)> {
    let mut labels = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after) = rest.split_once('=')?;
        let mut chars = after.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (at, '"') => break at,
                (_, other) => value.push(other),
            }
        };
        labels.push((key.trim().to_owned(), value));
        // Past the closing quote: `end` counts from after the opening one.
        rest = &after[end + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP flagd_proxy_upstream_watches Resources\n\
        # TYPE flagd_proxy_upstream_watches gauge\n\
        flagd_proxy_upstream_watches 2\n\
        flagd_proxy_rejected_requests_total{reason=\"max_watches\"} 3\n\
        flagd_proxy_rejected_requests_total{reason=\"max_connections\"} 0\n\
        flagd_proxy_invalid_documents_total{namespace=\"shop\",name=\"checkout\"} 2 1700000000\n\
        odd{path=\"a \\\"b\\\", c}\\\\\\n\"} 1.5\n\
        not a sample\n\
        broken{label=\"unclosed} 1\n\
        # EOF\n";

    #[test]
    fn samples_are_read_with_their_labels_and_lines_that_are_not_are_skipped() {
        let samples = Samples::parse(TEXT);
        assert_eq!(samples.len(), 5, "{samples:?}");
        assert_eq!(samples.get("flagd_proxy_upstream_watches"), Some(2.0));
        assert_eq!(
            samples
                .get("flagd_proxy_invalid_documents_total{name=\"checkout\",namespace=\"shop\"}"),
            Some(2.0),
            "labels in another order, and the timestamp ignored"
        );
        assert_eq!(
            samples.get("flagd_proxy_invalid_documents_total{namespace=\"shop\"}"),
            None
        );
        assert_eq!(samples.sum("flagd_proxy_rejected_requests_total"), 3.0);
        let odd = samples.named("odd").next().expect("odd");
        assert_eq!(odd.label("path"), Some("a \"b\", c}\\\n"));
        assert_eq!(odd.value, 1.5);
        assert_eq!(samples.get("broken"), None);
        assert!(Samples::parse("# only comments\n").is_empty());
    }
}
