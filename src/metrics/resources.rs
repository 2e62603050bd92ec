//! The gauges of the watched resources, set from the hub's view of them when scraped: how many
//! resources are in each state, which have their newest version refused, how many are served a
//! stale version, and how many streams each has.
use super::{Metrics, ResourceLabels, StateLabels};

impl Metrics {
    /// Sets the gauges of the watched resources from `resources`: each resource's state (as
    /// `/status` names it; every one of `states` is reported, 0 when no resource is in it),
    /// whether it is served a stale version, and its subscribers. Called when scraped.
    pub fn observe_resources<'a>(
        &self,
        states: &[&'static str],
        resources: impl IntoIterator<Item = WatchedResource<'a>>,
    ) {
        let mut counts: Vec<(&'static str, i64)> = states.iter().map(|s| (*s, 0)).collect();
        let mut stale = 0;
        self.watched_resources.clear();
        self.version_rejected.clear();
        self.subscribers.clear();
        for resource in resources {
            match counts.iter_mut().find(|(s, _)| *s == resource.state) {
                Some((_, count)) => *count += 1,
                None => counts.push((resource.state, 1)),
            }
            let labels = ResourceLabels {
                namespace: resource.namespace.to_owned(),
                name: resource.name.to_owned(),
            };
            stale += i64::from(resource.stale);
            if resource.state == STATE_INVALID {
                self.version_rejected.get_or_create(&labels).set(1);
            }
            self.subscribers
                .get_or_create(&labels)
                .set(i64::try_from(resource.subscribers).unwrap_or(i64::MAX));
        }
        self.stale_resources.set(stale);
        for (state, count) in counts {
            self.watched_resources
                .get_or_create(&StateLabels { state })
                .set(count);
        }
    }
}

/// One watched resource, as [`Metrics::observe_resources`] reports it.
pub struct WatchedResource<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub state: &'static str,
    /// Served a version kept from an earlier run until the source delivers one.
    pub stale: bool,
    pub subscribers: usize,
}

/// The state of a resource whose newest version is refused (see [`Metrics::observe_resources`]).
pub const STATE_INVALID: &str = "invalid";
