//! The streaming response body of a mock completion in any shape (chat/completions chunks, Responses events,
//! Anthropic events): one SSE event per body frame, paced by a timer, produced lazily as the connection polls
//! for it. Owns the stream's schedule and its completed/cancelled accounting; it
//! never buffers events ahead, spawns no task (dropping the body stops generation), and never panics.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::anthropic;
use super::engine::{DecodeShare, Draws};
use super::openai::{self, ResponseMeta};
use super::output;
use super::recorder::StreamGuard;
use super::request::Usage;
use super::responses::ResponseEvents;

/// `base + d`, or about thirty years after `base` when that would overflow.
pub(crate) fn after(base: Instant, d: Duration) -> Instant {
    base.checked_add(d)
        .unwrap_or_else(|| base + Duration::from_secs(86_400 * 365 * 30))
}

/// The wire shape of a stream: which events open it, carry each token and close it.
#[derive(Debug)]
pub(crate) enum Events {
    /// Chat and completions chunks (`data:` only), ending with `data: [DONE]`.
    OpenAi(ResponseMeta),
    /// OpenAI Responses events.
    Responses(ResponseEvents),
    /// Anthropic Messages events.
    Messages {
        /// `msg_…`
        id: String,
        /// `model`.
        model: String,
    },
}

impl Events {
    /// Events sent as soon as the stream opens, before the first token is due.
    fn opening(&mut self, usage: &Usage) -> Vec<Bytes> {
        match self {
            Events::OpenAi(_) => Vec::new(),
            Events::Responses(ev) => ev.opening(),
            Events::Messages { id, model } => anthropic::opening(id, model, usage),
        }
    }

    /// Events sent with the first token, just before it.
    fn before_first_token(&mut self) -> Vec<Bytes> {
        match self {
            Events::Responses(ev) => ev.before_first_token(),
            Events::OpenAi(_) | Events::Messages { .. } => Vec::new(),
        }
    }

    fn token(&mut self, index: u32, piece: &str) -> Bytes {
        match self {
            Events::OpenAi(meta) => openai::token_event(meta, index, piece),
            Events::Responses(ev) => ev.token(piece),
            Events::Messages { .. } => anthropic::token(piece),
        }
    }

    /// Events after the last token; the last one ends the stream.
    fn closing(&mut self, usage: &Usage) -> Vec<Bytes> {
        match self {
            Events::OpenAi(meta) => {
                let mut out = vec![openai::finish_event(meta)];
                if meta.include_usage {
                    out.push(openai::usage_event(meta, usage));
                }
                out.push(Bytes::from_static(openai::DONE_EVENT));
                out
            }
            Events::Responses(ev) => ev.closing(usage),
            Events::Messages { .. } => anthropic::closing(usage),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Opening,
    Tokens,
    Closing,
    End,
}

/// What a stream will say and when.
#[derive(Debug)]
pub(crate) struct StreamPlan {
    pub shape: Events,
    pub usage: Usage,
    pub seed: u64,
    /// The words the answer is made of ([`crate::mock::output::one_token_words`]).
    pub vocab: std::sync::Arc<[&'static str]>,
    pub tokens: u32,
    /// When the first token event is due.
    pub first_token_at: Instant,
    pub inter_token: Duration,
    /// Jitter on each gap between tokens (`mock.jitter`; `None`: a fixed schedule).
    pub jitter: Option<Draws>,
    /// The shared decode budget (`mock.decode_tokens_per_s`): gaps widen with the running requests.
    pub decode: Option<DecodeShare>,
    /// An injected failure that ends the stream early (`mock.failure_rate`).
    pub cut: Option<Cut>,
}

impl StreamPlan {
    /// The gap before the next token: `inter_token`, widened by the shared decode budget, then
    /// jittered.
    pub fn gap(&mut self) -> Duration {
        let base = match &self.decode {
            Some(d) => d.gap(self.inter_token),
            None => self.inter_token,
        };
        match self.jitter.as_mut() {
            Some(j) => j.jittered(base),
            None => base,
        }
    }
}

/// How an injected failure ends a stream once `after` token events were sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    pub after: u32,
    /// True: the connection is reset; false: the stream stalls (sends nothing more, ever).
    pub reset: bool,
}

/// SSE body: the shape's opening events at once, token events at `first_token_at + i × inter_token`, then its
/// closing events, each its own frame.
pub(crate) struct SseBody {
    plan: StreamPlan,
    phase: Phase,
    queue: VecDeque<Bytes>,
    index: u32,
    due: Instant,
    timer: Pin<Box<Sleep>>,
    guard: StreamGuard,
}

impl SseBody {
    pub(crate) fn new(plan: StreamPlan, guard: StreamGuard) -> Self {
        let due = plan.first_token_at;
        SseBody {
            timer: Box::pin(tokio::time::sleep_until(due)),
            plan,
            phase: Phase::Opening,
            queue: VecDeque::new(),
            index: 0,
            due,
            guard,
        }
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        loop {
            if let Some(event) = this.queue.pop_front() {
                if this.phase == Phase::Closing && this.queue.is_empty() {
                    // The last event is on its way: the stream is complete.
                    this.phase = Phase::End;
                    this.guard.complete();
                }
                return Poll::Ready(Some(Ok(Frame::data(event))));
            }
            match this.phase {
                Phase::Opening => {
                    let events = this.plan.shape.opening(&this.plan.usage);
                    this.queue.extend(events);
                    this.phase = Phase::Tokens;
                }
                Phase::Tokens if this.index >= this.plan.tokens => {
                    let events = this.plan.shape.closing(&this.plan.usage);
                    this.queue.extend(events);
                    this.phase = Phase::Closing;
                }
                Phase::Tokens => {
                    if let Some(cut) = this.plan.cut.filter(|c| this.index >= c.after) {
                        if cut.reset {
                            this.phase = Phase::End;
                            return Poll::Ready(Some(Err(std::io::Error::new(
                                std::io::ErrorKind::ConnectionReset,
                                "mock.failure_rate: injected reset mid-stream",
                            ))));
                        }
                        // A stall: nothing more, and nothing will wake this body again.
                        return Poll::Pending;
                    }
                    if Instant::now() < this.due && this.timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    if this.index == 0 {
                        let events = this.plan.shape.before_first_token();
                        this.queue.extend(events);
                    }
                    let piece = output::piece(&this.plan.vocab, this.plan.seed, this.index);
                    let event = this.plan.shape.token(this.index, &piece);
                    this.queue.push_back(event);
                    this.index += 1;
                    // A fixed schedule: a slow reader gets the backlog at once, as from a real server.
                    let gap = this.plan.gap();
                    this.due = after(this.due, gap);
                    let due = this.due;
                    this.timer.as_mut().reset(due);
                }
                Phase::Closing => {
                    // A shape that closes with no event still completes.
                    this.phase = Phase::End;
                    this.guard.complete();
                }
                Phase::End => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.phase == Phase::End && self.queue.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
