//! The gRPC methods of one sync protocol, routed by path: `SyncFlags` and `FetchAllFlags`
//! written straight from the shared frames (see [`crate::wire::body`]), `GetMetadata` through
//! tonic's codec, anything else `UNIMPLEMENTED`. This is the only way requests reach the [`SyncService`].
//!
//! Both protocols' messages have the same fields with the same numbers (`provider_id = 1,
//! selector = 2` in requests, `flag_configuration = 1` in `FetchAllFlagsResponse`), so the
//! `flagd.sync.v1` types decode and encode both.
use std::convert::Infallible;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http_body_util::StreamBody;
use prost::Message;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

use crate::protocol::client::flagd_sync_v1 as v1;
use crate::wire::body::{FrameBody, read_message};
use crate::wire::compression::{ENCODING, GZIP};
use crate::wire::frame::{Frame, Protocol};
use crate::wire::service::SyncService;
use crate::wire::stream::FrameStream;

/// A sync protocol served by [`SyncRoutes`].
pub trait SyncProtocol: Send + Sync + 'static {
    const PROTOCOL: Protocol;
    /// The gRPC service name, the first segment of every method's path.
    const SERVICE: &'static str;
    /// Whether the protocol has `GetMetadata`.
    const HAS_METADATA: bool;
}

/// `flagd.sync.v1`.
pub struct FlagdSyncV1;

impl SyncProtocol for FlagdSyncV1 {
    const PROTOCOL: Protocol = Protocol::FlagdSyncV1;
    const SERVICE: &'static str = "flagd.sync.v1.FlagSyncService";
    const HAS_METADATA: bool = true;
}

/// `sync.v1`, spoken by flagd before v0.9.0.
pub struct LegacySyncV1;

impl SyncProtocol for LegacySyncV1 {
    const PROTOCOL: Protocol = Protocol::LegacySyncV1;
    const SERVICE: &'static str = "sync.v1.FlagSyncService";
    const HAS_METADATA: bool = false;
}

/// The methods of protocol `P`, as a service for tonic's router.
pub struct SyncRoutes<P> {
    service: SyncService,
    max_request_bytes: usize,
    protocol: PhantomData<fn() -> P>,
}

impl<P> Clone for SyncRoutes<P> {
    fn clone(&self) -> Self {
        Self {
            service: self.service.clone(),
            max_request_bytes: self.max_request_bytes,
            protocol: PhantomData,
        }
    }
}

impl<P: SyncProtocol> SyncRoutes<P> {
    /// Requests larger than `max_request_bytes` are refused with `OUT_OF_RANGE`.
    pub fn new(service: SyncService, max_request_bytes: usize) -> Self {
        Self {
            service,
            max_request_bytes,
            protocol: PhantomData,
        }
    }

    fn grpc<Req, Resp>(&self) -> Grpc<ProstCodec<Resp, Req>>
    where
        Req: Message + Default + Send + 'static,
        Resp: Message + Send + 'static,
    {
        Grpc::new(ProstCodec::default())
            .apply_max_message_size_config(Some(self.max_request_bytes), None)
    }
}

impl<P: SyncProtocol> NamedService for SyncRoutes<P> {
    const NAME: &'static str = P::SERVICE;
}

