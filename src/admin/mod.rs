//! The admin port: `/healthz`, `/readyz`, `/metrics`, `GET|PUT /phase`, `GET /config`,
//! `GET /report`, and the runs ([`runs`]: `POST /report/reset`, `/runs`, `/runs/NAME`,
//! `POST /upstream/reset-cache`).
//! Never proxies traffic; mutating calls need the bearer token when one is configured.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::cachebust::Phase;
use crate::conn::{Activity, Admit, BodyTimeout, ConnTable, TimedIo};
use crate::error::{error_body, json_response};
use crate::runtime::SharedState;

mod runs;

type AdminBody = Full<Bytes>;

/// Serves the admin port until `shutdown` resolves. Connections are held to the same deadlines
/// as the data port's (`listen.header_read_timeout`, `listen.idle_timeout`): a client that opens
/// the port and sends nothing must not hold a socket forever. At most `cap` connections
/// (`admin.max_connections`) are open at once, shed as on the data port: past it the oldest with
/// no request in flight is closed for the new one, or the new one when every one is busy, so
/// a flood of silent connections cannot take the descriptors the data port, the upstream pool
/// and the health probe need.
pub async fn serve(
    listener: TcpListener,
    rt: Arc<SharedState>,
    cap: usize,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None); // `TimedIo` does it, as on the data port
    let timeouts = rt.config.listen.conn_timeouts();
    let table = ConnTable::new(cap);
    let mut warned = false;
    crate::conn::accept_loop(&listener, "admin", shutdown, |stream, peer| {
        let admit = table.admit();
        if admit != Admit::Room {
            rt.metrics.admin_shed.inc();
            let what = match admit {
                Admit::Full => "every connection is busy: closing the new one",
                _ => "closed the oldest connection with no request in flight",
            };
            if warned {
                tracing::debug!(%peer, "admin.max_connections reached; {what}");
            } else {
                warned = true;
                tracing::warn!(%peer, "admin.max_connections reached; {what} (counted in kvbust_admin_shed_total; logged once)");
            }
            if admit == Admit::Full {
                return false;
            }
        }
        let activity = Arc::new(Activity::default());
        let slot = table.slot();
        let id = slot.id();
        let io = TimedIo::new(stream, activity.clone(), timeouts);
        let rt = rt.clone();
        let requests = activity.clone();
        let service = service_fn(move |req| {
            let rt = rt.clone();
            // Admin responses are small and whole: the request ends with the handler.
            let guard = requests.begin();
            async move {
                let resp = handle(req, &rt).await;
                drop(guard);
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        let conn = builder
            .serve_connection(TokioIo::new(io), service)
            .into_owned();
        let fut = graceful.watch(conn);
        table.insert_spawned(id, activity, || {
            tokio::spawn(async move {
                let _slot = slot;
                let _ = fut.await;
            })
            .abort_handle()
        });
        admit == Admit::Shed
    })
    .await;
    // Admin calls are short; a second is plenty.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), graceful.shutdown()).await;
}

async fn handle(req: Request<Incoming>, rt: &SharedState) -> Response<AdminBody> {
    let path = req.uri().path().to_string();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        // 503 while draining and while the upstream is not up (the body says which).
        (&Method::GET, "/readyz") => match rt.readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n"),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        (&Method::GET, "/metrics") => typed(
            {
                rt.count_connections();
                let used = rt.bodies.used();
                rt.metrics
                    .buffered_bytes
                    .set(i64::try_from(used).unwrap_or(i64::MAX));
                rt.metrics.render()
            },
            "text/plain; version=0.0.4; charset=utf-8",
        ),
        (&Method::GET, "/phase") => json(
            StatusCode::OK,
            serde_json::json!({ "phase": rt.default_phase().as_str() }),
        ),
        (&Method::PUT, "/phase") => put_phase(req, rt).await,
        (&Method::GET, "/config") => typed(rt.config.redacted().to_toml(), "application/toml"),
        (&Method::GET, "/report") => match report_wait(req.uri().query()) {
            Ok(wait) => {
                let current = rt.cache_model.runs().current();
                if !wait.is_zero() && !current.settle(wait).await {
                    tracing::info!("GET /report: requests were still open after {wait:?}");
                }
                report_json(&rt.cache_model.report_of(&current))
            }
            Err(msg) => error(StatusCode::BAD_REQUEST, &msg, "invalid_query"),
        },
        (&Method::POST, "/report/reset") => runs::open(req, rt, false).await,
        (&Method::POST, "/runs") => runs::open(req, rt, true).await,
        (&Method::GET, "/runs") => runs::list(rt),
        (&Method::POST, "/upstream/reset-cache") => runs::reset_cache(&req, rt).await,
        (method, p) if p.starts_with("/runs/") => runs::one(method, &req, p, rt).await,
        (_, "/healthz" | "/readyz" | "/metrics" | "/phase" | "/config" | "/report" | "/report/reset" | "/runs" | "/upstream/reset-cache") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{} is not allowed on {path}", req.method()),
            "method_not_allowed",
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            &format!("no admin endpoint {path}; try /healthz, /readyz, /metrics, /phase, /config, /report, /runs"),
            "not_found",
        ),
    }
}

