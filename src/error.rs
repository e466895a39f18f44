//! The one request-path error type: who is at fault (client, upstream, internal), the status it
//! maps to and its OpenAI-shaped JSON body. Never decides policy; it only classifies and renders.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde::Serialize;

/// Who caused a failure; the `source` label of `kvbust_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Client,
    Upstream,
    Internal,
}

impl Fault {
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Client => "client",
            Fault::Upstream => "upstream",
            Fault::Internal => "internal",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("request body is larger than limits.max_body ({limit} bytes); send a smaller body or raise limits.max_body")]
    BodyTooLarge { limit: u64 },
    #[error("could not read the request body: {0}")]
    ClientBody(String),
    /// The client closed (or reset) its connection before its request body was complete.
    #[error("the client went away before its request body was complete: {0}")]
    ClientDisconnect(String),
    #[error("{method} is not allowed: kvbust is a reverse proxy, not a tunnel")]
    MethodNotAllowed { method: String },
    #[error("the client sent no request body bytes for {} (listen.body_read_timeout); send the body without pauses", humantime::format_duration(*after))]
    ClientBodyTimeout { after: Duration },
    #[error("the client did not send the whole request body within {} (listen.body_total_timeout); send it faster, or raise listen.body_total_timeout", humantime::format_duration(*after))]
    ClientBodyTotalTimeout { after: Duration },
    #[error("{message}")]
    BadRequest { code: &'static str, message: String },
    #[error("upstream {upstream} is unreachable: {detail}")]
    UpstreamConnect { upstream: String, detail: String },
    #[error("upstream did not {stage} within {}", humantime::format_duration(*after))]
    UpstreamTimeout {
        stage: &'static str,
        after: Duration,
    },
    #[error("upstream failed mid-request: {0}")]
    UpstreamBroken(String),
    #[error("kvbust is shutting down; retry against another replica")]
    Draining,
    /// A bounded queue is full: 503 with `retry-after`.
    #[error("{message}")]
    Overloaded {
        code: &'static str,
        message: String,
        retry_after_s: u64,
    },
    #[error("internal error: {0}")]
    Internal(String),
    /// The request came back to the kvbust that forwarded it (its own `via` entry).
    #[error("proxy loop: this request already passed through this kvbust ({via}); upstream.url must name the model server, not kvbust itself")]
    Loop { via: String },
}

impl ProxyError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ProxyError::BadRequest {
            code,
            message: message.into(),
        }
    }

    pub fn fault(&self) -> Fault {
        match self {
            ProxyError::BodyTooLarge { .. }
            | ProxyError::ClientBody(_)
            | ProxyError::ClientDisconnect(_)
            | ProxyError::MethodNotAllowed { .. }
            | ProxyError::ClientBodyTimeout { .. }
            | ProxyError::ClientBodyTotalTimeout { .. }
            | ProxyError::BadRequest { .. } => Fault::Client,
            ProxyError::UpstreamConnect { .. }
            | ProxyError::UpstreamTimeout { .. }
            | ProxyError::UpstreamBroken(_) => Fault::Upstream,
            ProxyError::Draining
            | ProxyError::Overloaded { .. }
            | ProxyError::Internal(_)
            | ProxyError::Loop { .. } => Fault::Internal,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::ClientBodyTimeout { .. } | ProxyError::ClientBodyTotalTimeout { .. } => {
                StatusCode::REQUEST_TIMEOUT
            }
            ProxyError::ClientBody(_)
            | ProxyError::ClientDisconnect(_)
            | ProxyError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ProxyError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::UpstreamConnect { .. } | ProxyError::UpstreamBroken(_) => {
                StatusCode::BAD_GATEWAY
            }
            ProxyError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Draining | ProxyError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::Loop { .. } => StatusCode::LOOP_DETECTED,
        }
    }

    /// Stable machine-readable code, the `code` label of `kvbust_errors_total`.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::BodyTooLarge { .. } => "body_too_large",
            ProxyError::ClientBody(_) => "client_body_error",
            ProxyError::ClientDisconnect(_) => "client_disconnect",
            ProxyError::MethodNotAllowed { .. } => "method_not_allowed",
            ProxyError::ClientBodyTimeout { .. } => "request_body_timeout",
            ProxyError::ClientBodyTotalTimeout { .. } => "request_body_total_timeout",
            ProxyError::BadRequest { code, .. } => code,
            ProxyError::UpstreamConnect { .. } => "upstream_unreachable",
            ProxyError::UpstreamTimeout { .. } => "upstream_timeout",
            ProxyError::UpstreamBroken(_) => "upstream_broken",
            ProxyError::Draining => "draining",
            ProxyError::Overloaded { code, .. } => code,
            ProxyError::Internal(_) => "internal_error",
            ProxyError::Loop { .. } => "proxy_loop",
        }
    }

    fn openai_type(&self) -> &'static str {
        match self.fault() {
            Fault::Client => "invalid_request_error",
            Fault::Upstream => "upstream_error",
            Fault::Internal => "server_error",
        }
    }

    /// The OpenAI-shaped JSON error body.
    pub fn body(&self) -> Bytes {
        error_body(&self.to_string(), self.openai_type(), self.code())
    }

    pub fn into_response<B: From<Bytes>>(&self) -> Response<B> {
        let mut resp = json_response(self.status(), self.body());
        if let ProxyError::Overloaded { retry_after_s, .. } = self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_s));
        }
        if let ProxyError::MethodNotAllowed { .. } = self {
            // RFC 9110 §15.5.6: a 405 lists the methods the target takes.
            resp.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
            );
        }
        resp
    }
}

