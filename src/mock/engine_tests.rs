//! The engine knobs (issue 31) through the mock's handler: one test per knob, in virtual time
//! (paused clocks) where delays matter, with fixed seeds for the jitter and failure draws.

use super::*;
use config::FailureKind;

fn quick() -> MockConfig {
    MockConfig {
        base_delay: Duration::ZERO,
        prefill_per_token: Duration::ZERO,
        inter_token: Duration::ZERO,
        ..MockConfig::default()
    }
}

fn get(path: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::GET)
        .uri(path)
        .body(Full::new(Bytes::new()))
        .expect("valid request")
}

fn post(path: &str, body: String) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .body(Full::new(Bytes::from(body)))
        .expect("valid request")
}

fn chat(model: Option<&str>, content: &str, max_tokens: u32, stream: bool) -> Request<Full<Bytes>> {
    let mut v = serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    });
    if let Some(m) = model {
        v["model"] = m.into();
    }
    post("/v1/chat/completions", v.to_string())
}

async fn text(resp: Response<MockBody>) -> String {
    let bytes = resp
        .into_body()
        .collect()
        .await
        .expect("whole body")
        .to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

async fn metrics(mock: &Arc<Mock>) -> String {
    text(mock.clone().handle(get("/metrics")).await).await
}

/// The value of the sample `name` (with its labels) in a Prometheus text.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

const LABEL: &str = "{model_name=\"kvbust-mock\"}";

#[tokio::test]
async fn served_model_names_refuse_other_models_and_list_exactly_those() {
    let mock = Mock::new(
        MockConfig {
            served_model_names: vec!["qwen".into(), "qwen-lora".into()],
            ..quick()
        },
        None,
    );
    let resp = mock
        .clone()
        .handle(chat(Some("gpt-4o"), "hi", 2, false))
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let v: serde_json::Value = serde_json::from_str(&text(resp).await).unwrap();
    assert_eq!(v["error"]["message"], "The model `gpt-4o` does not exist.");
    assert_eq!(v["error"]["code"], "model_not_found");
    let resp = mock
        .clone()
        .handle(chat(Some("qwen-lora"), "hi", 2, false))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    // A request without a model gets the first served name.
    let v: serde_json::Value =
        serde_json::from_str(&text(mock.clone().handle(chat(None, "hi", 2, false)).await).await)
            .unwrap();
    assert_eq!(v["model"], "qwen");
    let v: serde_json::Value =
        serde_json::from_str(&text(mock.clone().handle(get("/v1/models")).await).await).unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["qwen", "qwen-lora"]);
    // Unset (the default): any model is accepted, as before.
    let any = Mock::new(quick(), None);
    let resp = any
        .clone()
        .handle(chat(Some("gpt-4o"), "hi", 2, false))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn vllm_named_metrics_count_prefix_cache_queries_hits_and_ttft() {
    let mock = Mock::new(quick(), None);
    let empty = metrics(&mock).await;
    assert_eq!(
        sample(&empty, &format!("vllm:num_requests_running{LABEL}")),
        0.0
    );
    assert_eq!(
        sample(&empty, &format!("vllm:num_requests_waiting{LABEL}")),
        0.0
    );
    let long = "the same long prompt ".repeat(20);
    let mut prompt = 0.0;
    let mut cached = 0.0;
    for _ in 0..2 {
        let resp = mock.clone().handle(chat(None, &long, 2, false)).await;
        let n = |h: &str| resp.headers()[h].to_str().unwrap().parse::<f64>().unwrap();
        prompt += n(HEADER_PROMPT_TOKENS);
        cached += n(HEADER_CACHED_TOKENS);
        text(resp).await;
    }
    assert!(cached > 0.0, "the second request hits the cache");
    let m = metrics(&mock).await;
    assert_eq!(
        sample(&m, &format!("vllm:prefix_cache_queries_total{LABEL}")),
        prompt
    );
    assert_eq!(
        sample(&m, &format!("vllm:prefix_cache_hits_total{LABEL}")),
        cached
    );
    assert_eq!(
        sample(
            &m,
            &format!("vllm:time_to_first_token_seconds_count{LABEL}")
        ),
        2.0
    );
    assert_eq!(
        sample(&m, &format!("vllm:num_requests_running{LABEL}")),
        0.0
    );
}

#[tokio::test(start_paused = true)]
async fn max_num_seqs_queues_requests_past_it_until_a_slot_frees() {
    let mock = Mock::new(
        MockConfig {
            max_num_seqs: 1,
            inter_token: Duration::from_secs(1),
            ..quick()
        },
        None,
    );
    // The first holds the only slot while its stream is open.
    let first = mock.clone().handle(chat(None, "one", 100, true)).await;
    let m2 = mock.clone();
    let second =
        tokio::spawn(async move { text(m2.handle(chat(None, "two", 1, false)).await).await });
    let queued = loop {
        tokio::task::yield_now().await;
        let m = metrics(&mock).await;
        if sample(&m, &format!("vllm:num_requests_waiting{LABEL}")) == 1.0 {
            break m;
        }
    };
    assert_eq!(
        sample(&queued, &format!("vllm:num_requests_running{LABEL}")),
        1.0
    );
    assert!(!second.is_finished());
    // The first client leaves: its slot goes to the queued request, which completes.
    drop(first);
    let answer = second.await.unwrap();
    assert!(answer.contains("chat.completion"), "{answer}");
    let m = metrics(&mock).await;
    assert_eq!(
        sample(&m, &format!("vllm:num_requests_waiting{LABEL}")),
        0.0
    );
    assert_eq!(
        sample(&m, &format!("vllm:num_requests_running{LABEL}")),
        0.0
    );
}

/// The instants of a streamed body's frames (virtual time).
async fn frame_times(resp: Response<MockBody>) -> Vec<Instant> {
    let mut body = resp.into_body();
    let mut at = Vec::new();
    while let Some(f) = body.frame().await {
        f.expect("frame");
        at.push(Instant::now());
    }
    at
}

#[tokio::test(start_paused = true)]
async fn jitter_varies_each_delay_and_a_seed_repeats_it() {
    let jittery = |seed| {
        Mock::new(
            MockConfig {
                base_delay: Duration::from_millis(50),
                inter_token: Duration::from_millis(20),
                jitter: Duration::from_millis(5),
                seed: Some(seed),
                ..quick()
            },
            None,
        )
    };
    let gaps = |at: Vec<Instant>| -> Vec<Duration> { at.windows(2).map(|w| w[1] - w[0]).collect() };
    let a = jittery(7);
    let ga = gaps(frame_times(a.clone().handle(chat(None, "x", 8, true)).await).await);
    let gb = gaps(frame_times(jittery(7).handle(chat(None, "x", 8, true)).await).await);
    assert_eq!(ga, gb, "one seed, one schedule");
    let token_gaps = &ga[..7];
    assert!(
        token_gaps.iter().any(|g| *g != Duration::from_millis(20)),
        "{ga:?}"
    );
    assert!(
        token_gaps.windows(2).any(|w| w[0] != w[1]),
        "each gap drawn: {ga:?}"
    );
    let other = gaps(frame_times(jittery(8).handle(chat(None, "x", 8, true)).await).await);
    assert_ne!(ga, other);
    // Without jitter the schedule is exact, as before.
    let plain = Mock::new(
        MockConfig {
            inter_token: Duration::from_millis(20),
            ..quick()
        },
        None,
    );
    let g = gaps(frame_times(plain.handle(chat(None, "x", 8, true)).await).await);
    assert!(
        g[..7].iter().all(|d| *d == Duration::from_millis(20)),
        "{g:?}"
    );
    let ttft = sample(
        &metrics(&a).await,
        &format!("vllm:time_to_first_token_seconds_sum{LABEL}"),
    );
    assert!(
        (ttft - 0.050).abs() > 1e-9,
        "the first token's delay is jittered too: {ttft}"
    );
}

#[tokio::test(start_paused = true)]
async fn prefill_cost_grows_with_the_running_requests() {
    let per_token = Duration::from_micros(10);
    let per_running = Duration::from_micros(30);
    let mock = Mock::new(
        MockConfig {
            prefill_per_token: per_token,
            prefill_per_running: per_running,
            inter_token: Duration::from_secs(1),
            ..quick()
        },
        None,
    );
    let uncached = |resp: &Response<MockBody>| {
        let n = |h: &str| resp.headers()[h].to_str().unwrap().parse::<f64>().unwrap();
        n(HEADER_PROMPT_TOKENS) - n(HEADER_CACHED_TOKENS)
    };
    let first = mock
        .clone()
        .handle(chat(None, "a running stream", 50, true))
        .await;
    let alone = uncached(&first);
    let resp = mock
        .clone()
        .handle(chat(None, "a second request beside it", 1, false))
        .await;
    let beside = uncached(&resp);
    text(resp).await;
    let sum = sample(
        &metrics(&mock).await,
        &format!("vllm:time_to_first_token_seconds_sum{LABEL}"),
    );
    // The first ran alone; the second paid its prefill once more per token for the one beside it.
    let want = alone * per_token.as_secs_f64() + beside * (per_token + per_running).as_secs_f64();
    assert!((sum - want).abs() < 1e-9, "{sum} != {want}");
    drop(first);
}

fn failing(kind: FailureKind) -> Arc<Mock> {
    Mock::new(
        MockConfig {
            failure_rate: 1.0,
            failure_kinds: vec![kind],
            seed: Some(3),
            ..quick()
        },
        None,
    )
}

#[tokio::test]
async fn injected_status_failures_answer_in_openai_shape() {
    for (kind, status, code, retry) in [
        (
            FailureKind::TooManyRequests,
            429,
            "rate_limit_exceeded",
            true,
        ),
        (FailureKind::Internal, 500, "internal_server_error", false),
        (FailureKind::Unavailable, 503, "service_unavailable", true),
    ] {
        let resp = failing(kind).handle(chat(None, "hi", 4, true)).await;
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(
            resp.headers().contains_key(http::header::RETRY_AFTER),
            retry
        );
        let v: serde_json::Value = serde_json::from_str(&text(resp).await).unwrap();
        assert_eq!(v["error"]["code"], code, "{v}");
    }
}

#[tokio::test]
async fn an_injected_reset_cuts_a_stream_half_way_and_a_plain_answer_at_once() {
    let resp = failing(FailureKind::Reset)
        .handle(chat(None, "hi", 8, true))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut tokens = 0;
    let err = loop {
        match body.frame().await {
            Some(Ok(f)) => {
                let data = f.into_data().unwrap_or_default();
                tokens += usize::from(data.starts_with(b"data: {"));
            }
            Some(Err(e)) => break e,
            None => panic!("the stream ended cleanly"),
        }
    };
    assert_eq!(tokens, 4, "half of 8 tokens before the reset");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    let resp = failing(FailureKind::Reset)
        .handle(chat(None, "hi", 8, false))
        .await;
    assert!(resp.into_body().collect().await.is_err());
}

#[tokio::test(start_paused = true)]
async fn an_injected_stall_sends_half_the_tokens_then_nothing() {
    let resp = failing(FailureKind::Stall)
        .handle(chat(None, "hi", 8, true))
        .await;
    let mut body = resp.into_body();
    for _ in 0..4 {
        body.frame().await.expect("a token").expect("no error");
    }
    // Virtual time: an hour passes at once, and nothing more comes.
    let next = tokio::time::timeout(Duration::from_secs(3600), body.frame()).await;
    assert!(next.is_err(), "stalled");
    let plain = failing(FailureKind::Stall).handle(chat(None, "hi", 8, false));
    assert!(tokio::time::timeout(Duration::from_secs(3600), plain)
        .await
        .is_err());
}

#[tokio::test]
async fn the_defaults_never_fail_and_answer_as_before() {
    let mock = Mock::new(quick(), None);
    for i in 0..200 {
        let resp = mock
            .clone()
            .handle(chat(Some("any"), &format!("p{i}"), 2, i % 2 == 0))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.into_body().collect().await.is_ok());
    }
}

