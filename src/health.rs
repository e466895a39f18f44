//! Upstream health: one background task probes the upstream's health route and keeps what
//! `/readyz` and the `kvbust_upstream_up` gauge report. Never touches client traffic, never runs
//! on the data workers, and logs a change of state once, not every probe (a host name that does
//! not resolve: at WARN, at most once a minute).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::body::full_body;
use crate::config::UpstreamConfig;
use crate::metrics::Metrics;
use crate::upstream::client::{Upstream, UpstreamClient};

/// The probe's paths when `upstream.health_path` is not set: vLLM, SGLang, TensorRT-LLM and
/// llama.cpp serve `/health`; any OpenAI-compatible server serves `/v1/models`.
const DEFAULT_PATHS: [&str; 2] = ["/health", crate::api::MODELS_PATH];

/// At most this much of a probe's response body is read (so the connection can be reused).
const MAX_PROBE_BODY: usize = 64 << 10;

/// What is known about the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamStatus {
    /// `upstream.health_probe = false`: nothing is checked and readiness ignores the upstream.
    Unchecked,
    /// Not up since start; `last` is why the latest probe failed, if one did.
    Starting { last: Option<String> },
    /// Answered its probe (`success_threshold` times in a row).
    Up,
    /// Failed `failures` probes in a row; `last` is the latest reason.
    Down { failures: u32, last: String },
}

impl UpstreamStatus {
    /// Why the upstream holds readiness back, or `None` when it does not.
    pub fn not_ready_reason(&self) -> Option<String> {
        match self {
            UpstreamStatus::Unchecked | UpstreamStatus::Up => None,
            UpstreamStatus::Starting { last: None } => {
                Some("the upstream has not answered its health probe yet".into())
            }
            UpstreamStatus::Starting { last: Some(e) } => {
                Some(format!("the upstream is not up yet: {e}"))
            }
            UpstreamStatus::Down { failures, last } => Some(format!(
                "the upstream is down ({} in a row): {last}",
                failed_probes(*failures)
            )),
        }
    }

    pub fn is_up(&self) -> bool {
        matches!(self, UpstreamStatus::Up)
    }
}

/// The upstream's status, shared by the probe (writer) and the admin port (reader). Waiters can
/// subscribe to changes instead of polling.
pub struct Readiness {
    tx: watch::Sender<UpstreamStatus>,
}

impl Readiness {
    /// `probe`: whether a probe will run (`upstream.health_probe`); without one the upstream is
    /// unchecked and never holds readiness back.
    pub fn new(probe: bool) -> Self {
        let initial = if probe {
            UpstreamStatus::Starting { last: None }
        } else {
            UpstreamStatus::Unchecked
        };
        Self {
            tx: watch::Sender::new(initial),
        }
    }

    pub fn status(&self) -> UpstreamStatus {
        self.tx.borrow().clone()
    }

    /// Changes of status as they happen (for tests and anything that waits for the upstream).
    pub fn subscribe(&self) -> watch::Receiver<UpstreamStatus> {
        self.tx.subscribe()
    }

    fn set(&self, status: UpstreamStatus) {
        self.tx.send_if_modified(|s| {
            let changed = *s != status;
            *s = status;
            changed
        });
    }
}

/// A change worth one log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// The first failure while starting ("waiting for the upstream").
    Waiting(String),
    /// Up, from starting or from down.
    Up { was_down: bool },
    /// Down after `failures` failed probes in a row.
    Down { failures: u32, last: String },
}

fn failed_probes(n: u32) -> String {
    match n {
        1 => "1 failed health probe".into(),
        n => format!("{n} failed health probes"),
    }
}

/// Counts probe results in a row and decides the status, with the thresholds as hysteresis: an
/// up upstream stays up through `fail_threshold - 1` failures, a starting or down one needs
/// `success_threshold` successes in a row.
#[derive(Debug)]
pub struct Tracker {
    fail_threshold: u32,
    success_threshold: u32,
    status: UpstreamStatus,
    successes: u32,
    failures: u32,
}

impl Tracker {
    pub fn new(fail_threshold: u32, success_threshold: u32) -> Self {
        Self {
            fail_threshold: fail_threshold.max(1),
            success_threshold: success_threshold.max(1),
            status: UpstreamStatus::Starting { last: None },
            successes: 0,
            failures: 0,
        }
    }

    pub fn status(&self) -> &UpstreamStatus {
        &self.status
    }

