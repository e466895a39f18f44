//! `Recorder`: what the mock received (every request, any path or method, with its exact body bytes while they
//! fit a byte budget, else their size and sha256) and what happened to its streams, for tests and diagnostics.
//! Owns only that bookkeeping; it never alters a request or a response, and keeps a bounded number of requests
//! and a bounded number of bytes (heads and bodies, copied so that nothing kept pins a connection's buffer), so a
//! long-running mock cannot grow without limit.

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
    /// Bytes the heads of `requests` hold ([`head_bytes`]), bodies not included.
    head_bytes: usize,
    requests_total: usize,
    streams_started: u64,
    streams_completed: u64,
    streams_cancelled: u64,
}

impl State {
    fn pop_oldest(&mut self) {
        if let Some(old) = self.requests.pop_front() {
            self.body_bytes -= old.body.len();
            self.head_bytes -= head_bytes(&old);
        }
    }
}

/// What a kept request's head costs: the record itself, its URI and authority, and each header
/// (name, value and the map's entry).
fn head_bytes(req: &CapturedRequest) -> usize {
    /// A header map entry beyond its name and value (HPACK counts 32; the map's is similar).
    const PER_HEADER: usize = 32;
    let headers: usize = req
        .headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + PER_HEADER)
        .sum();
    std::mem::size_of::<CapturedRequest>()
        + req.uri.to_string().len()
        + req.authority.as_ref().map_or(0, String::len)
        + headers
}

