//! `Recorder`: what the mock received (every request, any path or method, with its exact body bytes while they
//! fit a byte budget, else their size and sha256) and what happened to its streams, for tests and diagnostics.
//! Owns only that bookkeeping; it never alters a request or a response, and keeps a bounded number of requests
//! and a bounded number of body bytes, so a long-running mock cannot grow without limit.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, Uri, Version};
use tokio::sync::watch;

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct CapturedRequest {
    /// Request method.
    pub method: Method,
    /// Path and query only (origin form), e.g. `/v1/chat/completions?x=1`.
    pub uri: Uri,
    /// The URI authority when the request carried one (HTTP/2 `:authority`, absolute-form HTTP/1.1); with
    /// plain HTTP/1.1 the host is in the `host` header instead.
    pub authority: Option<String>,
    /// Headers exactly as received.
    pub headers: HeaderMap,
    /// The body bytes exactly as received (truncated only if over the mock's body limit), while they fit the
    /// recorder's byte budget; empty once dropped for the budget (see [`CapturedRequest::body_kept`]).
    pub body: Bytes,
    /// The body's length in bytes, kept or not.
    pub body_len: usize,
    /// The body's sha256, kept or not.
    pub body_sha256: [u8; 32],
    /// HTTP version of the request.
    pub version: Version,
}

impl CapturedRequest {
    /// Whether [`CapturedRequest::body`] still holds the whole body.
    pub fn body_kept(&self) -> bool {
        self.body.len() == self.body_len
    }
}

#[derive(Debug, Default)]
struct State {
    requests: VecDeque<CapturedRequest>,
    /// Bytes of the bodies still held in `requests`.
    body_bytes: usize,
    requests_total: usize,
    streams_started: u64,
    streams_completed: u64,
    streams_cancelled: u64,
}

/// Everything the mock received and what happened to its streams. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct Recorder {
    state: Arc<watch::Sender<State>>,
    keep: usize,
    body_budget: usize,
}

impl Recorder {
    /// A recorder that keeps the `keep` most recent requests, holding their bodies while they total at most
    /// `body_budget` bytes (newest first); counters, sizes and digests are always kept.
    pub fn new(keep: usize, body_budget: usize) -> Self {
        Recorder {
            state: Arc::new(watch::Sender::new(State::default())),
            keep,
            body_budget,
        }
    }

    /// Bytes of request bodies the recorder holds now (never more than its budget).
    pub fn body_bytes(&self) -> usize {
        self.state.borrow().body_bytes
    }

    /// The retained requests, oldest first.
    pub fn requests(&self) -> Vec<CapturedRequest> {
        self.state.borrow().requests.iter().cloned().collect()
    }

    /// How many requests were received in total (including ones no longer retained).
    pub fn requests_total(&self) -> usize {
        self.state.borrow().requests_total
    }

    /// Streaming completions started (counted when the request is accepted, before any pacing delay).
    pub fn streams_started(&self) -> u64 {
        self.state.borrow().streams_started
    }

    /// Streams that produced their final `data: [DONE]` event.
    pub fn streams_completed(&self) -> u64 {
        self.state.borrow().streams_completed
    }

    /// Streams abandoned before `[DONE]` because the client went away (response future or body dropped).
    pub fn streams_cancelled(&self) -> u64 {
        self.state.borrow().streams_cancelled
    }

    /// Streams started and neither completed nor cancelled yet.
    pub fn streams_in_flight(&self) -> u64 {
        let s = self.state.borrow();
        s.streams_started
            .saturating_sub(s.streams_completed + s.streams_cancelled)
    }

    /// Resolves once at least `n` streams were cancelled.
    pub async fn wait_cancelled(&self, n: u64) {
        self.wait(|s| s.streams_cancelled >= n).await;
    }

    /// Resolves once at least `n` streams completed.
    pub async fn wait_completed(&self, n: u64) {
        self.wait(|s| s.streams_completed >= n).await;
    }

    /// Resolves once at least `n` requests were received in total.
    pub async fn wait_requests(&self, n: usize) {
        self.wait(|s| s.requests_total >= n).await;
    }

    async fn wait(&self, done: impl FnMut(&State) -> bool) {
        let mut rx = self.state.subscribe();
        // The sender lives in `self`, so this only returns once the condition holds.
        let _ = rx.wait_for(done).await;
    }

