//! The admin port's runs: `POST /runs` and `POST /report/reset` (close the current run, open
//! one), `GET /runs`, `GET /runs/NAME`, `POST /runs/NAME/close`, `POST /upstream/reset-cache`.
//! Owns the calls' shapes; never counts (the cache model's runs do) and never writes files
//! itself (`run_store` does).

use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;

use super::{check_token, error, json, report_json, AdminBody};
use crate::cache_model::RunSpec;
use crate::conn::BodyTimeout;
use crate::runtime::SharedState;

/// `POST /runs`' body; every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenBody {
    name: Option<String>,
    warmup_requests: Option<u64>,
    reset_upstream_cache: Option<bool>,
    /// The client command, when `kvbust run` opens the run.
    command: Option<Vec<String>>,
}

/// Closes the current run and opens a new one (named by the body of `POST /runs`; generated
/// for `POST /report/reset`); answers with the closed run's report once its requests are
/// counted (within `run.close_wait`), the new run's name in `x-kvbust-run`.
pub(super) async fn open(
    req: Request<Incoming>,
    rt: &SharedState,
    body: bool,
) -> Response<AdminBody> {
    if let Some(resp) = check_token(&req, rt.config.admin.token.as_deref()) {
        return resp;
    }
    let spec = if body {
        match read_body(req, rt).await {
            Ok(b) => b,
            Err(resp) => return resp,
        }
    } else {
        OpenBody::default()
    };
    let reset = spec
        .reset_upstream_cache
        .unwrap_or(rt.config.run.reset_upstream_cache);
    let spec = RunSpec {
        name: spec.name,
        warmup_requests: spec.warmup_requests,
        command: spec.command,
    };
    let (closed, opened) = match rt.cache_model.runs().open(spec) {
        Ok(pair) => pair,
        Err(msg) => return error(StatusCode::CONFLICT, &msg, "run_conflict"),
    };
    tracing::info!(closed = closed.name, opened = opened.name, "run opened");
    if reset {
        if let Err(e) = crate::run_store::reset_upstream(rt, "run_open").await {
            let msg = format!(
                "run {} opened, but the upstream's cache was not reset: {e}",
                opened.name
            );
            tracing::error!("{msg}");
            return error(StatusCode::BAD_GATEWAY, &msg, "cache_reset_failed");
        }
    }
    let report = crate::run_store::finish(rt, &closed).await;
    let mut resp = report_json(&report);
    if let Ok(v) = HeaderValue::from_str(&opened.name) {
        resp.headers_mut().insert("x-kvbust-run", v);
    }
    resp
}

async fn read_body(
    req: Request<Incoming>,
    rt: &SharedState,
) -> Result<OpenBody, Response<AdminBody>> {
    let body = BodyTimeout::new(req.into_body(), rt.config.listen.body_deadlines());
    let bytes = match Limited::new(body, 64 << 10).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "POST /runs: the body must be JSON of at most 64 KiB",
                "invalid_body",
            ))
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(OpenBody::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            &format!(
                "POST /runs: {e}; the body is {{\"name\": …, \"warmup_requests\": N, \
                 \"reset_upstream_cache\": bool}}, every field optional"
            ),
            "invalid_body",
        )
    })
}

/// `GET /runs`: every run held, oldest first.
pub(super) fn list(rt: &SharedState) -> Response<AdminBody> {
    let runs = rt.cache_model.runs();
    let all: Vec<_> = runs.all().iter().map(|c| runs.summary(c)).collect();
    json(StatusCode::OK, serde_json::json!({ "runs": all }))
}

/// `GET /runs/NAME` (its report) and `POST /runs/NAME/close` (closes it, answers its final
/// report).
pub(super) async fn one(
    method: &Method,
    req: &Request<Incoming>,
    path: &str,
    rt: &SharedState,
) -> Response<AdminBody> {
    let rest = path.trim_start_matches("/runs/");
    let (name, close) = match rest.strip_suffix("/close") {
        Some(n) => (n, true),
        None => (rest, false),
    };
    let runs = rt.cache_model.runs();
    match (method, close) {
        (&Method::GET, false) => match runs.get(name) {
            Some(cell) => report_json(&rt.cache_model.report_of(&cell)),
            None => no_run(name),
        },
        (&Method::POST, true) => {
            if let Some(resp) = check_token(req, rt.config.admin.token.as_deref()) {
                return resp;
            }
            match runs.close(name) {
                Some(cell) => report_json(&crate::run_store::finish(rt, &cell).await),
                None if runs.get(name).is_some() => error(
                    StatusCode::CONFLICT,
                    &format!("run {name} is already closed (GET /runs/{name} has its report)"),
                    "run_closed",
                ),
                None => no_run(name),
            }
        }
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{method} is not allowed on {path}: GET /runs/NAME, POST /runs/NAME/close"),
            "method_not_allowed",
        ),
    }
}

fn no_run(name: &str) -> Response<AdminBody> {
    error(
        StatusCode::NOT_FOUND,
        &format!(
            "no run named {}; GET /runs lists the runs held",
            crate::error::excerpt(name.as_bytes())
        ),
        "no_such_run",
    )
}

/// `POST /upstream/reset-cache`: empties the upstream's prefix cache and the model's index.
pub(super) async fn reset_cache(req: &Request<Incoming>, rt: &SharedState) -> Response<AdminBody> {
    if let Some(resp) = check_token(req, rt.config.admin.token.as_deref()) {
        return resp;
    }
    match crate::run_store::reset_upstream(rt, "admin").await {
        Ok(path) => json(StatusCode::OK, serde_json::json!({ "reset": path })),
        Err(e) => error(StatusCode::BAD_GATEWAY, &e, "cache_reset_failed"),
    }
}
