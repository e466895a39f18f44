//! `kvbust probe` as a user runs it (the binary, its output and exit code) against the built-in
//! mock (caching on and reported, block size 16), a silent upstream that sends usage without
//! `cached_tokens` (exit 1 naming both engine flags), usage errors (exit 2), an unreachable
//! upstream (exit 1), and llama.cpp when `KVBUST_REAL_UPSTREAM` names one.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kvbust::mock::{Mock, MockConfig};
use tokio::net::TcpListener;

/// Runs `kvbust probe ARGS` without the caller's KVBUST_* settings; (exit code, stdout, stderr).
async fn probe(args: &[&str]) -> (Option<i32>, String, String) {
    let mut p = tokio::process::Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") {
            p.env_remove(k);
        }
    }
    let out = p
        .arg("probe")
        .args(args)
        .output()
        .await
        .expect("kvbust runs");
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The built-in mock with its defaults (the shipped Qwen3 tokenizer and template, 16-token
/// blocks) but no pacing, on a port of its own.
pub(crate) async fn mock() -> (Stop, String) {
    let cfg = MockConfig {
        base_delay: std::time::Duration::ZERO,
        inter_token: std::time::Duration::ZERO,
        prefill_per_token: std::time::Duration::ZERO,
        ..MockConfig::default()
    };
    assert_eq!(cfg.block_size, 16, "the mock's default block size");
    let mock = tokio::task::spawn_blocking(move || Mock::from_config(cfg).unwrap())
        .await
        .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(kvbust::mock::serve(l, mock, async {
        let _ = rx.await;
    }));
    (Stop(Some(tx)), url)
}

/// Stops a test server when dropped.
pub(crate) struct Stop(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for Stop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

#[tokio::test]
async fn the_mock_reports_its_cache_and_the_probe_infers_its_block_size() {
    let (_stop, url) = mock().await;
    let (code, out, err) = probe(&["--upstream", &url]).await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("models      kvbust-mock\n"), "{out}");
    assert!(out.contains("model       kvbust-mock\n"), "{out}");
    let rows: Vec<(u64, u64)> = out
        .lines()
        .filter(|l| l.starts_with("request ") && !l.contains("(salt"))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let at = |k: &str| -> u64 {
                let i = w.iter().position(|x| *x == k).unwrap();
                w[i + 1].parse().unwrap()
            };
            (at("prompt_tokens"), at("cached_tokens"))
        })
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    let (n1, c1) = rows[0];
    assert!((1500..2600).contains(&n1), "about 2k tokens: {out}");
    assert_eq!(c1, 0, "the first request is cold: {out}");
    assert_eq!(rows[1].0, n1, "the same prompt: {out}");
    // vLLM's rule, which the mock follows: all full blocks but the one holding the last token.
    assert_eq!(rows[1].1, (n1 - 1) / 16 * 16, "{out}");
    assert!(
        rows[2].1 > 0 && rows[2].1 < n1 * 6 / 10,
        "only the first half: {out}"
    );
    assert_eq!(rows[2].1 % 16, 0, "{out}");
    assert!(out.contains("block size  16 tokens\n"), "{out}");
    assert!(
        out.contains("verdict     prefix caching is on and reported"),
        "{out}"
    );

    // A second run is cold again: its own nonce opens the prompt.
    let (code, again, _) = probe(&["--upstream", &url, "--model", "kvbust-mock"]).await;
    assert_eq!(code, Some(0), "{again}");
    assert!(again.contains("cached_tokens      0\n"), "{again}");
}

#[tokio::test]
async fn usage_errors_exit_2_and_an_unreachable_upstream_exits_1() {
    let (_stop, url) = mock().await;
    let (code, out, err) = probe(&["--upstream", &url, "--model", "gpt-4o"]).await;
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("--model gpt-4o"), "{err}");
    assert!(err.contains("it serves: kvbust-mock"), "{err}");
    let (code, _, err) = probe(&["--upstream", "not a url"]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--upstream"), "{err}");
    let (code, _, err) = probe(&["--upstream", &url, "--timeout", "soon"]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--timeout"), "{err}");

    // A port nothing listens on (bound, then let go).
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (code, out, err) = probe(&["--upstream", &format!("http://{closed}")]).await;
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("/v1/models"), "{err}");
    assert!(err.contains("is the server up"), "{err}");
}

