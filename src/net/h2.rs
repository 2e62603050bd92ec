//! HTTP/2 as the transport reads it on its way to the server (RFC 9113): the client preface and
//! frame headers, never more. One reader ([`FrameReader`]) walks a client's bytes as they pass,
//! without copying them; what reads a connection's frames builds on it: the preface deadline and
//! the count of the streams a client opens (`connection`, with [`arrivals`]), and on the unix
//! socket the filter that makes any `:authority` one the server accepts ([`authority`]).
pub(crate) mod arrivals;
pub(crate) mod authority;
mod frame;
mod reader;

pub(crate) use self::authority::{AuthorityFilter, FILTER_BYTES, MAX_FRAME_SIZE};
pub(crate) use self::frame::PREFACE;
pub(crate) use self::reader::FrameReader;
