//! The upstream as kvbust sees it: `/readyz` and `kvbust_upstream_up` follow a health probe
//! against an upstream this test controls (up, down, back, no `/health`), the `upstream.authority`
//! override reaches the upstream as `Host` / `:authority` over HTTP/1.1, h2c and TLS while SNI
//! stays as it was, and an upstream URL ending in `/v1` is refused at start.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::convert::Infallible;
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use http::{Request, Response, StatusCode, Version};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use kvbust::config::{Config, Http2Mode};
use kvbust::health::UpstreamStatus;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// One request as the fake upstream saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    version: Version,
    host: Option<String>,
    /// The URI's authority: HTTP/2's `:authority` (absent in origin-form HTTP/1.1).
    authority: Option<String>,
    /// The TLS server name the client sent, for TLS connections.
    sni: Option<String>,
    status: u16,
}

/// An upstream whose answers the test sets: `/health` and `/v1/models` with the configured
/// status, other `/v1/...` routes 200, anything else 404.
struct Fake {
    health: AtomicU16,
    models: AtomicU16,
    seen: watch::Sender<Vec<Seen>>,
}

impl Fake {
    fn new(health: u16, models: u16) -> Arc<Fake> {
        Arc::new(Fake {
            health: AtomicU16::new(health),
            models: AtomicU16::new(models),
            seen: watch::Sender::new(Vec::new()),
        })
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.borrow().clone()
    }

    fn count(&self, path: &str, status: u16) -> usize {
        self.seen
            .borrow()
            .iter()
            .filter(|s| s.path == path && s.status == status)
            .count()
    }

    /// Waits (bounded) until `path` was answered with `status` at least `n` times.
    async fn wait_count(&self, path: &str, status: u16, n: usize) {
        let mut rx = self.seen.subscribe();
        let wait = rx.wait_for(|v| {
            v.iter()
                .filter(|s| s.path == path && s.status == status)
                .count()
                >= n
        });
        tokio::time::timeout(HANG, wait)
            .await
            .unwrap_or_else(|_| panic!("{path} answered {status} {n} times: {:#?}", self.seen()))
            .expect("the fake lives");
    }

    fn answer(&self, path: &str) -> u16 {
        match path {
            "/health" => self.health.load(Ordering::SeqCst),
            "/v1/models" => self.models.load(Ordering::SeqCst),
            p if p.starts_with("/v1/") => 200,
            _ => 404,
        }
    }
}

/// Serves `fake` on `listener` (HTTP/1.1 and h2c; with `tls`, ALPN h2 and http/1.1) until the
/// returned task is aborted.
fn serve_fake(
    listener: TcpListener,
    fake: Arc<Fake>,
    tls: Option<TlsAcceptor>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let fake = fake.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    None => serve_conn(TokioIo::new(stream), fake, None).await,
                    Some(acceptor) => {
                        let Ok(s) = acceptor.accept(stream).await else {
                            return;
                        };
                        let sni = s.get_ref().1.server_name().map(str::to_string);
                        serve_conn(TokioIo::new(s), fake, sni).await
                    }
                }
            });
        }
    })
}

async fn serve_conn<I>(io: TokioIo<I>, fake: Arc<Fake>, sni: Option<String>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let fake = fake.clone();
        let sni = sni.clone();
        async move {
            let path = req.uri().path().to_string();
            let status = fake.answer(&path);
            fake.seen.send_modify(|v| {
                v.push(Seen {
                    path,
                    version: req.version(),
                    host: req
                        .headers()
                        .get("host")
                        .map(|h| h.to_str().unwrap().to_string()),
                    authority: req.uri().authority().map(|a| a.to_string()),
                    sni,
                    status,
                })
            });
            let mut resp = Response::new(Full::new(Bytes::from_static(b"{}")));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
            Ok::<_, Infallible>(resp)
        }
    });
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection(io, service)
        .await;
}