/// `req` with every byte it keeps in allocations of its own (the body only when `body`).
fn copied(req: &CapturedRequest, body: bool) -> CapturedRequest {
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    for (name, value) in &req.headers {
        // Both were valid when received, so their copies are: a failure drops just that header.
        let (Ok(n), Ok(mut v)) = (
            http::HeaderName::from_bytes(name.as_str().as_bytes()),
            http::HeaderValue::from_bytes(value.as_bytes()),
        ) else {
            continue;
        };
        v.set_sensitive(value.is_sensitive());
        headers.append(n, v);
    }
    CapturedRequest {
        method: req.method.clone(),
        uri: Uri::try_from(req.uri.to_string()).unwrap_or_else(|_| req.uri.clone()),
        authority: req.authority.clone(),
        headers,
        body: if body {
            Bytes::copy_from_slice(&req.body)
        } else {
            Bytes::new()
        },
        body_len: req.body_len,
        body_sha256: req.body_sha256,
        version: req.version,
    }
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

    /// Bytes the recorder holds now, heads (method, URI, headers, the record itself) and bodies
    /// together: never more than its budget.
    pub fn held_bytes(&self) -> usize {
        let s = self.state.borrow();
        s.body_bytes + s.head_bytes
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

    /// Records `req`: counted always; kept (the `keep` most recent) while everything kept, heads
    /// and bodies, totals at most the byte budget. What is kept is copied, each part at its exact
    /// size, because a server's request head and body are slices of its connection's read buffer:
    /// a kept slice would pin the whole buffer (~0.5 MB a request at 1 MB bodies). To make room
    /// the oldest bodies go first, then the oldest requests; a body over the budget is not kept.
    pub(crate) fn record(&self, req: CapturedRequest) {
        let (keep, budget) = (self.keep, self.body_budget);
        let head = head_bytes(&req);
        let keep_req = keep > 0 && head <= budget;
        let keep_body = keep_req && req.body.len() <= budget - head;
        let req = keep_req.then(|| copied(&req, keep_body));
        self.state.send_modify(|s| {
            s.requests_total += 1;
            let Some(req) = req else {
                return;
            };
            if s.requests.len() >= keep {
                s.pop_oldest();
            }
            let need = head + req.body.len();
            // Oldest first: the recent requests are the ones a test or a person looks at.
            let mut i = 0;
            while s.body_bytes + s.head_bytes + need > budget && i < s.requests.len() {
                let old = &mut s.requests[i];
                s.body_bytes -= old.body.len();
                old.body = Bytes::new();
                i += 1;
            }
            while s.body_bytes + s.head_bytes + need > budget && !s.requests.is_empty() {
                s.pop_oldest();
            }
            s.body_bytes += req.body.len();
            s.head_bytes += head;
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
        // Heads count too: room for three heads and 100 body bytes.
        let h = head_bytes(&req("/a"));
        let r = Recorder::new(10, 3 * h + 100);
        let mut held = Vec::new();
        for (p, n) in [("/a", 40), ("/b", 40), ("/c", 30), ("/d", 101), ("/e", 0)] {
            r.record(with_body(p, Bytes::from(vec![b'x'; n])));
            held.push(r.held_bytes());
        }
        let kept: Vec<(String, usize, bool)> = r
            .requests()
            .iter()
            .map(|c| (c.uri.to_string(), c.body_len, c.body_kept()))
            .collect();
        // /c's body made /a's go; /d's (101 bytes) made the bodies of /b and /c go, then /a and
        // /b themselves; /e's head then made /d's body go.
        let want = [("/c", 30, false), ("/d", 101, false), ("/e", 0, true)]
            .map(|(p, n, k)| (p.to_owned(), n, k));
        assert_eq!(kept, want);
        assert_eq!(held, [h + 40, 2 * h + 80, 3 * h + 70, 2 * h + 101, 3 * h]);
        assert_eq!(r.body_bytes(), 0);
        assert_eq!(r.requests_total(), 5);
        // A body over the whole budget is never kept; its request is.
        let r = Recorder::new(10, h + 100);
        r.record(with_body("/f", Bytes::from(vec![b'x'; 101])));
        assert_eq!(r.held_bytes(), h);
        assert!(!r.requests()[0].body_kept());
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

#[cfg(test)]
mod held_tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    /// A request whose head, like hyper's, is slices of one large read buffer (`buf`).
    fn sliced(buf: &Bytes, body: usize) -> CapturedRequest {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_maybe_shared(buf.slice(32..48)).unwrap(),
        );
        headers.insert(
            HeaderName::from_static("x-custom"),
            HeaderValue::from_maybe_shared(buf.slice(16..32)).unwrap(),
        );
        let uri = Uri::from_maybe_shared(buf.slice(0..8)).unwrap();
        CapturedRequest {
            method: Method::POST,
            uri,
            authority: None,
            headers,
            body_len: body,
            body_sha256: [0; 32],
            body: buf.slice(64..64 + body),
            version: Version::HTTP_11,
        }
    }

    fn inside(buf: &Bytes, b: &[u8]) -> bool {
        let r = buf.as_ptr_range();
        r.contains(&b.as_ptr())
    }

    /// Issue 23 item 6: kept requests held their headers as slices of the connection's read
    /// buffer (~0.5 MB each at 1 MB bodies, even with `record_bytes = 0`). What is kept is
    /// copied, and everything kept (head and body) is counted against `record_bytes`.
    #[test]
    fn kept_heads_are_copies_and_count_against_the_budget() {
        let mut v = vec![b'a'; 1 << 20];
        v[0] = b'/';
        let buf = Bytes::from(v);
        let r = Recorder::new(1024, 0);
        r.record(sliced(&buf, 1000));
        // With no budget, nothing is held, not even a head.
        assert_eq!(r.held_bytes(), 0);
        assert!(r.requests().is_empty());
        assert_eq!(r.requests_total(), 1);

        let budget = 4096;
        let r = Recorder::new(1024, budget);
        for _ in 0..100 {
            r.record(sliced(&buf, 1000));
        }
        assert_eq!(r.requests_total(), 100);
        assert!(r.held_bytes() <= budget, "{} > {budget}", r.held_bytes());
        let kept = r.requests();
        assert!(!kept.is_empty() && kept.len() < 100, "{}", kept.len());
        let newest = kept.last().unwrap();
        assert!(newest.body_kept());
        for c in &kept {
            for v in c.headers.values() {
                assert!(!inside(&buf, v.as_bytes()), "a header pins the read buffer");
            }
            assert!(!inside(&buf, c.uri.path().as_bytes()), "the URI pins it");
            assert!(!inside(&buf, c.body.as_ref()) || c.body.is_empty());
        }
        assert_eq!(kept[0].headers["x-custom"], "aaaaaaaaaaaaaaaa");
    }
}
