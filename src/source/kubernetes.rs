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
//! After a failure the watch starts again with a fresh list, after an exponential backoff, so a
//! permission granted later or an API server that comes back is picked up without a restart.
use std::collections::hash_map::RandomState;
use std::ffi::OsString;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use http::HeaderValue;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::config::{InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde_json::Value;

use crate::hub::Publisher;
use crate::metrics::Metrics;
use crate::selector::{GROUP, ResourceKey};
use crate::source::Source;

/// Version of the `FeatureFlag` resource that is watched.
pub const VERSION: &str = "v1beta1";
/// Kind of the watched resource.
pub const KIND: &str = "FeatureFlag";
/// Plural (URL) name of the watched resource.
pub const PLURAL: &str = "featureflags";

/// The first pause after a failure; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pause between attempts (as client-go's reflector).
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A watch that has not failed for this long starts again from [`MIN_BACKOFF`].
const BACKOFF_RESET: Duration = Duration::from_secs(120);
/// Refusals in a row that end streams once a watch has seen another outcome (see [`Refusals`]).
const FORBIDDEN_CONFIRMATIONS: u32 = 3;
/// How long a bearer token read from a file is used before the file is read again.
const TOKEN_REREAD: Duration = Duration::from_secs(5);

/// The name under which this source reports (logs, metrics).
const SOURCE: &str = "kubernetes";

/// How to reach the API server.
#[derive(Clone, Debug, Default)]
pub struct KubeSettings {
    pub api_server: Option<String>,
    pub ca_path: Option<PathBuf>,
    pub token_path: Option<PathBuf>,
}

/// A Kubernetes configuration that cannot work; reported before the proxy listens.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(
        "no Kubernetes API configuration found: set KUBECONFIG, run inside a cluster (with a \
         service account token mounted), pass --kube-api-server URL (with --kube-ca-path and \
         --kube-token-path), or serve manifest files with --manifests DIR"
    )]
    NoConfiguration,
    #[error("--kube-api-server {url:?} is not a usable URL: {reason}")]
    ApiServerUrl { url: String, reason: String },
    #[error("--kube-ca-path {path}: {reason}")]
    CaFile { path: PathBuf, reason: String },
    #[error("{what} {path}: {reason}")]
    TokenFile {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("KUBECONFIG={value}: {source}")]
    Kubeconfig {
        value: String,
        #[source]
        source: KubeconfigError,
    },
    #[error("in-cluster Kubernetes configuration (KUBERNETES_SERVICE_HOST is set): {0}")]
    InCluster(#[source] InClusterError),
    #[error("cannot build the Kubernetes client for {server}: {source}")]
    Client {
        server: String,
        #[source]
        source: kube::Error,
    },
}

/// Where the configuration comes from, in order of precedence.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ConfigChoice {
    /// `--kube-api-server` (with its CA and token files).
    ApiServer(String),
    /// The files named by `KUBECONFIG`.
    Kubeconfig(OsString),
    /// The pod's service account (`KUBERNETES_SERVICE_HOST` is set).
    InCluster,
    /// Nothing applies.
    None,
}

impl ConfigChoice {
    fn label(&self) -> &'static str {
        match self {
            ConfigChoice::ApiServer(_) => "--kube-api-server",
            ConfigChoice::Kubeconfig(_) => "KUBECONFIG",
            ConfigChoice::InCluster => "in-cluster",
            ConfigChoice::None => "none",
        }
    }
}

/// Picks the configuration: `--kube-api-server`, else `KUBECONFIG` if set, else in-cluster if
/// `KUBERNETES_SERVICE_HOST` is set. `~/.kube/config` is deliberately not read (as the Go
/// flagd-proxy), so a proxy never silently uses a developer's credentials.
fn choose(
    settings: &KubeSettings,
    kubeconfig: Option<OsString>,
    service_host: Option<OsString>,
) -> ConfigChoice {
    if let Some(url) = settings.api_server.as_deref().map(str::trim)
        && !url.is_empty()
    {
        return ConfigChoice::ApiServer(url.to_owned());
    }
    if let Some(value) =
        kubeconfig.filter(|v| std::env::split_paths(v).any(|p| !p.as_os_str().is_empty()))
    {
        return ConfigChoice::Kubeconfig(value);
    }
    if service_host.is_some_and(|h| !h.is_empty()) {
        return ConfigChoice::InCluster;
    }
    ConfigChoice::None
}

