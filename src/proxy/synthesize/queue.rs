//! The on-demand placeholder queue: which prompt generations may run now, and on what. Two
//! classes of work: a prompt of a length that already has a lane ([`Class::Built`]) and one that
//! makes a new lane ([`Class::New`]: for `coding`, AIPerf's pool, ~0.13 CPU-s). New lanes may
//! hold at most `synth.placeholder_build_share` of the `synth.placeholder_queue` places and of
//! the cores, run on their own thread pool of that many threads, and spend at most
//! `synth.placeholder_build_cpu` CPU-seconds per second, averaged over
//! `synth.placeholder_build_window`; the rest is kept for lengths already built, so such a
//! request never waits behind a new lane, however many source addresses ask for new ones. Every
//! client still holds at most `synth.placeholder_queue_per_client` places.
//!
//! Owns the places, the generation permits and the build budget; must never make a prompt itself
//! (its callers run the work it admits) nor block an async thread.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};

use crate::sync::lock;
use std::time::{Duration, Instant};

use crate::config::SynthConfig;
use crate::error::ProxyError;

/// What a generation makes, which decides the places, permits and threads it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A prompt of a (corpus, length) that has a lane: the lane's stream only.
    Built,
    /// A new lane (its stream, and for `coding` its pool) and its first prompt.
    New,
}

/// The places taken. `per_client` holds only clients with a place, so it has at most
/// `synth.placeholder_queue` entries.
#[derive(Debug, Default)]
pub(super) struct Places {
    pub(super) total: usize,
    pub(super) new: usize,
    pub(super) per_client: HashMap<Option<IpAddr>, usize>,
}

/// CPU-seconds new lanes may still spend: refilled at `rate` per second up to `cap` (rate ×
/// window); a build is charged after it ran, so the level may go below zero, and the next build
/// waits until it is above again.
#[derive(Debug)]
pub(super) struct Bucket {
    level: f64,
    at: Instant,
    rate: f64,
    cap: f64,
}

impl Bucket {
    fn new(rate: f64, window: Duration, now: Instant) -> Self {
        let cap = rate * window.as_secs_f64();
        Bucket {
            level: cap,
            at: now,
            rate,
            cap,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * self.rate).min(self.cap);
        self.at = now;
    }

    /// How long a build must wait at `now` before it may start (zero: at once).
    pub(super) fn wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        if self.level > 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((-self.level / self.rate).min(3600.0)) + Duration::from_millis(1)
    }

    pub(super) fn charge(&mut self, cpu_s: f64, now: Instant) {
        self.refill(now);
        self.level -= cpu_s;
    }
}

/// The queue of one synthesizer.
pub(super) struct Gate {
    cfg_total: usize,
    cfg_new: usize,
    cfg_per_client: usize,
    share: f64,
    pub(super) places: Mutex<Places>,
    /// Generations of built lengths running at once: one per core.
    pub(super) built: Arc<tokio::sync::Semaphore>,
    /// New lanes made at once: the build threads.
    pub(super) building: Arc<tokio::sync::Semaphore>,
    threads: usize,
    /// The build threads, made on the first new lane (None: they could not be started, and
    /// builds run on the blocking thread).
    pool: OnceLock<Option<rayon::ThreadPool>>,
    bucket: Mutex<Bucket>,
}

