//! The response-body wrapper: passes every frame on the moment it arrives, enforces the idle
//! timeout between frames, and on the side reads SSE event boundaries for TTFT/inter-token gaps
//! and `usage` for token counters. Never delays, merges, splits or holds a frame.
//!
//! In three parts: the [`Observer`] here (what one response teaches: timings, token counts, the
//! metrics and the access line), [`body`] (the [`Observed`] body that feeds it and its idle and
//! total timeouts) and [`wire`] (the `usage` and event shapes it reads).

mod body;
mod wire;

pub use body::{IdleTimeout, Observed, TotalTimeout};
use wire::Event;
pub use wire::{CachedDetails, UsageWire};

use std::time::{Duration, Instant};

use crate::api::Route;
use crate::metrics::Metrics;
use crate::usage::Tokens;

/// The metric labels of one exchange.
#[derive(Debug, Clone, Copy)]
pub struct Labels {
    pub route: Route,
    pub phase: &'static str,
    pub target: &'static str,
}

/// What the observer learns from one response, and where to count it.
pub struct Observer {
    metrics: Metrics,
    // Resolved once per exchange, not per event: a label lookup hashes and takes a lock. The
    // inter-token series is resolved at the second content event, so non-streams never create it.
    inter_token: Option<prometheus::Histogram>,
    duration: prometheus::Histogram,
    route: Route,
    phase: &'static str,
    target: &'static str,
    start: Instant,
    mode: Scan,
    first_content: Option<Instant>,
    last_content: Option<Instant>,
    // Boxed: most of a stream's life has none yet, and an idle open stream's observer is what
    // kvbust itself holds per stream (128 bytes inline against 8).
    usage: Option<Box<UsageWire>>,
    /// SSE data events seen (`[DONE]` included).
    events: u64,
    /// SSE events that carried generated content.
    content_events: u64,
    /// Response body bytes passed to the client.
    bytes_out: u64,
    ended: bool,
    aborted: Option<&'static str>,
    /// The access-log line, written when the response body ends or is dropped.
    access: Option<crate::access_log::Entry>,
    /// The request's place in `kvbust_in_flight_requests` and in its connection's activity,
    /// released when the response body ends or is dropped.
    in_flight: Option<crate::proxy::exchange::InFlight>,
    /// Where the usage and TTFT meet the cache model's prediction (2xx API responses).
    ticket: Option<crate::cache_model::Ticket>,
    /// The gaps between content events (ms), kept for the run report's ITL when a ticket
    /// meets this stream.
    gaps: Option<Vec<f32>>,
    /// The ticket the access line waits for (it carries the prediction).
    log_ticket: Option<crate::cache_model::Ticket>,
}

enum Scan {
    /// Not an API response (or not one we read).
    Off,
    /// `text/event-stream`: keeps only the unfinished tail line between frames.
    Sse { carry: Vec<u8> },
    /// A JSON body: copied up to a limit to read `usage` at the end.
    Json {
        copy: Vec<u8>,
        limit: usize,
        overflow: bool,
    },
}

impl Observer {
    /// `scan_limit`: `None` for traffic that is not an API response (nothing is read);
    /// otherwise the most bytes of a JSON body copied to read its `usage`.
    pub fn new(
        metrics: Metrics,
        labels: Labels,
        start: Instant,
        content_type: Option<&str>,
        scan_limit: Option<usize>,
    ) -> Self {
        let Labels {
            route,
            phase,
            target,
        } = labels;
        let mode = match (content_type, scan_limit) {
            (_, None) => Scan::Off,
            (Some(ct), _) if ct.starts_with("text/event-stream") => Scan::Sse { carry: Vec::new() },
            (Some(ct), Some(limit)) if ct.starts_with("application/json") => Scan::Json {
                copy: Vec::new(),
                limit,
                overflow: false,
            },
            _ => Scan::Off,
        };
        Self {
            in_flight: None,
            ticket: None,
            inter_token: None,
            duration: metrics.duration_of([route.label(), phase, target]),
            metrics,
            route,
            phase,
            target,
            start,
            mode,
            first_content: None,
            last_content: None,
            usage: None,
            events: 0,
            content_events: 0,
            bytes_out: 0,
            ended: false,
            aborted: None,
            access: None,
            gaps: None,
            log_ticket: None,
        }
    }

