//! The response-body wrapper: passes every frame on the moment it arrives, enforces the idle
//! timeout between frames, and on the side reads SSE event boundaries for TTFT/inter-token gaps
//! and `usage` for token counters. Never delays, merges, splits or holds a frame.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde::Deserialize;
use tokio::time::Sleep;

use super::BoxError;
use crate::metrics::Metrics;

/// The metric labels of one exchange.
#[derive(Debug, Clone, Copy)]
pub struct Labels {
    pub route: &'static str,
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
    route: &'static str,
    phase: &'static str,
    target: &'static str,
    start: Instant,
    mode: Scan,
    first_content: Option<Instant>,
    last_content: Option<Instant>,
    usage: Option<Usage>,
    ended: bool,
    aborted: Option<&'static str>,
    /// The request's place in `kvbust_in_flight_requests` and in its connection's activity,
    /// released when the response body ends or is dropped.
    in_flight: Option<super::InFlight>,
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

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

impl Usage {
    pub fn cached(&self) -> Option<u64> {
        self.prompt_tokens_details.and_then(|d| d.cached_tokens)
    }
}

/// The few fields of an SSE chunk or a JSON response the observer reads.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
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
            inter_token: None,
            duration: metrics.duration.with_label_values(&[route]),
            metrics,
            route,
            phase,
            target,
            start,
            mode,
            first_content: None,
            last_content: None,
            usage: None,
            ended: false,
            aborted: None,
        }
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
                let mut rest = data;
                // Lines may span frames: join the carried tail with this frame up to the newline.
                let mut lines: Vec<Vec<u8>> = Vec::new();
                while let Some(i) = rest.iter().position(|&b| b == b'\n') {
                    let (line, tail) = rest.split_at(i);
                    if carry.is_empty() {
                        if line.starts_with(b"data:") {
                            lines.push(line.to_vec());
                        }
                    } else {
                        carry.extend_from_slice(line);
                        if carry.starts_with(b"data:") {
                            lines.push(std::mem::take(carry));
                        }
                        carry.clear();
                    }
                    rest = &tail[1..];
                }
                // Keep an unfinished line only if it can still be a data line; cap it so a
                // pathological stream cannot grow it without bound.
                if !rest.is_empty() && carry.len() + rest.len() <= 4 << 20 {
                    carry.extend_from_slice(rest);
                }
                for line in lines {
                    self.on_sse_data(&line[5..], now);
                }
            }
        }
    }

    fn on_sse_data(&mut self, payload: &[u8], now: Instant) {
        let payload = trim_ascii(payload);
        if payload.is_empty() || payload == b"[DONE]" {
            return;
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk>(payload) else {
            return;
        };
        let has_content = chunk.choices.iter().any(|c| {
            c.text.as_deref().is_some_and(|t| !t.is_empty())
                || c.delta.as_ref().is_some_and(|d| {
                    d.content.as_deref().is_some_and(|t| !t.is_empty())
                        || d.reasoning_content
                            .as_deref()
                            .is_some_and(|t| !t.is_empty())
                })
        });
        if has_content {
            match self.last_content {
                None => {
                    self.first_content = Some(now);
                    self.metrics
                        .ttft
                        .with_label_values(&[self.route])
                        .observe(secs(now - self.start));
                }
                Some(prev) => self
                    .inter_token
                    .get_or_insert_with(|| {
                        self.metrics.inter_token.with_label_values(&[self.route])
                    })
                    .observe(secs(now - prev)),
            }
            self.last_content = Some(now);
        }
        if let Some(u) = chunk.usage {
            self.usage = Some(u);
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
            if let Ok(chunk) = serde_json::from_slice::<Chunk>(copy) {
                self.usage = chunk.usage;
            }
        }
        if let Some(u) = self.usage {
            let labels = [self.phase, self.target];
            if let Some(p) = u.prompt_tokens {
                self.metrics
                    .prompt_tokens
                    .with_label_values(&labels)
                    .inc_by(p);
            }
            if let Some(c) = u.cached() {
                self.metrics
                    .cached_tokens
                    .with_label_values(&labels)
                    .inc_by(c);
            }
        }
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
    pub fn holding(mut self, guard: super::InFlight) -> Self {
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
        self.duration.observe(secs(self.start.elapsed()));
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

/// Raised when no frame arrives within the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?} (upstream.idle_timeout)")]
pub struct IdleTimeout(pub Duration);

pin_project! {
    /// A body that forwards `inner` frame by frame while `observer` watches.
    pub struct Observed<B> {
        #[pin]
        inner: B,
        // Armed lazily: a frame only records when it came; the timer is moved only when it fires
        // early, so a stream of many small events costs no timer-wheel work per event.
        #[pin]
        idle: Sleep,
        idle_timeout: Duration,
        last_frame: tokio::time::Instant,
        // `upstream.total_timeout`: the whole exchange, headers included, must end by then.
        deadline: Option<(Pin<Box<Sleep>>, Duration)>,
        observer: Observer,
    }
}

/// Raised when the whole exchange outlives `upstream.total_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("response not finished within {0:?} (upstream.total_timeout)")]
pub struct TotalTimeout(pub Duration);

impl<B> Observed<B> {
    /// `total`: the total timeout and when the request started, if one is configured.
    pub fn new(
        inner: B,
        idle_timeout: Duration,
        total: Option<(Duration, Instant)>,
        observer: Observer,
    ) -> Self {
        let deadline = total.map(|(t, start)| {
            let at = tokio::time::Instant::from_std(start + t);
            (Box::pin(tokio::time::sleep_until(at)), t)
        });
        Self {
            inner,
            idle: tokio::time::sleep(idle_timeout),
            idle_timeout,
            last_frame: tokio::time::Instant::now(),
            deadline,
            observer,
        }
    }
}

impl<B> Body for Observed<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let now = Instant::now();
                if let Some(data) = frame.data_ref() {
                    this.observer.on_data(data, now);
                }
                *this.last_frame = tokio::time::Instant::from_std(now);
                if this.inner.is_end_stream() {
                    this.observer.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                tracing::warn!(error = %crate::proxy::forward::error_chain(e.as_ref()), "upstream response body failed");
                this.observer
                    .metrics
                    .error("upstream", "upstream_body_error");
                this.observer.abort("upstream_error");
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.observer.finish();
                Poll::Ready(None)
            }
            Poll::Pending => {
                while this.idle.as_mut().poll(cx).is_ready() {
                    let due = *this.last_frame + *this.idle_timeout;
                    if tokio::time::Instant::now() < due {
                        // A frame came since the timer was set: move it, poll it again.
                        this.idle.as_mut().reset(due);
                        continue;
                    }
                    let err = IdleTimeout(*this.idle_timeout);
                    tracing::warn!(route = this.observer.route, "{err}; closing the response");
                    this.observer
                        .metrics
                        .error("upstream", "upstream_idle_timeout");
                    this.observer.abort("idle_timeout");
                    return Poll::Ready(Some(Err(Box::new(err))));
                }
                if let Some((sleep, total)) = this.deadline.as_mut() {
                    if sleep.as_mut().poll(cx).is_ready() {
                        let err = TotalTimeout(*total);
                        tracing::warn!(route = this.observer.route, "{err}; closing the response");
                        this.observer
                            .metrics
                            .error("upstream", "upstream_total_timeout");
                        this.observer.abort("total_timeout");
                        return Poll::Ready(Some(Err(Box::new(err))));
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

use std::future::Future as _;

#[cfg(test)]
mod tests {
    use super::*;

    fn observer(ct: &str) -> Observer {
        let labels = Labels {
            route: "chat",
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
        assert_eq!(o.usage.unwrap().prompt_tokens, Some(40));
        assert_eq!(o.usage.unwrap().cached(), Some(32));
        o.finish();
        let text = String::from_utf8(o.metrics.render()).unwrap();
        assert!(
            text.contains(
                "kvbust_upstream_cached_tokens_total{phase=\"profiling\",target=\"none\"} 32"
            ),
            "{text}"
        );
        assert!(text.contains("kvbust_time_to_first_token_seconds_count{route=\"chat\"} 1"));
        assert!(text.contains("kvbust_inter_token_seconds_count{route=\"chat\"} 1"));
    }

    #[test]
    fn json_usage_is_read_at_the_end() {
        let mut o = observer("application/json");
        let body = br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        for piece in body.chunks(5) {
            o.on_data(piece, Instant::now());
        }
        o.finish();
        assert_eq!(o.usage.unwrap().prompt_tokens, Some(7));
    }

    #[test]
    fn dropped_before_end_counts_a_disconnect() {
        let o = observer("text/event-stream");
        let m = o.metrics.clone();
        let o = o.holding(super::super::InFlight::begin(&m, None));
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
}
