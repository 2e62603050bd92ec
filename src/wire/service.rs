//! What the sync services do, whatever the protocol: find the resource a request names,
//! check the client may read it, and open a stream of it or fetch it once.
use std::sync::Arc;
use std::time::Duration;

use prost_types::Struct;
use tokio_util::sync::CancellationToken;
use tonic::Request;

use crate::authz::{Authorizer, AuthzError};
use crate::hub::{Availability, Hub, Snapshot};
use crate::metrics::Metrics;
use crate::net::info::ConnectionInfo;
use crate::protocol::SELECTOR_HEADER;
use crate::selector::{self, ResourceKey};
use crate::wire::clients::{ClientResources, Named};
use crate::wire::compression::{CompressionSettings, Compressor};
use crate::wire::error::RequestError;
use crate::wire::frame::{Frame, Message, Protocol, proxy_identity};
use crate::wire::stream::{self, FrameStream, Grant};

/// Both sync protocols over one hub. Cheap to clone.
#[derive(Clone)]
pub struct SyncService {
    hub: Hub,
    /// The process's metrics: refusals and streams are counted here.
    metrics: Arc<Metrics>,
    authz: Option<Arc<Authorizer>>,
    shutdown: CancellationToken,
    fetch_timeout: Duration,
    /// The proxy's part of every `sync_context` and of `GetMetadata`.
    identity: Arc<Struct>,
    compressor: Arc<Compressor>,
    /// The resources each client names ([`Self::with_max_resources_per_address`]).
    clients: ClientResources,
}

impl SyncService {
    /// The services over `hub`, counting in `metrics`; `shutdown` ends every open stream with
    /// `UNAVAILABLE` when cancelled.
    pub fn new(hub: Hub, metrics: Arc<Metrics>, shutdown: CancellationToken) -> Self {
        Self {
            authz: None,
            shutdown,
            fetch_timeout: Duration::from_secs(10),
            identity: Arc::new(proxy_identity(&[])),
            compressor: Arc::new(Compressor::new(
                CompressionSettings::default(),
                metrics.clone(),
            )),
            clients: ClientResources::new(0, metrics.clone()),
            hub,
            metrics,
        }
    }

    /// Lets the streams and fetches of one client address (one connection, for those without
    /// an address) name at most `limit` distinct resources at once; 0: no limit (the default).
    pub fn with_max_resources_per_address(mut self, limit: usize) -> Self {
        self.clients = ClientResources::new(limit, self.metrics.clone());
        self
    }

    /// Counts `key` against the limit of the client that sent `request`, while the returned
    /// value lives.
    fn name<T>(
        &self,
        request: &Request<T>,
        key: &ResourceKey,
    ) -> Result<Option<Named>, RequestError> {
        self.clients
            .name(request.extensions().get::<ConnectionInfo>(), key)
    }

    /// Compresses messages as `settings` say (by default, [`CompressionSettings::default`]).
    pub fn with_compression(mut self, settings: CompressionSettings) -> Self {
        self.compressor = Arc::new(Compressor::new(settings, self.metrics.clone()));
        self
    }

    /// Whether a call with these request headers is answered with gzip.
    pub(crate) fn negotiate_gzip(&self, headers: &http::HeaderMap) -> bool {
        self.compressor.negotiate(headers)
    }

    /// Adds `--context-value` entries to every `sync_context` and to `GetMetadata`.
    pub fn with_context_values(mut self, values: &[(String, String)]) -> Self {
        self.identity = Arc::new(proxy_identity(values));
        self
    }

    /// Checks every request with `authz` (when it is enabled).
    pub fn with_authorizer(mut self, authz: Arc<Authorizer>) -> Self {
        self.authz = authz.enabled().then_some(authz);
        self
    }

    /// Identifies the client and checks that it may read `key`.
    async fn authorize<T>(
        &self,
        request: &Request<T>,
        key: &ResourceKey,
    ) -> Result<Option<Grant>, RequestError> {
        let Some(authz) = &self.authz else {
            return Ok(None);
        };
        let connection = request.extensions().get::<ConnectionInfo>();
        let result = async {
            let identity = authz.identify(request.metadata(), connection).await?;
            authz.check(&identity, key).await?;
            Ok::<_, AuthzError>(identity)
        }
        .await;
        match result {
            Ok(identity) => {
                tracing::debug!(resource = %key, %identity, "authorized");
                Ok(Some(Grant {
                    authz: authz.clone(),
                    identity,
                }))
            }
            Err(error) => {
                self.metrics.reject("unauthorized");
                tracing::info!(resource = %key, %error, "request refused");
                Err(error.into())
            }
        }
    }