/// A fast probe: every 10 ms, 300 ms to answer, down after `fail` failures, up after `ok`.
fn probe(fail: u32, ok: u32) -> impl FnOnce(&mut Config) {
    move |c| {
        c.upstream.health_probe = true;
        c.upstream.health_interval = Duration::from_millis(10);
        c.upstream.health_timeout = Duration::from_millis(300);
        c.upstream.health_fail_threshold = fail;
        c.upstream.health_success_threshold = ok;
    }
}

/// Waits (bounded) until the upstream's status satisfies `want`, and returns it.
async fn wait_status(h: &Harness, want: impl Fn(&UpstreamStatus) -> bool) -> UpstreamStatus {
    let mut rx = h.runtime.upstream_health.subscribe();
    let seen = tokio::time::timeout(HANG, rx.wait_for(|s| want(s)))
        .await
        .unwrap_or_else(|_| panic!("status now: {:?}", h.runtime.upstream_health.status()))
        .expect("the runtime lives")
        .clone();
    seen
}

async fn readyz(h: &Harness) -> (StatusCode, String) {
    let resp = send(&h1(), get(&h.admin_url("/readyz"))).await;
    let status = resp.status();
    (
        status,
        String::from_utf8(body_bytes(resp).await.to_vec()).unwrap(),
    )
}

async fn up_gauge(h: &Harness) -> String {
    let m = metrics_text(h).await;
    m.lines()
        .find(|l| l.starts_with("kvbust_upstream_up "))
        .unwrap_or_else(|| panic!("no kvbust_upstream_up in {m}"))
        .to_string()
}

#[tokio::test]
async fn readyz_waits_for_the_upstream_then_follows_it_down_and_back_up() {
    // A socket that accepts nothing yet: probes connect (the kernel's backlog) but get no answer.
    let early = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = early.local_addr().unwrap();
    let h = start_proxy(&format!("http://{addr}"), probe(3, 1)).await;

    // Not ready before the upstream is up, and /healthz (kvbust itself) is fine.
    wait_status(&h, |s| {
        matches!(s, UpstreamStatus::Starting { last: Some(_) })
    })
    .await;
    let (code, body) = readyz(&h).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body.starts_with("not ready: the upstream is not up yet: GET http://"),
        "{body}"
    );
    assert!(body.contains("upstream.health_timeout"), "{body}");
    assert_eq!(up_gauge(&h).await, "kvbust_upstream_up 0");
    let alive = send(&h1(), get(&h.admin_url("/healthz"))).await;
    assert_eq!(alive.status(), StatusCode::OK);

    // The upstream starts answering: ready.
    early.set_nonblocking(true).unwrap();
    let fake = Fake::new(200, 200);
    let server = serve_fake(TcpListener::from_std(early).unwrap(), fake.clone(), None);
    wait_status(&h, UpstreamStatus::is_up).await;
    assert_eq!(readyz(&h).await, (StatusCode::OK, "ready\n".to_string()));
    assert_eq!(up_gauge(&h).await, "kvbust_upstream_up 1");
    assert!(fake.count("/health", 200) >= 1);
    assert_eq!(
        fake.count("/v1/models", 200),
        0,
        "/health answered: no fallback"
    );

    // /health fails: not ready once three probes in a row have failed.
    fake.health.store(503, Ordering::SeqCst);
    let down = wait_status(&h, |s| matches!(s, UpstreamStatus::Down { .. })).await;
    assert!(fake.count("/health", 503) >= 3, "{:#?}", fake.seen());
    assert!(
        matches!(down, UpstreamStatus::Down { failures: 3, .. }),
        "{down:?}"
    );
    let (code, body) = readyz(&h).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("failed health probes in a row"), "{body}");
    assert!(
        body.contains(&format!("GET http://{addr}/health answered 503")),
        "{body}"
    );
    assert_eq!(up_gauge(&h).await, "kvbust_upstream_up 0");

    // And back.
    fake.health.store(200, Ordering::SeqCst);
    wait_status(&h, UpstreamStatus::is_up).await;
    assert_eq!(readyz(&h).await.0, StatusCode::OK);
    assert_eq!(up_gauge(&h).await, "kvbust_upstream_up 1");

    // Shutdown ends the probe: `run` waits for its task before it returns.
    h.shutdown().await;
    server.abort();
}

