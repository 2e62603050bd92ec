//! The deadline of a request's message on the sync port, as a tower layer in front of the
//! services: every request body must end within `--request-timeout` or fails with
//! `DEADLINE_EXCEEDED`, and a client address may have only so many requests whose message has
//! not arrived (`--max-pending-requests-per-address`).
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as _, Frame};

use super::{GrpcService, Layered};
use crate::net::info::ConnectionInfo;
use crate::net::limits::{AddressLimit, AddressSlot};

/// A request body that fails with `DEADLINE_EXCEEDED` unless it ends within its deadline, so a
/// stream whose request never completes cannot hold its memory for longer. Reading may stop
/// before the end (the sync streams read one message); the deadline then no longer matters.
/// While it is unfinished it holds a place among its client address's pending requests.
pub(crate) struct DeadlineBody<B> {
    inner: B,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
    place: Option<AddressSlot>,
}

impl<B> DeadlineBody<B> {
    pub(crate) fn new(inner: B, limit: Duration, place: Option<AddressSlot>) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            limit,
            place,
        }
    }
}

impl<B> http_body::Body for DeadlineBody<B>
where
    B: http_body::Body<Data = Bytes, Error = tonic::Status> + Unpin,
{
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if !matches!(frame, Some(Ok(_))) || self.inner.is_end_stream() {
                self.place = None;
            }
            return Poll::Ready(frame);
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.place = None;
            let limit = self.limit;
            return Poll::Ready(Some(Err(tonic::Status::deadline_exceeded(format!(
                "the request message did not arrive within {} (--request-timeout)",
                humantime::format_duration(limit)
            )))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Gives every request body a deadline (see [`DeadlineBody`]), and refuses a request with
/// `RESOURCE_EXHAUSTED` while its client address has the most unfinished requests already.
#[derive(Clone)]
pub(crate) struct RequestDeadline {
    pub(crate) limit: Duration,
    pub(crate) pending: AddressLimit,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Layered<RequestDeadline, S>
where
    S: GrpcService,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::Either<
        futures::future::Ready<Result<Self::Response, Self::Error>>,
        S::Future,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.body().is_end_stream() {
            return futures::future::Either::Right(self.inner.call(request));
        }
        let ip = request
            .extensions()
            .get::<ConnectionInfo>()
            .and_then(|c| c.remote_addr)
            .map(|a| a.ip());
        let place = match ip {
            Some(ip) => match self.limits.pending.admit(ip) {
                Some(place) => Some(place),
                None => {
                    let status = tonic::Status::resource_exhausted(
                        "this address has too many requests whose message has not arrived (--max-pending-requests-per-address)",
                    );
                    return futures::future::Either::Left(futures::future::ready(Ok(
                        status.into_http()
                    )));
                }
            },
            None => None,
        };
        let limit = self.limits.limit;
        futures::future::Either::Right(self.inner.call(
            request.map(|body| tonic::body::Body::new(DeadlineBody::new(body, limit, place))),
        ))
    }
}
