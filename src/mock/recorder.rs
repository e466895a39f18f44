//! `Recorder`: what the mock received (every request, any path or method, with its exact body bytes) and what
//! happened to its streams, for tests and diagnostics. Owns only that bookkeeping; it never alters a request or
//! a response, and keeps a bounded number of requests so a long-running mock cannot grow without limit.

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
    /// The body bytes exactly as received (truncated only if over the mock's body limit).
    pub body: Bytes,
    /// HTTP version of the request.
    pub version: Version,
}

#[derive(Debug, Default)]
struct State {
    requests: VecDeque<CapturedRequest>,
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
}

impl Recorder {
    /// A recorder that keeps the `keep` most recent requests (counters are always kept).
    pub fn new(keep: usize) -> Self {
        Recorder {
            state: Arc::new(watch::Sender::new(State::default())),
            keep,
        }
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

    pub(crate) fn record(&self, req: CapturedRequest) {
        let keep = self.keep;
        self.state.send_modify(|s| {
            s.requests_total += 1;
            if keep > 0 {
                if s.requests.len() >= keep {
                    s.requests.pop_front();
                }
                s.requests.push_back(req);
            }
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
        CapturedRequest {
            method: Method::GET,
            uri: Uri::try_from(path).expect("valid"),
            authority: None,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            version: Version::HTTP_11,
        }
    }

    #[test]
    fn keeps_a_bounded_window_and_counts_everything() {
        let r = Recorder::new(2);
        for p in ["/a", "/b", "/c"] {
            r.record(req(p));
        }
        let kept: Vec<String> = r.requests().iter().map(|c| c.uri.to_string()).collect();
        assert_eq!(kept, ["/b", "/c"]);
        assert_eq!(r.requests_total(), 3);
    }

    #[tokio::test]
    async fn guards_count_completion_and_cancellation() {
        let r = Recorder::new(0);
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