    /// Writes `entry` to the access log when the response body ends or is dropped.
    pub fn logging(mut self, entry: Option<crate::access_log::Entry>) -> Self {
        self.access = entry;
        self
    }

    /// Hands the response's usage and TTFT to `ticket` when the body ends (or is dropped).
    pub fn meeting(mut self, ticket: Option<crate::cache_model::Ticket>) -> Self {
        if ticket.is_some() && matches!(self.mode, Scan::Sse { .. }) {
            self.gaps = Some(Vec::new());
        }
        if self.access.is_some() {
            self.log_ticket = ticket.clone();
        }
        self.ticket = ticket;
        self
    }

    fn hand_in(&mut self, complete: bool) {
        if let Some(t) = self.ticket.take() {
            // A whole (not streamed) answer's first token is its end, as clients time it.
            let now = Instant::now();
            let first = self
                .first_content
                .or((complete && self.gaps.is_none()).then_some(now));
            t.outcome(crate::cache_model::Outcome {
                tokens: self.tokens(),
                ttft: first.map(|at| at - self.start),
                complete,
                content_events: self.content_events,
                ended: Some(now),
                aborted: self.aborted,
                gaps_ms: self.gaps.take().unwrap_or_default(),
            });
        }
    }

    /// The tokens read so far (all of them once the body has ended).
    pub fn tokens(&self) -> Tokens {
        self.usage
            .as_deref()
            .map(|u| u.tokens(self.route))
            .unwrap_or_default()
    }

    /// Reads one response frame (public for the micro-benchmark).
    pub fn on_data(&mut self, data: &[u8], now: Instant) {
        match &mut self.mode {
            Scan::Off => {}
            Scan::Json {
                copy,
                limit,
                overflow,
            } => {
                if copy.len() + data.len() <= *limit {
                    copy.extend_from_slice(data);
                } else {
                    *overflow = true;
                }
            }
            Scan::Sse { carry } => {
                // Lines may span frames: the carried tail is joined with this frame up to the
                // newline. Whole lines inside the frame are read in place, not copied.
                let mut carry = std::mem::take(carry);
                let mut rest = data;
                while let Some(i) = memchr::memchr(b'\n', rest) {
                    let (line, tail) = rest.split_at(i);
                    rest = &tail[1..];
                    if carry.is_empty() {
                        if let Some(payload) = line.strip_prefix(b"data:") {
                            self.on_sse_data(payload, now);
                        }
                    } else {
                        carry.extend_from_slice(line);
                        if let Some(payload) = carry.strip_prefix(b"data:") {
                            self.on_sse_data(payload, now);
                        }
                        carry.clear();
                    }
                }
                // Keep an unfinished line only if it can still be a data line; cap it so a
                // pathological stream cannot grow it without bound.
                if !rest.is_empty() && carry.len() + rest.len() <= 4 << 20 {
                    carry.extend_from_slice(rest);
                }
                if let Scan::Sse { carry: kept } = &mut self.mode {
                    *kept = carry;
                }
            }
        }
    }

    fn on_sse_data(&mut self, payload: &[u8], now: Instant) {
        let payload = trim_ascii(payload);
        if payload.is_empty() {
            return;
        }
        self.events += 1;
        if payload == b"[DONE]" {
            return;
        }
        let Ok(event) = serde_json::from_slice::<Event>(payload) else {
            return;
        };
        if event.has_content(self.route) {
            self.content_events += 1;
            match self.last_content {
                None => {
                    self.first_content = Some(now);
                    self.metrics
                        .ttft
                        .with_label_values(&[self.route.label(), self.phase, self.target])
                        .observe(secs(now - self.start));
                }
                Some(prev) => {
                    if let Some(g) = self.gaps.as_mut() {
                        g.push((now - prev).as_secs_f32() * 1000.0);
                    }
                    self.inter_token
                        .get_or_insert_with(|| {
                            self.metrics.inter_token.with_label_values(&[
                                self.route.label(),
                                self.phase,
                                self.target,
                            ])
                        })
                        .observe(secs(now - prev))
                }
            }
            self.last_content = Some(now);
        }
        for u in event.usages() {
            self.usage.get_or_insert_with(Box::default).merge(u);
        }
    }

