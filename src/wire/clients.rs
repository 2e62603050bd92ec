//! How many resources each client names at once: the streams and fetches of one client IP
//! address (of one connection, for connections that have no address, such as the unix
//! socket's) may name at most `limit` distinct resources. One pod cannot make the proxy watch
//! thousands of resources, and so cannot take a node tier's connections to its central proxy or
//! the central's places for resources that do not exist yet. More streams for resources the
//! client names already are not limited here.
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::locks::lock;
use crate::metrics::Metrics;
use crate::net::info::{Activity, ConnectionInfo};
use crate::selector::ResourceKey;
use crate::wire::error::RequestError;

/// The resources each client names. Cheap to clone.
#[derive(Clone)]
pub(crate) struct ClientResources {
    shared: Arc<Shared>,
}

struct Shared {
    /// The most distinct resources of one client; 0: no limit.
    limit: usize,
    metrics: Arc<Metrics>,
    /// Per client, the streams and fetches open for each resource it names.
    named: Mutex<HashMap<Client, HashMap<ResourceKey, usize>>>,
}

/// Who a request comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Client {
    Address(IpAddr),
    /// A connection without an address, by the address of its [`Activity`] (kept alive by
    /// every [`Named`] of it, so never reused meanwhile).
    Connection(usize),
}

impl ClientResources {
    pub(crate) fn new(limit: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            shared: Arc::new(Shared {
                limit,
                metrics,
                named: Mutex::default(),
            }),
        }
    }

    /// Counts `key` as named by the client of `connection` until the returned value is
    /// dropped; refused when that would make the client name more resources than the limit.
    /// Requests that say nothing of their connection are not counted.
    pub(crate) fn name(
        &self,
        connection: Option<&ConnectionInfo>,
        key: &ResourceKey,
    ) -> Result<Option<Named>, RequestError> {
        let shared = &self.shared;
        if shared.limit == 0 {
            return Ok(None);
        }
        let (client, activity) = match connection {
            Some(ConnectionInfo {
                remote_addr: Some(address),
                ..
            }) => (Client::Address(address.ip()), None),
            Some(ConnectionInfo {
                activity: Some(activity),
                ..
            }) => (
                Client::Connection(Arc::as_ptr(activity).addr()),
                Some(activity.clone()),
            ),
            _ => return Ok(None),
        };
        let mut named = lock(&shared.named);
        let resources = named.entry(client.clone()).or_default();
        if !resources.contains_key(key) && resources.len() >= shared.limit {
            drop(named);
            tracing::debug!(?client, resource = %key, limit = shared.limit, "refused: the client names as many resources as --max-resources-per-address");
            shared.metrics.reject("max_resources_per_address");
            return Err(RequestError::TooManyResourcesForClient {
                key: key.clone(),
                limit: shared.limit,
            });
        }
        *resources.entry(key.clone()).or_default() += 1;
        Ok(Some(Named {
            shared: shared.clone(),
            client,
            key: key.clone(),
            _activity: activity,
        }))
    }

    /// The distinct resources each client names now.
    #[cfg(test)]
    fn counts(&self) -> Vec<usize> {
        let mut counts: Vec<usize> = lock(&self.shared.named)
            .values()
            .map(HashMap::len)
            .collect();
        counts.sort_unstable();
        counts
    }
}

/// One stream or fetch of a client for a resource, counted until dropped.
pub(crate) struct Named {
    shared: Arc<Shared>,
    client: Client,
    key: ResourceKey,
    _activity: Option<Arc<Activity>>,
}

impl Drop for Named {
    fn drop(&mut self) {
        let mut named = lock(&self.shared.named);
        let Some(resources) = named.get_mut(&self.client) else {
            return;
        };
        if let Some(count) = resources.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                resources.remove(&self.key);
            }
        }
        if resources.is_empty() {
            named.remove(&self.client);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(address: &str) -> ConnectionInfo {
        ConnectionInfo {
            remote_addr: Some(address.parse().expect("socket address")),
            peer_certificates: None,
            activity: None,
        }
    }

    fn unix() -> ConnectionInfo {
        ConnectionInfo {
            remote_addr: None,
            peer_certificates: None,
            activity: Some(Arc::default()),
        }
    }

    fn key(name: &str) -> ResourceKey {
        ResourceKey::new("ns", name)
    }

    /// A client names at most `limit` resources; more streams for those it names are not
    /// limited; other clients are not affected; a place comes back when its last stream ends.
    #[test]
    fn one_client_names_at_most_the_limit() {
        let metrics = Arc::new(Metrics::new());
        let clients = ClientResources::new(2, metrics.clone());
        let pod = from("10.0.0.1:5000");
        let same_pod = from("10.0.0.1:5001");
        let a = clients.name(Some(&pod), &key("a")).expect("a");
        let b = clients.name(Some(&same_pod), &key("b")).expect("b");
        let a_again = clients.name(Some(&same_pod), &key("a")).expect("a again");
        let Err(refused) = clients.name(Some(&pod), &key("c")) else {
            panic!("a third resource from the same address is refused");
        };
        assert!(
            matches!(
                refused,
                RequestError::TooManyResourcesForClient { limit: 2, .. }
            ),
            "{refused:?}"
        );
        assert!(
            metrics.encode().contains(
                "flagd_proxy_rejected_requests_total{reason=\"max_resources_per_address\"} 1"
            ),
            "counted"
        );
        let other = clients.name(Some(&from("10.0.0.2:5000")), &key("c"));
        assert!(other.is_ok(), "another address is not affected");
        assert_eq!(clients.counts(), [1, 2]);

        drop(a);
        assert!(
            clients.name(Some(&pod), &key("c")).is_err(),
            "a is still named by another stream"
        );
        drop(a_again);
        let c = clients.name(Some(&pod), &key("c")).expect("room again");
        drop((b, c, other));
        assert_eq!(clients.counts(), Vec::<usize>::new(), "nothing kept");
    }

    /// Connections without an address (the unix socket's) are each a client of their own.
    #[test]
    fn connections_without_an_address_are_counted_one_by_one() {
        let clients = ClientResources::new(1, Arc::new(Metrics::new()));
        let (first, second) = (unix(), unix());
        let _a = clients.name(Some(&first), &key("a")).expect("a");
        assert!(clients.name(Some(&first), &key("b")).is_err());
        let _b = clients
            .name(Some(&second), &key("b"))
            .expect("another connection");
        assert!(
            clients.name(None, &key("c")).expect("unknown").is_none(),
            "a request that says nothing of its connection is not counted"
        );
    }

    #[test]
    fn no_limit_counts_nothing() {
        let clients = ClientResources::new(0, Arc::new(Metrics::new()));
        let pod = from("10.0.0.1:5000");
        let named: Vec<_> = (0..100)
            .map(|i| {
                clients
                    .name(Some(&pod), &key(&format!("r{i}")))
                    .expect("named")
            })
            .collect();
        assert!(named.iter().all(Option::is_none));
        assert_eq!(clients.counts(), Vec::<usize>::new());
    }
}