#[tokio::test]
async fn an_sdk_base_url_is_refused_with_the_fix_as_serve_refuses_it() {
    let (_stop, url) = mock().await;
    let (code, out, err) = probe(&["--upstream", &format!("{url}/v1")]).await;
    // A usage error (exit 2) naming the root to give, not a 404 from /v1/v1/models (exit 1).
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("--upstream"), "{err}");
    assert!(err.contains(&format!("set it to {url}")), "{err}");
    assert!(out.is_empty(), "nothing was probed: {out}");
    let (code, out, err) = probe(&["--upstream", &format!("{url}/")]).await;
    assert_eq!(
        code,
        Some(0),
        "a trailing slash is still the root: {out}{err}"
    );
}

/// An OpenAI-style server that reports `usage.prompt_tokens` but never `cached_tokens` (vLLM
/// without `--enable-prompt-tokens-details`, SGLang without `--enable-cache-report`).
async fn silent_upstream() -> (Stop, SocketAddr) {
    async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        let path = req.uri().path().to_owned();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let json = match path.as_str() {
            "/v1/models" => {
                r#"{"object":"list","data":[{"id":"Qwen/Qwen3-0.6B","object":"model","owned_by":"vllm"}]}"#.to_owned()
            }
            "/v1/chat/completions" => {
                // Counts words as tokens: enough for a prompt-size figure.
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let words = v["messages"][0]["content"]
                    .as_str()
                    .unwrap()
                    .split_whitespace()
                    .count();
                serde_json::json!({
                    "id": "chatcmpl-1", "object": "chat.completion", "model": "Qwen/Qwen3-0.6B",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"},
                                 "finish_reason": "length"}],
                    "usage": {"prompt_tokens": words, "completion_tokens": 1,
                              "total_tokens": words + 1, "prompt_tokens_details": null},
                })
                .to_string()
            }
            _ => return Ok(Response::builder().status(404).body(Full::default()).unwrap()),
        };
        Ok(Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(json)))
            .unwrap())
    }
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut rx => break,
                Ok((s, _)) = l.accept() => {
                    tokio::spawn(hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), hyper::service::service_fn(answer)));
                }
            }
        }
    });
    (Stop(Some(tx)), addr)
}

#[tokio::test]
async fn a_silent_upstream_exits_1_naming_both_engine_flags() {
    let (_stop, addr) = silent_upstream().await;
    let url = format!("http://{addr}");
    let (code, out, err) = probe(&["--upstream", &url, "--model", "Qwen/Qwen3-0.6B"]).await;
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        out.matches("cached_tokens not reported").count(),
        3,
        "{out}"
    );
    assert!(out.contains("block size  unknown\n"), "{out}");
    assert!(out.contains("--enable-prompt-tokens-details"), "{out}");
    assert!(out.contains("--enable-cache-report"), "{out}");
    assert!(err.contains("off or not reported"), "{err}");
}

/// llama.cpp fills `cached_tokens` (and its own `timings.cache_n`), and caches to the token.
#[tokio::test]
async fn llamacpp_reports_its_cache() {
    let Ok(url) = std::env::var("KVBUST_REAL_UPSTREAM") else {
        let _ = writeln!(
            std::io::stderr().lock(),
            "NOT RUN: real-upstream test `llamacpp_reports_its_cache`: KVBUST_REAL_UPSTREAM is not \
             set (start a server with `tests/real_upstream/llamacpp.sh start`)"
        );
        return;
    };
    // The server has one slot: take turns with the other real-upstream tests.
    let _turn = crate::real_upstream::ONE_AT_A_TIME.lock().await;
    let (code, out, err) = probe(&["--upstream", url.trim(), "--timeout", "600s"]).await;
    let _ = writeln!(
        std::io::stderr().lock(),
        "kvbust probe against llama.cpp:\n{out}"
    );
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("models      smollm2\n"), "{out}");
    assert!(out.contains("timings.cache_n"), "{out}");
    let second = out.lines().find(|l| l.starts_with("request 2")).unwrap();
    let w: Vec<&str> = second.split_whitespace().collect();
    let n: u64 = w[w.iter().position(|x| *x == "prompt_tokens").unwrap() + 1]
        .parse()
        .unwrap();
    let c: u64 = w[w.iter().position(|x| *x == "cached_tokens").unwrap() + 1]
        .parse()
        .unwrap();
    assert_eq!(c, n - 1, "llama.cpp reuses all but the last token: {out}");
    // Token-granular: 1 when the counts share no factor of two, else "unknown (1, 2, ...)".
    assert!(
        out.contains("block size  1 token") || out.contains("block size  unknown (1, 2"),
        "{out}"
    );
}

