//! The start-time model check of `kvbust serve`: once the upstream answers its health probe,
//! one `GET /v1/models`, and a warning for each model the synthetic dataset sends that the
//! upstream does not serve (the requests naming it would all fail). Logs only; never changes a
//! request, never holds readiness back and never retries past the one answer.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{header, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Limited};

use crate::body::full_body;
use crate::runtime::SharedState;
use crate::upstream::client::{Upstream, UpstreamClient};

/// At most this much of the `/v1/models` answer is read.
const MAX_MODELS_BODY: usize = 1 << 20;

/// The ids of a `/v1/models` answer (`{"data": [{"id": …}, …]}`); `None` when it has no such list.
pub fn served_ids(body: &[u8]) -> Option<Vec<String>> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let data = v.get("data")?.as_array()?;
    Some(
        data.iter()
            .filter_map(|m| m.get("id")?.as_str().map(str::to_owned))
            .collect(),
    )
}

/// The models of `wanted` that `served` does not list.
pub fn unserved<'a>(wanted: &'a [String], served: &[String]) -> Vec<&'a str> {
    wanted
        .iter()
        .filter(|w| !served.contains(w))
        .map(String::as_str)
        .collect()
}

/// Waits for the upstream to be up (at once when no health probe runs), asks it for its models
/// and logs a warning per model of `wanted` it does not serve; returns those models (empty
/// when the check could not be made, which is logged too).
pub async fn warn_unserved(
    rt: Arc<SharedState>,
    upstream: Upstream,
    client: UpstreamClient,
    wanted: Vec<String>,
) -> Vec<String> {
    if wanted.is_empty() {
        return Vec::new();
    }
    let mut status = rt.upstream_health.subscribe();
    loop {
        let s = status.borrow_and_update().clone();
        if s.is_up() || s == crate::health::UpstreamStatus::Unchecked {
            break;
        }
        if status.changed().await.is_err() {
            return Vec::new();
        }
    }
    let what = format!("GET {}/v1/models", upstream.display);
    let served = match fetch(&upstream, &client).await {
        Ok(body) => served_ids(&body),
        Err(e) => {
            tracing::warn!("{what}: {e}; cannot check that the upstream serves {wanted:?}");
            return Vec::new();
        }
    };
    let Some(served) = served else {
        tracing::warn!(
            "{what}: no \"data\" list of models; cannot check that it serves {wanted:?}"
        );
        return Vec::new();
    };
    let missing = unserved(&wanted, &served);
    for model in &missing {
        tracing::warn!(
            model,
            served = ?served,
            "the synthetic dataset sends model {model:?}, which the upstream does not serve (its \
             /v1/models lists {served:?}): requests naming it will fail; set \
             synth.dataset.model to the served name"
        );
    }
    missing.into_iter().map(str::to_owned).collect()
}

async fn fetch(upstream: &Upstream, client: &UpstreamClient) -> Result<Bytes, String> {
    let path = PathAndQuery::from_static(crate::api::MODELS_PATH);
    let uri = upstream.join(Some(&path)).map_err(|e| e.to_string())?;
    let mut req = Request::new(full_body(Bytes::new()));
    *req.method_mut() = Method::GET;
    *req.uri_mut() = uri;
    req.headers_mut().insert(
        header::USER_AGENT,
        HeaderValue::from_static(concat!("kvbust/", env!("CARGO_PKG_VERSION"))),
    );
    let exchange = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| crate::upstream::client::with_tls_hint(&e))?;
        if !resp.status().is_success() {
            return Err(format!("answered {}", resp.status()));
        }
        Limited::new(resp.into_body(), MAX_MODELS_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| format!("reading the answer: {e}"))
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| "no answer within 30s".to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_read_and_the_unserved_ones_named() {
        let body = br#"{"object":"list","data":[{"id":"qwen"},{"id":"llama","object":"model"}]}"#;
        let served = served_ids(body).unwrap();
        assert_eq!(served, ["qwen", "llama"]);
        let wanted = vec!["llama".to_string(), "claude".to_string()];
        assert_eq!(unserved(&wanted, &served), ["claude"]);
        assert_eq!(served_ids(b"{\"models\": []}"), None);
        assert_eq!(served_ids(b"not json"), None);
    }
}