    /// Ends the exchange: reads a JSON body's `usage` and counts the tokens (once; the body
    /// wrapper calls it at the end of the stream; public for the fuzz harness).
    pub fn finish(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        if let Scan::Json {
            copy,
            overflow: false,
            ..
        } = &self.mode
        {
            self.usage = wire::json_usage(copy).map(Box::new);
        }
        let tokens = self.tokens();
        self.hand_in(true);
        self.metrics.count_tokens(
            [self.phase, self.target],
            [tokens.prompt, tokens.cached, tokens.completion],
        );
    }

    fn abort(&mut self, reason: &'static str) {
        if self.aborted.is_none() && !self.ended {
            self.aborted = Some(reason);
            self.metrics
                .streams_aborted
                .with_label_values(&[reason])
                .inc();
        }
    }
}

impl Observer {
    /// Keeps `guard` until the response body ends or is dropped.
    pub fn holding(mut self, guard: crate::proxy::exchange::InFlight) -> Self {
        self.in_flight = Some(guard);
        self
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        if !self.ended && self.aborted.is_none() {
            // Dropped before the end: the client went away (or the server closed it on shutdown).
            self.abort("client_disconnect");
        }
        self.hand_in(false);
        let elapsed = self.start.elapsed();
        self.duration.observe(secs(elapsed));
        if let Some(entry) = self.access.take() {
            let streamed = matches!(self.mode, Scan::Sse { .. });
            let outcome = crate::access_log::Outcome {
                ttft: self.first_content.map(|t| t - self.start),
                duration: elapsed,
                events: streamed.then_some(self.events),
                bytes_out: self.bytes_out,
                tokens: self.tokens(),
                end: self.aborted.unwrap_or("complete"),
                run: None,
                predicted: None,
            };
            // With a ticket, the line waits for the model's prediction (it is written when the
            // ticket is counted); without one it goes now.
            match self.log_ticket.take() {
                Some(t) => t.log_when_counted(entry, outcome),
                None => entry.write(&outcome),
            }
        }
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn trim_ascii(mut b: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = b {
        if first.is_ascii_whitespace() {
            b = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = b {
        if last.is_ascii_whitespace() {
            b = rest;
        } else {
            break;
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::BoxError;
    use bytes::Bytes;
    use http_body::{Body, Frame};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    fn observer(ct: &str) -> Observer {
        let labels = Labels {
            route: Route::Api(crate::api::Shape::Chat),
            phase: "profiling",
            target: "none",
        };
        Observer::new(
            Metrics::new(),
            labels,
            Instant::now(),
            Some(ct),
            Some(1 << 20),
        )
    }

    #[test]
    fn sse_events_split_across_frames_are_read_once() {
        let mut o = observer("text/event-stream");
        let events = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\" there\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n",
            "data: [DONE]\n\n"
        )
        .as_bytes();
        let t0 = Instant::now();
        // Feed in awkward 7-byte pieces to cross every boundary.
        for (i, piece) in events.chunks(7).enumerate() {
            o.on_data(piece, t0 + Duration::from_millis(i as u64));
        }
        assert!(o.first_content.is_some());
        assert_eq!(o.events, 5);
        assert_eq!(
            o.tokens(),
            Tokens {
                prompt: Some(40),
                cached: Some(32),
                completion: Some(2)
            }
        );
        o.finish();
        let text = String::from_utf8(o.metrics.render()).unwrap();
        for line in [
            "kvbust_upstream_cached_tokens_total{phase=\"profiling\",target=\"none\"} 32",
            "kvbust_upstream_completion_tokens_total{phase=\"profiling\",target=\"none\"} 2",
            "kvbust_time_to_first_token_seconds_count{phase=\"profiling\",route=\"chat\",target=\"none\"} 1",
            "kvbust_inter_token_seconds_count{phase=\"profiling\",route=\"chat\",target=\"none\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing: {text}");
        }
    }

    /// Feeds `body` in `piece`-byte frames through an observer of `route`, 1 ms apart.
    fn run(route: &'static str, ct: &str, body: &[u8], piece: usize) -> Observer {
        let route = crate::api::Shape::ALL
            .into_iter()
            .find(|s| s.as_str() == route)
            .map_or(Route::Other, Route::Api);
        let labels = Labels {
            route,
            phase: "warmup",
            target: "first_turn_prefix",
        };
        let t0 = Instant::now();
        let mut o = Observer::new(Metrics::new(), labels, t0, Some(ct), Some(1 << 20));
        for (i, p) in body.chunks(piece).enumerate() {
            o.on_data(p, t0 + Duration::from_millis(i as u64 + 1));
        }
        o.finish();
        o
    }

    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/observe")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn responses_and_messages_streams_give_ttft_gaps_and_usage() {
        // (route, fixture, content events, SSE data events, tokens)
        let cases = [
            ("responses", "responses.sse", 3, 11, (2006, 1920, 3)),
            // Anthropic: prompt = input 12 + cache read 1700 + cache creation 300.
            ("messages", "messages.sse", 4, 10, (2012, 1700, 7)),
        ];
        for (route, file, content, events, (p, c, g)) in cases {
            let body = fixture(file);
            for piece in [1, 13, 200, body.len()] {
                let o = run(route, "text/event-stream", &body, piece);
                let what = format!("{file} in {piece}-byte pieces");
                assert_eq!(o.events, events, "{what}");
                assert!(o.first_content.is_some(), "{what}");
                let expected = Tokens {
                    prompt: Some(p),
                    cached: Some(c),
                    completion: Some(g),
                };
                assert_eq!(o.tokens(), expected, "{what}");
                let text = String::from_utf8(o.metrics.render()).unwrap();
                let labels =
                    format!("phase=\"warmup\",route=\"{route}\",target=\"first_turn_prefix\"");
                for line in [
                    format!("kvbust_time_to_first_token_seconds_count{{{labels}}} 1"),
                    format!("kvbust_inter_token_seconds_count{{{labels}}} {}", content - 1),
                    format!("kvbust_upstream_prompt_tokens_total{{phase=\"warmup\",target=\"first_turn_prefix\"}} {p}"),
                    format!("kvbust_upstream_cached_tokens_total{{phase=\"warmup\",target=\"first_turn_prefix\"}} {c}"),
                    format!("kvbust_upstream_completion_tokens_total{{phase=\"warmup\",target=\"first_turn_prefix\"}} {g}"),
                ] {
                    assert!(text.contains(&line), "{what}: {line} missing: {text}");
                }
            }
        }
    }

    #[test]
    fn responses_and_messages_json_usage() {
        for (route, file, p, c, g) in [
            ("responses", "responses.json", 2006, 1920, 3),
            ("messages", "messages.json", 2012, 1700, 7),
        ] {
            let o = run(route, "application/json", &fixture(file), 64);
            assert_eq!(o.first_content, None);
            assert_eq!(
                o.tokens(),
                Tokens {
                    prompt: Some(p),
                    cached: Some(c),
                    completion: Some(g)
                },
                "{file}"
            );
        }
        // The same bytes on a route of another API are not misread.
        let o = run("chat", "application/json", &fixture("messages.json"), 64);
        assert_eq!(o.tokens().prompt, None);
    }

    #[test]
    fn anthropic_message_delta_totals_replace_the_start() {
        let body = concat!(
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n",
            "data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n",
            "data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"\"}}\n\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":4,\"output_tokens\":9}}\n\n",
        );
        let o = run("messages", "text/event-stream", body.as_bytes(), 1000);
        assert_eq!(
            o.tokens(),
            Tokens {
                prompt: Some(9),
                cached: Some(4),
                completion: Some(9)
            }
        );
        // Thinking counts as output; an empty text delta does not.
        assert_eq!(o.first_content, o.last_content);
        assert!(o.first_content.is_some());
    }

    #[test]
    fn json_usage_is_read_at_the_end() {
        let mut o = observer("application/json");
        let body = br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        for piece in body.chunks(5) {
            o.on_data(piece, Instant::now());
        }
        o.finish();
        assert_eq!(o.tokens().prompt, Some(7));
        assert_eq!(o.tokens().cached, Some(0));
    }

    #[test]
    fn dropped_before_end_counts_a_disconnect() {
        let o = observer("text/event-stream");
        let m = o.metrics.clone();
        let o = o.holding(crate::proxy::exchange::InFlight::begin(&m, None));
        assert_eq!(m.in_flight.get(), 1);
        drop(o);
        assert_eq!(m.in_flight.get(), 0);
        assert_eq!(
            m.streams_aborted
                .with_label_values(&["client_disconnect"])
                .get(),
            1
        );
    }

    /// An upstream body that sends one data frame and then stalls.
    struct Stall(Option<Bytes>);

    impl Body for Stall {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.0.take() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => Poll::Pending,
            }
        }
    }

    /// Polls `body` past its one frame; returns the error that ended it, the virtual time it took
    /// after that frame, and the metrics text.
    async fn stall_until_cut(
        idle: Duration,
        total: Option<Duration>,
    ) -> (BoxError, Duration, String) {
        use http_body_util::BodyExt as _;
        let o = observer("text/event-stream");
        let metrics = o.metrics.clone();
        let total = total.map(|t| (t, Instant::now()));
        let body = Observed::new(
            Stall(Some(Bytes::from_static(b"data: {}\n\n"))),
            idle,
            total,
            o,
        );
        let mut body = Box::pin(body);
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.data_ref().map(|d| d.len()), Some(10));
        let t0 = tokio::time::Instant::now();
        let err = match body.frame().await {
            Some(Err(e)) => e,
            other => panic!("expected a timeout error, got {other:?}"),
        };
        let text = String::from_utf8(metrics.render()).expect("utf-8");
        (err, t0.elapsed(), text)
    }

