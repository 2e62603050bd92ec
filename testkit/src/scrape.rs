//! Reading what a process exposes: samples of the API server's Prometheus text format, and the
//! TCP connections a process holds (from `/proc`), both with the proxy's own readers.

use std::collections::BTreeMap;

use flagd_proxy::introspection::{Process, Samples, TcpSocket};

/// Sums `apiserver_longrunning_requests` samples with `verb="WATCH"` and the given resource.
pub fn sum_long_running_watches(metrics: &str, resource: &str) -> u64 {
    sum_samples(metrics, "apiserver_longrunning_requests", "WATCH", resource)
}

/// Sum of the samples of the apiserver metric `name` with labels `verb` and `resource`, over all
/// other labels.
pub(crate) fn sum_samples(metrics: &str, name: &str, verb: &str, resource: &str) -> u64 {
    let total: f64 = Samples::parse(metrics)
        .named(name)
        .filter(|sample| {
            sample.label("verb") == Some(verb) && sample.label("resource") == Some(resource)
        })
        .map(|sample| sample.value)
        .sum();
    total.max(0.0).round() as u64
}

/// What the API server has counted at one moment: `apiserver_request_total` by verb and
/// resource (summed over the other labels), and the watches open
/// (`apiserver_longrunning_requests`, verb `WATCH`) by resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestCounts {
    pub answered: BTreeMap<(String, String), u64>,
    pub open_watches: BTreeMap<String, u64>,
}

impl RequestCounts {
    /// Reads them from the API server's `/metrics` text.
    pub fn parse(metrics: &str) -> Self {
        let samples = Samples::parse(metrics);
        let mut answered = BTreeMap::<(String, String), f64>::new();
        for sample in samples.named("apiserver_request_total") {
            let key = |name| sample.label(name).unwrap_or_default().to_owned();
            *answered.entry((key("verb"), key("resource"))).or_default() += sample.value;
        }
        let mut open_watches = BTreeMap::<String, f64>::new();
        for sample in samples.named("apiserver_longrunning_requests") {
            if sample.label("verb") == Some("WATCH") {
                let resource = sample.label("resource").unwrap_or_default().to_owned();
                *open_watches.entry(resource).or_default() += sample.value;
            }
        }
        let round = |v: f64| v.max(0.0).round() as u64;
        RequestCounts {
            answered: answered.into_iter().map(|(k, v)| (k, round(v))).collect(),
            open_watches: open_watches
                .into_iter()
                .map(|(k, v)| (k, round(v)))
                .collect(),
        }
    }

    /// The requests made between `before` and these counts, by verb and resource: those
    /// answered in between, plus, for watches, the rise in open ones (the API server counts a
    /// watch in `apiserver_request_total` only once it has ended).
    pub fn since(&self, before: &RequestCounts) -> BTreeMap<(String, String), u64> {
        let mut made = BTreeMap::new();
        for (key, count) in &self.answered {
            let was = before.answered.get(key).copied().unwrap_or(0);
            if *count > was {
                made.insert(key.clone(), count - was);
            }
        }
        for (resource, open) in &self.open_watches {
            let was = before.open_watches.get(resource).copied().unwrap_or(0);
            if *open > was {
                *made
                    .entry(("WATCH".to_owned(), resource.clone()))
                    .or_default() += open - was;
            }
        }
        made
    }
}

/// The TCP connections process `pid` holds to 127.0.0.1:`port` (from /proc: its socket file
/// descriptors matched against the established connections of its network namespace).
pub fn connections_to(pid: u32, port: u16) -> usize {
    let process = Process::Id(pid);
    let inodes = process.socket_inodes().unwrap_or_default();
    process
        .tcp()
        .iter()
        .filter(|socket| {
            socket.remote_port == port
                && socket.state == TcpSocket::ESTABLISHED
                && inodes.contains(&socket.inode)
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",group="authentication.k8s.io",resource="tokenreviews",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 7
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 1
"#;

    const AFTER: &str = r#"apiserver_request_total{code="201",component="apiserver",group="authentication.k8s.io",resource="tokenreviews",scope="resource",subresource="",verb="POST",version="v1"} 5
apiserver_request_total{code="500",component="apiserver",group="authentication.k8s.io",resource="tokenreviews",scope="resource",subresource="",verb="POST",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 8
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
"#;

    fn key(verb: &str, resource: &str) -> (String, String) {
        (verb.to_owned(), resource.to_owned())
    }

    #[test]
    fn requests_made_between_two_readings_by_verb_and_resource() {
        let before = RequestCounts::parse(BEFORE);
        let after = RequestCounts::parse(AFTER);
        assert_eq!(before.answered[&key("POST", "tokenreviews")], 3);
        let made = after.since(&before);
        assert_eq!(
            made,
            BTreeMap::from([
                (key("GET", ""), 1),
                (key("POST", "tokenreviews"), 3),
                // One watch ended, and two more are open than before.
                (key("WATCH", "pods"), 2),
            ])
        );
        assert_eq!(
            sum_samples(AFTER, "apiserver_request_total", "POST", "tokenreviews"),
            6
        );
    }
}