    /// Opens a `SyncFlags` stream for a request whose body named `body_selector`, with gzip
    /// messages when `gzip` ([`Self::negotiate_gzip`]).
    pub(crate) async fn open_sync<T>(
        &self,
        request: &Request<T>,
        body_selector: &str,
        protocol: Protocol,
        gzip: bool,
    ) -> Result<FrameStream, RequestError> {
        let key = self.resource(request, body_selector)?;
        let grant = self.authorize(request, &key).await?;
        let named = self.name(request, &key)?;
        self.stream(key, protocol, grant, named, gzip)
    }

    /// The resource a request names: the `flagd-selector` header first, then the body field.
    fn resource<T>(
        &self,
        request: &Request<T>,
        body_selector: &str,
    ) -> Result<ResourceKey, RequestError> {
        let header = request
            .metadata()
            .get(SELECTOR_HEADER)
            .and_then(|v| v.to_str().ok());
        let selector = header
            .filter(|s| !s.trim().is_empty())
            .unwrap_or(body_selector);
        selector::parse(selector)
            .inspect_err(|_| self.metrics.reject("invalid_selector"))
            .map_err(Into::into)
    }

    fn stream(
        &self,
        key: ResourceKey,
        protocol: Protocol,
        grant: Option<Grant>,
        named: Option<Named>,
        gzip: bool,
    ) -> Result<FrameStream, RequestError> {
        if self.shutdown.is_cancelled() {
            return Err(RequestError::ShuttingDown);
        }
        let subscription = self.hub.subscribe(key)?;
        Ok(stream::open(
            subscription,
            protocol,
            self.identity.clone(),
            grant,
            named,
            &self.metrics,
            self.shutdown.clone(),
            self.compressor.for_stream(gzip),
        ))
    }

    /// Answers a `FetchAllFlags` request that named `body_selector`: the resource's current
    /// flag configuration, once the source has answered, as the version's shared
    /// `FetchAllFlagsResponse` message (gzip when `gzip`, see [`Self::negotiate_gzip`]).
    pub(crate) async fn fetch_all_flags<T>(
        &self,
        request: &Request<T>,
        body_selector: &str,
        gzip: bool,
    ) -> Result<Frame, RequestError> {
        let key = self.resource(request, body_selector)?;
        self.authorize(request, &key).await?;
        let named = self.name(request, &key)?;
        let snapshot = self.fetch(&key).await?;
        drop(named);
        Ok(self.compressor.for_stream(gzip).message(
            Message::FetchAll,
            &snapshot,
            &key,
            &self.identity,
        ))
    }

    /// The proxy's identity and context values, as `GetMetadata` reports them.
    pub(crate) fn metadata(&self) -> Struct {
        Struct::clone(&self.identity)
    }

    async fn fetch(&self, key: &ResourceKey) -> Result<Arc<Snapshot>, RequestError> {
        let key = key.clone();
        let mut subscription = self.hub.subscribe(key.clone())?;
        let state = tokio::time::timeout(self.fetch_timeout, subscription.settled())
            .await
            .map_err(|_| RequestError::SourceTimeout(key.clone()))?;
        match (state.snapshot, state.availability) {
            (_, Availability::Forbidden(reason)) => Err(RequestError::Forbidden {
                key,
                reason: reason.to_string(),
            }),
            (Some(snapshot), _) => Ok(snapshot),
            (None, Availability::Absent | Availability::TooManyWaiting { .. }) => {
                Err(RequestError::NotFound(key))
            }
            (None, Availability::Invalid(reason)) => Err(RequestError::Invalid {
                key,
                reason: reason.to_string(),
            }),
            (None, Availability::Unreachable(reason)) => Err(RequestError::Unreachable {
                key,
                reason: reason.to_string(),
            }),
            (None, Availability::Pending | Availability::Present) => {
                Err(RequestError::SourceTimeout(key))
            }
        }
    }
}