/// `err` and every error it wraps, outermost first.
pub fn causes<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |e| e.source())
}

/// `err` and its causes, `: `-joined; a cause whose text its parent already repeats is left
/// out (hyper keeps the useful part in the sources, thiserror often repeats it).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    for e in causes(err).skip(1) {
        let m = e.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
    }
    s
}

/// The most bytes of client-supplied text quoted in an error or a log line.
pub const MAX_EXCERPT: usize = 200;

/// Client text fit to quote in an error or a log line: at most [`MAX_EXCERPT`] bytes, control
/// characters (newlines included) escaped, `…` when cut.
pub fn excerpt(text: &[u8]) -> String {
    let cut = text.len() > MAX_EXCERPT;
    let shown = String::from_utf8_lossy(&text[..text.len().min(MAX_EXCERPT)]);
    let mut out = String::with_capacity(shown.len() + 8);
    for c in shown.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if cut {
        out.push('…');
    }
    out
}

/// `{"error": {"message", "type", "code"}}` as compact JSON.
pub fn error_body(message: &str, kind: &str, code: &str) -> Bytes {
    #[derive(Serialize)]
    struct Inner<'a> {
        message: &'a str,
        #[serde(rename = "type")]
        kind: &'a str,
        code: &'a str,
    }
    #[derive(Serialize)]
    struct Outer<'a> {
        error: Inner<'a>,
    }
    // Serializing plain strings into a Vec cannot fail.
    Bytes::from(
        serde_json::to_vec(&Outer {
            error: Inner {
                message,
                kind,
                code,
            },
        })
        .unwrap_or_default(),
    )
}

pub fn json_response<B: From<Bytes>>(status: StatusCode, body: Bytes) -> Response<B> {
    let mut resp = Response::new(B::from(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_status_fault_and_openai_shape() {
        let cases = [
            (
                ProxyError::BodyTooLarge { limit: 10 },
                413,
                Fault::Client,
                "body_too_large",
            ),
            (
                ProxyError::bad_request("invalid_phase", "x"),
                400,
                Fault::Client,
                "invalid_phase",
            ),
            (
                ProxyError::UpstreamConnect {
                    upstream: "http://x".into(),
                    detail: "refused".into(),
                },
                502,
                Fault::Upstream,
                "upstream_unreachable",
            ),
            (
                ProxyError::UpstreamTimeout {
                    stage: "send response headers",
                    after: Duration::from_secs(2),
                },
                504,
                Fault::Upstream,
                "upstream_timeout",
            ),
            (
                ProxyError::UpstreamBroken("reset".into()),
                502,
                Fault::Upstream,
                "upstream_broken",
            ),
            (ProxyError::Draining, 503, Fault::Internal, "draining"),
            (
                ProxyError::ClientBodyTimeout {
                    after: Duration::from_secs(60),
                },
                408,
                Fault::Client,
                "request_body_timeout",
            ),
            (
                ProxyError::ClientBodyTotalTimeout {
                    after: Duration::from_secs(300),
                },
                408,
                Fault::Client,
                "request_body_total_timeout",
            ),
            (
                ProxyError::Overloaded {
                    code: "placeholder_queue_full",
                    message: "full".into(),
                    retry_after_s: 1,
                },
                503,
                Fault::Internal,
                "placeholder_queue_full",
            ),
        ];
        for (err, status, fault, code) in cases {
            assert_eq!(err.status().as_u16(), status, "{err}");
            assert_eq!(err.fault(), fault);
            let v: serde_json::Value = serde_json::from_slice(&err.body()).unwrap();
            assert_eq!(v["error"]["code"], code);
            assert_eq!(v["error"]["message"], err.to_string());
            assert!(v["error"]["type"].is_string());
        }
    }

    #[test]
    fn timeout_message_reads_well() {
        let e = ProxyError::UpstreamTimeout {
            stage: "send response headers",
            after: Duration::from_millis(1500),
        };
        assert_eq!(
            e.to_string(),
            "upstream did not send response headers within 1s 500ms"
        );
    }
}