impl<P: SyncProtocol> tower::Service<http::Request<Body>> for SyncRoutes<P> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request
            .uri()
            .path()
            .strip_prefix('/')
            .and_then(|p| p.strip_prefix(P::SERVICE))
            .and_then(|p| p.strip_prefix('/'))
            .unwrap_or_default();
        let this = self.clone();
        match method {
            "SyncFlags" => Box::pin(async move {
                let gzip = this.service.negotiate_gzip(request.headers());
                Ok(match this.sync_flags(request, gzip).await {
                    Ok(stream) => grpc_response(Body::new(FrameBody::new(stream)), gzip),
                    Err(status) => status.into_http(),
                })
            }),
            "FetchAllFlags" => Box::pin(async move {
                let gzip = this.service.negotiate_gzip(request.headers());
                Ok(match this.fetch_all_flags(request, gzip).await {
                    Ok(frame) => grpc_response(unary_body(frame), gzip),
                    Err(status) => status.into_http(),
                })
            }),
            "GetMetadata" if P::HAS_METADATA => Box::pin(async move {
                let service = GetMetadata(this.service.clone());
                Ok(this.grpc().unary(service, request).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}

impl<P: SyncProtocol> SyncRoutes<P> {
    /// `SyncFlags`: a stream of the resource's versions, gzip messages when `gzip`.
    async fn sync_flags(
        &self,
        request: http::Request<Body>,
        gzip: bool,
    ) -> Result<FrameStream, Status> {
        let (request, decoded) = self
            .read::<v1::SyncFlagsRequest>(request, "SyncFlags")
            .await?;
        Ok(self
            .service
            .open_sync(&request, &decoded.selector, P::PROTOCOL, gzip)
            .await?)
    }

    /// `FetchAllFlags`: the resource's current flag configuration, as the version's shared
    /// message (gzip when `gzip`), like the streams' messages.
    async fn fetch_all_flags(
        &self,
        request: http::Request<Body>,
        gzip: bool,
    ) -> Result<Frame, Status> {
        let (request, decoded) = self
            .read::<v1::FetchAllFlagsRequest>(request, "FetchAllFlags")
            .await?;
        Ok(self
            .service
            .fetch_all_flags(&request, &decoded.selector, gzip)
            .await?)
    }

    /// The one request message of a call to `method`, decoded, and its metadata.
    async fn read<M: Message + Default>(
        &self,
        request: http::Request<Body>,
        method: &str,
    ) -> Result<(Request<()>, M), Status> {
        let (parts, body) = request.into_parts();
        let message = read_message(body, self.max_request_bytes).await?;
        let decoded = M::decode(message).map_err(|e| {
            Status::invalid_argument(format!("the {method} request does not decode: {e}"))
        })?;
        let request = Request::from_parts(
            tonic::metadata::MetadataMap::from_headers(parts.headers),
            parts.extensions,
            (),
        );
        Ok((request, decoded))
    }
}

/// A gRPC response's headers, with `grpc-encoding: gzip` when its messages may be compressed.
fn grpc_response(body: Body, gzip: bool) -> http::Response<Body> {
    let mut response = http::Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        tonic::metadata::GRPC_CONTENT_TYPE,
    );
    if gzip {
        response
            .headers_mut()
            .insert(ENCODING, http::HeaderValue::from_static(GZIP));
    }
    response
}

/// The body of a unary response: the one message, then the OK status.
fn unary_body(frame: Frame) -> Body {
    let ok = http::HeaderMap::from_iter([(
        http::HeaderName::from_static("grpc-status"),
        http::HeaderValue::from_static("0"),
    )]);
    let frames = frame
        .pieces()
        .iter()
        .filter(|piece| !piece.is_empty())
        .map(|piece| http_body::Frame::data(piece.clone()))
        .chain([http_body::Frame::trailers(ok)])
        .collect::<Vec<_>>();
    Body::new(StreamBody::new(futures::stream::iter(
        frames.into_iter().map(Ok::<_, Infallible>),
    )))
}

/// `GetMetadata`: the proxy's identity and context values.
struct GetMetadata(SyncService);

impl UnaryService<v1::GetMetadataRequest> for GetMetadata {
    type Response = v1::GetMetadataResponse;
    type Future = BoxFuture<'static, Result<Response<Self::Response>, Status>>;

    fn call(&mut self, _request: Request<v1::GetMetadataRequest>) -> Self::Future {
        let metadata = Some(self.0.metadata());
        Box::pin(async move { Ok(Response::new(v1::GetMetadataResponse { metadata })) })
    }
}
