//! The upstream transport: one worker's way to the upstream behind one `send`
//! ([`transport`]), made of the pooled client for TLS and HTTP/2 upstreams ([`client`]) and the
//! plain-HTTP/1.1 connections kvbust holds itself, per client connection and per worker
//! ([`pool`]); and the header hygiene of a forwarded request ([`headers`]). Used by the request
//! pipeline (`proxy`) and the health probe. Never inspects, buffers or rewrites bodies, and
//! never decides what a request is (that is `proxy`'s pipeline).

pub mod client;
pub mod headers;
pub mod loop_guard;
pub mod pool;
pub mod reset;
pub mod transport;
