//! Asks the upstream to empty its prefix cache: vLLM's `POST /reset_prefix_cache`, else
//! SGLang's `POST /flush_cache` (the built-in mock answers either). Owns that one call; never
//! touches kvbust's own state (the caller tells the cache model).

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Limited};

use super::client::{Upstream, UpstreamClient};
use crate::body::full_body;

/// The engines' reset routes, in the order tried.
pub const RESET_PATHS: [&str; 2] = ["/reset_prefix_cache", "/flush_cache"];

/// Whether a forwarded request with `method` and `path` asks the upstream to empty its cache.
pub fn is_reset(method: &Method, path: &str) -> bool {
    method == Method::POST && RESET_PATHS.contains(&path)
}

/// Empties the upstream's prefix cache; `Ok(path)`: the route that did it. A route the server
/// does not have (404, 405) moves on to the next; any other answer is the error.
pub async fn reset_cache(
    client: &UpstreamClient,
    upstream: &Upstream,
    timeout: std::time::Duration,
) -> Result<&'static str, String> {
    let mut last = String::new();
    for path in RESET_PATHS {
        let what = format!("POST {}{path}", upstream.display);
        let uri = upstream
            .join(Some(&PathAndQuery::from_static(path)))
            .map_err(|e| format!("{what}: {e}"))?;
        let mut req = Request::new(full_body(Bytes::new()));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = uri;
        req.headers_mut().insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("kvbust/", env!("CARGO_PKG_VERSION"))),
        );
        let exchange = async {
            let resp = client.request(req).await?;
            let status = resp.status();
            let _ = Limited::new(resp.into_body(), 64 << 10).collect().await;
            Ok::<StatusCode, hyper_util::client::legacy::Error>(status)
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => return Err(format!("{what}: no answer within {timeout:?}")),
            Ok(Err(e)) => return Err(format!("{what}: {}", super::client::with_tls_hint(&e))),
            Ok(Ok(s)) if s.is_success() => return Ok(path),
            Ok(Ok(s)) if s == StatusCode::NOT_FOUND || s == StatusCode::METHOD_NOT_ALLOWED => {
                last = format!("{what} answered {s}");
            }
            Ok(Ok(s)) => return Err(format!("{what} answered {s}")),
        }
    }
    Err(format!(
        "the upstream has no cache reset route ({last}); vLLM serves POST /reset_prefix_cache, \
         SGLang POST /flush_cache"
    ))
}