/// Watches `FeatureFlag` resources through the Kubernetes API.
pub struct KubernetesSource {
    client: Client,
    resource: ApiResource,
    metrics: Arc<Metrics>,
    server: Arc<str>,
    configured_by: &'static str,
}

impl KubernetesSource {
    /// The shared API client (also used for authorization reviews).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Builds the client from the settings or the environment. Does not contact the API server:
    /// it may be down for a moment, and every watch retries on its own.
    pub async fn connect(settings: KubeSettings, metrics: Arc<Metrics>) -> Result<Self, KubeError> {
        // kube's TLS and the sync port use the same provider; installing it twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let choice = choose(
            &settings,
            std::env::var_os("KUBECONFIG"),
            std::env::var_os("KUBERNETES_SERVICE_HOST"),
        );
        let (config, token) = match &choice {
            ConfigChoice::ApiServer(url) => api_server_config(url, &settings)?,
            ConfigChoice::Kubeconfig(value) => {
                let shown = value.to_string_lossy().into_owned();
                let wrap = |source| KubeError::Kubeconfig {
                    value: shown.clone(),
                    source,
                };
                let kubeconfig = Kubeconfig::from_env()
                    .map_err(wrap)?
                    .ok_or(KubeError::NoConfiguration)?;
                let config =
                    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                        .await
                        .map_err(wrap)?;
                take_over_token_file(config, "the kubeconfig's tokenFile")?
            }
            ConfigChoice::InCluster => {
                let config = Config::incluster().map_err(KubeError::InCluster)?;
                take_over_token_file(config, "the service account token")?
            }
            ConfigChoice::None => return Err(KubeError::NoConfiguration),
        };
        let server = config.cluster_url.to_string();
        let client = build_client(config, token).map_err(|source| KubeError::Client {
            server: server.clone(),
            source,
        })?;
        tracing::info!(api_server = %server, configured_by = choice.label(), "Kubernetes source ready");
        Ok(Self {
            client,
            resource: feature_flag_resource(),
            metrics,
            server: server.into(),
            configured_by: choice.label(),
        })
    }
}

/// The `FeatureFlag` resource as the dynamic API sees it.
pub fn feature_flag_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// The configuration for `--kube-api-server`, its CA file and its token file.
fn api_server_config(
    url: &str,
    settings: &KubeSettings,
) -> Result<(Config, Option<Arc<TokenFile>>), KubeError> {
    let bad_url = |reason: &str| KubeError::ApiServerUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad_url(&e.to_string()))?;
    match uri.scheme_str() {
        Some("https" | "http") => {}
        _ => return Err(bad_url("it must start with https:// (or http://)")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad_url("it has no host"));
    }
    let mut config = Config::new(uri);
    if let Some(path) = &settings.ca_path {
        config.root_cert = Some(read_ca(path).map_err(|reason| KubeError::CaFile {
            path: path.clone(),
            reason,
        })?);
        // kube re-reads this file about once a minute, so a rotated CA is picked up.
        config.root_cert_file = Some(path.clone());
    }
    let token = match &settings.token_path {
        Some(path) => Some(Arc::new(TokenFile::open(path, "--kube-token-path")?)),
        None => None,
    };
    Ok((config, token))
}

/// The DER certificates in a PEM file; an error if there are none.
fn read_ca(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate bundle: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate".to_owned());
    }
    Ok(certs)
}

/// Moves a token file out of kube's hands into a [`TokenFile`] (trimmed, re-read every few
/// seconds), when it is the credential kube would use.
fn take_over_token_file(
    mut config: Config,
    what: &'static str,
) -> Result<(Config, Option<Arc<TokenFile>>), KubeError> {
    let auth = &config.auth_info;
    let file_is_used = auth.auth_provider.is_none()
        && !(auth.username.is_some() && auth.password.is_some())
        && auth.token.is_none();
    match config.auth_info.token_file.take() {
        Some(path) if file_is_used => {
            let token = TokenFile::open(Path::new(&path), what)?;
            Ok((config, Some(Arc::new(token))))
        }
        other => {
            config.auth_info.token_file = other;
            Ok((config, None))
        }
    }
}

