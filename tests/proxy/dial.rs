//! The cache-hit dial (`x-kvbust-hit-ratio`, issue 40) through the running proxy, against the
//! mock with the shipped Qwen3 tokenizer and template and 16-token blocks on both sides:
//! synthesized prompts of 500 to 8,000 tokens, warmed once, then profiled at several dials;
//! each request's reported cached count is the block boundary at or after `R × prompt tokens`
//! (within one block of the target), the bytes around the marker are the client's, and the
//! cache model predicts what the mock reports.

use http::StatusCode;
use serde_json::{json, Value};

use crate::cache_model::{qwen3_mock, report};
use crate::common::*;
use kvbust::mock::MockTokenizerSetting;
use kvbust::synth::corpus::sonnet::SHAKESPEARE;

/// `count` chat bodies of about 500 to 8,000 Qwen3 tokens (2,000 to 29,000 characters of the
/// sonnet corpus, from places and of lengths drawn by a fixed LCG); every other one with a
/// system prompt.
fn prompts(count: usize) -> Vec<String> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        x >> 33
    };
    let text = SHAKESPEARE;
    (0..count)
        .map(|i| {
            let len = 2_000 + (next() as usize % 27_000);
            let mut start = next() as usize % (text.len() - len - 8);
            while !text.is_char_boundary(start) {
                start += 1;
            }
            let mut end = start + len;
            while !text.is_char_boundary(end) {
                end += 1;
            }
            let user = format!("Passage {i}:\n{}", &text[start..end]);
            let mut messages = vec![];
            if i % 2 == 0 {
                messages.push(json!({"role": "system", "content": "You are a careful reader."}));
            }
            messages.push(json!({"role": "user", "content": user}));
            json!({"model": "kvbust-mock", "messages": messages, "max_tokens": 1}).to_string()
        })
        .collect()
}

fn usage(v: &Value) -> (u64, u64) {
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    )
}

