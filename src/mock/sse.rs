//! The streaming response body of a mock completion: one SSE event per body frame, paced by a timer, produced
//! lazily as the connection polls for it. Owns the stream's schedule and its completed/cancelled accounting; it
//! never buffers events ahead, spawns no task (dropping the body stops generation), and never panics.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::openai::{self, ResponseMeta, Usage};
use super::output;
use super::recorder::StreamGuard;

/// `base + d`, or about thirty years after `base` when that would overflow.
pub(crate) fn after(base: Instant, d: Duration) -> Instant {
    base.checked_add(d)
        .unwrap_or_else(|| base + Duration::from_secs(86_400 * 365 * 30))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Token,
    Finish,
    Usage,
    Done,
    End,
}

/// What a stream will say and when.
#[derive(Debug)]
pub(crate) struct StreamPlan {
    pub meta: ResponseMeta,
    pub usage: Usage,
    pub seed: u64,
    pub tokens: u32,
    /// When the first token event is due.
    pub first_token_at: Instant,
    pub inter_token: Duration,
}

/// SSE body: token events at `first_token_at + i × inter_token`, then the finish event, the usage event (if
/// requested) and `data: [DONE]`, each its own frame.
pub(crate) struct SseBody {
    plan: StreamPlan,
    next: Next,
    index: u32,
    due: Instant,
    timer: Pin<Box<Sleep>>,
    guard: StreamGuard,
}

impl SseBody {
    pub(crate) fn new(plan: StreamPlan, guard: StreamGuard) -> Self {
        let due = plan.first_token_at;
        let next = if plan.tokens == 0 {
            Next::Finish
        } else {
            Next::Token
        };
        SseBody {
            timer: Box::pin(tokio::time::sleep_until(due)),
            plan,
            next,
            index: 0,
            due,
            guard,
        }
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        let event = match this.next {
            Next::Token => {
                if Instant::now() < this.due && this.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let piece = output::piece(this.plan.seed, this.index);
                let event = openai::token_event(&this.plan.meta, this.index, &piece);
                this.index += 1;
                if this.index >= this.plan.tokens {
                    this.next = Next::Finish;
                } else {
                    // A fixed schedule: a slow reader gets the backlog at once, as from a real server.
                    this.due = after(this.due, this.plan.inter_token);
                    let due = this.due;
                    this.timer.as_mut().reset(due);
                }
                event
            }
            Next::Finish => {
                this.next = if this.plan.meta.include_usage {
                    Next::Usage
                } else {
                    Next::Done
                };
                openai::finish_event(&this.plan.meta)
            }
            Next::Usage => {
                this.next = Next::Done;
                openai::usage_event(&this.plan.meta, &this.plan.usage)
            }
            Next::Done => {
                this.next = Next::End;
                this.guard.complete();
                Bytes::from_static(openai::DONE_EVENT)
            }
            Next::End => return Poll::Ready(None),
        };
        Poll::Ready(Some(Ok(Frame::data(event))))
    }

    fn is_end_stream(&self) -> bool {
        self.next == Next::End
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
