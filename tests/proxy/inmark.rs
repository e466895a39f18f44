//! Marking as the body flows (`cache_bust.mark_in_flight`): a marked chat body whose session is
//! known early reaches the upstream while the client is still sending it, marked where a
//! collected body is marked, byte for byte; what cannot be settled early is marked whole.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::common::*;
use crate::inflow::{
    big_chat, early_upstream_watching, raw_post_with, raw_upstream, response, Seen,
};

use kvbust::cachebust::Target;

/// An agentic body: a system prompt, a short first user turn, then `size` bytes of history
/// (an assistant turn and a tool result) and `extra` members after `messages`.
fn agentic(size: usize, extra: &str) -> String {
    let mut text = String::with_capacity(size);
    let mut i = 0u64;
    while text.len() < size {
        text.push_str(&format!("step {i}: ran the tests, \\\"ok\\\" \\\\ next; "));
        i += 1;
    }
    format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"You are an agent."}},{{"role":"user","content":"Fix the failing test."}},{{"role":"assistant","content":"{text}"}},{{"role":"tool","tool_call_id":"t1","content":"done"}}]{extra}}}"#
    )
}

/// A proxy marking with `target`, as it flows or (`in_flight` false) collecting first, in
/// front of its own raw upstream that reports each request's first body bytes.
async fn proxy(
    target: Target,
    in_flight: bool,
) -> (Harness, mpsc::Receiver<usize>, mpsc::Receiver<Seen>) {
    let (upstream, progress, seen) = raw_upstream(1).await;
    let h = start_proxy(&upstream, |c| {
        c.cache_bust.target = target;
        c.cache_bust.mark_in_flight = in_flight;
    })
    .await;
    (h, progress, seen)
}

/// Sends `body` with `headers`, its first `split` bytes first; with `progress`, the rest only
/// once the upstream has had some of the body (so it flowed), else at once. What the upstream
/// got, and the status line.
async fn send(
    h: &Harness,
    progress: Option<&mut mpsc::Receiver<usize>>,
    seen: &mut mpsc::Receiver<Seen>,
    (headers, body, split): (&str, &str, usize),
) -> (String, Option<Seen>) {
    let (go, wait) = oneshot::channel();
    let (addr, headers, body) = (h.proxy_addr, headers.to_string(), body.to_string());
    let client =
        tokio::spawn(
            async move { raw_post_with(addr, &headers, Bytes::from(body), split, wait).await },
        );
    if let Some(p) = progress {
        // A collected body would reach the upstream only after `go`: this bound is a "never
        // happens", not a measurement.
        tokio::time::timeout(Duration::from_secs(30), p.recv())
            .await
            .expect("the upstream had the body's start while the client held the rest back")
            .expect("the upstream reports");
    }
    go.send(()).unwrap();
    let status = client.await.unwrap();
    let got = if status.starts_with("HTTP/1.1 200") {
        seen.recv().await
    } else {
        None
    };
    (status, got)
}