#[tokio::test]
async fn a_server_without_health_is_probed_on_v1_models_from_then_on() {
    for missing in [404u16, 405] {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let fake = Fake::new(missing, 200);
        let server = serve_fake(l, fake.clone(), None);
        let h = start_proxy(&format!("http://{addr}"), probe(3, 1)).await;
        wait_status(&h, UpstreamStatus::is_up).await;
        assert_eq!(readyz(&h).await.0, StatusCode::OK);
        fake.wait_count("/v1/models", 200, 3).await;
        // /health was asked once; once it answered `missing`, every probe went to /v1/models.
        assert_eq!(fake.count("/health", missing), 1, "{:#?}", fake.seen());
        assert_eq!(fake.seen()[0].path, "/health");
        h.shutdown().await;
        server.abort();
    }
}

#[tokio::test]
async fn a_configured_health_path_has_no_fallback() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let fake = Fake::new(200, 200);
    let server = serve_fake(l, fake.clone(), None);
    let h = start_proxy(&format!("http://{addr}"), |c| {
        probe(3, 1)(c);
        c.upstream.health_path = Some("/ready".into());
    })
    .await;
    fake.wait_count("/ready", 404, 3).await;
    let (code, body) = readyz(&h).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.contains(&format!("GET http://{addr}/ready answered 404")),
        "{body}"
    );
    assert!(
        fake.seen().iter().all(|s| s.path == "/ready"),
        "{:#?}",
        fake.seen()
    );
    h.shutdown().await;
    server.abort();
}

#[tokio::test]
async fn with_the_probe_off_readiness_ignores_the_upstream() {
    // Nothing listens on the upstream's port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let h = start_proxy(&format!("http://127.0.0.1:{port}"), |c| {
        c.upstream.health_probe = false
    })
    .await;
    assert_eq!(
        h.runtime.upstream_health.status(),
        UpstreamStatus::Unchecked
    );
    assert_eq!(readyz(&h).await, (StatusCode::OK, "ready\n".to_string()));
    h.shutdown().await;
}

#[tokio::test]
async fn the_built_in_mock_answers_the_probe() {
    let h = start(probe(3, 1)).await;
    wait_status(&h, UpstreamStatus::is_up).await;
    assert_eq!(readyz(&h).await.0, StatusCode::OK);
    assert_eq!(up_gauge(&h).await, "kvbust_upstream_up 1");
    let health = h.mock.recorder().requests();
    assert!(health.iter().any(|r| r.uri == "/health"), "{health:?}");
    h.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// upstream.authority: Host / :authority, not the address dialled, not SNI.

/// A chat request through `h` with an HTTP/1.1 and an h2c client (the first rides the client
/// connection's own upstream connection, the second the worker's pool).
async fn chat_twice(h: &Harness) {
    for (name, client) in clients() {
        let resp = chat(&client, h, chat_body("hi", false, 1)).await;
        assert_eq!(resp.status(), StatusCode::OK, "{name}");
        body_bytes(resp).await;
    }
}

fn chats(fake: &Fake) -> Vec<Seen> {
    fake.seen()
        .into_iter()
        .filter(|s| s.path == "/v1/chat/completions")
        .collect()
}

#[tokio::test]
async fn the_authority_override_reaches_http1_and_h2c_upstreams() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let fake = Fake::new(200, 200);
    let server = serve_fake(l, fake.clone(), None);
    let url = format!("http://{addr}");

    // Without the override, the URL's authority.
    let h = start_proxy(&url, |_| {}).await;
    chat_twice(&h).await;
    h.shutdown().await;
    for s in chats(&fake) {
        assert_eq!(
            (s.version, s.host.as_deref()),
            (Version::HTTP_11, Some(addr.to_string().as_str()))
        );
    }

    // HTTP/1.1 upstream: Host, for requests and the health probe alike.
    fake.seen.send_modify(Vec::clear);
    let h = start_proxy(&url, |c| {
        probe(3, 1)(c);
        c.upstream.authority = Some("model.example:8443".into());
    })
    .await;
    wait_status(&h, UpstreamStatus::is_up).await;
    chat_twice(&h).await;
    h.shutdown().await;
    let seen = fake.seen();
    assert_eq!(chats(&fake).len(), 2);
    for s in &seen {
        assert_eq!(s.version, Version::HTTP_11, "{s:?}");
        assert_eq!(s.host.as_deref(), Some("model.example:8443"), "{s:?}");
    }
    assert!(seen.iter().any(|s| s.path == "/health"));

    // h2c upstream (prior knowledge): :authority, and no Host header beside it.
    fake.seen.send_modify(Vec::clear);
    let h = start_proxy(&url, |c| {
        c.upstream.http2 = Http2Mode::Always;
        c.upstream.authority = Some("model.example:8443".into());
    })
    .await;
    chat_twice(&h).await;
    h.shutdown().await;
    let seen = chats(&fake);
    assert_eq!(seen.len(), 2);
    for s in seen {
        assert_eq!(s.version, Version::HTTP_2, "{s:?}");
        assert_eq!(s.authority.as_deref(), Some("model.example:8443"), "{s:?}");
        assert_eq!(s.host, None, "{s:?}");
    }
    server.abort();
}