/// One client for every watch, over HTTP/2 where the API server offers it (watches share a few
/// connections: see `kube_http2`); the bearer token, when it comes from a file, is added per
/// request.
fn build_client(config: Config, token: Option<Arc<TokenFile>>) -> Result<Client, kube::Error> {
    let builder = super::kube_http2::client_builder(config)?;
    Ok(match token {
        Some(token) => builder
            .with_layer(&tower::util::MapRequestLayer::new(
                move |mut request: http::Request<kube::client::Body>| {
                    request
                        .headers_mut()
                        .insert(http::header::AUTHORIZATION, token.header());
                    request
                },
            ))
            .build(),
        None => builder.build(),
    })
}

/// A bearer token kept in a file that may be replaced at any time (a projected service-account
/// token, a mounted secret). Read again when the last read is older than [`TOKEN_REREAD`];
/// surrounding whitespace is ignored. If a read fails, the last good token stays in use.
struct TokenFile {
    path: PathBuf,
    state: Mutex<TokenState>,
}

struct TokenState {
    header: HeaderValue,
    read_at: Instant,
    last_error: Option<String>,
}

impl TokenFile {
    fn open(path: &Path, what: &'static str) -> Result<Self, KubeError> {
        let header = read_token(path).map_err(|reason| KubeError::TokenFile {
            what,
            path: path.to_owned(),
            reason,
        })?;
        Ok(Self {
            path: path.to_owned(),
            state: Mutex::new(TokenState {
                header,
                read_at: Instant::now(),
                last_error: None,
            }),
        })
    }

    /// The `Authorization` header value to send now.
    fn header(&self) -> HeaderValue {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.read_at.elapsed() >= TOKEN_REREAD {
            state.read_at = Instant::now();
            match read_token(&self.path) {
                Ok(header) => {
                    if header != state.header {
                        tracing::info!(path = %self.path.display(), "bearer token file changed; using the new token");
                        state.header = header;
                    }
                    state.last_error = None;
                }
                Err(error) => {
                    if state.last_error.as_ref() != Some(&error) {
                        tracing::warn!(path = %self.path.display(), %error, "cannot read the bearer token file again; keeping the last token");
                        state.last_error = Some(error);
                    }
                }
            }
        }
        state.header.clone()
    }
}

fn read_token(path: &Path) -> Result<HeaderValue, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let token = text.trim();
    if token.is_empty() {
        return Err("the file is empty".to_owned());
    }
    let mut header = HeaderValue::try_from(format!("Bearer {token}"))
        .map_err(|_| "the token holds characters that cannot go into an HTTP header".to_owned())?;
    header.set_sensitive(true);
    Ok(header)
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
        };
        Box::pin(watch_resource(api, context, publisher))
    }
}

struct WatchContext {
    key: ResourceKey,
    server: Arc<str>,
    metrics: Arc<Metrics>,
}

