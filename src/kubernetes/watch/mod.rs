//! The Kubernetes source: one watch per requested `FeatureFlag`, on demand.
//!
//! Every watch is limited to one namespace and one name (field selector
//! `metadata.name=<name>`), all of them sharing one [`kube::Client`]: a list of that one object,
//! then a watch from the list's resource version, with bookmarks. What a watch sees is reported
//! to the hub's [`Publisher`]:
//!
//! - the object, after a list that contained it and on every change;
//! - its absence, after a list that did not contain it and when it is deleted (clients keep the
//!   last flags, as flagd's own Kubernetes sync does);
//! - `forbidden` when RBAC refuses the read (the message names the missing permission);
//! - `unreachable` for every other failure (connection refused or lost, 5xx, bad credentials,
//!   CRD not installed).
//!
//! A watch that ends (the API server's timeout) or fails (a restart, a cut connection, a dead one
//! found by the HTTP/2 keepalive) is made again from the last resource version it saw, which
//! bookmarks keep current: an API server that comes back costs each watched resource one watch
//! request, not a list. Only a version the API server no longer has (410 Gone: etcd compacted
//! it, or a restarted API server's watch cache starts later) is followed by a new list; the
//! subscribers get the newest version, never one in between. Failures are retried after the
//! process's backoff ([`crate::backoff`]), so a permission granted later or an API server that
//! comes back is picked up without a restart, and a watch that works again tells subscribers'
//! status that their flags are current again.
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
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, WatchParams};
use kube::core::WatchEvent;
use kube::runtime::watcher;

use crate::backoff::Backoff;
use crate::hub::{Publisher, SpanSink};
use crate::introspection::{KubernetesStatus, SourceStatus};
use crate::metrics::Metrics;
use crate::selector::{GROUP, ResourceKey};
use crate::source::{ConnectAttempt, Source};

mod failure;

use super::client::{self, KubeError, KubeSettings};
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
    /// Where each watch's attempts to reach the API server go ([`CONNECT_SPAN`]).
    spans: Option<Arc<dyn SpanSink>>,
}

/// The span of one attempt of a resource's watch to reach the API server: its first request,
/// and the first after every failure (a list, or a watch from the last version seen), until it
/// is answered or fails. The watch requests made again when the API server ends one (every
/// few minutes) are not attempts.
pub const CONNECT_SPAN: &str = "flagd_proxy.kubernetes.connect";

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

    /// Records every watch's attempts to reach the API server in `spans` ([`CONNECT_SPAN`]).
    pub fn with_spans(mut self, spans: Option<Arc<dyn SpanSink>>) -> Self {
        self.spans = spans;
        self
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
            spans: None,
        }
    }
}

/// What one watch on the API server holds: its task, the list and watch requests on a shared
/// HTTP/2 connection and their buffers (43.2 KiB measured per watched FeatureFlag with its
/// stream taken out, `docs/capacity.md`, of which its 1 KiB version is charged apart).
const WATCH_BYTES: usize = 42 * 1024;

/// The `FeatureFlag` resource as the dynamic API sees it.
pub fn feature_flag_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

impl Source for KubernetesSource {
    fn name(&self) -> &'static str {
        SOURCE
    }

    fn watch_bytes(&self) -> usize {
        WATCH_BYTES
    }

    fn status(&self) -> SourceStatus {
        SourceStatus::Kubernetes(KubernetesStatus {
            api_server: self.server.to_string(),
            configured_by: self.configured_by.to_owned(),
            resource: format!("{PLURAL}.{GROUP}/{VERSION}"),
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
            spans: self.spans.clone(),
        };
        Box::pin(watch_resource(api, context, publisher))
    }
}

struct WatchContext {
    key: ResourceKey,
    server: Arc<str>,
    metrics: Arc<Metrics>,
    backoff: Backoff,
    spans: Option<Arc<dyn SpanSink>>,
}

/// How long the API server keeps one watch request open (seconds); then it is made again from
/// the last version seen. The same as kube-runtime's watcher.
const WATCH_TIMEOUT_SECS: u32 = 290;

/// Runs until dropped: lists the object once, then watches it from the list's resource version.
/// A watch that ends or fails is made again from the last version seen (bookmarks keep it
/// current), so an API server restart or a cut connection costs each watched resource one watch
/// request, not a list; only a version the API server no longer has (410 Gone, after etcd
/// compaction) is followed by a list. Failures are retried after the backoff.
async fn watch_resource(api: Api<DynamicObject>, mut context: WatchContext, publisher: Publisher) {
    let fields = format!("metadata.name={}", escape_field_value(&context.key.name));
    let mut watch = ResourceWatch::default();
    loop {
        watch.attempt(&context);
        let step = match watch.resume.clone() {
            None => watch.list(&api, &fields, &context, &publisher).await,
            Some(version) => {
                watch
                    .watch(&api, &fields, &version, &context, &publisher)
                    .await
            }
        };
        if let Step::Failed(error) = step
            && watch.failed(&error, &context, &publisher)
        {
            tokio::time::sleep(context.backoff.next_delay()).await;
        }
    }
}

/// What one request of the loop ended with.
enum Step {
    /// Go on at once: watch again from the version to resume from, or list when there is none.
    Next,
    /// A failure: it is judged, then the loop goes on after the backoff.
    Failed(watcher::Error),
}