    /// Records `req`. Its body is kept (as its own exact-size copy, so a kept body never pins a larger buffer)
    /// when it fits the budget, dropping the oldest kept bodies to make room; a body over the whole budget is
    /// not kept.
    pub(crate) fn record(&self, mut req: CapturedRequest) {
        let (keep, budget) = (self.keep, self.body_budget);
        let body = std::mem::take(&mut req.body);
        let keep_body = keep > 0 && body.len() <= budget;
        if keep_body {
            req.body = Bytes::copy_from_slice(&body);
        }
        drop(body);
        self.state.send_modify(|s| {
            s.requests_total += 1;
            if keep == 0 {
                return;
            }
            if s.requests.len() >= keep {
                if let Some(old) = s.requests.pop_front() {
                    s.body_bytes -= old.body.len();
                }
            }
            if keep_body {
                // Oldest first: the bodies of recent requests are the ones a test or a person looks at.
                let mut i = 0;
                while s.body_bytes + req.body.len() > budget && i < s.requests.len() {
                    let old = &mut s.requests[i];
                    s.body_bytes -= old.body.len();
                    old.body = Bytes::new();
                    i += 1;
                }
                s.body_bytes += req.body.len();
            }
            s.requests.push_back(req);
        });
    }

    pub(crate) fn stream_started(&self) -> StreamGuard {
        self.state.send_modify(|s| s.streams_started += 1);
        StreamGuard {
            recorder: self.clone(),
            finished: false,
        }
    }
}

/// Tracks one streaming completion: unless [`StreamGuard::complete`] was called, dropping it counts the stream
/// as cancelled and wakes `wait_cancelled` callers. Dropped with the response body (or the handler future, if the
/// client leaves before the headers).
#[derive(Debug)]
pub(crate) struct StreamGuard {
    recorder: Recorder,
    finished: bool,
}

impl StreamGuard {
    /// Counts the stream as completed (idempotent).
    pub(crate) fn complete(&mut self) {
        if !self.finished {
            self.finished = true;
            self.recorder
                .state
                .send_modify(|s| s.streams_completed += 1);
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.finished = true;
            self.recorder
                .state
                .send_modify(|s| s.streams_cancelled += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str) -> CapturedRequest {
        with_body(path, Bytes::new())
    }

    fn with_body(path: &str, body: Bytes) -> CapturedRequest {
        CapturedRequest {
            method: Method::GET,
            uri: Uri::try_from(path).expect("valid"),
            authority: None,
            headers: HeaderMap::new(),
            body_len: body.len(),
            body_sha256: [0; 32],
            body,
            version: Version::HTTP_11,
        }
    }

    #[test]
    fn bodies_stay_within_the_byte_budget_newest_first() {
        let r = Recorder::new(10, 100);
        for (p, n) in [("/a", 40), ("/b", 40), ("/c", 30), ("/d", 101), ("/e", 0)] {
            r.record(with_body(p, Bytes::from(vec![b'x'; n])));
        }
        let kept: Vec<(String, usize, bool)> = r
            .requests()
            .iter()
            .map(|c| (c.uri.to_string(), c.body_len, c.body_kept()))
            .collect();
        let want = [
            ("/a", 40, false), // dropped to make room for /c
            ("/b", 40, true),
            ("/c", 30, true),
            ("/d", 101, false), // over the whole budget
            ("/e", 0, true),
        ]
        .map(|(p, n, k)| (p.to_owned(), n, k));
        assert_eq!(kept, want);
        assert_eq!(r.body_bytes(), 70);
        assert!(r.requests()[0].body.is_empty());
    }

    #[test]
    fn keeps_a_bounded_window_and_counts_everything() {
        let r = Recorder::new(2, 1 << 20);
        for p in ["/a", "/b", "/c"] {
            r.record(req(p));
        }
        let kept: Vec<String> = r.requests().iter().map(|c| c.uri.to_string()).collect();
        assert_eq!(kept, ["/b", "/c"]);
        assert_eq!(r.requests_total(), 3);
    }

    #[tokio::test]
    async fn guards_count_completion_and_cancellation() {
        let r = Recorder::new(0, 0);
        let mut done = r.stream_started();
        let dropped = r.stream_started();
        assert_eq!(r.streams_in_flight(), 2);
        done.complete();
        drop(done);
        drop(dropped);
        r.wait_cancelled(1).await;
        r.wait_completed(1).await;
        assert_eq!(
            (
                r.streams_started(),
                r.streams_completed(),
                r.streams_cancelled()
            ),
            (2, 1, 1)
        );
        assert_eq!(r.streams_in_flight(), 0);
    }
}
