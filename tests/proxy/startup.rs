//! Start-up work done before the first request: `synth.preload` loads the synthesis tokenizer
//! and corpora at start, and `/readyz` answers 503 until it is done.

use std::sync::Arc;

use crate::common::*;
use http::StatusCode;
use kvbust::config::Config;
use kvbust::metrics::Metrics;
use kvbust::runtime::SharedState;
use kvbust::synth::PromptCorpus;

#[test]
fn readiness_waits_for_the_preload() {
    let mut cfg = Config::default();
    // Readiness ignores the upstream here, so only the preload can hold it back.
    cfg.upstream.health_probe = false;
    cfg.synth.preload = vec![PromptCorpus::Sonnet];
    let rt = SharedState::new(Arc::new(cfg), Metrics::new());
    let why = rt.readiness().unwrap_err();
    assert!(why.contains("synth.preload"), "{why}");
    rt.preload_done();
    assert_eq!(rt.readiness(), Ok(()));
    // Nothing to preload: ready from the start.
    let mut cfg_without_probe = Config::default();
    cfg_without_probe.upstream.health_probe = false;
    let rt = SharedState::new(Arc::new(cfg_without_probe), Metrics::new());
    assert_eq!(rt.readiness(), Ok(()));
}

#[tokio::test]
async fn preloaded_corpora_make_the_proxy_ready_and_serve_placeholders() {
    let h = start(|c| c.synth.preload = vec![PromptCorpus::Sonnet, PromptCorpus::Random]).await;
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        h.runtime.wait_preloaded(),
    )
    .await
    .expect("preload finishes");
    let ready = send(&h1(), get(&h.admin_url("/readyz"))).await;
    assert_eq!(ready.status(), StatusCode::OK);
    body_bytes(ready).await;
    let body = chat_body("{{kvbust:prompt:40}}", false, 1);
    let resp = chat(&h1(), &h, body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let overhead_us: u64 = resp.headers()["x-kvbust-overhead-us"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    eprintln!("first placeholder request after preload: overhead {overhead_us} us");
    body_bytes(resp).await;
    h.shutdown().await;
}
