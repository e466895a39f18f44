//! The model's fan-out for `cache_model.threads` > 1: numbers each job as it is queued (the
//! forwarding order), hands it to one of the prepare threads (a session's jobs to the same one,
//! so its memo sees the conversation grow), and gives the prepared jobs to the apply stage on the
//! calling thread strictly in number order (a reorder buffer). Owns the numbers and the count of
//! jobs in flight; never looks inside a job, and never lets a number go missing: a job refused
//! at the inlet takes none, and every number taken reaches the apply stage, prepared or not.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel as unbounded, Receiver, Sender};
use std::sync::{Arc, Mutex};

/// Why the inlet did not take a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// `capacity` jobs are in flight already.
    Full,
    /// The prepare thread the job was meant for is gone.
    Stopped,
}

impl Refused {
    /// The `reason` label of `kvbust_cache_model_unaccounted_total`.
    pub(super) fn reason(self) -> &'static str {
        match self {
            Refused::Full => "queue_full",
            Refused::Stopped => "model_stopped",
        }
    }
}

/// The request side's end: numbers jobs and hands them to the prepare threads. Never blocks
/// but for the short lock that keeps numbering and sending one step.
pub(super) struct Inlet<T> {
    lanes: Mutex<Lanes<T>>,
    in_flight: Arc<AtomicUsize>,
    capacity: usize,
}

struct Lanes<T> {
    /// The next job's number.
    next: u64,
    /// The lane the next job without a session key goes to.
    turn: usize,
    senders: Vec<Sender<(u64, T)>>,
}

/// The model's end: the prepare threads' queues and the count the apply stage lowers.
pub(super) struct Outlet<T> {
    lanes: Vec<Receiver<(u64, T)>>,
    in_flight: Arc<AtomicUsize>,
}

/// An inlet and outlet for `threads` prepare threads, holding at most `capacity` jobs between
/// them: a job counts from the moment the inlet takes it until the apply stage is done with it.
pub(super) fn channel<T>(threads: usize, capacity: usize) -> (Inlet<T>, Outlet<T>) {
    let (senders, lanes) = (0..threads.max(1)).map(|_| unbounded()).unzip();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let inlet = Inlet {
        lanes: Mutex::new(Lanes {
            next: 0,
            turn: 0,
            senders,
        }),
        in_flight: in_flight.clone(),
        capacity,
    };
    (inlet, Outlet { lanes, in_flight })
}

impl<T> Inlet<T> {
    /// Numbers the job `make` builds (called only once it is taken, under the lock, so what it
    /// reads, such as the cache's epoch, is in number order too) and queues it for the lane of
    /// `affinity` (a session key), or the next lane in turn without one.
    pub(super) fn try_send(
        &self,
        affinity: Option<u64>,
        make: impl FnOnce() -> T,
    ) -> Result<(), Refused> {
        let mut lanes = crate::sync::lock(&self.lanes);
        if self.in_flight.load(Ordering::Acquire) >= self.capacity {
            return Err(Refused::Full);
        }
        let n = lanes.senders.len();
        let lane = match affinity {
            // The remainder is below `n`, a usize.
            Some(key) => (key % n as u64) as usize,
            None => {
                let k = lanes.turn;
                lanes.turn = (k + 1) % n;
                k
            }
        };
        let seq = lanes.next;
        let Some(sender) = lanes.senders.get(lane) else {
            return Err(Refused::Stopped);
        };
        // Counted before it is sent: the apply stage may be done with it before `send` returns.
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if sender.send((seq, make())).is_err() {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::Stopped);
        }
        lanes.next += 1;
        Ok(())
    }
}

impl<T: Send> Outlet<T> {
    /// The number of prepare threads.
    pub(super) fn threads(&self) -> usize {
        self.lanes.len()
    }

    /// Runs `prepare` on one thread per lane (`kvbust-model-prep-K`, at `nice`, each with its
    /// own of `states`) and `apply` on the calling thread, in number order. Returns once the
    /// inlet is gone and every job taken has been applied.
    ///
    /// A prepare that panics loses its job (the job's ticket counts it as not modelled, and its
    /// bytes stay counted as queued, as a stopped one-thread model's do): its number still
    /// reaches the apply stage, as nothing, and the thread ends, so its lane's later jobs are
    /// refused (`model_stopped`), as every job is once the one-thread model stopped.
    pub(super) fn run<S: Send, P: Send>(
        self,
        nice: i32,
        states: Vec<S>,
        prepare: impl Fn(&mut S, T) -> P + Sync,
        mut apply: impl FnMut(P),
    ) {
        let (done_tx, done_rx) = unbounded::<(u64, Option<P>)>();
        let prepare = &prepare;
        std::thread::scope(|scope| {
            for (k, (lane, mut state)) in self.lanes.into_iter().zip(states).enumerate() {
                let done = done_tx.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("kvbust-model-prep-{k}"))
                    .spawn_scoped(scope, move || {
                        super::priority::lower_this_thread(nice);
                        for (seq, job) in lane {
                            let got = catch_unwind(AssertUnwindSafe(|| prepare(&mut state, job)));
                            let lost = got.is_err();
                            if lost {
                                tracing::error!(
                                    "cache model: prepare thread {k} panicked; its jobs are \
                                     counted as unaccounted (model_stopped) from now on"
                                );
                            }
                            if done.send((seq, got.ok())).is_err() || lost {
                                return;
                            }
                        }
                    });
                if let Err(e) = spawned {
                    // Its lane's receiver went with the closure: its jobs are refused.
                    tracing::error!(
                        "cannot start the cache model's prepare thread {k}: {e}; its share of \
                         jobs is counted as unaccounted (model_stopped)"
                    );
                }
            }
            // Only the prepare threads hold senders now: the loop ends when the last one does.
            drop(done_tx);
            let mut order = Reorder::default();
            for (seq, prepared) in done_rx {
                order.insert(seq, prepared);
                while let Some(prepared) = order.pop() {
                    if let Some(p) = prepared {
                        apply(p);
                    }
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                }
            }
            if order.len() > 0 {
                // Every number taken was sent on, so none can be missing once all have arrived.
                tracing::error!(
                    "cache model: {} prepared jobs were left waiting for a number that never came",
                    order.len()
                );
            }
        });
    }
}

