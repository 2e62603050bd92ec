//! The Kubernetes source: one watch per requested `FeatureFlag`, on demand.
//!
//! Every watch is a `kube::runtime::watcher` limited to one namespace and one name (field
//! selector `metadata.name=<name>`), all of them sharing one [`kube::Client`]. What a watch sees
//! is reported to the hub's [`Publisher`]:
//!
//! - the object, after every initial list (`InitDone`) that contained it and on every change;
//! - its absence, after an initial list that did not contain it and when it is deleted (clients
//!   keep the last flags, as flagd's own Kubernetes sync does);
//! - `forbidden` when RBAC refuses the read (the message names the missing permission);
//! - `unreachable` for every other failure (connection refused, 5xx, bad credentials, CRD not
//!   installed).
//!
//! After a failure the watch starts again with a fresh list, after the process's backoff
//! ([`crate::backoff`]), so a permission granted later or an API server that comes back is
//! picked up without a restart.
//!
//! The module has three parts: this one (the source and its watch loop), `client` (where the
//! client's configuration comes from, the bearer token file) and `failure` (what a failed
//! watch means and what clients are told).
use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use futures::future::BoxFuture;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use serde_json::Value;

use crate::backoff::Backoff;
use crate::hub::Publisher;
use crate::metrics::Metrics;
use crate::selector::{GROUP, ResourceKey};
use crate::source::Source;

mod client;
mod failure;

pub use client::{KubeError, KubeSettings};
use failure::{Action, Kind, Problem, Refusals, classify};

/// Version of the `FeatureFlag` resource that is watched.
pub const VERSION: &str = "v1beta1";
/// Kind of the watched resource.
pub const KIND: &str = "FeatureFlag";
/// Plural (URL) name of the watched resource.
pub const PLURAL: &str = "featureflags";

/// The name under which this source reports (logs, metrics).
const SOURCE: &str = "kubernetes";

/// Watches `FeatureFlag` resources through the Kubernetes API.
pub struct KubernetesSource {
    client: Client,
    resource: ApiResource,
    metrics: Arc<Metrics>,
    server: Arc<str>,
    configured_by: &'static str,
    /// The retry policy every watch starts from.
    backoff: Backoff,
}

impl KubernetesSource {
    /// The shared API client (also used for authorization reviews).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Builds the client from the settings or the environment. Does not contact the API server:
    /// it may be down for a moment, and every watch retries on its own.
    pub async fn connect(settings: KubeSettings, metrics: Arc<Metrics>) -> Result<Self, KubeError> {
        let configured = client::configure(&settings).await?;
        tracing::info!(api_server = %configured.server, configured_by = configured.configured_by, "Kubernetes source ready");
        Ok(Self::with_client(
            configured.client,
            configured.server,
            configured.configured_by,
            metrics,
        ))
    }

    fn with_client(
        client: Client,
        server: String,
        configured_by: &'static str,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            client,
            resource: feature_flag_resource(),
            metrics,
            server: server.into(),
            configured_by,
            backoff: Backoff::new(),
        }
    }
}

/// The `FeatureFlag` resource as the dynamic API sees it.
pub fn feature_flag_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

impl Source for KubernetesSource {
    fn name(&self) -> &'static str {
        SOURCE
    }

    fn status(&self) -> Value {
        serde_json::json!({
            "apiServer": &*self.server,
            "configuredBy": self.configured_by,
            "resource": format!("{PLURAL}.{GROUP}/{VERSION}"),
        })
    }

    fn watch(&self, key: ResourceKey, publisher: Publisher) -> BoxFuture<'static, ()> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.namespace, &self.resource);
        let context = WatchContext {
            key,
            server: self.server.clone(),
            metrics: self.metrics.clone(),
            backoff: self.backoff.clone(),
        };
        Box::pin(watch_resource(api, context, publisher))
    }
}

struct WatchContext {
    key: ResourceKey,
    server: Arc<str>,
    metrics: Arc<Metrics>,
    backoff: Backoff,
}

