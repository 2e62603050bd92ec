//! The tests' gRPC sync client: connect (plaintext or TLS), open a `SyncFlags` stream for a
//! selector, read its next message, and read a flag's variant from a flag configuration. Both
//! protocols are here: [`v1`] (`flagd.sync.v1`) and [`legacy`] (`sync.v1`).

use serde_json::Value;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status, Streaming};

pub use flagd_proxy::protocol::SELECTOR_HEADER;
pub use flagd_proxy::protocol::client::flagd_sync_v1 as v1;
pub use flagd_proxy::protocol::client::sync_v1 as legacy;

use crate::{EVENT_TIMEOUT, Proxy};

/// A `flagd.sync.v1` client.
pub type Client = v1::flag_sync_service_client::FlagSyncServiceClient<Channel>;
/// A `sync.v1` (legacy) client.
pub type LegacyClient = legacy::flag_sync_service_client::FlagSyncServiceClient<Channel>;

/// A plaintext channel to 127.0.0.1:`port`.
pub async fn channel(port: u16) -> Channel {
    Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("uri")
        .connect()
        .await
        .expect("connecting to the proxy")
}

/// A TLS channel to `localhost:port` (the name the test certificates carry); the error when the
/// handshake fails.
pub async fn tls_channel(
    port: u16,
    tls: ClientTlsConfig,
) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("https://localhost:{port}"))
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls config")
        .connect()
        .await
}

/// A `flagd.sync.v1` client of `proxy`'s sync port.
pub async fn client(proxy: &Proxy) -> Client {
    Client::new(channel(proxy.port).await)
}

/// A `sync.v1` client of `proxy`'s sync port.
pub async fn legacy_client(proxy: &Proxy) -> LegacyClient {
    LegacyClient::new(channel(proxy.port).await)
}

/// `message` as a request carrying `selector` in the selector header.
pub fn with_selector<T>(message: T, selector: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(SELECTOR_HEADER, selector.parse().expect("ascii selector"));
    request
}

/// `flagd.sync.v1` `FetchAllFlags` for `selector` (in the header).
pub async fn fetch(
    client: &mut Client,
    selector: &str,
) -> Result<v1::FetchAllFlagsResponse, Status> {
    client
        .fetch_all_flags(with_selector(v1::FetchAllFlagsRequest::default(), selector))
        .await
        .map(tonic::Response::into_inner)
}

/// A `SyncFlags` stream just opened, or the status it was refused with before its first message.
pub type Opened<T> = Result<Streaming<T>, Status>;

/// Opens a `flagd.sync.v1` `SyncFlags` stream for `selector` (in the header).
pub async fn open(client: &mut Client, selector: &str) -> Opened<v1::SyncFlagsResponse> {
    let request = with_selector(v1::SyncFlagsRequest::default(), selector);
    answered(client.sync_flags(request)).await
}

/// Opens a `flagd.sync.v1` `SyncFlags` stream with `selector` in the request's body, as a
/// provider that sends no header does.
pub async fn open_in_body(client: &mut Client, selector: &str) -> Opened<v1::SyncFlagsResponse> {
    let selector = selector.to_owned();
    answered(client.sync_flags(v1::SyncFlagsRequest {
        selector,
        ..Default::default()
    }))
    .await
}

/// Opens a `sync.v1` (legacy) `SyncFlags` stream with `selector` in the request's body, where
/// that protocol's clients send it.
pub async fn open_legacy(
    client: &mut LegacyClient,
    selector: &str,
) -> Opened<legacy::SyncFlagsResponse> {
    let selector = selector.to_owned();
    answered(client.sync_flags(legacy::SyncFlagsRequest {
        selector,
        ..Default::default()
    }))
    .await
}

/// What a `SyncFlags` call opened; panics when the proxy does not answer within
/// [`EVENT_TIMEOUT`].
async fn answered<T>(
    call: impl Future<Output = Result<tonic::Response<Streaming<T>>, Status>>,
) -> Opened<T> {
    tokio::time::timeout(EVENT_TIMEOUT, call)
        .await
        .expect("the proxy answers SyncFlags")
        .map(tonic::Response::into_inner)
}

/// The next message of a stream (of either protocol), or the status that ended it. Panics when
/// nothing arrives within [`EVENT_TIMEOUT`] or the stream ends with OK, which the proxy never
/// does.
pub async fn next_message<T>(stream: &mut Streaming<T>) -> Result<T, Status> {
    match tokio::time::timeout(EVENT_TIMEOUT, stream.message())
        .await
        .expect("a message (or the end of the stream) arrives in time")
    {
        Ok(Some(message)) => Ok(message),
        Ok(None) => panic!("the stream ended with OK"),
        Err(status) => Err(status),
    }
}

/// The next message of a stream that must stay healthy.
pub async fn next<T>(stream: &mut Streaming<T>) -> T {
    next_message(stream)
        .await
        .expect("the stream stays healthy")
}

/// The default variant of `flag` in a flag configuration (the JSON a sync message carries).
pub fn default_variant(flag_configuration: &str, flag: &str) -> String {
    let doc: Value = serde_json::from_str(flag_configuration).expect("the configuration is JSON");
    doc["flags"][flag]["defaultVariant"]
        .as_str()
        .unwrap_or_else(|| panic!("no string defaultVariant of {flag} in {flag_configuration}"))
        .to_owned()
}

/// Asserts that `status` has `code` and a message containing `needle`.
#[track_caller]
pub fn assert_status(status: &Status, code: tonic::Code, needle: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(needle),
        "{needle:?} is not in the message of {status:?}"
    );
}
