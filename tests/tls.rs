//! TLS on both sides: a client speaks HTTP/2 over TLS (ALPN) to kvbust, and kvbust forwards to an
//! `https` upstream verified with `upstream.tls.ca_file`. The https upstream is a second kvbust
//! with a TLS listener in front of the mock.

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
    let dir = std::env::temp_dir().join(format!("kvbust-tls-{tag}-{}", std::process::id()));
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

    strict.shutdown().await;
    front.shutdown().await;
    edge.shutdown().await;
    let _ = std::fs::remove_dir_all(&certs.dir);
}