/// The forwarded body with its one dial marker taken out, and the marker.
fn unmarked(body: &[u8]) -> (String, String) {
    let s = String::from_utf8(body.to_vec()).unwrap();
    let at = s.find("[dial:").expect("a dial marker");
    let marker = s[at..at + 23].to_string();
    assert!(marker.ends_with(']'), "{marker}");
    assert!(
        marker[6..22].bytes().all(|b| b.is_ascii_hexdigit()),
        "{marker}"
    );
    (s.replacen(&marker, "", 1), marker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dial_caches_its_share_of_every_warmed_prompt() {
    // 100 prompts, 600 requests of up to 8k tokens, each tokenized by the dial (twice), the
    // mock and the cache model: about a minute here. The issue's 200 (1,200 requests) ran the
    // same way in 148 s on the loaded 2-core machine, all 1,000 dialled requests exact.
    let bodies = prompts(100);
    let h = start_with(qwen3_mock(100_000_000), |c| {
        c.cache_model.tokenizer = Some(MockTokenizerSetting::Qwen3);
    })
    .await;
    let client = h1();
    let url = h.url("/v1/chat/completions");
    let bs = 16u64;
    let mut n = Vec::with_capacity(bodies.len());
    for b in &bodies {
        let hs = [("x-kvbust-phase", "warmup")];
        let v = json(send(&client, post(&url, b.clone(), &hs)).await).await;
        let (prompt, cached) = usage(&v);
        // Cold but for the template's opening and the shared system prompt.
        assert!(cached <= 2 * bs, "{cached}");
        assert!((450..8_100).contains(&prompt), "{prompt} tokens");
        n.push(prompt);
    }
    let mut markers = std::collections::HashSet::new();
    let mut exact = 0;
    let ratios = ["0.1", "0.25", "0.5", "0.75", "0.9"];
    for r in ratios {
        let ratio: f64 = r.parse().unwrap();
        for (i, b) in bodies.iter().enumerate() {
            let hs = [("x-kvbust-phase", "profiling"), ("x-kvbust-hit-ratio", r)];
            let resp = send(&client, post(&url, b.clone(), &hs)).await;
            assert_eq!(resp.status(), StatusCode::OK);
            let (prompt, cached) = usage(&json(resp).await);
            let target = ratio * n[i] as f64;
            let boundary = (target.ceil() as u64).div_ceil(bs) * bs;
            assert!(
                (cached as f64 - target).abs() <= bs as f64,
                "R {r} prompt {i}: {cached} cached of {} (target {target:.1})",
                n[i]
            );
            exact += u64::from(cached == boundary);
            assert!(prompt > n[i], "the marker adds tokens");
            // The bytes the mock got are the client's, with the marker in one place.
            let got = h.mock.recorder().requests().pop().unwrap();
            let (rest, marker) = unmarked(&got.body);
            assert_eq!(&rest, b, "R {r} prompt {i}");
            assert!(markers.insert(marker), "request-unique");
        }
    }
    let total = (ratios.len() * bodies.len()) as u64;
    println!("dial: {exact} of {total} requests cached exactly the boundary block count");
    assert_eq!(
        exact, total,
        "every marker lands in the block right after its boundary"
    );
    // The model's thread (niced, on a loaded machine) may trail 1,200 long prompts: a bound
    // that only a hang reaches.
    let settled = h
        .runtime
        .cache_model
        .settle(std::time::Duration::from_secs(600))
        .await;
    assert!(settled, "the cache model counted every request");
    let r = report(&h).await;
    let row = r.rows.iter().find(|r| r.phase == "profiling").unwrap();
    assert_eq!(row.dialled_requests, total);
    let mean = ratios
        .iter()
        .map(|r| r.parse::<f64>().unwrap())
        .sum::<f64>()
        / 5.0;
    assert!((row.hit_ratio.unwrap() - mean).abs() < 1e-9, "{row:?}");
    assert_eq!(row.divergent_requests, 0, "{row:?}");
    assert_eq!(
        row.cached_tokens.reported,
        Some(row.cached_tokens.predicted)
    );
    println!(
        "dial report: profiling hit_ratio {:.2}, predicted hit rate {:.4}, reported {:.4}",
        row.hit_ratio.unwrap(),
        row.predicted_hit_rate().unwrap(),
        row.reported_hit_rate().unwrap()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_bad_dial_is_a_400_and_responses_cannot_take_one() {
    let h = start(|_| {}).await;
    let client = h1();
    for bad in ["1.5", "-0.1", "half", "NaN"] {
        let hs = [("x-kvbust-hit-ratio", bad)];
        let url = h.url("/v1/chat/completions");
        let resp = send(&client, post(&url, chat_body("hi", false, 1), &hs)).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{bad}");
        let v = json(resp).await;
        assert_eq!(v["error"]["code"], "invalid_hit_ratio", "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("from 0 to 1"));
    }
    let hs = [("x-kvbust-hit-ratio", "0.5")];
    let body = r#"{"model":"kvbust-mock","input":"hi","max_output_tokens":1}"#;
    let resp = send(&client, post(&h.url("/v1/responses"), body, &hs)).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json(resp).await["error"]["code"], "dial_unsupported");
    h.shutdown().await;
}

/// Issue 40 (5): a dialled run's report, as the admin port answers it when the run closes,
/// carries per phase × target the dial, the predicted and the reported hit rate, and every
/// form of it shows them: the table, markdown, HTML, runs side by side and `kvbust run`'s
/// summary. Warmup, which ran without a dial, shows none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialled_runs_report_shows_the_dial_beside_the_hit_rates() {
    use kvbust::report::render::{self, Colour, Format};
    use kvbust::report::Report;

    let bodies = prompts(4);
    let h = start_with(qwen3_mock(100_000), |c| {
        c.cache_model.tokenizer = Some(MockTokenizerSetting::Qwen3);
    })
    .await;
    let client = h1();
    let admin = |path: &str| {
        http::Request::post(h.admin_url(path))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap()
    };
    let open = http::Request::post(h.admin_url("/runs"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            json!({"name": "r0.5"}).to_string(),
        )))
        .unwrap();
    assert_eq!(send(&client, open).await.status(), StatusCode::OK);
    let url = h.url("/v1/chat/completions");
    let mut want_cached = 0;
    for (phase, dial) in [("warmup", None), ("profiling", Some("0.5"))] {
        for b in &bodies {
            let mut hs = vec![("x-kvbust-phase", phase)];
            hs.extend(dial.map(|r| ("x-kvbust-hit-ratio", r)));
            let v = json(send(&client, post(&url, b.clone(), &hs)).await).await;
            if dial.is_some() {
                want_cached += usage(&v).1;
            }
        }
    }
    let close = send(&client, admin("/runs/r0.5/close")).await;
    assert_eq!(close.status(), StatusCode::OK);
    let r: Report = serde_json::from_slice(&body_bytes(close).await).unwrap();
    assert!(r.run.complete, "{:?}", r.run);
    let warmup = r.rows.iter().find(|w| w.phase == "warmup").unwrap();
    let profiling = r.rows.iter().find(|w| w.phase == "profiling").unwrap();
    assert_eq!((warmup.hit_ratio, warmup.dialled_requests), (None, 0));
    assert_eq!(
        (profiling.hit_ratio, profiling.dialled_requests),
        (Some(0.5), 4)
    );
    assert_eq!(profiling.cached_tokens.reported, Some(want_cached));
    assert_eq!(
        profiling.cached_tokens.predicted, want_cached,
        "{profiling:?}"
    );
    let (reported, predicted) = (
        profiling.reported_hit_rate().unwrap(),
        profiling.predicted_hit_rate().unwrap(),
    );
    // Each request within one block of half its prompt: the row within a block a request.
    let prompt = profiling.prompt_tokens.reported.unwrap() as f64;
    assert!(
        (reported * prompt - 0.5 * prompt).abs() <= 16.0 * 4.0,
        "{reported}"
    );
    let pct = |v: f64| format!("{:.1}%", v * 100.0);

    // The terminal table: dial, reported, predicted under one "hit rate" heading.
    let table = render::render(&r, Format::Table, Colour::Never);
    let head = table.lines().find(|l| l.starts_with("phase")).unwrap();
    assert!(head.contains("dial  reported  predicted"), "{table}");
    let line = |text: &str, phase: &str| -> Vec<String> {
        let l = text.lines().find(|l| l.starts_with(phase)).unwrap();
        l.split_whitespace().map(String::from).collect()
    };
    assert_eq!(
        line(&table, "profiling")[4..7],
        ["0.5".to_string(), pct(reported), pct(predicted)],
        "{table}"
    );
    assert_eq!(line(&table, "warmup")[4], "-", "{table}");
    // Markdown.
    let md = render::render(&r, Format::Markdown, Colour::Never);
    assert!(md.contains("| hit rate dial | hit rate reported | hit rate predicted |"));
    assert!(
        md.contains(&format!("| 0.5 | {} | {} |", pct(reported), pct(predicted))),
        "{md}"
    );
    // HTML: the exact dial behind its cell.
    let page = render::render(&r, Format::Html, Colour::Never);
    assert!(
        page.contains("data-col=\"hit_ratio\" data-value=\"0.5\">0.5</td>"),
        "{page}"
    );
    assert!(page.contains("<td class=\"num missing\" data-col=\"hit_ratio\">-</td>"));
    // Runs side by side, and what `kvbust run` prints.
    let side = render::render_runs(std::slice::from_ref(&r), Format::Table, Colour::Never);
    assert!(
        side.contains("dial  cached reported  cached predicted"),
        "{side}"
    );
    let summary = render::summary(&r);
    assert!(
        summary.contains(&format!(
            "dial 0.5: cached {} reported, {} predicted",
            pct(reported),
            pct(predicted)
        )),
        "{summary}"
    );
    h.shutdown().await;
}
