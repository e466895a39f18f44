//! TLS on both sides: a client speaks HTTP/2 over TLS (ALPN) to kvbust, and kvbust forwards to an
//! `https` upstream verified with `upstream.tls.ca_file`. The https upstream is a second kvbust
//! with a TLS listener in front of the mock.
// Test code: a panic is the failure report (Cargo.toml denies these in the library).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use http::{StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvbust::config::TlsFiles;

struct Certs {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    der: rustls::pki_types::CertificateDer<'static>,
}

fn self_signed(tag: &str) -> Certs {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = test_dir().join(format!("tls-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    Certs {
        dir,
        cert,
        key,
        der: ck.cert.der().clone(),
    }
}

#[tokio::test]
async fn tls_listener_with_alpn_h2_and_https_upstream_with_a_ca_file() {
    let certs = self_signed("edge");
    let tls = TlsFiles {
        cert: certs.cert.clone(),
        key: certs.key.clone(),
        client_ca: None,
        watch_interval: std::time::Duration::from_secs(10),
    };
    let edge = start(move |c| c.listen.tls = Some(tls)).await;

    // A client that trusts only our CA and offers h2 + http/1.1.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certs.der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(cfg)
        .https_only()
        .enable_all_versions()
        .build();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
    let url = format!(
        "https://localhost:{}/v1/chat/completions",
        edge.proxy_addr.port()
    );
    let body = chat_body("over tls", true, 3);
    let resp = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.request(post(&url, body.clone(), &[])),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), Version::HTTP_2, "ALPN picked h2");
    let all = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(sse_data(&all).last().map(String::as_str), Some("[DONE]"));
    assert_eq!(
        edge.mock.recorder().requests()[0].body.as_ref(),
        body.as_bytes()
    );
    let forwarded = &edge.mock.recorder().requests()[0].headers;
    assert_eq!(forwarded["x-forwarded-proto"], "https");

    // A plain kvbust in front of the TLS one: https upstream trusted through ca_file.
    let ca = certs.cert.clone();
    let front = start_proxy(
        &format!("https://localhost:{}", edge.proxy_addr.port()),
        move |c| {
            c.upstream.tls.ca_file = Some(ca);
        },
    )
    .await;
    let resp = send(
        &h1(),
        post(&front.url("/v1/chat/completions"), body.clone(), &[]),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    let got = edge.mock.recorder().requests();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].body.as_ref(), body.as_bytes());

    // Without the CA the upstream's certificate is refused: a 502 that says why.
    let strict = start_proxy(
        &format!("https://localhost:{}", edge.proxy_addr.port()),
        |_| {},
    )
    .await;
    let resp = send(&h1(), post(&strict.url("/v1/chat/completions"), body, &[])).await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let v = json(resp).await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("certificate"),
        "{v}"
    );
    // ...and names the fix (issue 31).
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("set upstream.tls.ca_file"), "{v}");

    strict.shutdown().await;
    front.shutdown().await;
    edge.shutdown().await;
    let _ = std::fs::remove_dir_all(&certs.dir);
}

