//! Bounds on open connections: per client address, and in total on a port.
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::locks::lock;
use crate::metrics::{Metrics, PortLabels};

/// Open connections on one port, bounded by `limit` (0: no limit), shown as the
/// `flagd_proxy_open_connections{port}` gauge.
#[derive(Clone)]
pub(crate) struct TotalLimit {
    /// One permit per place; `None`: no limit.
    places: Option<Arc<Semaphore>>,
    gauge: Gauge,
    metrics: Arc<Metrics>,
    reason: &'static str,
}

impl TotalLimit {
    /// `reason` names the flag in `flagd_proxy_rejected_requests_total` when a connection is
    /// refused.
    pub(crate) fn new(
        limit: usize,
        port: &'static str,
        reason: &'static str,
        metrics: Arc<Metrics>,
    ) -> Self {
        let gauge = metrics
            .open_connections
            .get_or_create(&PortLabels { port })
            .clone();
        metrics
            .connection_limit
            .get_or_create(&PortLabels { port })
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
        let limit = limit.min(Semaphore::MAX_PERMITS);
        Self {
            places: (limit > 0).then(|| Arc::new(Semaphore::new(limit))),
            gauge,
            metrics,
            reason,
        }
    }

    /// A place for one more connection, or `None` (counted) when all are taken.
    pub(crate) fn admit(&self) -> Option<TotalSlot> {
        let permit = match &self.places {
            None => None,
            Some(places) => match places.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    self.metrics.reject(self.reason);
                    return None;
                }
            },
        };
        self.gauge.inc();
        Some(TotalSlot {
            _permit: permit,
            gauge: self.gauge.clone(),
        })
    }
}

/// One connection's place in a [`TotalLimit`]; dropping it gives the place back.
pub(crate) struct TotalSlot {
    _permit: Option<OwnedSemaphorePermit>,
    gauge: Gauge,
}

impl Drop for TotalSlot {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Open connections per client IP address, bounded by `max_connections_per_address`.
#[derive(Clone)]
pub(crate) struct AddressLimit {
    limit: usize,
    open: OpenPerAddress,
    metrics: Arc<Metrics>,
    reason: &'static str,
}

type OpenPerAddress = Arc<Mutex<HashMap<IpAddr, usize>>>;

impl AddressLimit {
    pub(crate) fn new(limit: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            limit,
            open: Arc::default(),
            metrics,
            reason: "max_connections_per_address",
        }
    }

    /// The same limit, counted under another reason in the rejection metric.
    pub(crate) fn with_reason(self, reason: &'static str) -> Self {
        Self { reason, ..self }
    }

    /// A place for one more connection from `ip`, or `None` (counted) when it has the most.
    pub(crate) fn admit(&self, ip: IpAddr) -> Option<AddressSlot> {
        if self.limit == 0 {
            return Some(AddressSlot(None));
        }
        let ip = ip.to_canonical();
        let mut open = lock(&self.open);
        let count = open.entry(ip).or_insert(0);
        if *count >= self.limit {
            drop(open);
            self.metrics.reject(self.reason);
            return None;
        }
        *count += 1;
        Some(AddressSlot(Some((self.open.clone(), ip))))
    }
}

/// One connection's place in [`AddressLimit`]; dropping it gives the place back.
pub(crate) struct AddressSlot(Option<(OpenPerAddress, IpAddr)>);

impl AddressSlot {
    /// A connection that counts against no address (a unix socket's).
    pub(crate) fn none() -> Self {
        Self(None)
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let Some((open, ip)) = self.0.take() else {
            return;
        };
        let mut open = lock(&open);
        if let Some(count) = open.get_mut(&ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_per_address_are_bounded_and_given_back() {
        let limit = AddressLimit::new(2, Arc::new(Metrics::new()));
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let first = limit.admit(a).expect("first");
        let _second = limit.admit(a).expect("second");
        assert!(limit.admit(a).is_none(), "third from the same address");
        let _other = limit.admit(b).expect("another address has its own count");
        // The same client seen over IPv6 as a mapped IPv4 address is the same address.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("ip");
        assert!(limit.admit(mapped).is_none());
        drop(first);
        let _again = limit.admit(a).expect("a place came free");
        let encoded = limit.metrics.encode();
        assert!(
            encoded.contains(
                "flagd_proxy_rejected_requests_total{reason=\"max_connections_per_address\"} 2"
            ),
            "{encoded}"
        );
        let unlimited = AddressLimit::new(0, Arc::new(Metrics::new()));
        let slots: Vec<_> = (0..1_000).filter_map(|_| unlimited.admit(a)).collect();
        assert_eq!(slots.len(), 1_000);
        assert!(lock(&unlimited.open).is_empty(), "nothing is tracked");
    }

    #[test]
    fn total_connections_are_bounded_and_given_back() {
        let metrics = Arc::new(Metrics::new());
        let limit = TotalLimit::new(2, "sync", "max_connections", metrics.clone());
        let first = limit.admit().expect("first");
        let _second = limit.admit().expect("second");
        assert!(limit.admit().is_none());
        drop(first);
        let _third = limit.admit().expect("a place came free");
        let encoded = metrics.encode();
        assert!(
            encoded.contains("flagd_proxy_open_connections{port=\"sync\"} 2"),
            "{encoded}"
        );
        assert!(
            encoded.contains("flagd_proxy_connection_limit{port=\"sync\"} 2"),
            "{encoded}"
        );
        assert!(
            encoded.contains("flagd_proxy_rejected_requests_total{reason=\"max_connections\"} 1"),
            "{encoded}"
        );
        let unlimited = TotalLimit::new(0, "management", "x", metrics);
        let slots: Vec<_> = (0..100).filter_map(|_| unlimited.admit()).collect();
        assert_eq!(slots.len(), 100);
    }
}
