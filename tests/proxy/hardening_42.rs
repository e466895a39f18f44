//! Issue 42 (hardening, round four): a percent-encoded route is the route it decodes to, the
//! cache model's tokenization is bounded, and the report's table escapes what a client chose.

use kvbust::cachebust::Target;

use crate::common::*;
use crate::inflow::raw_upstream;

/// `POST /v1/chat%2Fcompletions` is chat to uvicorn (it decodes the path before routing): it
/// is marked and counted as chat, and goes upstream on the path as it came.
#[tokio::test]
async fn a_percent_encoded_route_is_marked_and_counted_as_the_route_it_decodes_to() {
    let (upstream, _progress, mut seen) = raw_upstream(usize::MAX).await;
    let h = start_proxy(&upstream, |c| {
        c.cache_bust.target = Target::FirstTurnPrefix;
    })
    .await;
    let body = chat_body("what is a prefix cache?", false, 8);
    let req = post(
        &h.url("/v1/chat%2Fcompletions"),
        body,
        &[("x-correlation-id", "enc")],
    );
    let resp = send(&h1(), req).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().contains_key("x-kvbust-rid"));
    let got = seen.recv().await.expect("the upstream had it");
    assert!(
        got.head.starts_with("post /v1/chat%2fcompletions "),
        "{}",
        got.head
    );
    let sent = String::from_utf8(got.body).unwrap();
    assert!(sent.contains("[rid:"), "{sent}");
    let text = metrics_text(&h).await;
    assert!(
        text.contains(r#"route="chat",status="200",target="first_turn_prefix""#),
        "{text}"
    );
    h.shutdown().await;
}
