//! One timer that the requests of an HTTP/1.1 client connection take turns on, for a deadline
//! each request has in its turn (the upstream's first byte). Registered in tokio's timer wheel
//! once and moved only when it fires before the deadline then current, so a busy connection pays
//! no wheel insert and remove per request. Never used by two requests at once: HTTP/1.1 serves
//! one request at a time on a connection (HTTP/2 streams use their own timers).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

#[derive(Default)]
pub struct TurnTimer(Mutex<Option<Pin<Box<Sleep>>>>);

impl TurnTimer {
    fn lock(&self) -> MutexGuard<'_, Option<Pin<Box<Sleep>>>> {
        // Poisoning needs a panic while the lock is held; the timer is valid either way.
        crate::sync::lock(&self.0)
    }

    /// Ready once `deadline` has passed. The timer may be set later than the deadline of an
    /// earlier turn; it is moved earlier when this deadline is before it, and when it fires
    /// before this deadline (set for an earlier turn) it is moved to this one.
    pub fn poll_deadline(&self, deadline: Instant, cx: &mut Context<'_>) -> Poll<()> {
        let mut slot = self.lock();
        let sleep = slot.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() > deadline {
            sleep.as_mut().reset(deadline);
        }
        while sleep.as_mut().poll(cx).is_ready() {
            if Instant::now() >= deadline {
                return Poll::Ready(());
            }
            sleep.as_mut().reset(deadline);
        }
        Poll::Pending
    }

    /// `fut`, or `Err(Elapsed)` once `deadline` passes first; as `tokio::time::timeout_at`.
    pub fn timeout_at<F: Future>(&self, deadline: Instant, fut: F) -> TurnTimeout<'_, F> {
        TurnTimeout {
            timer: self,
            deadline,
            fut,
        }
    }
}

/// The deadline passed before the future finished.
#[derive(Debug)]
pub struct Elapsed;

pin_project_lite::pin_project! {
    pub struct TurnTimeout<'t, F> {
        timer: &'t TurnTimer,
        deadline: Instant,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for TurnTimeout<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.fut.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        match this.timer.poll_deadline(*this.deadline, cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn each_turn_times_out_at_its_own_deadline() {
        let timer = TurnTimer::default();
        let t = Duration::from_secs(10);
        // A turn that finishes leaves the timer set for its deadline...
        let start = Instant::now();
        let done = timer.timeout_at(start + t, async { 1 }).await;
        assert_eq!(done.unwrap(), 1);
        // ...a later turn that stalls is cut at its own deadline, not the earlier one's.
        tokio::time::advance(Duration::from_secs(4)).await;
        let second = Instant::now();
        let cut = timer
            .timeout_at(second + t, std::future::pending::<()>())
            .await;
        assert!(cut.is_err());
        assert_eq!(Instant::now(), second + t);
        // A shorter deadline than the one the timer is set for moves it earlier.
        let third = Instant::now();
        let short = Duration::from_secs(2);
        let cut = timer
            .timeout_at(third + short, std::future::pending::<()>())
            .await;
        assert!(cut.is_err());
        assert_eq!(Instant::now(), third + short);
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_that_finishes_in_time_is_not_cut() {
        let timer = TurnTimer::default();
        let start = Instant::now();
        let slow = async {
            tokio::time::sleep(Duration::from_secs(9)).await;
            7
        };
        let out = timer
            .timeout_at(start + Duration::from_secs(10), slow)
            .await;
        assert_eq!(out.unwrap(), 7);
        assert_eq!(Instant::now(), start + Duration::from_secs(9));
    }
}
