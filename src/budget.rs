//! The budget for request bodies buffered at once (`limits.max_buffered_total`), shared by all
//! workers: a request that would go past it is refused at once. Never waits and never queues.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub struct BodyBudget {
    used: AtomicU64,
    limit: u64,
}

impl BodyBudget {
    pub fn new(limit: u64) -> Self {
        Self {
            used: AtomicU64::new(0),
            limit,
        }
    }

    /// Bytes held by buffered bodies right now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation, grown as the body arrives.
    pub fn reservation(&self) -> Reservation<'_> {
        Reservation {
            budget: self,
            held: 0,
        }
    }

    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }
}

/// Bytes of the budget held for one request's body; given back when dropped (the body has been
/// handed to the upstream connection by then, or the request failed).
#[derive(Debug)]
pub struct Reservation<'a> {
    budget: &'a BodyBudget,
    held: u64,
}

impl Reservation<'_> {
    /// Holds at least `n` bytes in all; false (and nothing more held) when the budget is spent.
    pub fn grow_to(&mut self, n: u64) -> bool {
        if n <= self.held {
            return true;
        }
        if !self.budget.take(n - self.held) {
            return false;
        }
        self.held = n;
        true
    }
}

impl Reservation<'_> {
    /// Holds at most `n` bytes: gives back what a step no longer holds (the body a rewrite was
    /// built from, once the rewrite replaced it).
    pub fn shrink_to(&mut self, n: u64) {
        if n < self.held {
            self.budget.used.fetch_sub(self.held - n, Ordering::AcqRel);
            self.held = n;
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_one_limit_and_give_back_on_drop() {
        let b = BodyBudget::new(100);
        let mut a = b.reservation();
        assert!(a.grow_to(60));
        assert!(a.grow_to(40), "shrinking asks nothing");
        let mut c = b.reservation();
        assert!(!c.grow_to(41), "60 + 41 > 100");
        assert_eq!(b.used(), 60);
        assert!(c.grow_to(40));
        assert!(!a.grow_to(61));
        assert_eq!(b.used(), 100);
        drop(a);
        assert_eq!(b.used(), 40);
        drop(c);
        assert_eq!(b.used(), 0);
        let mut d = b.reservation();
        assert!(d.grow_to(90));
        d.shrink_to(30);
        d.shrink_to(50);
        assert_eq!(b.used(), 30, "shrinking gives back, never takes");
        drop(d);
        assert_eq!(b.used(), 0);
    }
}