    /// Takes one probe's result; returns the transition it caused, if any.
    pub fn record(&mut self, result: Result<(), String>) -> Option<Transition> {
        match result {
            Ok(()) => {
                self.failures = 0;
                self.successes = self.successes.saturating_add(1);
                if self.status.is_up() || self.successes < self.success_threshold {
                    return None;
                }
                let was_down = matches!(self.status, UpstreamStatus::Down { .. });
                self.status = UpstreamStatus::Up;
                Some(Transition::Up { was_down })
            }
            Err(e) => {
                self.successes = 0;
                self.failures = self.failures.saturating_add(1);
                let failures = self.failures;
                match &self.status {
                    UpstreamStatus::Up if failures < self.fail_threshold => None,
                    UpstreamStatus::Up => {
                        self.status = UpstreamStatus::Down {
                            failures,
                            last: e.clone(),
                        };
                        Some(Transition::Down { failures, last: e })
                    }
                    UpstreamStatus::Down { .. } => {
                        self.status = UpstreamStatus::Down { failures, last: e };
                        None
                    }
                    UpstreamStatus::Starting { .. } | UpstreamStatus::Unchecked => {
                        // Logged for the first failure since start only.
                        let first =
                            !matches!(self.status, UpstreamStatus::Starting { last: Some(_) });
                        self.status = UpstreamStatus::Starting {
                            last: Some(e.clone()),
                        };
                        first.then_some(Transition::Waiting(e))
                    }
                }
            }
        }
    }
}

/// One probe's outcome.
enum Outcome {
    Healthy,
    /// 404 or 405: the server has no such route (try the fallback path, if any).
    NoRoute(String),
    Failed(Failure),
}

/// Why a probe failed, and whether it was because the host name does not resolve.
struct Failure {
    why: String,
    unresolved: bool,
}

impl From<String> for Failure {
    fn from(why: String) -> Self {
        Failure {
            why,
            unresolved: false,
        }
    }
}

/// Whether `err` failed at the name lookup. hyper-util's connector wraps a resolver failure in
/// an error whose text is exactly "dns error" (its type is private), whatever the resolver said
/// (unknown name, no DNS server reachable).
fn is_unresolved(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.to_string() == "dns error" {
            return true;
        }
        cur = e.source();
    }
    false
}

/// How often a host name that does not resolve is logged at WARN while it goes on failing: a
/// typo in `upstream.url` never fixes itself, and an INFO line once at start is easy to miss
/// while `/readyz` answers 503. The first failure, then one line a minute (counted in probes,
/// so it needs no clock).
#[derive(Debug)]
pub struct UnresolvedWarning {
    every: u32,
    in_a_row: u32,
}

impl UnresolvedWarning {
    /// Probes `interval` apart: a line every `DNS_WARN_EVERY`, at least every probe.
    pub fn new(interval: Duration) -> Self {
        let every = DNS_WARN_EVERY.as_millis() / interval.as_millis().max(1);
        Self {
            every: u32::try_from(every).unwrap_or(u32::MAX).max(1),
            in_a_row: 0,
        }
    }

    /// Takes one probe's result (`unresolved`: it failed at the name lookup); true when this
    /// one is to be logged.
    pub fn record(&mut self, unresolved: bool) -> bool {
        if !unresolved {
            self.in_a_row = 0;
            return false;
        }
        self.in_a_row = self.in_a_row.saturating_add(1);
        (self.in_a_row - 1) % self.every == 0
    }
}

/// At most one WARN line this often for an upstream host name that does not resolve.
const DNS_WARN_EVERY: Duration = Duration::from_secs(60);

/// Sends the probes: the paths to try and the one that worked last.
struct Prober {
    client: UpstreamClient,
    upstream: Upstream,
    paths: Vec<PathAndQuery>,
    /// Index into `paths` of the path in use; moves to the fallback once for good.
    current: usize,
    timeout: Duration,
}

impl Prober {
    fn new(client: UpstreamClient, upstream: Upstream, cfg: &UpstreamConfig) -> Self {
        let configured = cfg.health_path.as_deref().map(|p| vec![p]);
        let paths = configured
            .unwrap_or_else(|| DEFAULT_PATHS.to_vec())
            .into_iter()
            // `Config::validate` checked a configured path; the defaults are valid literals.
            .filter_map(|p| PathAndQuery::try_from(p).ok())
            .collect();
        Self {
            client,
            upstream,
            paths,
            current: 0,
            timeout: cfg.health_timeout,
        }
    }

    /// One round: the current path, and the fallback when the server has no such route.
    async fn round(&mut self) -> Result<(), Failure> {
        loop {
            let Some(path) = self.paths.get(self.current).cloned() else {
                return Err(String::from("no health path to probe").into());
            };
            match self.probe(&path).await {
                Outcome::Healthy => return Ok(()),
                Outcome::Failed(e) => return Err(e),
                Outcome::NoRoute(e) if self.current + 1 < self.paths.len() => {
                    let next = &self.paths[self.current + 1];
                    tracing::info!("{e}: probing {next} for upstream health instead");
                    self.current += 1;
                }
                Outcome::NoRoute(e) => return Err(e.into()),
            }
        }
    }

