//! Isolation by `cache_salt` (`cache_bust.method = "salt"`, issue 40) through the running
//! proxy: the salt every target and phase gives on chat, completions and Responses, with the
//! prompt bytes exactly the client's (collected, whole and flowing bodies); a client's own salt
//! kept as the tail; vLLM's limits refused with a 400 naming them; Anthropic Messages falling
//! back to the marker.

use bytes::Bytes;
use http::StatusCode;
use tokio::sync::oneshot;

use crate::common::*;
use crate::inflow::{raw_post_with, raw_upstream};
use kvbust::cachebust::{digest, DigestInputs, Method, Phase, Target};

const TRACE: &str = "trace-salt-1";

/// The digest the explicit headers below name (the harness's benchmark id).
fn rid() -> String {
    digest(&DigestInputs {
        benchmark_id: "0123456789ab".into(),
        recycle_pass: 0,
        trajectory_index: 0,
        trace_id: TRACE.into(),
    })
}

/// The salt the contract gives `target` in `phase`.
fn want_salt(target: Target, phase: Phase) -> Option<String> {
    match target {
        Target::None => None,
        Target::WarmupIsolationSystem | Target::WarmupIsolationFirstTurn => {
            (phase == Phase::Warmup).then(|| "kvbust-warmup-0123456789ab".to_string())
        }
        _ => Some(format!("kvbust-{}", rid())),
    }
}

/// `original` with `"cache_salt":"<salt>"` as its last member: the only bytes kvbust may add.
fn with_salt(original: &str, salt: Option<&str>) -> Vec<u8> {
    let Some(salt) = salt else {
        return original.as_bytes().to_vec();
    };
    let close = original.rfind('}').unwrap();
    format!(
        "{},\"cache_salt\":\"{salt}\"{}",
        &original[..close],
        &original[close..]
    )
    .into_bytes()
}