/// Items numbered from 0 that may arrive in any order, given back in number order.
pub(super) struct Reorder<P> {
    next: u64,
    waiting: BTreeMap<u64, P>,
}

impl<P> Default for Reorder<P> {
    fn default() -> Self {
        Self {
            next: 0,
            waiting: BTreeMap::new(),
        }
    }
}

impl<P> Reorder<P> {
    /// Holds item `seq` until every earlier one has been given back.
    pub(super) fn insert(&mut self, seq: u64, item: P) {
        debug_assert!(seq >= self.next, "item {seq} arrived twice");
        self.waiting.insert(seq, item);
    }

    /// The next item in number order, once it has arrived.
    pub(super) fn pop(&mut self) -> Option<P> {
        let item = self.waiting.remove(&self.next)?;
        self.next += 1;
        Some(item)
    }

    /// Items held, waiting for an earlier one.
    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items come back in number order whatever order they arrive in; a skipped item (`None`,
    /// a job whose preparing failed) still moves the order on.
    #[test]
    fn the_reorder_buffer_gives_items_back_in_number_order() {
        let mut order = Reorder::default();
        let mut out = Vec::new();
        let arrivals = [
            (2, Some("c")),
            (1, None),
            (4, Some("e")),
            (0, Some("a")),
            (3, Some("d")),
            (6, Some("g")),
            (5, None),
        ];
        let mut held = Vec::new();
        for (seq, item) in arrivals {
            order.insert(seq, item);
            while let Some(item) = order.pop() {
                out.push(item);
            }
            held.push(order.len());
        }
        assert_eq!(
            out,
            [
                Some("a"),
                None,
                Some("c"),
                Some("d"),
                Some("e"),
                None,
                Some("g")
            ]
        );
        // Nothing comes out before 0 arrives, then 0 to 2 (4 waits for 3); 5 frees 6.
        assert_eq!(held, [1, 2, 3, 1, 0, 1, 0]);
        assert_eq!(order.pop(), None);
    }

    /// A refused job takes no number: the next one taken gets the number the refused one would
    /// have had, so the apply stage never waits for a number nobody holds. The count of jobs in
    /// flight bounds the inlet, and a session key picks the same lane each time.
    #[test]
    fn a_refused_job_takes_no_number_and_a_session_keeps_its_lane() {
        let (inlet, outlet) = channel::<&str>(3, 2);
        assert_eq!(inlet.try_send(Some(7), || "a"), Ok(()));
        assert_eq!(inlet.try_send(None, || "b"), Ok(()));
        let mut made = false;
        let refused = inlet.try_send(Some(7), || {
            made = true;
            "c"
        });
        assert_eq!(refused, Err(Refused::Full));
        assert!(!made, "a refused job is never built");
        // The apply stage finished one.
        outlet.in_flight.fetch_sub(1, Ordering::AcqRel);
        assert_eq!(inlet.try_send(Some(7), || "c"), Ok(()));
        let got: Vec<Vec<(u64, &str)>> = outlet
            .lanes
            .iter()
            .map(|l| l.try_iter().collect())
            .collect();
        // Key 7 → lane 1 (7 % 3), both times; the keyless job → lane 0, the first in turn.
        assert_eq!(got, [vec![(1, "b")], vec![(0, "a"), (2, "c")], vec![]]);
        // A lane whose thread is gone refuses, and takes no number either.
        outlet.in_flight.fetch_sub(1, Ordering::AcqRel);
        let Outlet { lanes, .. } = outlet;
        drop(lanes);
        assert_eq!(inlet.try_send(None, || "d"), Err(Refused::Stopped));
        assert_eq!(crate::sync::lock(&inlet.lanes).next, 3);
        assert_eq!(inlet.in_flight.load(Ordering::Acquire), 1);
    }
}