/// The state of one resource's watch loop.
#[derive(Default)]
struct ResourceWatch {
    /// The resource version to watch from; `None`: list first.
    resume: Option<String>,
    /// What subscribers were told last, told again when a watch works after a failure that was
    /// reported (nothing else would end that report when nothing changed meanwhile).
    last: Option<Report<DynamicObject>>,
    /// A failure was reported since the last request that worked.
    failing: bool,
    /// The API server answered 410 Gone since the last watch event: a second one in a row is
    /// retried after the backoff, not at once.
    gone: bool,
    refusals: Refusals,
    /// The last request worked (the API server answered it); false at first and after a
    /// failure, when the next request is an attempt to reach the API server again.
    reached: bool,
    /// Attempts to reach the API server so far.
    attempts: u64,
    /// The attempt under way, recorded when it works or fails.
    attempt: Option<ConnectAttempt>,
}

impl ResourceWatch {
    /// Starts an attempt to reach the API server unless the last request reached it.
    fn attempt(&mut self, context: &WatchContext) {
        let Some(spans) = &context.spans else {
            return;
        };
        if self.reached || self.attempt.is_some() {
            return;
        }
        self.attempts += 1;
        let request = if self.resume.is_some() {
            "watch"
        } else {
            "list"
        };
        self.attempt = Some(ConnectAttempt::start(
            spans.clone(),
            CONNECT_SPAN,
            &context.key,
            self.attempts,
            [
                ("flagd_proxy.request", request.into()),
                ("flagd_proxy.api_server", (&*context.server).into()),
            ],
        ));
    }

    async fn list(
        &mut self,
        api: &Api<DynamicObject>,
        fields: &str,
        context: &WatchContext,
        publisher: &Publisher,
    ) -> Step {
        let list = match api.list(&ListParams::default().fields(fields)).await {
            Ok(list) => list,
            Err(error) => return Step::Failed(watcher::Error::InitialListFailed(error)),
        };
        let Some(version) = list.metadata.resource_version.filter(|v| !v.is_empty()) else {
            return Step::Failed(watcher::Error::NoResourceVersion);
        };
        self.worked();
        let report = match list.items.into_iter().next() {
            Some(object) => Report::Present(object),
            None => Report::Absent,
        };
        self.tell(report, context, publisher);
        self.resume = Some(version);
        Step::Next
    }

    async fn watch(
        &mut self,
        api: &Api<DynamicObject>,
        fields: &str,
        version: &str,
        context: &WatchContext,
        publisher: &Publisher,
    ) -> Step {
        let params = WatchParams::default()
            .fields(fields)
            .timeout(WATCH_TIMEOUT_SECS);
        let events = match api.watch(&params, version).await {
            Ok(events) => events,
            Err(error) => return Step::Failed(watcher::Error::WatchStartFailed(error)),
        };
        if std::mem::take(&mut self.failing) {
            tracing::debug!(resource = %context.key, version, "watch resumed");
            if let Some(last) = self.last.take() {
                self.tell(last, context, publisher);
            }
        }
        self.worked();
        let mut events = pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => {
                    self.gone = false;
                    self.resume = object.metadata.resource_version.clone();
                    self.tell(Report::Present(object), context, publisher);
                }
                Ok(WatchEvent::Deleted(object)) => {
                    self.gone = false;
                    self.resume = object.metadata.resource_version.clone();
                    self.tell(Report::Absent, context, publisher);
                }
                Ok(WatchEvent::Bookmark(bookmark)) => {
                    self.gone = false;
                    self.resume = Some(bookmark.metadata.resource_version);
                }
                Ok(WatchEvent::Error(status)) => {
                    return Step::Failed(watcher::Error::WatchError(status));
                }
                Err(error) => return Step::Failed(watcher::Error::WatchFailed(error)),
            }
        }
        // The API server ended the watch (its timeout): watch again from the last version.
        Step::Next
    }

    fn worked(&mut self) {
        self.refusals.not_refused();
        self.reached = true;
        if let Some(attempt) = self.attempt.take() {
            attempt.done(None);
        }
    }

    /// Tells subscribers the resource's state and keeps it.
    fn tell(
        &mut self,
        report: Report<DynamicObject>,
        context: &WatchContext,
        publisher: &Publisher,
    ) {
        match &report {
            Report::Present(object) => publish(publisher, context, object),
            Report::Absent => publisher.absent(),
        }
        self.last = Some(report);
    }

    /// Judges a failure: reports it, or lists again where the version to resume from is gone.
    /// True when the next request is to wait for the backoff.
    fn failed(
        &mut self,
        error: &watcher::Error,
        context: &WatchContext,
        publisher: &Publisher,
    ) -> bool {
        self.reached = false;
        if let Some(attempt) = self.attempt.take() {
            attempt.done(Some(error.to_string()));
        }
        let problem = match classify(error, &context.key, &context.server) {
            Action::Continue | Action::Restart => {
                tracing::debug!(resource = %context.key, %error, "the watch's version is gone; listing again");
                self.resume = None;
                return std::mem::replace(&mut self.gone, true);
            }
            Action::Report(problem) => problem,
        };
        self.failing = true;
        if problem.kind == Kind::Forbidden && !self.refusals.refused() {
            context
                .metrics
                .source_error(SOURCE, Kind::Forbidden.label());
            tracing::warn!(resource = %context.key, reason = %problem.message,
                "the API server refused access that worked before; retrying before telling clients");
            return true;
        }
        if problem.kind != Kind::Forbidden {
            self.refusals.not_refused();
        }
        report(publisher, context, problem);
        true
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

/// What subscribers are told of the resource.
#[derive(Clone, Debug, PartialEq)]
enum Report<K> {
    Present(K),
    Absent,
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
