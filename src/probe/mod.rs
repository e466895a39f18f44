//! `kvbust probe --upstream URL [--model M]`: tells whether an upstream's prefix cache is on and
//! reported. Reads `/v1/models`, sends one ~2k-token chat prompt twice and a third prompt that
//! shares only its first half (non-streaming, `max_tokens` 1, temperature 0), and reads
//! `usage.prompt_tokens_details.cached_tokens` from each answer; on a cache that reports, sends
//! a fresh prompt under two `cache_salt`s to tell whether salts isolate (honoured, ignored or
//! refused: what `cache_bust.method = "salt"` relies on). [`verdict`] holds the pure part:
//! prompts, inference, verdicts, report. Owns these requests over the proxy's own upstream
//! client; never sends anything else, and never runs inside `kvbust serve`.

pub mod verdict;

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Limited};

use crate::body::full_body;
use crate::config::{UpstreamConfig, UpstreamUrl};
use crate::error::error_chain;
use crate::upstream::client::{build_client, tls_config, Upstream, UpstreamClient};
pub use verdict::{Findings, Observation, SaltSupport, Verdict};

/// Largest answer read (a model list or one chat completion).
const MAX_ANSWER: usize = 8 << 20;

/// What to probe.
#[derive(Debug, Clone)]
pub struct Options {
    /// The model server's root, as `--upstream` gave it.
    pub upstream: String,
    /// The model to ask; `None`: the first one `/v1/models` lists.
    pub model: Option<String>,
    /// Longest one request may take (connect, answer and its body).
    pub timeout: Duration,
    /// Opens the prompts so that no earlier run's cache entries are hit.
    pub nonce: u64,
}

/// Why a probe gave no verdict.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The user's mistake: a bad `--upstream`, or a `--model` the server does not serve (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The upstream could not be reached or did not answer as an OpenAI-style server (exit 1).
    #[error("{0}")]
    Failed(String),
}

/// Runs the probe: the four requests, in order. The verdict is in the findings.
pub async fn run(opts: &Options) -> Result<Findings, ProbeError> {
    let url = UpstreamUrl::parse(&opts.upstream).map_err(|e| {
        ProbeError::Usage(format!(
            "--upstream: {e} (give the server's root, e.g. http://127.0.0.1:8000)"
        ))
    })?;
    // The `/v1` trap `serve` refuses: the probe sends `/v1/models` itself, so a base URL
    // ending in `/v1` would ask for `/v1/v1/models` and read the 404 as a dead server.
    url.check_base_path().map_err(|e| {
        ProbeError::Usage(format!(
            "--upstream: {}",
            e.message.replace("upstream.url is", "--upstream is")
        ))
    })?;
    let cfg = UpstreamConfig {
        url: Some(opts.upstream.clone()),
        ..UpstreamConfig::default()
    };
    let fail = |e: &(dyn std::error::Error + 'static)| {
        ProbeError::Failed(format!("--upstream: {}", error_chain(e)))
    };
    let upstream = Upstream::from_url(&url).map_err(|e| fail(&e))?;
    let tls = std::sync::Arc::new(tls_config(&cfg).map_err(|e| fail(&e))?);
    let client = Prober {
        client: build_client(&cfg, tls, &upstream),
        upstream,
        timeout: opts.timeout,
    };

    let models = client.models().await?;
    let model = match &opts.model {
        Some(m) if models.contains(m) => m.clone(),
        Some(m) => {
            return Err(ProbeError::Usage(format!(
                "--model {m}: {} does not serve it; it serves: {} (pass one of those, or leave \
                 --model out for the first)",
                client.upstream.display,
                models.join(", ")
            )))
        }
        None => models.first().cloned().ok_or_else(|| {
            ProbeError::Failed(format!(
                "GET {}/v1/models lists no model",
                client.upstream.display
            ))
        })?,
    };
    let p = verdict::prompts(opts.nonce);
    let mut observations = [Observation {
        prompt_tokens: 0,
        cached: None,
        cache_n: None,
    }; 3];
    for (slot, prompt) in observations.iter_mut().zip([&p.first, &p.first, &p.third]) {
        *slot = client.chat(&model, prompt).await?;
    }
    // Salts are tried only on a cache that reports what it reused: else nothing tells them
    // apart. Their prompt is a fresh one (another nonce).
    let salt = if Verdict::of(&observations).is_success() {
        let fresh = verdict::prompts(opts.nonce.wrapping_add(1));
        client
            .salt_support(&model, &fresh.first, opts.nonce)
            .await?
    } else {
        SaltSupport::Unknown
    };
    Ok(Findings {
        upstream: client.upstream.display.clone(),
        models,
        model,
        observations,
        salt,
    })
}

