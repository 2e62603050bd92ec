//! What the services can learn about the connection a request came on. A leaf: the listener
//! fills it in, authorization and the wire read it.
use std::net::SocketAddr;
use std::sync::Arc;

/// The client's address and certificate chain, as seen when the connection was accepted.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    pub remote_addr: Option<SocketAddr>,
    /// The client certificate chain, when the client presented one.
    pub peer_certificates: Option<Arc<Vec<rustls_pki_types::CertificateDer<'static>>>>,
}