impl Gate {
    pub(super) fn new(cfg: &SynthConfig) -> Arc<Self> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let share = cfg.placeholder_build_share.clamp(0.0, 1.0);
        let part = |n: usize| ((n as f64 * share).floor() as usize).clamp(1, n.max(1));
        let threads = part(cores);
        Arc::new(Gate {
            cfg_total: cfg.placeholder_queue,
            cfg_new: part(cfg.placeholder_queue),
            cfg_per_client: cfg.placeholder_queue_per_client,
            share,
            places: Mutex::new(Places::default()),
            built: Arc::new(tokio::sync::Semaphore::new(cores)),
            building: Arc::new(tokio::sync::Semaphore::new(threads)),
            threads,
            pool: OnceLock::new(),
            bucket: Mutex::new(Bucket::new(
                cfg.placeholder_build_cpu.max(f64::MIN_POSITIVE),
                cfg.placeholder_build_window,
                Instant::now(),
            )),
        })
    }

    /// A place for `client`'s generation of `class`, or a 503 naming the bound it would pass:
    /// `synth.placeholder_queue` in all, the new lanes' share of it, or the client's own.
    pub(super) fn place(
        self: &Arc<Self>,
        client: Option<IpAddr>,
        class: Class,
    ) -> Result<Place, ProxyError> {
        let mut q = lock(&self.places);
        let mine = q.per_client.get(&client).copied().unwrap_or(0);
        let full = |message: String| ProxyError::Overloaded {
            code: "placeholder_queue_full",
            message,
            retry_after_s: 1,
        };
        if q.total >= self.cfg_total {
            return Err(full(format!(
                "synth.placeholder_queue = {} placeholder prompts are being made; retry shortly",
                self.cfg_total
            )));
        }
        if class == Class::New && q.new >= self.cfg_new {
            return Err(full(format!(
                "{} new placeholder lengths are being made, synth.placeholder_build_share = {} \
                 of synth.placeholder_queue (the rest is kept for lengths already made); retry \
                 shortly, or reuse lengths already asked for",
                self.cfg_new, self.share
            )));
        }
        if mine >= self.cfg_per_client {
            return Err(full(format!(
                "synth.placeholder_queue_per_client = {} placeholder prompts are being made for \
                 this client; retry shortly",
                self.cfg_per_client
            )));
        }
        q.total += 1;
        q.new += usize::from(class == Class::New);
        q.per_client.insert(client, mine + 1);
        Ok(Place {
            gate: self.clone(),
            client,
            class,
        })
    }

    /// Waits for `class`'s turn (first come, first served within the class): a generation
    /// permit and, for a new lane, budget left in the window. Dropping the future gives both up.
    pub(super) async fn turn(self: &Arc<Self>, class: Class) -> Result<Turn, ProxyError> {
        let sem = match class {
            Class::Built => &self.built,
            Class::New => &self.building,
        };
        let permit = sem
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ProxyError::Internal("the generation semaphore was closed".into()))?;
        if class == Class::New {
            // Holding the permit, so the next build in line waits behind this one.
            loop {
                let wait = lock(&self.bucket).wait(Instant::now());
                if wait.is_zero() {
                    break;
                }
                tokio::time::sleep(wait).await;
            }
        }
        Ok(Turn {
            gate: self.clone(),
            class,
            _permit: permit,
        })
    }

    fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(self.threads)
                    .thread_name(|i| format!("kvbust-lane-{i}"))
                    .build()
                    .map_err(|e| {
                        tracing::warn!("placeholder build threads not started ({e}): new lanes are made on the shared pool");
                    })
                    .ok()
            })
            .as_ref()
    }

    /// CPU-seconds charged to the build budget so far (for tests).
    #[cfg(test)]
    pub(super) fn level(&self) -> f64 {
        lock(&self.bucket).level
    }
}

/// One place in the queue, freed when the generation holding it ends (not when the request goes
/// away, so the bound counts work that is really running).
pub(super) struct Place {
    gate: Arc<Gate>,
    client: Option<IpAddr>,
    class: Class,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut q = lock(&self.gate.places);
        q.total = q.total.saturating_sub(1);
        if self.class == Class::New {
            q.new = q.new.saturating_sub(1);
        }
        if let Some(n) = q.per_client.get_mut(&self.client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                q.per_client.remove(&self.client);
            }
        }
    }
}

