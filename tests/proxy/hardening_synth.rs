//! Issue 23 (hardening round two), the synthesis and marking side: every expansion kvbust makes
//! of a client's body is bounded by `limits.max_body`, charged to `limits.max_buffered_total`
//! before it is built, and capped in count. In-process, port 0, no timing.

use crate::common::*;
use kvbust::cachebust::Target;
use kvbust::config::ByteSize;

/// `{"prompt":["","",…]}` with `n` empty prompts.
fn prompt_list(n: usize) -> String {
    let mut s = String::from(r#"{"model":"m","max_tokens":1,"prompt":["#);
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(r#""""#);
    }
    s.push_str("]}");
    s
}

async fn completions(h: &Harness, body: String) -> (u16, serde_json::Value) {
    let resp = send(&h1(), post(&h.url("/v1/completions"), body, &[])).await;
    let status = resp.status().as_u16();
    let b = body_bytes(resp).await;
    (status, serde_json::from_slice(&b).unwrap_or_default())
}

/// The JSON spelling of a RID prefix marker, `[rid:<12 hex>]\n\n`, as it lands in each prompt.
const MARKER_JSON_LEN: usize = r"[rid:0123456789ab]\n\n".len();

/// Item 3: the number of prompts marked is capped (`cache_bust.max_marked_prompts`): one more
/// is a 400 naming the key, and nothing reaches the upstream.
#[tokio::test]
async fn a_prompt_list_longer_than_the_cap_is_a_400_naming_the_key() {
    let h = start(|c| {
        c.cache_bust.target = Target::SystemPrefix;
        c.cache_bust.max_marked_prompts = 100;
    })
    .await;
    let (status, v) = completions(&h, prompt_list(101)).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "too_many_prompts", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("cache_bust.max_marked_prompts"), "{msg}");
    assert!(h.mock.recorder().requests().is_empty());
    let (status, v) = completions(&h, prompt_list(100)).await;
    assert_eq!(status, 200, "{v}");
    let sent = h.mock.recorder().requests();
    assert_eq!(sent.len(), 1);
    let prompts: serde_json::Value = serde_json::from_slice(&sent[0].body).unwrap();
    let prompts = prompts["prompt"].as_array().unwrap();
    assert_eq!(prompts.len(), 100);
    assert!(prompts
        .iter()
        .all(|p| p.as_str().unwrap().starts_with("[rid:")));
    h.shutdown().await;
}

/// Item 3: a marked prompt list is re-checked against `limits.max_body`, as expanded
/// placeholders are: a body under the limit whose markers take it over is a 413, not an
/// upstream body 8x the limit.
#[tokio::test]
async fn marking_a_prompt_list_past_max_body_is_a_413() {
    let n = 3000;
    let body = prompt_list(n);
    let limit = 64 << 10;
    assert!(body.len() < limit && body.len() + n * MARKER_JSON_LEN > limit);
    let h = start(|c| {
        c.cache_bust.target = Target::SystemPrefix;
        c.cache_bust.max_marked_prompts = 10_000;
        c.limits.max_body = ByteSize(limit as u64);
    })
    .await;
    let (status, v) = completions(&h, body).await;
    assert_eq!(status, 413, "{v}");
    assert!(h.mock.recorder().requests().is_empty());
    assert_eq!(h.runtime.bodies.used(), 0);
    h.shutdown().await;
}

/// Item 3: the marked body is charged to the buffer budget before it is built, next to the
/// client's body it is built from (both are held until the splice ends): a budget that holds
/// either alone but not both refuses at once with a 503.
#[tokio::test]
async fn the_marked_body_is_charged_to_the_budget_with_the_body_it_is_built_from() {
    let n = 2000;
    let body = prompt_list(n);
    let marked = body.len() + n * MARKER_JSON_LEN;
    let budget = marked + 2000;
    assert!(budget < body.len() + marked);
    let h = start(|c| {
        c.cache_bust.target = Target::SystemPrefix;
        c.cache_bust.max_marked_prompts = 10_000;
        c.limits.max_body = ByteSize(budget as u64);
        c.limits.max_buffered_total = ByteSize(budget as u64);
    })
    .await;
    let (status, v) = completions(&h, body).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "buffer_budget_exhausted", "{v}");
    assert!(h.mock.recorder().requests().is_empty());
    assert_eq!(h.runtime.bodies.used(), 0);
    // Half the prompts fit: both copies are within the budget.
    let (status, v) = completions(&h, prompt_list(n / 2)).await;
    assert_eq!(status, 200, "{v}");
    h.shutdown().await;
}