struct Prober {
    client: UpstreamClient,
    upstream: Upstream,
    timeout: Duration,
}

impl Prober {
    /// The ids `/v1/models` lists, in its order.
    async fn models(&self) -> Result<Vec<String>, ProbeError> {
        let (what, body) = self
            .exchange(Method::GET, crate::api::MODELS_PATH, None)
            .await?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| ProbeError::Failed(format!("{what}: the answer is not JSON ({e})")))?;
        let ids: Option<Vec<String>> = v.get("data").and_then(|d| d.as_array()).map(|d| {
            d.iter()
                .filter_map(|m| m.get("id")?.as_str().map(str::to_owned))
                .collect()
        });
        ids.ok_or_else(|| {
            ProbeError::Failed(format!(
                "{what}: the answer has no \"data\" list of models (is --upstream an \
                 OpenAI-compatible server's root?)"
            ))
        })
    }

    /// One non-streaming chat completion of `prompt`, one output token, greedy.
    async fn chat(&self, model: &str, prompt: &str) -> Result<Observation, ProbeError> {
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 1,
            "temperature": 0,
            "stream": false,
        });
        let (what, answer) = self
            .exchange(
                Method::POST,
                crate::api::Shape::Chat.path(),
                Some(Bytes::from(body.to_string())),
            )
            .await?;
        Observation::from_response(&answer).map_err(|e| ProbeError::Failed(format!("{what}: {e}")))
    }

    /// Sends one request; `Ok` with a 2xx answer's body, else a failure naming the request.
    async fn exchange(
        &self,
        method: Method,
        path: &'static str,
        body: Option<Bytes>,
    ) -> Result<(String, Bytes), ProbeError> {
        let (what, status, bytes) = self.answer(method, path, body).await?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
            return Err(ProbeError::Failed(format!(
                "{what}: answered {status}: {text}"
            )));
        }
        Ok((what, bytes))
    }

    /// Whether the upstream honours `cache_salt`: a fresh prompt under one salt, then under
    /// another. A server that isolates salts does not serve the second from the first's blocks.
    async fn salt_support(
        &self,
        model: &str,
        prompt: &str,
        nonce: u64,
    ) -> Result<SaltSupport, ProbeError> {
        let mut seen = Vec::with_capacity(2);
        for salt in ["a", "b"] {
            let body = serde_json::json!({
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 1,
                "temperature": 0,
                "stream": false,
                "cache_salt": format!("kvbust-probe-{salt}-{nonce}"),
            });
            let path = crate::api::Shape::Chat.path();
            let (what, status, answer) = self
                .answer(Method::POST, path, Some(Bytes::from(body.to_string())))
                .await?;
            if status.is_client_error() {
                return Ok(SaltSupport::refused(status.as_u16(), &answer));
            }
            if !status.is_success() {
                let text = String::from_utf8_lossy(&answer[..answer.len().min(300)]).into_owned();
                return Err(ProbeError::Failed(format!(
                    "{what}: answered {status}: {text}"
                )));
            }
            let o = Observation::from_response(&answer)
                .map_err(|e| ProbeError::Failed(format!("{what}: {e}")))?;
            seen.push(o);
        }
        Ok(SaltSupport::of(&seen[0], &seen[1]))
    }

    /// Sends one request: what it was, the status and the answer's body (any status).
    async fn answer(
        &self,
        method: Method,
        path: &'static str,
        body: Option<Bytes>,
    ) -> Result<(String, StatusCode, Bytes), ProbeError> {
        let what = format!("{method} {}{path}", self.upstream.display);
        let fail = |why: String| ProbeError::Failed(format!("{what}: {why}"));
        let uri = self
            .upstream
            .join(Some(&http::uri::PathAndQuery::from_static(path)))
            .map_err(|e| fail(e.to_string()))?;
        let mut req = Request::new(full_body(body.clone().unwrap_or_default()));
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        let h = req.headers_mut();
        h.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("kvbust-probe/", env!("CARGO_PKG_VERSION"))),
        );
        if body.is_some() {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| {
                format!(
                    "{} (is the server up, and is --upstream its root?)",
                    error_chain(&e)
                )
            })?;
            let status = resp.status();
            let bytes = Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            Ok::<(StatusCode, Bytes), String>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| {
                fail(format!(
                    "no answer within {} (--timeout)",
                    humantime::format_duration(self.timeout)
                ))
            })?
            .map_err(fail)?;
        Ok((what, status, bytes))
    }
}