#[tokio::test]
async fn over_tls_the_authority_override_leaves_sni_alone() {
    // A certificate for `localhost`, reached by IP with upstream.tls.server_name = localhost.
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = crate::common::test_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("cert.pem");
    std::fs::write(&ca, ck.cert.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key)
    .unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let fake = Fake::new(200, 200);
    let server = serve_fake(l, fake.clone(), Some(TlsAcceptor::from(Arc::new(tls))));
    let url = format!("https://{addr}");

    // (http2 mode, authority override, the version and host name the upstream should see)
    let cases = [
        (Http2Mode::Auto, None, Version::HTTP_2, addr.to_string()),
        (
            Http2Mode::Auto,
            Some("model.example"),
            Version::HTTP_2,
            "model.example".into(),
        ),
        (
            Http2Mode::Never,
            Some("model.example"),
            Version::HTTP_11,
            "model.example".into(),
        ),
        (
            Http2Mode::Never,
            Some("model.example:8443"),
            Version::HTTP_11,
            "model.example:8443".into(),
        ),
    ];
    for (mode, authority, version, want) in cases {
        fake.seen.send_modify(Vec::clear);
        let ca = ca.clone();
        let h = start_proxy(&url, move |c| {
            c.upstream.http2 = mode;
            c.upstream.tls.ca_file = Some(ca);
            c.upstream.tls.server_name = Some("localhost".into());
            c.upstream.authority = authority.map(str::to_string);
        })
        .await;
        chat_twice(&h).await;
        h.shutdown().await;
        let seen = chats(&fake);
        assert_eq!(seen.len(), 2, "{mode:?} {authority:?}");
        for s in seen {
            let ctx = format!("{mode:?} {authority:?}: {s:?}");
            assert_eq!(s.version, version, "{ctx}");
            assert_eq!(s.sni.as_deref(), Some("localhost"), "{ctx}");
            let named = if version == Version::HTTP_2 {
                &s.authority
            } else {
                &s.host
            };
            assert_eq!(named.as_deref(), Some(want.as_str()), "{ctx}");
        }
    }
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// The OpenAI base_url habit.

#[test]
fn an_upstream_url_ending_in_v1_is_refused_with_exit_64() {
    for command in [
        &["config", "check"][..],
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
    ] {
        let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
        for (k, _) in std::env::vars() {
            if k.starts_with("KVBUST_") {
                p.env_remove(k);
            }
        }
        let out = p
            .args(command)
            .args(["--upstream", "http://127.0.0.1:8000/v1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{command:?}: {err}");
        assert!(err.contains("upstream.url"), "{err}");
        assert!(err.contains("/v1/v1/chat/completions"), "{err}");
        assert!(err.contains("set it to http://127.0.0.1:8000"), "{err}");
    }
}