/// What a front before the mock does with a chat body's `cache_salt`.
#[derive(Clone, Copy)]
pub(crate) enum SaltFront {
    /// Takes it out before the mock sees it: an engine that ignores salts.
    Ignore,
    /// Answers 400, as a server without the parameter does.
    Refuse,
}

/// The mock behind a front that ignores or refuses `cache_salt`; everything else passes.
pub(crate) async fn salt_front(mode: SaltFront) -> (Stop, Stop, String) {
    let (mock_stop, mock_url) = mock().await;
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        loop {
            let (client, mock_url) = (client.clone(), mock_url.clone());
            let answer = move |req: Request<Incoming>| {
                let (client, mock_url) = (client.clone(), mock_url.clone());
                async move {
                    let (parts, body) = req.into_parts();
                    let mut body = body.collect().await.unwrap().to_bytes();
                    if let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&body) {
                        if v.get("cache_salt").is_some() {
                            if let SaltFront::Refuse = mode {
                                let e = r#"{"error":{"message":"Unrecognized request argument supplied: cache_salt","type":"invalid_request_error","code":null}}"#;
                                return Ok::<_, Infallible>(
                                    Response::builder()
                                        .status(400)
                                        .header("content-type", "application/json")
                                        .body(Full::new(Bytes::from_static(e.as_bytes())))
                                        .unwrap(),
                                );
                            }
                            v.as_object_mut().unwrap().remove("cache_salt");
                            body = Bytes::from(v.to_string());
                        }
                    }
                    let mut fwd = Request::builder()
                        .method(parts.method)
                        .uri(format!("{mock_url}{}", parts.uri.path()));
                    if !body.is_empty() {
                        fwd = fwd.header("content-type", "application/json");
                    }
                    let resp = client
                        .request(fwd.body(Full::new(body)).unwrap())
                        .await
                        .unwrap();
                    let (parts, body) = resp.into_parts();
                    let bytes = body.collect().await.unwrap().to_bytes();
                    Ok(Response::from_parts(parts, Full::new(bytes)))
                }
            };
            tokio::select! {
                _ = &mut rx => break,
                Ok((s, _)) = l.accept() => {
                    tokio::spawn(hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), hyper::service::service_fn(answer)));
                }
            }
        }
    });
    (mock_stop, Stop(Some(tx)), url)
}

/// The salt line of a probe's output.
fn salt_line(out: &str) -> &str {
    out.lines()
        .find(|l| l.starts_with("cache_salt  "))
        .unwrap_or_else(|| panic!("no cache_salt line: {out}"))
}

/// `kvbust probe` tells whether salts isolate: the mock honours them (vLLM's rule), a front
/// that drops them makes the mock ignore them, and one that answers 400 refuses them. The cache
/// itself is on and reported behind all three (exit 0).
#[tokio::test]
async fn the_probe_reports_whether_cache_salt_is_honoured_ignored_or_refused() {
    let (_stop, url) = mock().await;
    let (code, out, err) = probe(&["--upstream", &url]).await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        salt_line(&out).starts_with("cache_salt  honoured: "),
        "{out}"
    );
    let row = |out: &str, n: &str| -> (u64, u64) {
        let l = out
            .lines()
            .find(|l| l.starts_with(&format!("request {n} (salt")))
            .unwrap_or_else(|| panic!("no request {n}: {out}"));
        let w: Vec<&str> = l.split_whitespace().collect();
        let at = |k: &str| -> u64 {
            w[w.iter().position(|x| *x == k).unwrap() + 1]
                .parse()
                .unwrap()
        };
        (at("prompt_tokens"), at("cached_tokens"))
    };
    assert_eq!(row(&out, "4").1, 0, "{out}");
    assert_eq!(row(&out, "5").1, 0, "another salt is not cached: {out}");

    let (_m, _f, front) = salt_front(SaltFront::Ignore).await;
    let (code, out, err) = probe(&["--upstream", &front]).await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        salt_line(&out).starts_with("cache_salt  ignored: "),
        "{out}"
    );
    let (n, cached) = row(&out, "5");
    assert_eq!(
        cached,
        (n - 1) / 16 * 16,
        "served from the first salt's blocks: {out}"
    );

    let (_m, _f, front) = salt_front(SaltFront::Refuse).await;
    let (code, out, err) = probe(&["--upstream", &front]).await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let line = salt_line(&out);
    assert!(line.starts_with("cache_salt  refused: "), "{out}");
    assert!(
        line.contains("answered 400 (Unrecognized request argument supplied: cache_salt)"),
        "{out}"
    );
    assert!(!out.contains("(salt a)"), "{out}");
}
