//! One `SyncFlags` stream: the newest snapshot each time the client can take one, in this
//! stream's protocol, until shutdown, a revoked grant, or a final answer from the hub ends it.
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use prost_types::Struct;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::authz::{Authorizer, AuthzError, Identity};
use crate::hub::{Subscription, SubscriptionEnd};
use crate::metrics::{Metrics, ProtocolLabels};
use crate::selector::ResourceKey;
use crate::wire::clients::Named;
use crate::wire::compression::StreamEncoder;
use crate::wire::error::RequestError;
use crate::wire::frame::{Frame, Message, Protocol};

/// A stream of frames, ending with the status that ends the stream.
pub type FrameStream = Pin<Box<dyn Stream<Item = Result<Frame, Status>> + Send + 'static>>;

/// Opens a stream of `subscription` for a client; `grant` is its authorization, when checked,
/// and `named` its count among the resources the client names, when counted.
#[allow(clippy::too_many_arguments)]
pub(crate) fn open(
    subscription: Subscription,
    protocol: Protocol,
    identity: Arc<Struct>,
    grant: Option<Grant>,
    named: Option<Named>,
    metrics: &Arc<Metrics>,
    shutdown: CancellationToken,
    encoder: StreamEncoder,
) -> FrameStream {
    tracing::debug!(resource = %subscription.key(), protocol = protocol.label(), "stream opened");
    // Boxed, so a stream without authorization does not carry the size of a recheck.
    let revoked =
        grant.map(|grant| -> Revocation { Box::pin(revoked(grant, subscription.key().clone())) });
    let state = StreamState {
        subscription,
        shutdown,
        protocol,
        identity,
        encoder,
        _open: OpenStream::new(metrics.clone(), protocol),
        updates_sent: metrics
            .updates_sent
            .get_or_create(&ProtocolLabels {
                protocol: protocol.label(),
            })
            .clone(),
        revoked,
        _named: named.map(Box::new),
        done: false,
    };
    Box::pin(futures::stream::unfold(state, StreamState::step))
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
pub(crate) struct Grant {
    pub(crate) authz: Arc<Authorizer>,
    pub(crate) identity: Identity,
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
            Err(error @ AuthzError::Unavailable(_)) => {
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
    subscription: Subscription,
    shutdown: CancellationToken,
    protocol: Protocol,
    identity: Arc<Struct>,
    encoder: StreamEncoder,
    /// This protocol's `updates_sent` counter, looked up once per stream.
    updates_sent: prometheus_client::metrics::counter::Counter,
    _open: OpenStream,
    /// Present when authorization is on: the stream ends once the client loses access. It
    /// lives as long as the stream, so a check under way is not restarted by an update.
    revoked: Option<Revocation>,
    /// Counted among the resources its client names while the stream lives (boxed, like the
    /// recheck: only when the limit is on).
    _named: Option<Box<Named>>,
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
                    let frame = self.encoder.message(
                        Message::Sync(self.protocol),
                        &snapshot,
                        self.subscription.key(),
                        &self.identity,
                    );
                    self.updates_sent.inc();
                    self.subscription.delivered(&snapshot);
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
                Err(SubscriptionEnd::Invalid(reason)) => Err(RequestError::Invalid {
                    key: self.subscription.key().clone(),
                    reason: reason.to_string(),
                }),
            },
        };
        if item.is_err() {
            self.done = true;
        }
        Some((item.map_err(Status::from), self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::{Hub, HubOptions};
    use crate::testing::FakeSource;

    /// Every open stream holds its state and the future of its next step for as long as it
    /// lives, so their size is paid once per subscriber. The authorization recheck (with the
    /// API calls it may make) is boxed for that reason.
    #[tokio::test]
    async fn an_idle_stream_stays_small() {
        let hub = Hub::for_test(FakeSource::new(), HubOptions::default());
        let key = ResourceKey::new("ns", "a");
        let state = StreamState {
            subscription: hub.subscribe(key).expect("subscribe"),
            shutdown: CancellationToken::new(),
            protocol: Protocol::FlagdSyncV1,
            identity: Arc::new(Struct::default()),
            encoder: StreamEncoder::default(),
            updates_sent: Default::default(),
            _open: OpenStream::new(hub.metrics().clone(), Protocol::FlagdSyncV1),
            revoked: None,
            _named: None,
            done: false,
        };
        let stream = futures::stream::unfold(state, StreamState::step);
        // `Unfold` holds either the state or the future of a step, whichever is larger.
        let bytes = size_of_val(&stream);
        eprintln!("an idle stream takes {bytes} bytes");
        assert!(bytes <= 1024, "an idle stream takes {bytes} bytes");
    }
}
