//! The per-request limits of the sync port, as a tower layer in front of the services: a
//! header list over `--max-header-bytes` is answered `RESOURCE_EXHAUSTED` (and counted), the
//! requests a service refused for a message over `--max-request-bytes` are counted, and every
//! stream is charged to the memory budget while its response lives, and for its request message
//! (as large as `--max-request-bytes` allows) until it has been read. (The deadlines of a
//! request are in `request_deadline`.)
use std::sync::Arc;
use std::task::{Context, Poll};

use super::{GrpcService, Layered};
use crate::budget::{self, Kind, MemoryBudget};
use crate::metrics::Metrics;
use crate::net::info::ConnectionInfo;

/// Refuses requests whose header block is over the limit with `RESOURCE_EXHAUSTED`, and counts
/// those and the requests a service refused for a message over `max_request_bytes`.
#[derive(Clone)]
pub(crate) struct RequestLimits {
    pub(crate) max_header_bytes: usize,
    /// The largest request message a service takes: what an unfinished request may make the
    /// proxy hold, charged until the request ends.
    pub(crate) max_request_bytes: usize,
    /// Each stream is charged to it while it is open.
    pub(crate) budget: Arc<MemoryBudget>,
    pub(crate) metrics: Arc<Metrics>,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Layered<RequestLimits, S>
where
    S: GrpcService,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let size = header_list_size(&request);
        let limit = self.limits.max_header_bytes;
        if size > limit {
            self.limits.metrics.reject("max_header_bytes");
            let status = tonic::Status::resource_exhausted(format!(
                "the request headers are {size} bytes, over the limit of {limit} bytes (--max-header-bytes)"
            ));
            return Box::pin(futures::future::ready(Ok(status.into_http())));
        }
        // The request's part is charged with the stream's, before anything of it is held, and
        // let go of as soon as the message has been read, the request body dropped (real clients
        // send theirs at once).
        let request_bytes = self.limits.max_request_bytes + GRPC_PREFIX_BYTES;
        let Some(mut memory) = self
            .limits
            .budget
            .try_charge(budget::STREAM_BYTES + request_bytes, Kind::Streams)
        else {
            let status = tonic::Status::resource_exhausted(
                "the proxy is at its memory budget (--memory-budget); try again later or another replica",
            );
            return Box::pin(futures::future::ready(Ok(status.into_http())));
        };
        let metrics = self.limits.metrics.clone();
        // The stream counts as open on its connection, and is charged to the budget, until its
        // response body is dropped; what a new busiest moment makes the connection keep is
        // charged until it closes.
        let open = request
            .extensions()
            .get::<ConnectionInfo>()
            .and_then(|info| info.activity.as_ref())
            .map(|activity| {
                let open = activity.open_stream();
                activity.retain_peak(activity.streams(), &self.limits.budget);
                open
            });
        let unfinished = memory.split_off(request_bytes);
        let request = request.map(|body| {
            tonic::body::Body::new(Holding {
                body,
                _held: unfinished,
            })
        });
        let held = (open, memory);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            let response =
                response.map(|body| tonic::body::Body::new(Holding { body, _held: held }));
            // tonic answers a request message over the decoding limit with OUT_OF_RANGE before
            // the service sees it; no service of this server returns that code otherwise.
            let out_of_range = (tonic::Code::OutOfRange as i32).to_string();
            if response
                .headers()
                .get("grpc-status")
                .is_some_and(|code| code.as_bytes() == out_of_range.as_bytes())
            {
                metrics.reject("max_request_bytes");
            }
            Ok(response)
        })
    }
}

/// A body that holds something (an open stream's count, a request's charge) for as long as it
/// lives.
pub(crate) struct Holding<T> {
    body: tonic::body::Body,
    _held: T,
}

impl<T: Unpin + Send + 'static> http_body::Body for Holding<T> {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The length prefix of a gRPC message.
const GRPC_PREFIX_BYTES: usize = 5;

/// The size of a request's header list as HTTP/2 counts it: name + value + 32 per field,
/// pseudo-headers included.
fn header_list_size<B>(request: &http::Request<B>) -> usize {
    const FIELD_OVERHEAD: usize = 32;
    let uri = request.uri();
    let pseudo = [
        (":method".len(), request.method().as_str().len()),
        (":scheme".len(), uri.scheme_str().map_or(0, str::len)),
        (
            ":authority".len(),
            uri.authority().map_or(0, |a| a.as_str().len()),
        ),
        (
            ":path".len(),
            uri.path_and_query().map_or(0, |p| p.as_str().len()),
        ),
    ];
    let pseudo: usize = pseudo
        .iter()
        .map(|(name, value)| name + value + FIELD_OVERHEAD)
        .sum();
    let fields: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + FIELD_OVERHEAD)
        .sum();
    pseudo + fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_size_counts_like_http2() {
        let request = http::Request::builder()
            .uri("http://h/p")
            .header("flagd-selector", "x".repeat(100))
            .body(())
            .expect("request");
        // :method GET, :scheme http, :authority h, :path /p, one field.
        let pseudo = (7 + 3 + 32) + (7 + 4 + 32) + (10 + 1 + 32) + (5 + 2 + 32);
        assert_eq!(header_list_size(&request), pseudo + 14 + 100 + 32);
    }
}