/// `PUT /phase`: sets the default phase (token-checked) and answers with the old and new one.
async fn put_phase(req: Request<Incoming>, rt: &SharedState) -> Response<AdminBody> {
    if let Some(resp) = check_token(&req, rt.config.admin.token.as_deref()) {
        return resp;
    }
    // The body is read under the data port's deadlines: a stalled body must not hold the
    // connection (its request is in flight, so the idle deadline does not apply).
    let body = BodyTimeout::new(req.into_body(), rt.config.listen.body_deadlines());
    let body = match Limited::new(body, 1024).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            if let Some(t) = crate::conn::body_timeout_in(e.as_ref()) {
                let e = crate::error::ProxyError::from(t);
                tracing::info!("admin PUT /phase: {e}");
                return error(e.status(), &e.to_string(), e.code());
            }
            return error(
                StatusCode::BAD_REQUEST,
                "body must be `warmup` or `profiling` (at most 1 KiB)",
                "invalid_phase",
            );
        }
    };
    let text_body = String::from_utf8_lossy(&body);
    // Accept a bare word or a JSON string / {"phase": ...} for convenience.
    let word = text_body.trim().trim_matches('"').to_string();
    let word = serde_json::from_str::<serde_json::Value>(text_body.trim())
        .ok()
        .and_then(|v| v.get("phase").and_then(|p| p.as_str()).map(str::to_string))
        .unwrap_or(word);
    match word.parse::<Phase>() {
        Ok(p) => {
            let old = rt.set_default_phase(p);
            tracing::info!(
                old = old.as_str(),
                new = p.as_str(),
                "default phase changed"
            );
            json(
                StatusCode::OK,
                serde_json::json!({ "old": old.as_str(), "new": p.as_str() }),
            )
        }
        Err(e) => error(
            StatusCode::BAD_REQUEST,
            &format!("PUT /phase: {e}"),
            "invalid_phase",
        ),
    }
}

/// `?wait=DURATION` (at most a minute): how long `GET /report` waits for the requests still
/// open (in flight, or queued for the cache model) to be counted first.
fn report_wait(query: Option<&str>) -> Result<std::time::Duration, String> {
    let Some(v) = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("wait="))
    else {
        return Ok(std::time::Duration::ZERO);
    };
    match humantime::parse_duration(v) {
        Ok(d) if d <= std::time::Duration::from_secs(60) => Ok(d),
        _ => Err(format!(
            "wait={} must be a duration of at most 60s, e.g. wait=5s",
            crate::error::excerpt(v.as_bytes())
        )),
    }
}

/// The report as JSON (pretty: people read it with curl as often as programs do).
fn report_json(r: &crate::report::Report) -> Response<AdminBody> {
    match serde_json::to_vec_pretty(r) {
        Ok(body) => json_response(StatusCode::OK, Bytes::from(body)),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot write the report: {e}"),
            "internal",
        ),
    }
}

/// `None` when the call may go ahead: no `admin.token` is configured, or `req` carries it.
fn check_token(req: &Request<Incoming>, token: Option<&str>) -> Option<Response<AdminBody>> {
    let want = token?;
    let got = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(got.as_bytes(), want.as_bytes()) {
        None
    } else {
        Some(error(
            StatusCode::UNAUTHORIZED,
            "this call needs `Authorization: Bearer <admin.token>`",
            "unauthorized",
        ))
    }
}

/// Compares without an early exit so timing does not reveal the token's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<AdminBody> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

/// A 200 with `body` as `content_type`.
fn typed(body: impl Into<Bytes>, content_type: &'static str) -> Response<AdminBody> {
    let mut r = text(StatusCode::OK, body);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json(status: StatusCode, v: serde_json::Value) -> Response<AdminBody> {
    json_response(status, Bytes::from(v.to_string()))
}

fn error(status: StatusCode, message: &str, code: &str) -> Response<AdminBody> {
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    json_response(status, error_body(message, kind, code))
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn token_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