/// Item 5: an evicted placeholder lane restarted its seeded stream, so with more than 32 lengths
/// in use the same "fresh" prompt went upstream again (and the mock counted a cache hit). 40
/// lengths, each used twice: the 80 prompts sent upstream are all different, and each length's
/// second prompt is the second of its lane's stream (its place survived eviction).
#[tokio::test]
async fn placeholder_prompts_never_repeat_past_32_lengths() {
    use kvbust::synth::prompt::placeholders::lane_seed;
    use kvbust::synth::{PromptCorpus, PromptStream, RandomCorpusStyle, Tokenizer};
    let h = start(|c| {
        c.synth.placeholder_seed = Some(11);
        c.synth.placeholder_prefetch = 0;
        c.synth.placeholder_corpus = PromptCorpus::Random;
    })
    .await;
    let lengths: Vec<usize> = (2..42).collect();
    let mut sent = Vec::new();
    for _round in 0..2 {
        for chunk in lengths.chunks(8) {
            let content: Vec<String> = chunk
                .iter()
                .map(|n| format!("\u{1}{{{{kvbust:prompt:{n}}}}}"))
                .collect();
            let body = chat_body(&content.concat(), false, 1);
            let resp = chat(&h1(), &h, body).await;
            assert_eq!(resp.status(), 200);
            body_bytes(resp).await;
            let req = h.mock.recorder().requests().pop().unwrap();
            let v: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
            let text = v["messages"][0]["content"].as_str().unwrap().to_owned();
            let prompts: Vec<String> = text.split('\u{1}').skip(1).map(str::to_owned).collect();
            assert_eq!(prompts.len(), chunk.len(), "{text}");
            sent.extend(chunk.iter().copied().zip(prompts));
        }
    }
    let distinct: std::collections::HashSet<&String> = sent.iter().map(|(_, p)| p).collect();
    assert_eq!(
        distinct.len(),
        sent.len(),
        "a placeholder prompt was sent twice"
    );
    let tok = std::sync::Arc::new(Tokenizer::default_qwen3().unwrap());
    for &n in &[2usize, 20, 41] {
        let mut stream = PromptStream::new(
            tok.clone(),
            PromptCorpus::Random,
            RandomCorpusStyle::Vllm,
            None,
            Some(lane_seed(11, PromptCorpus::Random, n)),
            kvbust::app::default_cache_dir().as_deref(),
        )
        .unwrap();
        let want = [stream.prompt(n).unwrap(), stream.prompt(n).unwrap()];
        let got: Vec<&String> = sent
            .iter()
            .filter(|(m, _)| *m == n)
            .map(|(_, p)| p)
            .collect();
        assert_eq!(got, [&want[0], &want[1]], "length {n}");
    }
    h.shutdown().await;
}

/// One raw HTTP/1.1 chat request from `source` (a 127.0.0.x address): (status, body).
async fn chat_from(proxy: std::net::SocketAddr, source: [u8; 4], content: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind((std::net::Ipv4Addr::from(source), 0).into())
        .unwrap();
    let mut s = sock.connect(proxy).await.unwrap();
    let body = chat_body(content, false, 1);
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// Issue 34 item 4: the per-client placeholder queue was defeated by many source addresses (80
/// threads from 10 addresses asking new coding lengths: a victim asking a length already built
/// got 503 on every request). New lanes take at most `synth.placeholder_build_share` of the
/// places (and wait for the build budget, spent here by the victim's first request, in them);
/// the rest is kept for lengths already built. Ten addresses ask new lengths: two get the new
/// share, eight a 503; the victim's built length is then served, every time, and only a new
/// length of its own is refused. Outcomes only: nothing here depends on time.
#[tokio::test]
async fn a_built_placeholder_length_is_served_while_many_addresses_ask_new_ones() {
    use kvbust::synth::PromptCorpus;
    let h = start(|c| {
        c.synth.placeholder_corpus = PromptCorpus::Sonnet;
        c.synth.placeholder_prefetch = 0;
        c.synth.placeholder_queue = 4;
        c.synth.placeholder_queue_per_client = 1;
        c.synth.placeholder_build_share = 0.5;
        // The victim's first (new) length spends the budget for far longer than this test.
        c.synth.placeholder_build_cpu = 1e-6;
        c.synth.placeholder_build_window = std::time::Duration::from_millis(100);
    })
    .await;
    let victim = [127, 0, 0, 200];
    let (status, body) = chat_from(h.proxy_addr, victim, "{{kvbust:prompt:50}}").await;
    assert_eq!(status, 200, "{body}");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let flood: Vec<_> = (0..10u8)
        .map(|i| {
            let (tx, proxy) = (tx.clone(), h.proxy_addr);
            let content = format!("{{{{kvbust:prompt:{}}}}}", 100 + usize::from(i));
            tokio::spawn(
                async move { tx.send(chat_from(proxy, [127, 0, 0, 11 + i], &content).await) },
            )
        })
        .collect();
    // The eight answered while the new lanes' share is held are refused at once.
    for _ in 0..8 {
        let (status, body) = rx.recv().await.unwrap();
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("placeholder_queue_full"), "{body}");
        assert!(body.contains("synth.placeholder_build_share"), "{body}");
    }
    for _ in 0..3 {
        let (status, body) = chat_from(h.proxy_addr, victim, "{{kvbust:prompt:50}}").await;
        assert_eq!(status, 200, "the victim's built length: {body}");
    }
    let (status, body) = chat_from(h.proxy_addr, victim, "{{kvbust:prompt:51}}").await;
    assert_eq!(status, 503, "a new length waits for the new share: {body}");
    let sent = h.mock.recorder().requests();
    assert_eq!(
        sent.len(),
        4,
        "the victim's four 200s, nothing of the flood"
    );
    assert!(sent
        .iter()
        .all(|r| !String::from_utf8_lossy(&r.body).contains("{{kvbust:")));
    assert!(
        rx.try_recv().is_err(),
        "the two holding the share still wait"
    );
    for f in flood {
        f.abort();
    }
    h.shutdown().await;
}
