//! The `flagd.sync.v1` and legacy `sync.v1` FlagSyncService implementations.
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use prost_types::Struct;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::authz::{Authorizer, Identity};
use crate::hub::{Availability, Hub, SubscriptionEnd};
use crate::metrics::{Metrics, ProtocolLabels};
use crate::selector::{self, ResourceKey};
use crate::wire::error::RequestError;
use crate::wire::frame::{Frame, Protocol, proxy_identity};
use crate::wire::proto::server::{flagd_sync_v1 as v1, sync_v1 as legacy};

/// The metadata header flagd providers send the selector in.
pub const SELECTOR_HEADER: &str = "flagd-selector";

/// A stream of frames, as the generated service traits want it.
pub type FrameStream = Pin<Box<dyn Stream<Item = Result<Frame, Status>> + Send + 'static>>;

/// Both sync services over one hub. Cheap to clone.
#[derive(Clone)]
pub struct SyncService {
    hub: Hub,
    authz: Option<Arc<Authorizer>>,
    shutdown: CancellationToken,
    fetch_timeout: Duration,
    /// The proxy's part of every `sync_context` and of `GetMetadata`.
    identity: Arc<Struct>,
}

impl SyncService {
    /// `shutdown` ends every open stream with `UNAVAILABLE` when cancelled.
    pub fn new(hub: Hub, shutdown: CancellationToken) -> Self {
        Self {
            hub,
            authz: None,
            shutdown,
            fetch_timeout: Duration::from_secs(10),
            identity: Arc::new(proxy_identity(&[])),
        }
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
        let connection = request.extensions().get::<crate::server::ConnectionInfo>();
        let result = async {
            let identity = authz.identify(request.metadata(), connection).await?;
            authz.check(&identity, key).await?;
            Ok::<_, crate::authz::AuthzError>(identity)
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
                self.metrics().reject("unauthorized");
                tracing::info!(resource = %key, %error, "request refused");
                Err(error.into())
            }
        }
    }

    pub fn flagd_sync_v1(&self) -> v1::flag_sync_service_server::FlagSyncServiceServer<Self> {
        v1::flag_sync_service_server::FlagSyncServiceServer::new(self.clone())
    }

    pub fn legacy_sync_v1(&self) -> legacy::flag_sync_service_server::FlagSyncServiceServer<Self> {
        legacy::flag_sync_service_server::FlagSyncServiceServer::new(self.clone())
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        self.hub.metrics()
    }

    /// Opens a `SyncFlags` stream for a request whose body named `body_selector`.
    pub(crate) async fn open_sync<T>(
        &self,
        request: &Request<T>,
        body_selector: &str,
        protocol: Protocol,
    ) -> Result<FrameStream, RequestError> {
        let key = self.resource(request, body_selector)?;
        let grant = self.authorize(request, &key).await?;
        self.stream(key, protocol, grant)
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
            .inspect_err(|_| self.metrics().reject("invalid_selector"))
            .map_err(Into::into)
    }

    fn stream(
        &self,
        key: ResourceKey,
        protocol: Protocol,
        grant: Option<Grant>,
    ) -> Result<FrameStream, RequestError> {
        if self.shutdown.is_cancelled() {
            return Err(RequestError::ShuttingDown);
        }
        let subscription = self.hub.subscribe(key)?;
        tracing::debug!(resource = %subscription.key(), protocol = protocol.label(), "stream opened");
        // Boxed, so a stream without authorization does not carry the size of a recheck.
        let revoked = grant
            .map(|grant| -> Revocation { Box::pin(revoked(grant, subscription.key().clone())) });
        let state = StreamState {
            subscription,
            shutdown: self.shutdown.clone(),
            protocol,
            identity: self.identity.clone(),
            _open: OpenStream::new(self.metrics().clone(), protocol),
            metrics: self.metrics().clone(),
            updates_sent: self
                .metrics()
                .updates_sent
                .get_or_create(&ProtocolLabels {
                    protocol: protocol.label(),
                })
                .clone(),
            revoked,
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(state, StreamState::step)))
    }

    async fn fetch(&self, key: ResourceKey) -> Result<String, RequestError> {
        let mut subscription = self.hub.subscribe(key.clone())?;
        let state = tokio::time::timeout(self.fetch_timeout, subscription.settled())
            .await
            .map_err(|_| RequestError::SourceTimeout(key.clone()))?;
        match (state.snapshot, state.availability) {
            (_, Availability::Forbidden(reason)) => Err(RequestError::Forbidden {
                key,
                reason: reason.to_string(),
            }),
            (Some(snapshot), _) => Ok(snapshot.flag_configuration.to_string()),
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

/// Keeps the open-stream gauges right for as long as a stream lives.
struct OpenStream {
    metrics: Arc<Metrics>,
    protocol: Protocol,
}

impl OpenStream {
    fn new(metrics: Arc<Metrics>, protocol: Protocol) -> Self {
        metrics.sync_active_streams.inc();
        metrics
            .active_streams
            .get_or_create(&ProtocolLabels {
                protocol: protocol.label(),
            })
            .inc();
        Self { metrics, protocol }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.metrics.sync_active_streams.dec();
        self.metrics
            .active_streams
            .get_or_create(&ProtocolLabels {
                protocol: self.protocol.label(),
            })
            .dec();
    }
}

/// A client's authorization to read a resource, checked again while its stream is open.
struct Grant {
    authz: Arc<Authorizer>,
    identity: Identity,
}

/// Resolves once the client behind a stream has lost access.
type Revocation = Pin<Box<dyn Future<Output = RequestError> + Send>>;

/// Checks `grant` again at every interval; returns once the client has lost access. Only a
/// definite "no" ends the stream: an unavailable API does not.
async fn revoked(grant: Grant, key: ResourceKey) -> RequestError {
    loop {
        tokio::time::sleep(grant.authz.recheck_interval()).await;
        match grant.authz.check(&grant.identity, &key).await {
            Ok(()) => {}
            Err(error @ crate::authz::AuthzError::Unavailable(_)) => {
                tracing::warn!(resource = %key, %error, "authorization recheck failed; keeping the stream");
            }
            Err(error) => {
                tracing::info!(resource = %key, %error, "access revoked; ending the stream");
                return error.into();
            }
        }
    }
}

struct StreamState {
    subscription: crate::hub::Subscription,
    shutdown: CancellationToken,
    protocol: Protocol,
    identity: Arc<Struct>,
    metrics: Arc<Metrics>,
    /// This protocol's `updates_sent` counter, looked up once per stream.
    updates_sent: prometheus_client::metrics::counter::Counter,
    _open: OpenStream,
    /// Present when authorization is on: the stream ends once the client loses access. It
    /// lives as long as the stream, so a check under way is not restarted by an update.
    revoked: Option<Revocation>,
    done: bool,
}

impl StreamState {
    /// The next message: a newer snapshot, or the status that ends the stream. A stream never
    /// ends with OK: clients that see OK may never reconnect.
    async fn step(mut self) -> Option<(Result<Frame, Status>, Self)> {
        if self.done {
            return None;
        }
        let revoked = async {
            match self.revoked.as_mut() {
                Some(revoked) => revoked.await,
                None => futures::future::pending().await,
            }
        };
        let item = tokio::select! {
            biased;
            () = self.shutdown.cancelled() => Err(RequestError::ShuttingDown),
            error = revoked => Err(error),
            next = self.subscription.next() => match next {
                Ok(snapshot) => {
                    let frame = self
                        .protocol
                        .frame(&snapshot, self.subscription.key(), &self.identity);
                    self.updates_sent.inc();
                    self.subscription.delivered(&snapshot, &self.metrics);
                    Ok(frame)
                }
                Err(SubscriptionEnd::Forbidden(reason)) => Err(RequestError::Forbidden {
                    key: self.subscription.key().clone(),
                    reason: reason.to_string(),
                }),
                Err(SubscriptionEnd::TooManyWaiting { limit }) => Err(RequestError::TooManyWaiting {
                    key: self.subscription.key().clone(),
                    limit,
                }),
            },
        };
        if item.is_err() {
            self.done = true;
        }
        Some((item.map_err(Status::from), self))
    }
}

#[tonic::async_trait]
impl v1::flag_sync_service_server::FlagSyncService for SyncService {
    type SyncFlagsStream = FrameStream;

    async fn sync_flags(
        &self,
        request: Request<v1::SyncFlagsRequest>,
    ) -> Result<Response<Self::SyncFlagsStream>, Status> {
        let selector = request.get_ref().selector.clone();
        Ok(Response::new(
            self.open_sync(&request, &selector, Protocol::FlagdSyncV1)
                .await?,
        ))
    }

    async fn fetch_all_flags(
        &self,
        request: Request<v1::FetchAllFlagsRequest>,
    ) -> Result<Response<v1::FetchAllFlagsResponse>, Status> {
        let key = self.resource(&request, &request.get_ref().selector)?;
        self.authorize(&request, &key).await?;
        let flag_configuration = self.fetch(key).await?;
        Ok(Response::new(v1::FetchAllFlagsResponse {
            flag_configuration,
        }))
    }

    async fn get_metadata(
        &self,
        _request: Request<v1::GetMetadataRequest>,
    ) -> Result<Response<v1::GetMetadataResponse>, Status> {
        Ok(Response::new(v1::GetMetadataResponse {
            metadata: Some(Struct::clone(&self.identity)),
        }))
    }
}

#[tonic::async_trait]
impl legacy::flag_sync_service_server::FlagSyncService for SyncService {
    type SyncFlagsStream = FrameStream;

    async fn sync_flags(
        &self,
        request: Request<legacy::SyncFlagsRequest>,
    ) -> Result<Response<Self::SyncFlagsStream>, Status> {
        let selector = request.get_ref().selector.clone();
        Ok(Response::new(
            self.open_sync(&request, &selector, Protocol::LegacySyncV1)
                .await?,
        ))
    }

    async fn fetch_all_flags(
        &self,
        request: Request<legacy::FetchAllFlagsRequest>,
    ) -> Result<Response<legacy::FetchAllFlagsResponse>, Status> {
        let key = self.resource(&request, &request.get_ref().selector)?;
        self.authorize(&request, &key).await?;
        let flag_configuration = self.fetch(key).await?;
        Ok(Response::new(legacy::FetchAllFlagsResponse {
            flag_configuration,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::HubOptions;
    use crate::testing::FakeSource;

    /// Every open stream holds its state and the future of its next step for as long as it
    /// lives, so their size is paid once per subscriber. The authorization recheck (with the
    /// API calls it may make) is boxed for that reason.
    #[tokio::test]
    async fn an_idle_stream_stays_small() {
        let hub = Hub::new(
            FakeSource::new(),
            HubOptions::default(),
            Arc::new(Metrics::new()),
        );
        let service = SyncService::new(hub, CancellationToken::new());
        let key = ResourceKey::new("ns", "a");
        let state = StreamState {
            subscription: service.hub.subscribe(key).expect("subscribe"),
            shutdown: service.shutdown.clone(),
            protocol: Protocol::FlagdSyncV1,
            identity: service.identity.clone(),
            metrics: service.metrics().clone(),
            updates_sent: Default::default(),
            _open: OpenStream::new(service.metrics().clone(), Protocol::FlagdSyncV1),
            revoked: None,
            done: false,
        };
        let stream = futures::stream::unfold(state, StreamState::step);
        // `Unfold` holds either the state or the future of a step, whichever is larger.
        let bytes = size_of_val(&stream);
        eprintln!("an idle stream takes {bytes} bytes");
        assert!(bytes <= 1024, "an idle stream takes {bytes} bytes");
    }
}