#[tokio::test]
async fn a_marked_agentic_body_flows_once_its_first_user_turn_has_come() {
    let (flow, mut progress, mut seen) = proxy(Target::FirstTurnPrefix, true).await;
    let (whole, _, mut seen_whole) = proxy(Target::FirstTurnPrefix, false).await;
    let body = agentic(512 * 1024, "");
    let hdr = "x-correlation-id: conv-1\r\n";
    // The client holds back all but the first 200 KiB; the upstream has the marked first
    // turn and more before the client sends the rest.
    let (status, got) = send(
        &flow,
        Some(&mut progress),
        &mut seen,
        (hdr, &body, 200 * 1024),
    )
    .await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let got = got.unwrap();
    let (status, want) = send(&whole, None, &mut seen_whole, (hdr, &body, body.len())).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let want = want.unwrap();
    assert!(
        got.body == want.body,
        "the flowing body differs from the collected one"
    );
    let text = String::from_utf8(got.body).unwrap();
    assert!(
        text.contains(r#"{"role":"user","content":"[rid:"#),
        "no marker at the first user turn"
    );
    assert!(
        got.head.contains("transfer-encoding: chunked"),
        "{}",
        got.head
    );
    flow.shutdown().await;
    whole.shutdown().await;
}

/// Bodies, headers and targets where the marker's place or session is decided by the first
/// messages, each against the collected path's bytes.
#[tokio::test]
async fn flowing_and_collected_bodies_are_marked_alike() {
    for len in [40_000, 10] {
        marked_alike("x".repeat(len)).await;
    }
}

/// The table of [`flowing_and_collected_bodies_are_marked_alike`] with `long` as the long text:
/// each body sent flowing and sent at once (whole in one read when short) to a proxy marking as
/// bodies flow, against the bytes one that collects them first sends.
async fn marked_alike(long: String) {
    let bodies = [
        format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"sys"}},{{"role":"user","content":"hi {long}"}}],"stream":true}}"#
        ),
        format!(
            r#"{{"messages":[{{"role":"user","content":"a"}},{{"role":"assistant","content":"{long}"}},{{"role":"user","content":"b"}}],"model":"m"}}"#
        ),
        format!(
            r#"{{"messages": [ {{"content": [{{"type":"text","text":"look"}},{{"type":"image_url","image_url":{{"url":"data:x"}}}}], "role": "user"}} , {{"role":"assistant","content":"{long}"}} ] }}"#
        ),
        format!(
            r#"{{"messages":[{{"role":"developer","content":"d\n\"q\""}},{{"role":"user","content":"u\u00e9"}},{{"role":"user","content":"{long}"}}]}}"#
        ),
        format!(r#"{{"messages":[{{"role":"system","content":"{long}"}}],"user":"u1"}}"#),
        // A role the rule cannot read: the same 400 either way.
        format!(
            r#"{{"messages":[{{"role":5,"content":"{long}"}},{{"role":"user","content":"y"}}]}}"#
        ),
        format!(
            r#"{{"messages":[{{"role":"user","content":"{{{{kvbust:prompt:8}}}} {long}"}}],"max_tokens":4}}"#
        ),
    ];
    // Every target that marks (`none` does not).
    for target in Target::ALL.into_iter().filter(|t| *t != Target::None) {
        let (flow, mut progress, mut seen) = proxy(target, true).await;
        let (whole, _, mut seen_whole) = proxy(target, false).await;
        let mut n = 0;
        for body in &bodies {
            for extra in ["", "x-kvbust-user-context-messages: 1\r\n"] {
                n += 1;
                let hdr = format!("x-correlation-id: s{n}\r\nx-kvbust-phase: warmup\r\n{extra}");
                // Cut just inside `messages`, so the head goes at once and the rest flows.
                let split = body.find('[').unwrap() + 1;
                let (s1, got) =
                    send(&flow, Some(&mut progress), &mut seen, (&hdr, body, split)).await;
                let (s2, want) =
                    send(&whole, None, &mut seen_whole, (&hdr, body, body.len())).await;
                assert_eq!(s1, s2, "{target:?} {hdr:?} {body:.80}");
                // The same session again, the body at once: the same marker, the same bytes.
                let (s3, at_once) = send(&flow, None, &mut seen, (&hdr, body, body.len())).await;
                assert_eq!(s1, s3, "{target:?} {hdr:?} {body:.80}");
                let (Some(got), Some(want), Some(at_once)) = (got, want, at_once) else {
                    continue;
                };
                if !body.contains("{{kvbust:") {
                    assert!(at_once.body == want.body, "{target:?} {hdr:?} sent at once");
                }
                let (got, want) = (got.body, want.body);
                let placeholder = body.contains("{{kvbust:");
                if placeholder {
                    // Expanded with fresh text each time: the marker is where it belongs.
                    assert!(!String::from_utf8_lossy(&got).contains("{{kvbust:"));
                    continue;
                }
                assert!(
                    got == want,
                    "{target:?} {hdr:?}:\n{}\n{}",
                    String::from_utf8_lossy(&got[..got.len().min(300)]),
                    String::from_utf8_lossy(&want[..want.len().min(300)])
                );
            }
        }
        flow.shutdown().await;
        whole.shutdown().await;
    }
}

