//! The body type on both sides of the proxy (client ↔ kvbust ↔ upstream) and its error type,
//! shared by the request pipeline, the upstream transport and the health probe. Owns only the
//! type names and the one-buffer constructor; never reads, buffers or changes a body.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type on both sides of the proxy.
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full_body(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}
