//! `observe.request_usage`, on by default: a chat or completions stream that does not ask for
//! usage is measured (kvbust asks the upstream on its behalf), and the client receives exactly
//! the stream it asked for, event for event, with no usage chunk.

use crate::common::*;

/// The `data:` payloads with the per-request `id` and `created` masked (the mock numbers its
/// completions; nothing else in a chunk depends on the request being a new one).
fn masked(body: &[u8]) -> Vec<serde_json::Value> {
    sse_data(body)
        .iter()
        .map(|d| {
            if d == "[DONE]" {
                return serde_json::Value::String(d.clone());
            }
            let mut v: serde_json::Value = serde_json::from_str(d).unwrap();
            v["id"] = "X".into();
            v["created"] = 0.into();
            v
        })
        .collect()
}

fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_stream_without_include_usage_is_measured_and_the_client_gets_no_usage_chunk() {
    let h = start(|_| {}).await;
    assert!(
        kvbust::config::Config::default().observe.request_usage,
        "on by default"
    );
    let c = h1();
    let direct = format!("http://{}", h.mock_addr);
    let mut counted = 0u64;
    for (path, body) in [
        (
            "/v1/chat/completions",
            serde_json::json!({"model": "kvbust-mock", "stream": true, "max_tokens": 5,
                "messages": [{"role": "user", "content": "Can I return a tent I used once?"}]}),
        ),
        (
            "/v1/completions",
            serde_json::json!({"model": "kvbust-mock", "stream": true, "max_tokens": 5,
                "prompt": "The capital of France is"}),
        ),
    ] {
        let body = body.to_string();
        let before = counter(
            &metrics_text(&h).await,
            "kvbust_upstream_prompt_tokens_total",
        );
        let via = body_bytes(send(&c, post(&h.url(path), body.clone(), &[])).await).await;
        // What the upstream received: the client's bytes plus include_usage.
        let got = h.mock.recorder().requests().last().unwrap().body.clone();
        assert_eq!(
            got,
            format!(
                "{},\"stream_options\":{{\"include_usage\":true}}}}",
                &body[..body.len() - 1]
            )
            .as_bytes(),
            "{path}"
        );
        let after = counter(
            &metrics_text(&h).await,
            "kvbust_upstream_prompt_tokens_total",
        );

        // The same request straight to the mock, which then sends no usage either.
        let straight =
            body_bytes(send(&c, post(&format!("{direct}{path}"), body.clone(), &[])).await).await;
        assert!(
            !String::from_utf8_lossy(&straight).contains("\"usage\""),
            "{path}: the mock sends no usage unless asked"
        );
        assert!(
            !String::from_utf8_lossy(&via).contains("\"usage\""),
            "{path}: no usage chunk or member reached the client: {}",
            String::from_utf8_lossy(&via)
        );
        let (v, s) = (masked(&via), masked(&straight));
        assert!(v.len() >= 6, "{path}: tokens, finish and [DONE]: {v:?}");
        assert_eq!(
            v, s,
            "{path}: event for event what the upstream sends unasked"
        );

        // And what kvbust counted is the upstream's own count for this prompt.
        let mut asked: serde_json::Value = serde_json::from_str(&body).unwrap();
        asked["stream_options"] = serde_json::json!({"include_usage": true});
        let with_usage =
            body_bytes(send(&c, post(&format!("{direct}{path}"), asked.to_string(), &[])).await)
                .await;
        let usage = sse_data(&with_usage)
            .iter()
            .filter(|d| *d != "[DONE]")
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .find_map(|v| v["usage"]["prompt_tokens"].as_u64())
            .expect("the mock reports usage when asked");
        assert!(usage > 0);
        assert_eq!(
            after - before,
            usage as f64,
            "{path}: kvbust_upstream_prompt_tokens_total moved by the prompt"
        );
        counted += usage;
    }
    let m = metrics_text(&h).await;
    assert_eq!(
        counter(&m, "kvbust_upstream_prompt_tokens_total"),
        counted as f64,
        "{m}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn request_usage_off_leaves_such_a_stream_alone_and_unmeasured() {
    let h = start(|c| c.observe.request_usage = false).await;
    let body = serde_json::json!({"model": "kvbust-mock", "stream": true, "max_tokens": 3,
        "messages": [{"role": "user", "content": "Hello"}]})
    .to_string();
    let via = body_bytes(
        send(
            &h1(),
            post(&h.url("/v1/chat/completions"), body.clone(), &[]),
        )
        .await,
    )
    .await;
    assert!(sse_data(&via).len() >= 4);
    assert_eq!(
        h.mock.recorder().requests().last().unwrap().body,
        body.as_bytes()
    );
    let m = metrics_text(&h).await;
    assert_eq!(
        counter(&m, "kvbust_upstream_prompt_tokens_total"),
        0.0,
        "{m}"
    );
    h.shutdown().await;
}