/// Runs until dropped: a watcher for one object, started again after every failure.
async fn watch_resource(api: Api<DynamicObject>, mut context: WatchContext, publisher: Publisher) {
    let config = watcher::Config::default().fields(&format!(
        "metadata.name={}",
        escape_field_value(&context.key.name)
    ));
    let mut refusals = Refusals::default();
    loop {
        let mut tracker = Tracker::default();
        let mut events = pin!(watcher::watcher(api.clone(), config.clone()));
        let problem = loop {
            match events.next().await {
                Some(Ok(event)) => {
                    if !matches!(event, Event::Init) {
                        // `Init` comes before the list request; anything else means it worked.
                        refusals.access_worked();
                    }
                    match tracker.on_event(event) {
                        Some(Report::Present(object)) => publish(&publisher, &context, &object),
                        Some(Report::Absent) => publisher.absent(),
                        None => {}
                    }
                }
                Some(Err(error)) => match classify(&error, &context.key, &context.server) {
                    Action::Continue => {
                        tracing::debug!(resource = %context.key, %error, "watch expired; listing again");
                    }
                    Action::Restart => {
                        tracing::debug!(resource = %context.key, %error, "restarting the watch");
                        break None;
                    }
                    Action::Report(problem) => break Some(problem),
                },
                None => break None,
            }
        };
        match problem {
            Some(problem) if problem.kind == Kind::Forbidden && !refusals.refused() => {
                context
                    .metrics
                    .source_error(SOURCE, Kind::Forbidden.label());
                tracing::warn!(resource = %context.key, reason = %problem.message,
                    "the API server refused access that worked before; retrying before telling clients");
            }
            Some(problem) => {
                if problem.kind != Kind::Forbidden {
                    refusals.other_failure();
                }
                report(&publisher, &context, problem);
            }
            None => {}
        }
        tokio::time::sleep(context.backoff.next_delay()).await;
    }
}

fn publish(publisher: &Publisher, context: &WatchContext, object: &DynamicObject) {
    match serde_json::to_value(object) {
        Ok(value) => publisher.resource(&value, Instant::now()),
        Err(error) => {
            context.metrics.source_error(SOURCE, "watch");
            tracing::warn!(resource = %context.key, %error, "cannot re-encode the object");
        }
    }
}

fn report(publisher: &Publisher, context: &WatchContext, problem: Problem) {
    if problem.kind == Kind::Forbidden {
        // The publisher counts and logs this one.
        publisher.forbidden(problem.message);
        return;
    }
    context.metrics.source_error(SOURCE, problem.kind.label());
    tracing::debug!(resource = %context.key, kind = problem.kind.label(), message = %problem.message, "watch failed; retrying");
    publisher.unreachable(problem.message);
}

/// What a watch event means for subscribers.
#[derive(Debug, PartialEq)]
enum Report<K> {
    Present(K),
    Absent,
}

/// Turns watcher events into reports. During an initial list (`Init` … `InitDone`) the object is
/// held back and reported once the list is complete, so a relist after an expired watch ends on
/// the object's final state, or on its absence if the list did not contain it.
#[derive(Debug)]
struct Tracker<K> {
    /// `Some` while an initial list is in progress, holding what it has returned so far.
    listing: Option<Option<K>>,
}

impl<K> Default for Tracker<K> {
    fn default() -> Self {
        Self { listing: None }
    }
}

impl<K> Tracker<K> {
    fn on_event(&mut self, event: Event<K>) -> Option<Report<K>> {
        match event {
            Event::Init => {
                self.listing = Some(None);
                None
            }
            Event::InitApply(object) => match &mut self.listing {
                Some(seen) => {
                    *seen = Some(object);
                    None
                }
                None => Some(Report::Present(object)),
            },
            Event::InitDone => match self.listing.take() {
                Some(Some(object)) => Some(Report::Present(object)),
                Some(None) => Some(Report::Absent),
                None => None,
            },
            Event::Apply(object) => Some(Report::Present(object)),
            Event::Delete(_) => Some(Report::Absent),
        }
    }
}

/// Escapes a value for a field selector (`\`, `,` and `=` are special).
fn escape_field_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod api_server;
#[cfg(test)]
mod tests;