/// Uncached prompt tokens of a generation (its usage headers).
#[allow(clippy::unwrap_used)] // the mock always sets both headers on a generation
fn uncached_of(resp: &Response<MockBody>) -> u64 {
    let n = |h: &str| resp.headers()[h].to_str().unwrap().parse::<u64>().unwrap();
    n(HEADER_PROMPT_TOKENS) - n(HEADER_CACHED_TOKENS)
}

/// Prefill time of `tokens` at 1,000 tokens per second.
fn at_1000_per_s(tokens: u64) -> Duration {
    Duration::from_millis(tokens)
}

/// `mock.prefill_tokens_per_s`: one budget, first come first served. Alone, a request's first
/// token comes after its own uncached tokens; with seven more at once, each first token waits
/// for the prefills before it, so TTFT grows with load and with the tokens ahead.
#[tokio::test(start_paused = true)]
#[allow(clippy::unwrap_used)] // test tasks do not panic
async fn a_shared_prefill_budget_queues_first_tokens_in_arrival_order() {
    let mock = Mock::new(
        MockConfig {
            prefill_tokens_per_s: Some(1000),
            // Ignored while the shared budget is set.
            prefill_per_token: Duration::from_secs(1),
            ..quick()
        },
        None,
    );
    let t0 = Instant::now();
    let resp = mock
        .clone()
        .handle(chat(None, "a prompt that runs alone", 1, false))
        .await;
    assert_eq!(Instant::now() - t0, at_1000_per_s(uncached_of(&resp)));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let m = mock.clone();
            let words = "lorem ipsum dolor ".repeat(i + 1);
            tokio::spawn(async move {
                let r = m
                    .handle(chat(None, &format!("{i}: {words}"), 1, false))
                    .await;
                (Instant::now(), uncached_of(&r))
            })
        })
        .collect();
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.unwrap());
    }
    done.sort();
    let mut due = t0;
    for (i, (at, uncached)) in done.iter().enumerate() {
        due += at_1000_per_s(*uncached);
        assert_eq!(
            *at, due,
            "request {i} of 8 answers after the prefills before it"
        );
    }
    assert!(done.windows(2).all(|w| w[0].0 < w[1].0), "{done:?}");
}

