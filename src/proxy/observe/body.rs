//! The response body kvbust streams back ([`Observed`]): passes every frame on the moment it
//! arrives to the client and, on the side, to the observer, and ends the exchange on the idle
//! timeout between frames or the total timeout. Never delays, merges, splits or holds a frame.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::Observer;
use crate::body::BoxError;

/// Raised when no frame arrives within the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?} (upstream.idle_timeout)")]
pub struct IdleTimeout(pub Duration);

pin_project! {
    /// A body that forwards `inner` frame by frame while `observer` watches.
    #[project = ObservedProj]
    pub struct Observed<B> {
        #[pin]
        inner: B,
        // Armed lazily: a frame only records when it came; the timer is moved only when it fires
        // early, so a stream of many small events costs no timer-wheel work per event.
        idle: IdleTimer,
        idle_timeout: Duration,
        last_frame: tokio::time::Instant,
        // `upstream.total_timeout`: the whole exchange, headers included, must end by then.
        deadline: Option<(Pin<Box<Sleep>>, Duration)>,
        observer: Observer,
        // `observe.request_usage`: takes out what kvbust's `include_usage` added to the stream.
        strip: Option<crate::proxy::usage::UsageStrip>,
    }
}

/// The timer of `upstream.idle_timeout`: on an HTTP/1.1 client connection, the connection's own,
/// which its responses take in turn (registered once, not per response); else the body's own.
enum IdleTimer {
    Turn(std::sync::Arc<crate::proxy::exchange::Downstream>),
    Own(crate::proxy::turn_timer::TurnTimer),
}

impl IdleTimer {
    fn get(&self) -> &crate::proxy::turn_timer::TurnTimer {
        match self {
            IdleTimer::Turn(conn) => &conn.response_idle,
            IdleTimer::Own(timer) => timer,
        }
    }
}

/// Raised when the whole exchange outlives `upstream.total_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("response not finished within {0:?} (upstream.total_timeout)")]
pub struct TotalTimeout(pub Duration);

impl<B: Body> Observed<B> {
    /// `total`: the total timeout and when the request started, if one is configured.
    pub fn new(
        inner: B,
        idle_timeout: Duration,
        total: Option<(Duration, Instant)>,
        observer: Observer,
    ) -> Self {
        Self::with_idle_timer(inner, idle_timeout, total, observer, None)
    }

    /// As [`Observed::new`], timing the idle gaps on `turn`'s timer when given: the client
    /// connection's (HTTP/1.1, whose responses come one at a time).
    pub fn with_idle_timer(
        inner: B,
        idle_timeout: Duration,
        total: Option<(Duration, Instant)>,
        mut observer: Observer,
        turn: Option<std::sync::Arc<crate::proxy::exchange::Downstream>>,
    ) -> Self {
        // A body that is over before it starts (a HEAD response, content-length 0) is never
        // polled: the server sends the headers and drops it, which is its complete end.
        if inner.is_end_stream() {
            observer.finish();
        }
        let deadline = total.map(|(t, start)| {
            let at = tokio::time::Instant::from_std(start + t);
            (Box::pin(tokio::time::sleep_until(at)), t)
        });
        Self {
            inner,
            idle: match turn {
                Some(conn) => IdleTimer::Turn(conn),
                None => IdleTimer::Own(Default::default()),
            },
            idle_timeout,
            last_frame: tokio::time::Instant::now(),
            deadline,
            observer,
            strip: None,
        }
    }

    /// Removes the usage chunk (and the `"usage":null` members) that kvbust's own
    /// `include_usage` added, so the client receives what it asked for.
    pub fn stripping_usage(mut self, on: bool) -> Self {
        self.strip = on.then(crate::proxy::usage::UsageStrip::default);
        self
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
        // Loops only when stripping left nothing of a frame to send.
        loop {
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let now = Instant::now();
                    if let Some(data) = frame.data_ref() {
                        this.observer.on_data(data, now);
                    }
                    *this.last_frame = tokio::time::Instant::from_std(now);
                    let end = this.inner.is_end_stream();
                    if end {
                        this.observer.finish();
                    }
                    let frame = match (this.strip.as_mut(), frame.into_data()) {
                        (Some(strip), Ok(data)) => {
                            let out = strip.filter(data, end);
                            if out.is_empty() {
                                if end {
                                    return Poll::Ready(None);
                                }
                                continue;
                            }
                            Frame::data(out)
                        }
                        (_, Ok(data)) => Frame::data(data),
                        (_, Err(frame)) => frame,
                    };
                    if let Some(data) = frame.data_ref() {
                        this.observer.bytes_out += data.len() as u64;
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Err(e))) => {
                    let e: BoxError = e.into();
                    tracing::warn!(error = %crate::error::error_chain(e.as_ref()), "upstream response body failed");
                    this.observer
                        .metrics
                        .error("upstream", "upstream_body_error");
                    this.observer.abort("upstream_error");
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    this.observer.finish();
                    // A stream that ended inside an event: what was held goes out as it came.
                    if let Some(tail) = this.strip.as_mut().and_then(|s| s.take_tail()) {
                        this.observer.bytes_out += tail.len() as u64;
                        return Poll::Ready(Some(Ok(Frame::data(tail))));
                    }
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    return match poll_timeouts(&mut this, cx) {
                        Some(err) => Poll::Ready(Some(Err(err))),
                        None => Poll::Pending,
                    };
                }
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

/// While the inner body is pending: polls the idle timer and the total deadline, and returns the
/// error that ends the response if one ran out (counted, logged, the exchange aborted).
#[inline]
fn poll_timeouts<B>(this: &mut ObservedProj<'_, B>, cx: &mut Context<'_>) -> Option<BoxError> {
    // A frame that came since the timer was set moves it (only when it fires).
    let due = *this.last_frame + *this.idle_timeout;
    if this.idle.get().poll_deadline(due, cx).is_ready() {
        let err = IdleTimeout(*this.idle_timeout);
        return Some(timed_out(
            this.observer,
            err,
            "upstream_idle_timeout",
            "idle_timeout",
        ));
    }
    if let Some((sleep, total)) = this.deadline.as_mut() {
        if sleep.as_mut().poll(cx).is_ready() {
            let err = TotalTimeout(*total);
            return Some(timed_out(
                this.observer,
                err,
                "upstream_total_timeout",
                "total_timeout",
            ));
        }
    }
    None
}

/// Ends the exchange on a timeout: logged, counted as an upstream error `code`, the stream
/// counted as aborted for `reason`.
fn timed_out<E>(observer: &mut Observer, err: E, code: &str, reason: &'static str) -> BoxError
where
    E: std::error::Error + Send + Sync + 'static,
{
    tracing::warn!(
        route = observer.route.label(),
        "{err}; closing the response"
    );
    observer.metrics.error("upstream", code);
    observer.abort(reason);
    Box::new(err)
}

use std::future::Future as _;