/// Runs until dropped: a watcher for one object, started again after every failure.
async fn watch_resource(api: Api<DynamicObject>, context: WatchContext, publisher: Publisher) {
    let config = watcher::Config::default().fields(&format!(
        "metadata.name={}",
        escape_field_value(&context.key.name)
    ));
    let mut backoff = Backoff::default();
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
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Decides when a 403 is believed. The first answer of a new watch is; after that, a refusal must
/// repeat [`FORBIDDEN_CONFIRMATIONS`] times in a row, because an API server that has just started
/// answers 403 until its RBAC caches are filled, and clients should not lose their stream to that.
#[derive(Debug, Default)]
struct Refusals {
    seen_outcome: bool,
    consecutive: u32,
}

impl Refusals {
    fn access_worked(&mut self) {
        self.seen_outcome = true;
        self.consecutive = 0;
    }

    fn other_failure(&mut self) {
        self.seen_outcome = true;
        self.consecutive = 0;
    }

    /// Records a refusal; true if clients are to be told.
    fn refused(&mut self) -> bool {
        if !self.seen_outcome {
            // Believed at once, and so is every refusal in a row after it.
            self.seen_outcome = true;
            self.consecutive = FORBIDDEN_CONFIRMATIONS;
            return true;
        }
        self.consecutive = self.consecutive.saturating_add(1);
        self.consecutive >= FORBIDDEN_CONFIRMATIONS
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

/// The kinds of failure, as counted in `flagd_proxy_source_errors_total{source="kubernetes"}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// RBAC refuses the read.
    Forbidden,
    /// The API server does not accept the credentials (401).
    Unauthorized,
    /// The API server cannot be reached or answers 5xx/429.
    Unreachable,
    /// The API server does not serve the FeatureFlag resource (CRD not installed).
    NotServed,
    /// Anything else from the watch (unexpected status, undecodable answer).
    Watch,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Forbidden => "forbidden",
            Kind::Unauthorized => "unauthorized",
            Kind::Unreachable => "unreachable",
            Kind::NotServed => "not_served",
            Kind::Watch => "watch",
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Problem {
    kind: Kind,
    message: String,
}

#[derive(Debug, PartialEq, Eq)]
enum Action {
    /// Nothing to report; the watcher recovers by itself (a 410 Gone inside the watch).
    Continue,
    /// Nothing to report; start over with a fresh list after the backoff.
    Restart,
    /// Report the problem, then start over with a fresh list after the backoff.
    Report(Problem),
}

/// Decides what a watcher error means, with a message that tells an operator what to do.
fn classify(error: &watcher::Error, key: &ResourceKey, server: &str) -> Action {
    let (verb, source) = match error {
        watcher::Error::InitialListFailed(e) => ("list", e),
        watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => ("watch", e),
        watcher::Error::WatchError(status) if status.code == 410 => return Action::Continue,
        watcher::Error::WatchError(status) => {
            return Action::Report(classify_status(
                "watch",
                status.code,
                &status.reason,
                &status.message,
                key,
                server,
            ));
        }
        watcher::Error::NoResourceVersion => {
            return Action::Report(Problem {
                kind: Kind::Watch,
                message: format!(
                    "the Kubernetes API server at {server} answered without a resourceVersion; retrying"
                ),
            });
        }
    };
    match source {
        kube::Error::Api(status) if status.code == 410 => Action::Restart,
        kube::Error::Api(status) => Action::Report(classify_status(
            verb,
            status.code,
            &status.reason,
            &status.message,
            key,
            server,
        )),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            Action::Report(Problem {
                kind: Kind::Unreachable,
                message: format!(
                    "cannot reach the Kubernetes API server at {server}: {}; retrying",
                    error_chain(source)
                ),
            })
        }
        kube::Error::Auth(_) => Action::Report(Problem {
            kind: Kind::Unauthorized,
            message: format!(
                "cannot authenticate to the Kubernetes API server at {server}: {}; retrying",
                error_chain(source)
            ),
        }),
        other => Action::Report(Problem {
            kind: Kind::Watch,
            message: format!(
                "cannot {verb} {PLURAL}.{GROUP} in namespace {:?} at {server}: {}; retrying",
                key.namespace,
                error_chain(other)
            ),
        }),
    }
}

/// A failure status answered by the API server.
fn classify_status(
    verb: &str,
    code: u16,
    reason: &str,
    message: &str,
    key: &ResourceKey,
    server: &str,
) -> Problem {
    let said = if message.is_empty() {
        String::new()
    } else {
        format!(" (the API server said: {message})")
    };
    match code {
        403 => Problem {
            kind: Kind::Forbidden,
            message: format!(
                "RBAC forbids {verb} on {PLURAL}.{GROUP} in namespace {ns:?} for this proxy's identity: \
                 grant get, list, watch on {PLURAL}.{GROUP} in namespace {ns:?} (a RoleBinding) or in \
                 all namespaces (a ClusterRoleBinding){said}",
                ns = key.namespace,
            ),
        },
        401 => Problem {
            kind: Kind::Unauthorized,
            message: format!(
                "the Kubernetes API server at {server} does not accept this proxy's credentials \
                 (401 Unauthorized): check the token (--kube-token-path, KUBECONFIG or the \
                 service account){said}; retrying"
            ),
        },
        404 => Problem {
            kind: Kind::NotServed,
            message: format!(
                "the Kubernetes API server at {server} does not serve {PLURAL}.{GROUP}/{VERSION}: \
                 is the FeatureFlag CRD (OpenFeature Operator) installed?{said}; retrying"
            ),
        },
        429 | 500..=599 => Problem {
            kind: Kind::Unreachable,
            message: format!(
                "the Kubernetes API server at {server} is unavailable ({code} {reason}){said}; retrying"
            ),
        },
        _ => Problem {
            kind: Kind::Watch,
            message: format!(
                "cannot {verb} {PLURAL}.{GROUP} in namespace {ns:?} at {server}: {code} {reason}{said}; retrying",
                ns = key.namespace,
            ),
        },
    }
}

/// An error and its causes, without repeating text a message already includes.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
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

/// Exponential backoff with jitter, from [`MIN_BACKOFF`] to [`MAX_BACKOFF`], starting over once a
/// watch has gone [`BACKOFF_RESET`] without failing.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    last_failure: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: MIN_BACKOFF,
            last_failure: None,
        }
    }
}