/// A generation's turn: run its work with [`Turn::run`] on a blocking thread.
pub(super) struct Turn {
    gate: Arc<Gate>,
    class: Class,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Turn {
    /// Runs `work` (blocking): a new lane on the build threads, charged at its wall time times
    /// their number (at least the CPU it used there); a built length where it is.
    pub(super) fn run<T: Send>(self, work: impl FnOnce() -> T + Send) -> T {
        if self.class == Class::Built {
            return work();
        }
        let t0 = Instant::now();
        let out = match self.gate.pool() {
            Some(pool) => pool.install(work),
            None => work(),
        };
        let cpu = t0.elapsed().as_secs_f64() * self.gate.threads as f64;
        lock(&self.gate.bucket).charge(cpu, Instant::now());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_refills_at_its_rate_up_to_its_window() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut b = Bucket::new(0.5, s(4), t0);
        assert_eq!(
            b.wait(t0),
            Duration::ZERO,
            "a full window (2 CPU-s) to start with"
        );
        b.charge(3.0, t0);
        // 1 CPU-s in debt at 0.5 per second: two seconds (and the millisecond that makes it > 0).
        assert_eq!(b.wait(t0), s(2) + Duration::from_millis(1));
        assert_eq!(b.wait(t0 + s(1)), s(1) + Duration::from_millis(1));
        assert_eq!(b.wait(t0 + s(3)), Duration::ZERO);
        // Idle time fills the window, never more: 2 CPU-s after a long pause, not 50.
        b.charge(2.5, t0 + s(100));
        assert!(b.wait(t0 + s(100)) > Duration::ZERO);
    }

    fn cfg(queue: usize, per_client: usize, share: f64) -> SynthConfig {
        SynthConfig {
            placeholder_queue: queue,
            placeholder_queue_per_client: per_client,
            placeholder_build_share: share,
            ..SynthConfig::default()
        }
    }

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, last]))
    }

    /// New lanes from many addresses take their share of the places and no more: a length
    /// already built still gets one, whichever address asks.
    #[test]
    fn new_lanes_from_many_addresses_leave_places_for_built_lengths() {
        let gate = Gate::new(&cfg(8, 2, 0.5));
        let mut held = Vec::new();
        for a in 1..=10 {
            for _ in 0..2 {
                if let Ok(p) = gate.place(ip(a), Class::New) {
                    held.push(p);
                }
            }
        }
        assert_eq!(held.len(), 4, "half of 8 places for new lanes");
        let e = gate
            .place(ip(11), Class::New)
            .err()
            .expect("their share is taken");
        assert_eq!(e.code(), "placeholder_queue_full");
        assert!(
            e.to_string()
                .contains("synth.placeholder_build_share = 0.5"),
            "{e}"
        );
        let victim: Vec<_> = (0..2)
            .map(|_| gate.place(ip(200), Class::Built).unwrap())
            .collect();
        let e = gate
            .place(ip(200), Class::Built)
            .err()
            .expect("its own share");
        assert!(
            e.to_string()
                .contains("synth.placeholder_queue_per_client = 2"),
            "{e}"
        );
        drop(held);
        drop(victim);
        let q = lock(&gate.places);
        assert_eq!((q.total, q.new, q.per_client.len()), (0, 0, 0));
    }

    /// A built length's generation never waits for a build's permit or budget: with every
    /// build permit held and the budget spent, it gets its turn at once.
    #[tokio::test]
    async fn a_built_length_does_not_wait_behind_new_lanes() {
        use futures_util::FutureExt;
        let gate = Gate::new(&cfg(8, 8, 0.5));
        let builds = gate.building.available_permits() as u32;
        let _held = gate
            .building
            .clone()
            .acquire_many_owned(builds)
            .await
            .unwrap();
        lock(&gate.bucket).charge(1e6, Instant::now());
        assert!(
            gate.turn(Class::New).now_or_never().is_none(),
            "a build waits"
        );
        let turn = gate
            .turn(Class::Built)
            .now_or_never()
            .expect("at once")
            .unwrap();
        assert_eq!(turn.run(|| 7), 7);
    }

    /// A build runs on the build threads and is charged to the budget.
    #[tokio::test]
    async fn a_new_lane_runs_on_the_build_threads_and_is_charged() {
        let gate = Gate::new(&cfg(8, 8, 0.5));
        let before = gate.level();
        let turn = gate.turn(Class::New).await.unwrap();
        let name = tokio::task::spawn_blocking(move || {
            turn.run(|| std::thread::current().name().map(str::to_owned))
        })
        .await
        .unwrap();
        assert_eq!(name.as_deref(), Some("kvbust-lane-0"));
        assert!(gate.level() < before, "charged");
    }
}
