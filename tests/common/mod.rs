//! Test harness: starts the built-in mock and kvbust in-process on port 0 and talks real HTTP
//! (HTTP/1.1 or h2c) to them. No fixed ports, no sleeps as synchronisation.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use kvbust::config::Config;
use kvbust::metrics::Metrics;
use kvbust::mock::{Mock, MockConfig};
use kvbust::runtime::SharedState;
use kvbust::server::{self, Listeners, RunReport};

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub struct Harness {
    pub mock: Arc<Mock>,
    pub mock_addr: SocketAddr,
    pub proxy_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub runtime: Arc<SharedState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<RunReport>>,
    mock_stop: Option<oneshot::Sender<()>>,
}

/// This test's own scratch folder: made on its first use in the test's thread (libtest runs each
/// test on a thread of its own), removed when that thread ends. Two tests never share one, so
/// none can remove or overwrite what another is writing.
pub fn test_dir() -> std::path::PathBuf {
    thread_local! {
        static DIR: tempfile::TempDir = tempfile::Builder::new()
            .prefix("kvbust-test-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
    }
    DIR.with(|d| d.path().to_path_buf())
}

pub fn quick_mock() -> MockConfig {
    MockConfig {
        base_delay: Duration::from_millis(1),
        prefill_per_token: Duration::ZERO,
        inter_token: Duration::from_millis(1),
        ..MockConfig::default()
    }
}

pub async fn start(tweak: impl FnOnce(&mut Config)) -> Harness {
    start_with_mock(quick_mock(), tweak).await
}

pub async fn start_with_mock(mock_cfg: MockConfig, tweak: impl FnOnce(&mut Config)) -> Harness {
    start_with(Mock::new(mock_cfg, None), tweak).await
}

/// Starts `mock` (on port 0) and kvbust in front of it.
pub async fn start_with(mock: Arc<Mock>, tweak: impl FnOnce(&mut Config)) -> Harness {
    let ml = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mock_addr = ml.local_addr().unwrap();
    let (mtx, mrx) = oneshot::channel::<()>();
    tokio::spawn(kvbust::mock::serve(ml, mock.clone(), async {
        let _ = mrx.await;
    }));
    let mut h = start_proxy(&format!("http://{mock_addr}"), tweak).await;
    h.mock = mock;
    h.mock_addr = mock_addr;
    h.mock_stop = Some(mtx);
    h
}

/// Starts only kvbust, in front of `upstream`.
pub async fn start_proxy(upstream: &str, tweak: impl FnOnce(&mut Config)) -> Harness {
    let mut cfg = Config::default();
    cfg.listen.addr = "127.0.0.1:0".parse().unwrap();
    cfg.admin.addr = "127.0.0.1:0".parse().unwrap();
    cfg.upstream.url = Some(upstream.to_string());
    cfg.cache_bust.benchmark_id = Some("0123456789ab".into());
    // No upstream health probe unless a test asks for one: its requests would show up in the
    // mock's recorder, and readiness would wait for it.
    cfg.upstream.health_probe = false;
    // Corpus token caches where `kvbust serve` keeps them (app.rs reads the environment).
    cfg.synth.cache_dir = kvbust::app::default_cache_dir();
    // The cache model counts as the mock does (built-in tokenizer, `Mock::new(_, None)`), and
    // no test loads the Qwen3 tokenizer for it unless it asks.
    cfg.cache_model.tokenizer = Some(kvbust::mock::MockTokenizerSetting::Builtin);
    // The model's thread at the test's own priority: at the shipped nice 19 it gets next to no
    // CPU on a saturated machine (CI's, `stress`), and tests that count every request modelled
    // would measure the scheduler instead. The nice value has a test of its own.
    cfg.cache_model.nice = 0;
    tweak(&mut cfg);
    cfg.validate().expect("test config is valid");
    let data = server::DataListener::bind(cfg.listen.addr, cfg.listen.worker_count()).unwrap();
    let admin = TcpListener::bind(cfg.admin.addr).await.unwrap();
    let proxy_addr = data.local_addr();
    let admin_addr = admin.local_addr().unwrap();
    let runtime = SharedState::new(Arc::new(cfg), Metrics::new());
    let (tx, rx) = oneshot::channel::<()>();
    let rt2 = runtime.clone();
    let upstream = upstream.to_string();
    let task = tokio::spawn(async move {
        let upstream = kvbust::config::UpstreamUrl::parse(&upstream).expect("a valid upstream URL");
        server::run(rt2, &upstream, Listeners { data, admin }, async {
            let _ = rx.await;
        })
        .await
        .expect("proxy runs")
    });
    Harness {
        mock: Mock::new(quick_mock(), None),
        mock_addr: "127.0.0.1:9".parse().unwrap(),
        proxy_addr,
        admin_addr,
        runtime,
        stop: Some(tx),
        task: Some(task),
        mock_stop: None,
    }
}

impl Harness {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.proxy_addr, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin_addr, path)
    }

    /// Waits until every request so far is counted by the cache model (`GET /report?wait=`):
    /// its response ended and the model took it.
    pub async fn settle_report(&self) {
        let resp = send(&h1(), get(&self.admin_url("/report?wait=60s"))).await;
        assert_eq!(resp.status(), http::StatusCode::OK);
    }

    /// Whether the server task has already ended (returned an error or panicked, while running).
    pub fn server_ended(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Begins shutdown and returns the task that finishes when draining is done.
    pub fn begin_shutdown(&mut self) -> JoinHandle<RunReport> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.take().expect("shutdown once")
    }

    pub async fn shutdown(mut self) -> RunReport {
        let report = self.begin_shutdown().await.unwrap();
        if let Some(tx) = self.mock_stop.take() {
            let _ = tx.send(());
        }
        report
    }
}