/// A plain-HTTP server behind an `https://` upstream URL: the 502 says to use http://.
#[tokio::test]
async fn a_plain_upstream_behind_https_gets_an_error_that_names_http() {
    let plain = start(|_| {}).await;
    let front = start_proxy(&format!("https://{}", plain.mock_addr), |_| {}).await;
    let resp = send(
        &h1(),
        post(
            &front.url("/v1/chat/completions"),
            chat_body("tls?", false, 1),
            &[],
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let v = json(resp).await;
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the upstream does not speak TLS: use http://"),
        "{v}"
    );
    front.shutdown().await;
    plain.shutdown().await;
}

/// A test PKI made with rcgen: a CA, and leaf certificates it signs.
struct Pki {
    dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

/// A leaf certificate and key, as files and as what a rustls client presents.
struct Leaf {
    cert: PathBuf,
    key: PathBuf,
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key_der: Vec<u8>,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let dir = test_dir().join(format!("pki-{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("kvbust test CA {tag}"));
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        roots
    }

    /// A certificate for `localhost`, for a server or (with `client`) a client.
    fn leaf(&self, name: &str, client: bool) -> Leaf {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.extended_key_usages = vec![if client {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        }];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let leaf = Leaf {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
            chain: vec![cert.der().clone()],
            key_der: key.serialize_der(),
        };
        std::fs::write(&leaf.cert, cert.pem()).unwrap();
        std::fs::write(&leaf.key, key.serialize_pem()).unwrap();
        leaf
    }
}

impl Leaf {
    /// The listener configuration serving this certificate.
    fn listener(&self, client_ca: Option<PathBuf>, watch_ms: u64) -> TlsFiles {
        TlsFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca,
            watch_interval: std::time::Duration::from_millis(watch_ms),
        }
    }

    /// Rotates this leaf's files to `next`'s certificate and key, as cert-manager would.
    fn rotate_to(&self, next: &Leaf) {
        std::fs::copy(&next.key, &self.key).unwrap();
        std::fs::copy(&next.cert, &self.cert).unwrap();
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

type HttpsClient = Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// An https client that trusts `roots`, presents `identity` when given, and speaks `version`
/// (h2 or http/1.1 by ALPN).
fn https_client(
    roots: rustls::RootCertStore,
    identity: Option<&Leaf>,
    version: Version,
) -> HttpsClient {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let cfg = match identity {
        Some(l) => builder
            .with_client_auth_cert(
                l.chain.clone(),
                rustls::pki_types::PrivateKeyDer::Pkcs8(l.key_der.clone().into()),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let b = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(cfg)
        .https_only();
    let https = if version == Version::HTTP_2 {
        b.enable_http2().build()
    } else {
        b.enable_http1().build()
    };
    let mut cb = Client::builder(TokioExecutor::new());
    cb.http2_only(version == Version::HTTP_2);
    cb.build(https)
}

async fn try_request(
    client: &HttpsClient,
    url: &str,
    body: &str,
) -> Result<http::Response<hyper::body::Incoming>, String> {
    match tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.request(post(url, body.to_string(), &[])),
    )
    .await
    {
        Err(_) => panic!("request to {url} hung"),
        Ok(r) => r.map_err(|e| format!("{e:?}")),
    }
}

#[tokio::test]
async fn mtls_listener_serves_trusted_clients_over_h2_and_http1_and_refuses_the_rest() {
    let pki = Pki::new("mtls");
    let server = pki.leaf("server", false);
    let client_id = pki.leaf("client", true);
    let stranger_pki = Pki::new("mtls-stranger");
    let stranger = stranger_pki.leaf("stranger", true);
    let tls = server.listener(Some(pki.ca_file()), 0);
    let h = start(move |c| c.listen.tls = Some(tls)).await;
    let url = format!(
        "https://localhost:{}/v1/chat/completions",
        h.proxy_addr.port()
    );
    let body = chat_body("mutual", true, 2);

    for version in [Version::HTTP_2, Version::HTTP_11] {
        let client = https_client(pki.roots(), Some(&client_id), version);
        let resp = try_request(&client, &url, &body).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.version(), version);
        let all = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(sse_data(&all).last().map(String::as_str), Some("[DONE]"));
    }
    assert_eq!(h.mock.recorder().requests_total(), 2);

    // No certificate, or one from a CA the listener does not trust: no request gets through.
    for (what, identity) in [("no certificate", None), ("untrusted CA", Some(&stranger))] {
        for version in [Version::HTTP_2, Version::HTTP_11] {
            let client = https_client(pki.roots(), identity, version);
            let err = try_request(&client, &url, &body).await.err();
            assert!(err.is_some(), "{what} over {version:?} was served");
        }
    }
    assert_eq!(h.mock.recorder().requests_total(), 2);
    h.shutdown().await;
}

/// Polls new connections until the listener presents a certificate that `roots` trusts.
async fn until_served_with(roots: &rustls::RootCertStore, port: u16) {
    let url = format!("https://localhost:{port}/v1/models");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let client = https_client(roots.clone(), None, Version::HTTP_11);
        let req = http::Request::get(&url)
            .body(Full::new(Bytes::new()))
            .unwrap();
        if let Ok(Ok(resp)) =
            tokio::time::timeout(std::time::Duration::from_secs(5), client.request(req)).await
        {
            assert_eq!(resp.status(), StatusCode::OK);
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the listener never presented the new certificate"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn certificate_reload_serves_new_connections_while_an_open_stream_finishes() {
    let old = Pki::new("reload-old");
    let new = Pki::new("reload-new");
    let first = old.leaf("server", false);
    let tls = first.listener(None, 25);
    let slow = kvbust::mock::MockConfig {
        inter_token: std::time::Duration::from_millis(25),
        ..quick_mock()
    };
    let h = start_with_mock(slow, move |c| c.listen.tls = Some(tls)).await;
    let port = h.proxy_addr.port();
    let url = format!("https://localhost:{port}/v1/chat/completions");

    // A long stream on a connection made with the old certificate.
    let old_client = https_client(old.roots(), None, Version::HTTP_2);
    let resp = try_request(&old_client, &url, &chat_body("long", true, 60))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut stream = resp.into_body();
    let first_frame = stream.frame().await.unwrap().unwrap();
    assert!(first_frame.is_data());

    // cert-manager rotates the Secret: new certificate and key, from another CA.
    first.rotate_to(&new.leaf("server", false));
    until_served_with(&new.roots(), port).await;

    // New connections get the new certificate only; the old stream runs on to [DONE].
    let stale = https_client(old.roots(), None, Version::HTTP_11);
    assert!(try_request(&stale, &url, &chat_body("x", false, 1))
        .await
        .is_err());
    let rest = stream.collect().await.unwrap().to_bytes();
    assert_eq!(sse_data(&rest).last().map(String::as_str), Some("[DONE]"));
    let m = metrics_text(&h).await;
    assert!(m.contains("kvbust_tls_reloads_total{result=\"ok\"}"), "{m}");
    h.shutdown().await;
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads_the_certificate() {
    // Our own SIGHUP listener first: the signal must never meet the default action (exit).
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).unwrap();
    let old = Pki::new("hup-old");
    let new = Pki::new("hup-new");
    let first = old.leaf("server", false);
    let tls = first.listener(None, 0); // SIGHUP only
    let h = start(move |c| c.listen.tls = Some(tls)).await;
    until_served_with(&old.roots(), h.proxy_addr.port()).await;
    first.rotate_to(&new.leaf("server", false));
    let kill = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    hup.recv().await;
    until_served_with(&new.roots(), h.proxy_addr.port()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn upstream_mtls_with_a_client_certificate_and_a_server_name_override() {
    // The https upstream: a kvbust whose listener requires a client certificate from `pki`, in
    // front of the mock.
    let pki = Pki::new("upstream-mtls");
    let server = pki.leaf("server", false);
    let client_id = pki.leaf("client", true);
    let tls = server.listener(Some(pki.ca_file()), 0);
    let edge = start(move |c| c.listen.tls = Some(tls)).await;
    let port = edge.proxy_addr.port();
    let body = chat_body("through two proxies", true, 2);

    // One request through a fresh front kvbust forwarding to `url`, with or without the client
    // certificate and with an optional server name override: the status and body it answers.
    let through = |url: String, client: bool, server_name: Option<&str>| {
        let (ca, cert, key) = (pki.ca_file(), client_id.cert.clone(), client_id.key.clone());
        let server_name = server_name.map(str::to_string);
        let body = body.clone();
        async move {
            let front = start_proxy(&url, move |c| {
                c.upstream.tls.ca_file = Some(ca);
                if client {
                    c.upstream.tls.client_cert = Some(cert);
                    c.upstream.tls.client_key = Some(key);
                }
                c.upstream.tls.server_name = server_name;
            })
            .await;
            let resp = send(&h1(), post(&front.url("/v1/chat/completions"), body, &[])).await;
            let status = resp.status();
            let bytes = body_bytes(resp).await;
            front.shutdown().await;
            (status, bytes)
        }
    };

    let by_name = format!("https://localhost:{port}");
    let (status, bytes) = through(by_name.clone(), true, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sse_data(&bytes).last().map(String::as_str), Some("[DONE]"));
    assert_eq!(edge.mock.recorder().requests_total(), 1);

    // Without the client certificate the upstream refuses the connection: a 502.
    let (status, _) = through(by_name, false, None).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);

    // By IP address the certificate (for localhost) does not match, unless the server name
    // sent and checked is overridden.
    let by_ip = format!("https://127.0.0.1:{port}");
    let (status, _) = through(by_ip.clone(), true, None).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let (status, _) = through(by_ip, true, Some("localhost")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(edge.mock.recorder().requests_total(), 2);
    edge.shutdown().await;
}

#[tokio::test]
async fn insecure_skip_verify_shows_on_config_and_as_a_metric() {
    for insecure in [false, true] {
        let h = start(move |c| c.upstream.tls.insecure_skip_verify = insecure).await;
        let config = String::from_utf8(
            body_bytes(send(&h1(), get(&h.admin_url("/config"))).await)
                .await
                .to_vec(),
        )
        .unwrap();
        assert!(
            config.contains(&format!("insecure_skip_verify = {insecure}")),
            "{config}"
        );
        let m = metrics_text(&h).await;
        assert!(
            m.contains(&format!(
                "kvbust_upstream_tls_insecure_skip_verify {}",
                u8::from(insecure)
            )),
            "{m}"
        );
        h.shutdown().await;
    }
}
