//! What tonic learns of an accepted connection: the transport's [`ConnectionInfo`] (address,
//! client certificates, stream activity), handed to every request as its extension.
//!
//! The transport (`crate::net`) knows nothing of the gRPC server above it, so tonic's
//! [`Connected`] is implemented here, on the transport's own [`Connection`] (a trait of another
//! crate on a type of this one may be implemented anywhere in it): no wrapper type sits between
//! the connection and the server, and the connection reads no differently.
use tonic::transport::server::Connected;

use crate::net::connection::Connection;
use crate::net::info::ConnectionInfo;

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info()
    }
}