/// `mock.decode_tokens_per_s`: the running requests share it. Alone at 100 tokens per second a
/// stream's gaps are 10 ms (above its 4 ms `inter_token`); three running at once get 30 ms.
#[tokio::test(start_paused = true)]
#[allow(clippy::unwrap_used)] // test tasks do not panic
async fn a_shared_decode_budget_widens_the_gaps_with_the_running_requests() {
    let mock = Mock::new(
        MockConfig {
            decode_tokens_per_s: Some(100),
            inter_token: Duration::from_millis(4),
            ..quick()
        },
        None,
    );
    let token_gaps = |at: Vec<Instant>| -> Vec<Duration> {
        at.windows(2).take(5).map(|w| w[1] - w[0]).collect()
    };
    let alone = frame_times(mock.clone().handle(chat(None, "alone", 6, true)).await).await;
    assert_eq!(token_gaps(alone), vec![Duration::from_millis(10); 5]);
    let mut running = Vec::new();
    for i in 0..3 {
        running.push(
            mock.clone()
                .handle(chat(None, &format!("stream {i}"), 6, true))
                .await,
        );
    }
    let tasks: Vec<_> = running
        .into_iter()
        .map(|r| tokio::spawn(frame_times(r)))
        .collect();
    for t in tasks {
        assert_eq!(
            token_gaps(t.await.unwrap()),
            vec![Duration::from_millis(30); 5]
        );
    }
    // A plain answer reads the budget at its first token: 5 gaps of 10 ms alone.
    let t0 = Instant::now();
    text(mock.clone().handle(chat(None, "plain", 6, false)).await).await;
    assert_eq!(Instant::now() - t0, Duration::from_millis(50));
}