impl Backoff {
    /// The pause before the next attempt: between 80 % and 120 % of the nominal delay.
    fn next_delay(&mut self) -> Duration {
        let now = Instant::now();
        if self
            .last_failure
            .is_some_and(|at| now.duration_since(at) >= BACKOFF_RESET)
        {
            self.next = MIN_BACKOFF;
        }
        self.last_failure = Some(now);
        let nominal = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        nominal.mul_f64(0.8 + 0.4 * unit_random())
    }
}

/// A number in [0, 1) that differs between calls (jitter only; not for secrets).
fn unit_random() -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn key() -> ResourceKey {
        ResourceKey::new("team-b", "flags")
    }

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Status::failure(message, reason).with_code(code).boxed())
    }

    fn problem(action: Action) -> Problem {
        match action {
            Action::Report(problem) => problem,
            other => panic!("expected a problem, got {other:?}"),
        }
    }

    #[test]
    fn configuration_precedence() {
        let flag = KubeSettings {
            api_server: Some("https://127.0.0.1:6443".into()),
            ..KubeSettings::default()
        };
        let none = KubeSettings::default();
        let kubeconfig = || Some(OsString::from("/etc/kube/config"));
        let host = || Some(OsString::from("10.0.0.1"));
        assert_eq!(
            choose(&flag, kubeconfig(), host()),
            ConfigChoice::ApiServer("https://127.0.0.1:6443".into())
        );
        assert_eq!(
            choose(&none, kubeconfig(), host()),
            ConfigChoice::Kubeconfig("/etc/kube/config".into())
        );
        assert_eq!(choose(&none, None, host()), ConfigChoice::InCluster);
        assert_eq!(
            choose(&none, Some(OsString::new()), host()),
            ConfigChoice::InCluster,
            "an empty KUBECONFIG counts as unset"
        );
        assert_eq!(choose(&none, None, None), ConfigChoice::None);
        assert_eq!(
            choose(&none, None, Some(OsString::new())),
            ConfigChoice::None
        );
    }

    #[tokio::test]
    async fn no_configuration_tells_every_way_out() {
        let message = KubeError::NoConfiguration.to_string();
        for needle in [
            "KUBECONFIG",
            "inside a cluster",
            "--kube-api-server",
            "--manifests DIR",
        ] {
            assert!(message.contains(needle), "{message}");
        }
    }

    #[tokio::test]
    async fn api_server_settings_are_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = |ca: Option<PathBuf>, token: Option<PathBuf>| KubeSettings {
            api_server: None,
            ca_path: ca,
            token_path: token,
        };
        let err = api_server_config("127.0.0.1:6443", &settings(None, None))
            .err()
            .expect("no scheme");
        assert!(err.to_string().contains("https://"), "{err}");

        let missing = dir.path().join("missing.pem");
        let err = api_server_config(
            "https://127.0.0.1:6443",
            &settings(Some(missing.clone()), None),
        )
        .err()
        .expect("missing CA");
        assert!(
            err.to_string().contains(&*missing.to_string_lossy()),
            "{err}"
        );

        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "hello").expect("write");
        let err = api_server_config("https://127.0.0.1:6443", &settings(Some(not_pem), None))
            .err()
            .expect("no certificate");
        assert!(err.to_string().contains("--kube-ca-path"), "{err}");

        let token = dir.path().join("token");
        let err = api_server_config(
            "https://127.0.0.1:6443",
            &settings(None, Some(token.clone())),
        )
        .err()
        .expect("missing token");
        assert!(err.to_string().starts_with("--kube-token-path"), "{err}");

        std::fs::write(&token, "abc\n").expect("write");
        let (config, token) =
            api_server_config("https://127.0.0.1:6443", &settings(None, Some(token)))
                .expect("valid");
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(token.expect("token").header(), "Bearer abc");
    }

    #[tokio::test]
    async fn broken_kubeconfig_is_an_error_naming_the_file() {
        // Exercised through the same conversion `connect` uses, without touching the
        // process environment.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broken.kubeconfig");
        std::fs::write(&path, "clusters: [").expect("write");
        let source = Kubeconfig::read_from(&path).expect_err("does not parse");
        let err = KubeError::Kubeconfig {
            value: path.display().to_string(),
            source,
        };
        assert!(
            err.to_string()
                .starts_with(&format!("KUBECONFIG={}", path.display())),
            "{err}"
        );
    }

    #[test]
    fn token_file_is_trimmed_and_read_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "  first\n").expect("write");
        let token = TokenFile::open(&path, "--kube-token-path").expect("readable");
        assert_eq!(token.header(), "Bearer first");
        assert!(token.header().is_sensitive());

        std::fs::write(&path, "second").expect("write");
        // Not yet re-read: the cached token is still fresh.
        assert_eq!(token.header(), "Bearer first");
        token.state.lock().expect("lock").read_at = Instant::now() - TOKEN_REREAD;
        assert_eq!(token.header(), "Bearer second");

        // A file that disappears keeps the last good token.
        std::fs::remove_file(&path).expect("remove");
        token.state.lock().expect("lock").read_at = Instant::now() - TOKEN_REREAD;
        assert_eq!(token.header(), "Bearer second");

        std::fs::write(&path, "\n").expect("write");
        let err = TokenFile::open(&path, "--kube-token-path")
            .err()
            .expect("empty");
        assert!(err.to_string().contains("empty"), "{err}");
    }

    #[test]
    fn tracker_reports_the_listed_state_after_init_done() {
        let mut tracker = Tracker::default();
        assert_eq!(tracker.on_event(Event::Init), None);
        assert_eq!(tracker.on_event(Event::InitApply("v1")), None);
        assert_eq!(
            tracker.on_event(Event::InitDone),
            Some(Report::Present("v1"))
        );
        assert_eq!(
            tracker.on_event(Event::Apply("v2")),
            Some(Report::Present("v2"))
        );
        assert_eq!(tracker.on_event(Event::Delete("v2")), Some(Report::Absent));
        assert_eq!(
            tracker.on_event(Event::Apply("v3")),
            Some(Report::Present("v3"))
        );
    }

    #[test]
    fn tracker_reports_absence_when_the_list_is_empty() {
        let mut tracker = Tracker::<&str>::default();
        assert_eq!(tracker.on_event(Event::Init), None);
        assert_eq!(tracker.on_event(Event::InitDone), Some(Report::Absent));
    }

    #[test]
    fn relist_after_expiry_ends_on_the_final_state() {
        let mut tracker = Tracker::default();
        tracker.on_event(Event::Init);
        tracker.on_event(Event::InitApply("v1"));
        tracker.on_event(Event::InitDone);
        // 410 Gone: the watcher lists again; the object was deleted meanwhile.
        assert_eq!(tracker.on_event(Event::Init), None);
        assert_eq!(tracker.on_event(Event::InitDone), Some(Report::Absent));
        // Another relist that finds a newer version.
        tracker.on_event(Event::Init);
        assert_eq!(tracker.on_event(Event::InitApply("v5")), None);
        assert_eq!(
            tracker.on_event(Event::InitDone),
            Some(Report::Present("v5"))
        );
    }

    #[test]
    fn forbidden_names_the_missing_permission() {
        let error = watcher::Error::InitialListFailed(api_error(
            403,
            "Forbidden",
            "featureflags.core.openfeature.dev is forbidden: User \"system:serviceaccount:flagd:proxy\" cannot list resource \"featureflags\"",
        ));
        let p = problem(classify(&error, &key(), "https://k8s:6443/"));
        assert_eq!(p.kind, Kind::Forbidden);
        assert!(
            p.message.starts_with(
                "RBAC forbids list on featureflags.core.openfeature.dev in namespace \"team-b\" for this proxy's identity: grant get, list, watch"
            ),
            "{}",
            p.message
        );
        assert!(p.message.contains("system:serviceaccount:flagd:proxy"));

        let error = watcher::Error::WatchStartFailed(api_error(403, "Forbidden", ""));
        let p = problem(classify(&error, &key(), "https://k8s:6443/"));
        assert!(
            p.message.starts_with("RBAC forbids watch on"),
            "{}",
            p.message
        );
    }

    #[test]
    fn other_statuses_are_classified() {
        let server = "https://k8s:6443/";
        let kind = |code| {
            problem(classify(
                &watcher::Error::InitialListFailed(api_error(code, "X", "m")),
                &key(),
                server,
            ))
            .kind
        };
        assert_eq!(kind(401), Kind::Unauthorized);
        assert_eq!(kind(404), Kind::NotServed);
        assert_eq!(kind(429), Kind::Unreachable);
        assert_eq!(kind(503), Kind::Unreachable);
        assert_eq!(kind(400), Kind::Watch);
        assert_eq!(Kind::NotServed.label(), "not_served");
        let gone = Status::failure("too old resource version", "Expired").with_code(410);
        assert_eq!(
            classify(
                &watcher::Error::WatchError(gone.clone().boxed()),
                &key(),
                server
            ),
            Action::Continue
        );
        assert_eq!(
            classify(
                &watcher::Error::WatchStartFailed(kube::Error::Api(gone.boxed())),
                &key(),
                server
            ),
            Action::Restart
        );
        let p = problem(classify(
            &watcher::Error::WatchError(
                Status::failure("denied", "Forbidden")
                    .with_code(403)
                    .boxed(),
            ),
            &key(),
            server,
        ));
        assert_eq!(p.kind, Kind::Forbidden);
    }

    #[test]
    fn connection_failures_are_unreachable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let error = watcher::Error::InitialListFailed(kube::Error::Service(Box::new(io)));
        let p = problem(classify(&error, &key(), "https://127.0.0.1:1/"));
        assert_eq!(p.kind, Kind::Unreachable);
        assert!(
            p.message
                .starts_with("cannot reach the Kubernetes API server at https://127.0.0.1:1/")
                && p.message.contains("connection refused"),
            "{}",
            p.message
        );
    }

    #[test]
    fn refusals_are_believed_at_once_only_on_a_new_watch() {
        let mut fresh = Refusals::default();
        assert!(fresh.refused(), "the first answer of a new watch");
        assert!(fresh.refused());

        let mut worked = Refusals::default();
        worked.access_worked();
        assert!(!worked.refused());
        assert!(!worked.refused());
        assert!(worked.refused(), "the third refusal in a row");
        worked.access_worked();
        assert!(
            !worked.refused(),
            "counting starts over after access worked"
        );

        let mut unreachable = Refusals::default();
        unreachable.other_failure();
        assert!(!unreachable.refused());
        unreachable.other_failure();
        assert!(!unreachable.refused());
        assert!(!unreachable.refused());
        assert!(unreachable.refused());
    }

    #[test]
    fn field_selector_values_are_escaped() {
        assert_eq!(escape_field_value("a.b-c"), "a.b-c");
        assert_eq!(escape_field_value(r"a,b=c\d"), r"a\,b\=c\\d");
    }

    #[test]
    fn backoff_grows_to_the_cap_and_starts_over_after_quiet() {
        let mut backoff = Backoff::default();
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next_delay()).collect();
        let within =
            |d: Duration, nominal: Duration| d >= nominal.mul_f64(0.8) && d <= nominal.mul_f64(1.2);
        assert!(within(delays[0], MIN_BACKOFF), "{delays:?}");
        assert!(within(delays[1], MIN_BACKOFF * 2), "{delays:?}");
        assert!(within(delays[7], MAX_BACKOFF), "{delays:?}");
        backoff.last_failure = Some(Instant::now() - BACKOFF_RESET);
        assert!(within(backoff.next_delay(), MIN_BACKOFF));
    }

    #[test]
    fn resource_is_featureflags_v1beta1() {
        let resource = feature_flag_resource();
        assert_eq!(
            (
                resource.group.as_str(),
                resource.version.as_str(),
                resource.kind.as_str(),
                resource.plural.as_str(),
                resource.api_version.as_str()
            ),
            (
                "core.openfeature.dev",
                "v1beta1",
                "FeatureFlag",
                "featureflags",
                "core.openfeature.dev/v1beta1"
            )
        );
    }

    #[tokio::test]
    async fn dynamic_objects_become_documents() {
        // The JSON the publisher gets from a DynamicObject is the CR as the API server sent it.
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "core.openfeature.dev/v1beta1",
            "kind": "FeatureFlag",
            "metadata": {"name": "flags", "namespace": "team-b", "resourceVersion": "7"},
            "spec": {"flagSpec": {"flags": {"f": {
                "state": "ENABLED", "variants": {"on": true, "off": false}, "defaultVariant": "on"
            }}}}
        }))
        .expect("object");
        let value = serde_json::to_value(&object).expect("json");
        let document = crate::document::from_resource(&value).expect("valid");
        let parsed: Value = serde_json::from_str(&document).expect("json");
        assert_eq!(parsed["flags"]["f"]["defaultVariant"], "on");
    }
}