#[tokio::test]
async fn a_second_messages_member_after_the_marked_one_is_refused_and_never_reaches_the_upstream() {
    let (h, mut progress, mut seen) = proxy(Target::FirstTurnPrefix, true).await;
    let first = r#"{"messages":[{"role":"user","content":"marked here"}],"x":1"#;
    let body = format!(
        r#"{first},"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "y".repeat(100_000)
    );
    let mut sock = TcpStream::connect(h.proxy_addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-session-id: dup\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(&body.as_bytes()[..first.len()])
        .await
        .unwrap();
    sock.flush().await.unwrap();
    // The first messages were marked and went before the second came.
    tokio::time::timeout(Duration::from_secs(30), progress.recv())
        .await
        .expect("the marked start went")
        .expect("the upstream reports");
    sock.write_all(&body.as_bytes()[first.len()..])
        .await
        .unwrap();
    let (status, answer) = response(&mut sock).await;
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    let err: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(err["error"]["code"], "duplicate_messages", "{answer}");
    // The upstream never had the cut body as a request: the first whole one is the next.
    let small = big_chat(100, "");
    let (status, got) = send(
        &h,
        None,
        &mut seen,
        ("x-session-id: next\r\n", &small, small.len()),
    )
    .await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let got = String::from_utf8(got.unwrap().body).unwrap();
    assert!(got.contains("be brief"), "{got}");
    h.shutdown().await;
}

/// Issue 42 (5): a marker went into the first `messages`, then an escaped duplicate key
/// (`messag\u0065s`, which an engine reads as `messages`) and a tail no parser takes (`NaN`)
/// came. The end check cannot say which `messages` the upstream would read: the request fails
/// with a 400, counted as an error, even when the upstream answered before the body ended.
#[tokio::test]
async fn a_marked_body_whose_end_fails_the_check_fails_even_after_an_early_answer() {
    let first = r#"{"messages":[{"role":"user","content":"hello"}],"#;
    // Megabytes after the marked part: the upstream's early answer is in before the end.
    let pad = "p".repeat(4 << 20);
    let body = format!(
        r#"{first}"messag\u0065s":[{{"role":"user","content":"other"}}],"pad":"{pad}","temperature":NaN}}"#
    );
    let (early, mut early_progress) = early_upstream_watching(1).await;
    // The early upstream reports no requests: its channel is closed from the start.
    let mut none_seen = mpsc::channel::<Seen>(1).1;
    let (reads_all, mut progress, mut seen) = raw_upstream(1).await;
    for (upstream, watch, seen) in [
        (early, &mut early_progress, &mut none_seen),
        (reads_all, &mut progress, &mut seen),
    ] {
        let h = start_proxy(&upstream, |c| {
            c.cache_bust.target = Target::FirstTurnPrefix;
        })
        .await;
        let hdr = "x-correlation-id: v\r\n";
        let (status, got) = send(&h, Some(watch), seen, (hdr, &body, first.len())).await;
        assert!(status.starts_with("HTTP/1.1 400"), "{upstream}: {status}");
        assert!(got.is_none());
        let text = metrics_text(&h).await;
        assert!(
            text.contains(r#"kvbust_errors_total{code="invalid_body",source="client"} 1"#),
            "{text}"
        );
        h.shutdown().await;
    }
}

/// Issue 42 (8): two objects, split after the first (`{…}{…}`): read whole, the body is a 400;
/// marked as it flows, the scan cannot follow past the first object, so the end check parses
/// the whole body and refuses it too, and the upstream never has it as a request.
#[tokio::test]
async fn two_objects_split_after_the_first_are_refused_as_when_read_whole() {
    let (flow, mut progress, mut seen) = proxy(Target::FirstTurnPrefix, true).await;
    let (whole, _, mut seen_whole) = proxy(Target::FirstTurnPrefix, false).await;
    let first = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;
    let body = format!("{first}{first}");
    let hdr = "x-correlation-id: two\r\n";
    let (status, got) = send(
        &flow,
        Some(&mut progress),
        &mut seen,
        (hdr, &body, first.len()),
    )
    .await;
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    assert!(got.is_none());
    let (status, _) = send(&whole, None, &mut seen_whole, (hdr, &body, body.len())).await;
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    flow.shutdown().await;
    whole.shutdown().await;
}

#[tokio::test]
async fn what_is_not_read_is_not_validated() {
    let (flow, _progress, mut seen) = proxy(Target::FirstTurnPrefix, true).await;
    let (whole, _, mut seen_whole) = proxy(Target::FirstTurnPrefix, false).await;
    // A bad literal after the first user turn: read whole, the body is a 400; marked as it
    // flows, kvbust never reads that far and the upstream answers it as it would.
    // Past 16 KiB, so that read whole it is still read apart (smaller, it is parsed whole).
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"hi"}},{{"role":"assistant","content":"{}"}}],"temperature":tru}}"#,
        "x".repeat(20_000)
    );
    let body = body.as_str();
    let hdr = "x-correlation-id: v\r\n";
    let (status, got) = send(&flow, None, &mut seen, (hdr, body, body.len())).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let got = String::from_utf8(got.unwrap().body).unwrap();
    assert!(
        got.starts_with(r#"{"messages":[{"role":"user","content":"[rid:"#),
        "{got}"
    );
    assert!(got.ends_with(r#""temperature":tru}"#), "{got}");
    let (status, _) = send(&whole, None, &mut seen_whole, (hdr, body, body.len())).await;
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    flow.shutdown().await;
    whole.shutdown().await;
}

#[tokio::test]
async fn bodies_without_a_session_header_are_marked_alike_however_they_arrive() {
    let (flow, _progress, mut seen) = proxy(Target::FirstTurnPrefix, true).await;
    let (whole, _, mut seen_whole) = proxy(Target::FirstTurnPrefix, false).await;
    // Sent at once: whole in one read or not, read apart (past 16 KiB) or parsed whole, the
    // session is the `user` member wherever it is or, without one, the first user turn's hash.
    let pad = "p".repeat(20_000);
    let bodies = [
        format!(
            r#"{{"messages":[{{"role":"system","content":"s"}},{{"role":"user","content":"task"}},{{"role":"assistant","content":"{pad}"}}],"user":"alice","max_tokens":3}}"#
        ),
        format!(
            r#"{{"user":"bob","messages":[{{"role":"user","content":"task"}},{{"role":"assistant","content":"{pad}"}}],"user":" carol "}}"#
        ),
        format!(
            r#"{{"messages":[{{"role":"user","content":"task two"}},{{"role":"assistant","content":"{pad}"}}],"stream":true}}"#
        ),
        format!(
            r#"{{"messages":[{{"role":"user","content":"task"}},{{"role":"assistant","content":"{pad}"}}],"user":7}}"#
        ),
        r#"{"messages":[{"role":"user","content":"small"}],"user":"erin"}"#.to_string(),
    ];
    for body in &bodies {
        let (s1, got) = send(&flow, None, &mut seen, ("", body, body.len())).await;
        let (s2, want) = send(&whole, None, &mut seen_whole, ("", body, body.len())).await;
        assert!(s1.starts_with("HTTP/1.1 200") && s2 == s1, "{s1} {s2}");
        let (got, want) = (got.unwrap().body, want.unwrap().body);
        assert!(got == want, "{:.300}", String::from_utf8_lossy(&got));
    }
    // A small body that came whole is parsed whole: a bad literal is a 400, as collected.
    let bad = r#"{"messages":[{"role":"user","content":"task"}],"user":"dave","temperature":tru}"#;
    let (status, _) = send(&flow, None, &mut seen, ("", bad, bad.len())).await;
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    flow.shutdown().await;
    whole.shutdown().await;
}

/// A flowing body larger than the model's queue may hold (a quarter of
/// `cache_model.max_memory`, 256 KiB here) reaches the upstream whole and marked, and is counted
/// unaccounted as `queue_full`: refused before the model's copy of it is made.
#[tokio::test]
async fn a_flowing_body_past_the_models_queue_is_forwarded_and_counted_queue_full() {
    let (upstream, mut progress, mut seen) = raw_upstream(1).await;
    let h = start_proxy(&upstream, |c| {
        c.cache_bust.target = Target::FirstTurnPrefix;
        c.cache_model.max_memory = kvbust::units::ByteSize(1 << 20);
    })
    .await;
    let body = agentic(512 * 1024, "");
    let hdr = "x-correlation-id: conv-1\r\n";
    let (status, got) = send(&h, Some(&mut progress), &mut seen, (hdr, &body, 200 * 1024)).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let got = String::from_utf8(got.expect("the upstream had it").body).unwrap();
    assert!(
        got.contains(r#"{"role":"user","content":"[rid:"#),
        "not marked"
    );
    let r = crate::cache_model::report(&h).await;
    assert_eq!(
        r.cache_model.unaccounted.get("queue_full"),
        Some(&1),
        "{:?}",
        r.cache_model.unaccounted
    );
    h.shutdown().await;
}