/// A body of `route` with a system prompt and a user turn; `pad` bytes of extra user text
/// (large bodies take the whole-body-read-apart path on chat).
fn body(route: &str, pad: usize) -> String {
    let long = "lorem ipsum dolor sit amet ".repeat(pad / 27 + 1);
    match route {
        "/v1/chat/completions" => format!(
            r#"{{"model":"kvbust-mock","messages":[{{"role":"system","content":"be brief"}},{{"role":"user","content":"hello {long}"}}],"max_tokens":2 , "temperature":0.50}}"#
        ),
        "/v1/completions" => {
            format!(r#"{{"model":"kvbust-mock","prompt":"hello {long}","max_tokens":2}}"#)
        }
        _ => format!(
            r#"{{"model":"kvbust-mock","instructions":"be brief","input":"hello {long}","max_output_tokens":2}}"#
        ),
    }
}

fn headers(target: Target, phase: Phase) -> Vec<(&'static str, &'static str)> {
    vec![
        ("x-kvbust-target", target.as_str()),
        ("x-kvbust-phase", phase.as_str()),
        ("x-kvbust-trace-id", TRACE),
    ]
}

#[tokio::test]
async fn every_target_and_phase_gets_its_salt_and_the_prompt_bytes_go_unchanged() {
    // Marker by default: the header switches each request to salt; a second proxy configured
    // with salt (and marking in flight off) covers the configuration and the collected path.
    let by_header = start(|_| {}).await;
    let by_config = start(|c| {
        c.cache_bust.method = Method::Salt;
        c.cache_bust.mark_in_flight = false;
    })
    .await;
    let client = h1();
    let mut checked = 0;
    for (h, header) in [(&by_header, true), (&by_config, false)] {
        for route in ["/v1/chat/completions", "/v1/completions", "/v1/responses"] {
            // Small (parsed whole) and 20 KiB (chat: read apart from its first messages).
            for pad in [0, 20 * 1024] {
                for target in Target::ALL {
                    for phase in Phase::ALL {
                        let original = body(route, pad);
                        let mut hs = headers(target, phase);
                        if header {
                            hs.push(("x-kvbust-method", "salt"));
                        }
                        let resp = send(&client, post(&h.url(route), original.clone(), &hs)).await;
                        let ctx = format!("{route} pad {pad} {target} {phase} header {header}");
                        assert_eq!(resp.status(), StatusCode::OK, "{ctx}");
                        let _ = body_bytes(resp).await;
                        let got = h.mock.recorder().requests().pop().unwrap();
                        let salt = want_salt(target, phase);
                        assert_eq!(
                            String::from_utf8_lossy(&got.body),
                            String::from_utf8_lossy(&with_salt(&original, salt.as_deref())),
                            "{ctx}"
                        );
                        assert!(got.headers.get("x-kvbust-method").is_none(), "{ctx}");
                        checked += 1;
                    }
                }
            }
        }
    }
    assert_eq!(checked, 2 * 3 * 2 * 7 * 2);
    by_header.shutdown().await;
    by_config.shutdown().await;
}

#[tokio::test]
async fn a_flowing_body_gets_its_salt_at_its_end_and_its_prompt_goes_as_it_came() {
    let (upstream, mut progress, mut seen) = raw_upstream(64 * 1024).await;
    let h = start_proxy(&upstream, |c| {
        c.cache_bust.target = Target::FirstTurnPrefix;
        c.cache_bust.method = Method::Salt;
    })
    .await;
    // A client salt before `messages` (the scan holds from it) and none at all.
    for client_salt in [None, Some("tenant-b")] {
        let lead = client_salt.map_or(String::new(), |s| format!(r#""cache_salt":"{s}","#));
        let text = "a long agentic context line; ".repeat(20_000);
        let original = format!(
            r#"{{{lead}"model":"m","messages":[{{"role":"user","content":"task"}},{{"role":"assistant","content":"{text}"}}],"max_tokens":2}}"#
        );
        let (go, wait) = oneshot::channel();
        let hs = format!("x-kvbust-trace-id: {TRACE}\r\n");
        let (addr, b) = (h.proxy_addr, Bytes::from(original.clone()));
        let client = tokio::spawn(async move { raw_post_with(addr, &hs, b, 300_000, wait).await });
        if client_salt.is_none() {
            // Without a client salt the body flows before it has all come: the upstream has
            // 64 KiB while the client still holds the rest back (a "never happens" bound).
            tokio::time::timeout(std::time::Duration::from_secs(30), progress.recv())
                .await
                .expect("the body flowed")
                .unwrap();
        }
        go.send(()).unwrap();
        let status = client.await.unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        let got = seen.recv().await.unwrap();
        let want = match client_salt {
            None => with_salt(&original, Some(&format!("kvbust-{}", rid()))),
            Some(s) => original
                .replacen(
                    &format!(r#""cache_salt":"{s}""#),
                    &format!(r#""cache_salt":"kvbust-{}-{s}""#, rid()),
                    1,
                )
                .into_bytes(),
        };
        assert!(got.body == want, "{client_salt:?}");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_client_salt_is_kept_as_the_tail_and_vllm_limits_are_a_400() {
    let h = start(|c| {
        c.cache_bust.target = Target::SystemPrefix;
        c.cache_bust.method = Method::Salt;
    })
    .await;
    let client = h1();
    let hs = [("x-kvbust-trace-id", TRACE)];
    let tail = |salt: &str| {
        format!(
            r#"{{"cache_salt":{salt},"model":"kvbust-mock","messages":[{{"role":"user","content":"hi"}}],"max_tokens":1}}"#
        )
    };
    // Kept as the tail; `null` counts as absent.
    for (client_salt, want) in [
        (r#""tenant-a""#, format!(r#""kvbust-{}-tenant-a""#, rid())),
        ("null", format!(r#""kvbust-{}""#, rid())),
    ] {
        let original = tail(client_salt);
        let url = h.url("/v1/chat/completions");
        let resp = send(&client, post(&url, original.clone(), &hs)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = body_bytes(resp).await;
        let got = h.mock.recorder().requests().pop().unwrap();
        let want = original.replacen(client_salt, &want, 1);
        assert_eq!(String::from_utf8_lossy(&got.body), want);
    }
    // Past vLLM's limits: a 400 naming the limit, nothing forwarded.
    let before = h.mock.recorder().requests().len();
    let room = 128 - "kvbust-".len() - 12 - 1;
    for (salt, code, names) in [
        (
            format!("\"{}\"", "x".repeat(room + 1)),
            "cache_salt_too_long",
            "at most 128",
        ),
        (
            "\"a/b\"".to_string(),
            "cache_salt_forbidden_character",
            "'/'",
        ),
        (
            "\"a@b\"".to_string(),
            "cache_salt_forbidden_character",
            "'@'",
        ),
        ("[\"a\"]".to_string(), "invalid_cache_salt", "array"),
    ] {
        let url = h.url("/v1/chat/completions");
        let resp = send(&client, post(&url, tail(&salt), &hs)).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{salt}");
        let v = json(resp).await;
        assert_eq!(v["error"]["code"], code, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(names), "{msg}");
    }
    // The longest tail that fits passes.
    let url = h.url("/v1/chat/completions");
    let fits = format!("\"{}\"", "x".repeat(room));
    let resp = send(&client, post(&url, tail(&fits), &hs)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let _ = body_bytes(resp).await;
    assert_eq!(h.mock.recorder().requests().len(), before + 1);
    h.shutdown().await;
}

#[tokio::test]
async fn anthropic_messages_fall_back_to_the_marker_and_say_so() {
    let h = start(|c| {
        c.cache_bust.target = Target::FirstTurnPrefix;
        c.cache_bust.method = Method::Salt;
    })
    .await;
    let client = h1();
    let original =
        r#"{"model":"kvbust-mock","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..2 {
        let hs = [("x-kvbust-trace-id", TRACE)];
        let resp = send(&client, post(&h.url("/v1/messages"), original, &hs)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = body_bytes(resp).await;
        let got = h.mock.recorder().requests().pop().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
        assert!(v.get("cache_salt").is_none(), "{v}");
        let marker = format!("[rid:{}]\n\nhi", rid());
        assert_eq!(v["messages"][0]["content"], marker.as_str(), "{v}");
    }
    let text = metrics_text(&h).await;
    assert!(text.contains("kvbust_salt_fallback_total 2"), "{text}");
    // And in the run report's row.
    let r = crate::cache_model::report(&h).await;
    assert_eq!(r.rows.len(), 1, "{:?}", r.rows);
    assert_eq!(r.rows[0].salt_fallbacks, 2, "{:?}", r.rows[0]);
    // Chat on the same proxy takes the salt, and the fallback count stays.
    let resp = chat(&client, &h, chat_body("hi", false, 1)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let _ = body_bytes(resp).await;
    let got = h.mock.recorder().requests().pop().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    assert!(
        v["cache_salt"].as_str().unwrap().starts_with("kvbust-"),
        "{v}"
    );
    assert!(metrics_text(&h)
        .await
        .contains("kvbust_salt_fallback_total 2"));
    h.shutdown().await;
}

#[tokio::test]
async fn an_unknown_method_header_is_a_400_naming_the_values() {
    let h = start(|c| c.cache_bust.target = Target::FirstTurnPrefix).await;
    let hs = [("x-kvbust-method", "pepper")];
    let url = h.url("/v1/chat/completions");
    let resp = send(&h1(), post(&url, chat_body("hi", false, 1), &hs)).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let v = json(resp).await;
    assert_eq!(v["error"]["code"], "invalid_method");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("marker, salt") && msg.contains("x-kvbust-method"),
        "{msg}"
    );
    h.shutdown().await;
}

/// The cache model under salt isolation: Qwen3 with its chat template and 16-token blocks on
/// both sides, both caches unbounded, every target and both phases, multi-turn conversations
/// with a shared system prompt: the model (whose index is keyed by the forwarded `cache_salt`,
/// as the mock's cache is) predicts exactly what the mock reports, for every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predictions_equal_the_mocks_report_under_salt_for_every_target_and_phase() {
    use crate::cache_model::{qwen3_mock, report, run_conversation, sonnet_conversations};
    use kvbust::mock::MockTokenizerSetting;
    let conversations = sonnet_conversations(70);
    let mut hits = 0;
    for (t, target) in Target::ALL.into_iter().enumerate() {
        let h = start_with(qwen3_mock(10_000_000), |c| {
            c.cache_model.tokenizer = Some(MockTokenizerSetting::Qwen3);
            c.cache_bust.target = target;
            c.cache_bust.method = Method::Salt;
        })
        .await;
        let client = h1();
        for (p, phase) in Phase::ALL.into_iter().enumerate() {
            for c in &conversations[t * 10 + p * 5..t * 10 + p * 5 + 5] {
                run_conversation(&client, &h, c, &[("x-kvbust-phase", phase.as_str())]).await;
            }
        }
        // Every salted request reached the mock with the prompt as sent and a salt.
        let salted = h
            .mock
            .recorder()
            .requests()
            .iter()
            .filter(|r| {
                serde_json::from_slice::<serde_json::Value>(&r.body)
                    .is_ok_and(|v| v["cache_salt"].is_string())
            })
            .count();
        let want = match target {
            Target::None => 0,
            t if t.is_warmup_isolation() => 15,
            _ => 30,
        };
        assert_eq!(salted, want, "{target}");
        let r = report(&h).await;
        assert_eq!(r.rows.len(), 2, "{target}: {:?}", r.rows);
        for row in &r.rows {
            let what = format!("{} {}", row.phase, row.target);
            assert_eq!(row.accounted_requests, 15, "{what}");
            crate::cache_model::assert_predicted_as_reported(row, &what);
            assert_eq!(row.breaches.total(), 0, "{what}: {row:?}");
            hits += row.cached_tokens.predicted;
        }
        h.shutdown().await;
    }
    assert!(hits > 0, "later turns reuse earlier ones");
}

/// The point of the salt: the workload's tokens are the workload's. The same five
/// conversations sent in warmup and again in profiling: under `salt` every target's prompt
/// tokens equal target `none`'s, in both phases; under `marker` the RID marker adds tokens to
/// both phases and the warmup marker to the warmup phase only. Prints the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_salt_prompt_tokens_are_the_workloads_where_markers_change_them() {
    use crate::cache_model::{qwen3_mock, report, run_conversation, sonnet_conversations};
    use kvbust::mock::MockTokenizerSetting;
    let conversations = sonnet_conversations(5);
    let mut tokens = std::collections::HashMap::new();
    for method in Method::ALL {
        for target in [
            Target::None,
            Target::FirstTurnPrefix,
            Target::WarmupIsolationFirstTurn,
        ] {
            let h = start_with(qwen3_mock(10_000_000), |c| {
                c.cache_model.tokenizer = Some(MockTokenizerSetting::Qwen3);
                c.cache_bust.target = target;
                c.cache_bust.method = method;
            })
            .await;
            let client = h1();
            for phase in Phase::ALL {
                for c in &conversations {
                    run_conversation(&client, &h, c, &[("x-kvbust-phase", phase.as_str())]).await;
                }
            }
            for row in report(&h).await.rows {
                let reported = row.prompt_tokens.reported.unwrap();
                println!(
                    "method {method} target {} phase {}: prompt_tokens {reported}, cached {:?}",
                    row.target, row.phase, row.cached_tokens.reported
                );
                tokens.insert((method, target, row.phase.clone()), reported);
            }
            h.shutdown().await;
        }
    }
    let get = |m, t, p: Phase| tokens[&(m, t, p.as_str().to_string())];
    let (w, p) = (Phase::Warmup, Phase::Profiling);
    let workload = get(Method::Marker, Target::None, p);
    assert_eq!(get(Method::Marker, Target::None, w), workload);
    for t in [Target::FirstTurnPrefix, Target::WarmupIsolationFirstTurn] {
        assert_eq!(get(Method::Salt, t, w), workload, "{t}");
        assert_eq!(get(Method::Salt, t, p), workload, "{t}");
    }
    assert!(get(Method::Marker, Target::FirstTurnPrefix, w) > workload);
    assert!(get(Method::Marker, Target::FirstTurnPrefix, p) > workload);
    assert!(get(Method::Marker, Target::WarmupIsolationFirstTurn, w) > workload);
    assert_eq!(
        get(Method::Marker, Target::WarmupIsolationFirstTurn, p),
        workload
    );
}

/// An upstream that ignores `cache_salt` (a front that drops it before the mock) reuses one
/// session's system prompt for another: more than salt isolation allows. The report's row
/// counts it (`salt_ignored`) and `serve` warns once; in front of the mock itself (which
/// honours the salt) nothing is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_ignores_the_salt_is_named_in_the_report() {
    use crate::probe::{mock, salt_front, SaltFront};
    let system = "You are a patient tutor who answers every question in full sentences. ".repeat(6);
    let (_ms, _fs, ignoring) = salt_front(SaltFront::Ignore).await;
    let (_m, honouring) = mock().await;
    for (upstream, ignored) in [(ignoring, true), (honouring, false)] {
        let h = start_proxy(&upstream, |c| {
            c.cache_model.tokenizer = Some(kvbust::mock::MockTokenizerSetting::Qwen3);
            c.cache_bust.target = Target::FirstTurnPrefix;
            c.cache_bust.method = Method::Salt;
        })
        .await;
        for session in ["s1", "s2", "s3"] {
            let body = serde_json::json!({"model": "kvbust-mock", "max_tokens": 1, "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("question of {session}")}]});
            let hs = [("x-correlation-id", session)];
            let url = h.url("/v1/chat/completions");
            let resp = send(&h1(), post(&url, body.to_string(), &hs)).await;
            assert_eq!(resp.status(), StatusCode::OK);
            let _ = body_bytes(resp).await;
        }
        let r = crate::cache_model::report(&h).await;
        let row = &r.rows[0];
        let want = if ignored { 2 } else { 0 };
        assert_eq!(row.salt_ignored, want, "{row:?}");
        // The verdict says so: isolation by a salt the upstream ignores cannot be trusted.
        let untrusted = r.verdict.message.contains("cannot be trusted");
        assert_eq!(untrusted, want > 0, "{}", r.verdict.message);
        h.shutdown().await;
    }
}