    async fn probe(&self, path: &PathAndQuery) -> Outcome {
        let what = format!("GET {}{path}", self.upstream.display);
        let uri = match self.upstream.join(Some(path)) {
            Ok(u) => u,
            Err(e) => return Outcome::Failed(format!("{what}: {e}").into()),
        };
        let mut req = Request::new(full_body(Bytes::new()));
        *req.method_mut() = Method::GET;
        *req.uri_mut() = uri;
        req.headers_mut().insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("kvbust-health/", env!("CARGO_PKG_VERSION"))),
        );
        let exchange = async {
            let resp = self.client.request(req).await?;
            let status = resp.status();
            // Read (a bounded part of) the body so the connection can serve the next probe.
            let _ = Limited::new(resp.into_body(), MAX_PROBE_BODY)
                .collect()
                .await;
            Ok::<StatusCode, hyper_util::client::legacy::Error>(status)
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => Outcome::Failed(
                format!(
                    "{what}: no answer within {} (upstream.health_timeout)",
                    humantime::format_duration(self.timeout)
                )
                .into(),
            ),
            Ok(Err(e)) => Outcome::Failed(Failure {
                why: format!("{what}: {}", crate::upstream::client::with_tls_hint(&e)),
                unresolved: is_unresolved(&e),
            }),
            Ok(Ok(s)) if s.is_success() => Outcome::Healthy,
            Ok(Ok(s)) if s == StatusCode::NOT_FOUND || s == StatusCode::METHOD_NOT_ALLOWED => {
                Outcome::NoRoute(format!("{what} answered {s}"))
            }
            Ok(Ok(s)) => Outcome::Failed(format!("{what} answered {s}").into()),
        }
    }
}

/// Starts the probe task when `upstream.health_probe` is on: one task on the caller's runtime,
/// probing every `health_interval` (the first at once) until `stop` turns true. `client` is
/// built like the data path's (same TLS, client certificate, server name, authority), so the
/// probe reaches the upstream exactly as requests do.
pub fn spawn(
    cfg: &UpstreamConfig,
    readiness: Arc<Readiness>,
    metrics: Metrics,
    upstream: Upstream,
    client: UpstreamClient,
    mut stop: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    if !cfg.health_probe {
        return None;
    }
    let mut prober = Prober::new(client, upstream, cfg);
    let mut tracker = Tracker::new(cfg.health_fail_threshold, cfg.health_success_threshold);
    let interval = cfg.health_interval;
    let mut unresolved = UnresolvedWarning::new(interval);
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        // A slow probe pushes the next one back rather than firing a burst to catch up.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let result = tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                result = async {
                    tick.tick().await;
                    prober.round().await
                } => result,
            };
            let warn_unresolved = unresolved.record(matches!(&result, Err(f) if f.unresolved));
            let transition = tracker.record(result.map_err(|f| f.why));
            // The gauge first, so whoever sees the new status also sees the gauge agree.
            metrics.upstream_up.set(i64::from(tracker.status().is_up()));
            readiness.set(tracker.status().clone());
            if warn_unresolved && !matches!(transition, Some(Transition::Down { .. })) {
                warn_unresolved_host(&prober.upstream, tracker.status());
            }
            log_transition(transition, &prober.upstream, warn_unresolved);
        }
    }))
}

/// The WARN line for an upstream whose host name does not resolve (at most one a minute).
fn warn_unresolved_host(upstream: &Upstream, status: &UpstreamStatus) {
    let why = match status {
        UpstreamStatus::Starting { last: Some(e) } | UpstreamStatus::Down { last: e, .. } => {
            e.as_str()
        }
        _ => "",
    };
    tracing::warn!(
        upstream = %upstream.display,
        "the upstream's host name does not resolve ({why}); /readyz answers 503 until it \
         does: check the host in upstream.url / --upstream"
    );
}