    /// The last frame's time is read from the real clock (one read serves the observer and the
    /// idle timer), so on the paused test clock the cut lands `want` after it plus the real time
    /// the test took to get there: up to seconds on a loaded machine, never less than `want`.
    fn within(waited: Duration, want: Duration) -> bool {
        want <= waited && waited <= want + Duration::from_secs(2)
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_upstream_body_is_cut_at_the_idle_timeout_and_counted() {
        let (err, waited, m) = stall_until_cut(Duration::from_secs(5), None).await;
        assert!(err.downcast_ref::<IdleTimeout>().is_some(), "{err}");
        assert!(within(waited, Duration::from_secs(5)), "{waited:?}");
        assert!(
            m.contains("kvbust_errors_total{code=\"upstream_idle_timeout\",source=\"upstream\"} 1")
        );
        assert!(m.contains("kvbust_streams_aborted_total{reason=\"idle_timeout\"} 1"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_total_timeout_cuts_a_stalled_body_before_the_idle_timeout() {
        let (err, waited, m) =
            stall_until_cut(Duration::from_secs(5), Some(Duration::from_secs(2))).await;
        assert!(err.downcast_ref::<TotalTimeout>().is_some(), "{err}");
        // The deadline is a real instant and the clock is paused, so it lands at 2 s of virtual
        // time plus however long the test took to start; well before the idle timeout at 5 s.
        let expected = Duration::from_secs(2)..Duration::from_secs(5);
        assert!(expected.contains(&waited), "{waited:?}");
        assert!(m.contains(
            "kvbust_errors_total{code=\"upstream_total_timeout\",source=\"upstream\"} 1"
        ));
        assert!(m.contains("kvbust_streams_aborted_total{reason=\"total_timeout\"} 1"));
        assert!(!m.contains("upstream_idle_timeout"));
    }
}