pub fn h1() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub fn h2c() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

pub fn clients() -> [(&'static str, HttpClient); 2] {
    [("http1", h1()), ("h2c", h2c())]
}

pub fn post(url: &str, body: impl Into<Bytes>, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(body.into())).unwrap()
}

/// How long a test waits for something that must happen before it calls it a hang. Only a
/// failing test waits this long, so it is generous: on a loaded 2-core machine (CI, or the suite
/// under `stress --cpu 4`) a request can take tens of seconds, and 20 s guards tripped there.
pub const HANG: Duration = Duration::from_secs(120);

/// POSTs a chat-completions `body` through `h`'s proxy with `client`.
pub async fn chat(client: &HttpClient, h: &Harness, body: impl Into<Bytes>) -> Response<Incoming> {
    send(client, post(&h.url("/v1/chat/completions"), body, &[])).await
}

pub fn get(url: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .uri(url)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

pub async fn send(client: &HttpClient, req: Request<Full<Bytes>>) -> Response<Incoming> {
    tokio::time::timeout(HANG, client.request(req))
        .await
        .expect("no hang")
        .expect("request sent")
}

pub async fn body_bytes(resp: Response<Incoming>) -> Bytes {
    tokio::time::timeout(HANG, resp.into_body().collect())
        .await
        .expect("no hang")
        .unwrap()
        .to_bytes()
}

pub async fn json(resp: Response<Incoming>) -> serde_json::Value {
    let b = body_bytes(resp).await;
    serde_json::from_slice(&b)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&b)))
}

/// Reads a response body frame by frame, stamping each frame's arrival time.
pub async fn frames(resp: Response<Incoming>) -> Vec<(Instant, Bytes)> {
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) = tokio::time::timeout(HANG, body.frame())
        .await
        .expect("no hang")
    {
        if let Ok(data) = frame.expect("frame").into_data() {
            out.push((Instant::now(), data));
        }
    }
    out
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|ev| {
            ev.lines()
                .find_map(|l| l.strip_prefix("data:").map(|d| d.trim().to_string()))
        })
        .collect()
}

pub fn chat_body(content: &str, stream: bool, max_tokens: u32) -> String {
    serde_json::json!({
        "model": "kvbust-mock",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

pub async fn metrics_text(h: &Harness) -> String {
    let resp = send(&h1(), get(&h.admin_url("/metrics"))).await;
    String::from_utf8(body_bytes(resp).await.to_vec()).unwrap()
}

/// `send` with a caller-chosen guard, for real servers on a loaded CPU.
pub async fn send_within(
    client: &HttpClient,
    req: Request<Full<Bytes>>,
    limit: Duration,
) -> Response<Incoming> {
    tokio::time::timeout(limit, client.request(req))
        .await
        .expect("no hang")
        .expect("request sent")
}