/// One line per change of state. `warned`: this probe's failure was just logged at WARN, so
/// the "waiting" line would say it twice.
fn log_transition(transition: Option<Transition>, upstream: &Upstream, warned: bool) {
    match transition {
        None => {}
        Some(Transition::Waiting(_)) if warned => {}
        Some(Transition::Waiting(e)) => {
            tracing::info!("waiting for the upstream ({e}); /readyz answers 503 until it is up")
        }
        Some(Transition::Up { was_down: false }) => {
            tracing::info!(upstream = %upstream.display, "upstream is up; ready")
        }
        Some(Transition::Up { was_down: true }) => {
            tracing::info!(upstream = %upstream.display, "upstream is up again; ready")
        }
        Some(Transition::Down { failures, last }) => tracing::warn!(
            "upstream is down after {} in a row ({last}); /readyz answers 503 until it \
             is up again",
            failed_probes(failures)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(t: &mut Tracker, why: &str) -> Option<Transition> {
        t.record(Err(why.into()))
    }

    #[test]
    fn an_unresolved_host_warns_at_once_then_once_a_minute_of_probes() {
        // Probes 5 s apart: the 1st, 13th, 25th failure in a row.
        let mut w = UnresolvedWarning::new(Duration::from_secs(5));
        let logged: Vec<usize> = (1..=30).filter(|_| w.record(true)).collect();
        assert_eq!(logged, vec![1, 13, 25]);
        // Any other outcome starts the count again.
        assert!(!w.record(false));
        assert!(w.record(true));
        // Probes further apart than a minute: every one.
        let mut w = UnresolvedWarning::new(Duration::from_secs(90));
        assert!((0..3).all(|_| w.record(true)));
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_told_from_a_refused_connection() {
        use hyper_util::client::legacy::{connect::HttpConnector, Client};
        let client: Client<HttpConnector, http_body_util::Empty<Bytes>> =
            Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        // `.invalid` never resolves (RFC 2606), with or without a DNS server.
        let uri: http::Uri = "http://kvbust-no-such-host.invalid/health".parse().unwrap();
        let err = client.get(uri).await.unwrap_err();
        assert!(is_unresolved(&err), "{}", crate::error::error_chain(&err));
        // A port nothing listens on: connected to nothing, but resolved.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let uri: http::Uri = format!("http://127.0.0.1:{port}/health").parse().unwrap();
        let err = client.get(uri).await.unwrap_err();
        assert!(!is_unresolved(&err), "{}", crate::error::error_chain(&err));
    }

    #[test]
    fn starting_needs_the_success_threshold_and_logs_waiting_once() {
        let mut t = Tracker::new(3, 2);
        assert_eq!(
            fail(&mut t, "refused"),
            Some(Transition::Waiting("refused".into()))
        );
        assert_eq!(fail(&mut t, "refused again"), None);
        assert_eq!(
            t.status(),
            &UpstreamStatus::Starting {
                last: Some("refused again".into())
            }
        );
        assert_eq!(t.record(Ok(())), None, "one success of two");
        assert!(!t.status().is_up());
        // A failure in between starts the count again.
        assert_eq!(fail(&mut t, "503"), None);
        assert_eq!(t.record(Ok(())), None);
        assert_eq!(t.record(Ok(())), Some(Transition::Up { was_down: false }));
        assert!(t.status().is_up());
        assert_eq!(t.record(Ok(())), None, "no transition while up");
    }

    #[test]
    fn up_goes_down_only_after_the_fail_threshold_in_a_row() {
        let mut t = Tracker::new(3, 1);
        assert_eq!(t.record(Ok(())), Some(Transition::Up { was_down: false }));
        assert_eq!(fail(&mut t, "a"), None);
        assert_eq!(fail(&mut t, "b"), None);
        assert!(t.status().is_up(), "two failures of three");
        assert_eq!(t.record(Ok(())), None, "a success resets the count");
        assert_eq!(fail(&mut t, "c"), None);
        assert_eq!(fail(&mut t, "d"), None);
        assert_eq!(
            fail(&mut t, "e"),
            Some(Transition::Down {
                failures: 3,
                last: "e".into()
            })
        );
        assert_eq!(fail(&mut t, "f"), None, "logged once");
        assert_eq!(
            t.status(),
            &UpstreamStatus::Down {
                failures: 4,
                last: "f".into()
            }
        );
        assert_eq!(t.record(Ok(())), Some(Transition::Up { was_down: true }));
    }

    #[test]
    fn reasons_say_why_not_ready() {
        assert_eq!(UpstreamStatus::Unchecked.not_ready_reason(), None);
        assert_eq!(UpstreamStatus::Up.not_ready_reason(), None);
        let r = UpstreamStatus::Starting {
            last: Some("GET http://m/health: connection refused".into()),
        }
        .not_ready_reason()
        .unwrap();
        assert!(
            r.contains("not up yet") && r.contains("connection refused"),
            "{r}"
        );
        let r = UpstreamStatus::Down {
            failures: 3,
            last: "GET http://m/health answered 503 Service Unavailable".into(),
        }
        .not_ready_reason()
        .unwrap();
        assert!(
            r.contains("3 failed health probes") && r.contains("503"),
            "{r}"
        );
    }

    #[test]
    fn readiness_starts_pending_with_a_probe_and_unchecked_without() {
        assert_eq!(
            Readiness::new(true).status().not_ready_reason().as_deref(),
            Some("the upstream has not answered its health probe yet")
        );
        assert_eq!(Readiness::new(false).status(), UpstreamStatus::Unchecked);
    }
}
