//! The gRPC-aware tower layers in front of the sync services: they read a request's headers and
//! body as tonic hands them over and answer what they refuse with a gRPC status.
mod request_deadline;
mod request_limits;

pub(super) use self::request_deadline::RequestDeadline;
pub(super) use self::request_limits::RequestLimits;

/// One of these layers (its settings), as tower takes it.
#[derive(Clone)]
pub(super) struct Layer<L>(pub(super) L);

impl<L: Clone, S> tower::Layer<S> for Layer<L> {
    type Service = Layered<L, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Layered {
            inner,
            limits: self.0.clone(),
        }
    }
}

/// The service behind one of these layers: the next service, and the layer's settings.
#[derive(Clone)]
pub(crate) struct Layered<L, S> {
    inner: S,
    limits: L,
}

/// A service of tonic's requests and responses: what these layers sit in front of.
pub(crate) trait GrpcService:
    tower::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>
{
}

impl<T> GrpcService for T where
    T: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        >
{
}
