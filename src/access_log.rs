//! The access log and the request id: one structured `tracing` line per data-port request
//! (target `access_log`, text or JSON as `log.format` says), written when the response body
//! ends or is dropped, and the `x-request-id` the line is keyed by. Never writes on the request
//! path itself (lines go to the non-blocking writer `app` sets up), never logs a query string, a
//! header value other than the request id, or a body.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use http::{Method, Uri};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};
use crate::proxy::observe::Tokens;

/// The tracing target of access-log lines. Not under `kvbust::`: filter directives match target
/// prefixes, so `kvbust::access` would also take in this module's own events.
pub const TARGET: &str = "access_log";

/// The request-id header, passed on to the upstream and set on the response.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Phase, target and RID digest of an exchange.
pub type Labels = (&'static str, &'static str, Option<String>);

/// What the request path knows of one request, for its access-log line.
pub struct Entry {
    method: Method,
    /// The client's request target; only its path is logged.
    uri: Uri,
    pub route: &'static str,
    pub phase: &'static str,
    pub target: &'static str,
    pub rid: Option<String>,
    request_id: HeaderValue,
    pub status: u16,
    pub upstream_status: Option<u16>,
    pub upstream_connect: Option<Duration>,
    /// Request body bytes from the client: counted when the body was read, else its
    /// `content-length`.
    pub bytes_in: Option<u64>,
    pub error: Option<&'static str>,
}

/// What the response body showed, known when it ends.
pub struct Outcome {
    pub ttft: Option<Duration>,
    pub duration: Duration,
    /// SSE data events (streams only).
    pub events: Option<u64>,
    pub bytes_out: u64,
    pub tokens: Tokens,
    /// `complete`, or why the body ended early (`client_disconnect`, `upstream_error`, ...).
    pub end: &'static str,
}

impl Entry {
    /// The entry of a request, or `None` when `log.access` is off (then nothing else is done
    /// for the access log, request ids included). Takes the client's `x-request-id`, or sets a
    /// new one on the request so the upstream sees the id the line carries.
    pub fn begin<B>(on: bool, req: &mut http::Request<B>, route: &'static str) -> Option<Entry> {
        if !on {
            return None;
        }
        let headers = req.headers_mut();
        let request_id = match headers.get(&X_REQUEST_ID) {
            Some(v) if !v.is_empty() => v.clone(),
            _ => {
                let v = new_request_id();
                headers.insert(X_REQUEST_ID, v.clone());
                v
            }
        };
        let bytes_in = headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Some(Entry {
            method: req.method().clone(),
            uri: req.uri().clone(),
            route,
            phase: "none",
            target: "none",
            rid: None,
            request_id,
            status: 0,
            upstream_status: None,
            upstream_connect: None,
            bytes_in,
            error: None,
        })
    }

    /// The upstream answered: takes its status and connect time, and sets the request id on
    /// the response unless the upstream set one.
    pub fn responded(
        mut self,
        resp: &mut http::response::Parts,
        (phase, target, rid): Labels,
    ) -> Entry {
        (self.phase, self.target, self.rid) = (phase, target, rid);
        self.status = resp.status.as_u16();
        self.upstream_status = Some(self.status);
        self.upstream_connect = resp
            .extensions
            .get::<crate::proxy::forward::UpstreamConnect>()
            .map(|c| c.0);
        if !resp.headers.contains_key(&X_REQUEST_ID) {
            resp.headers.insert(X_REQUEST_ID, self.request_id.clone());
        }
        self
    }

    /// kvbust answered with an error (`code`) itself: writes the line now.
    pub fn failed<B: http_body::Body>(
        mut self,
        resp: &mut http::Response<B>,
        (phase, target, rid): Labels,
        code: &'static str,
        start: std::time::Instant,
    ) {
        (self.phase, self.target, self.rid) = (phase, target, rid);
        self.status = resp.status().as_u16();
        self.error = Some(code);
        resp.headers_mut()
            .insert(X_REQUEST_ID, self.request_id.clone());
        self.write(&Outcome {
            ttft: None,
            duration: start.elapsed(),
            events: None,
            bytes_out: resp.body().size_hint().exact().unwrap_or(0),
            tokens: Tokens::default(),
            end: "complete",
        });
    }

    /// The id to set on the response.
    pub fn request_id(&self) -> &HeaderValue {
        &self.request_id
    }

    /// Writes the line.
    pub fn write(&self, o: &Outcome) {
        let us = |d: Duration| d.as_micros() as u64;
        tracing::info!(
            target: TARGET,
            method = %self.method,
            path = self.uri.path(),
            route = self.route,
            status = self.status,
            upstream_status = self.upstream_status,
            phase = self.phase,
            target = self.target,
            rid = self.rid.as_deref(),
            request_id = self.request_id.to_str().unwrap_or("(not visible ASCII)"),
            upstream_connect_us = self.upstream_connect.map(us),
            ttft_us = o.ttft.map(us),
            duration_us = us(o.duration),
            events = o.events,
            bytes_in = self.bytes_in,
            bytes_out = o.bytes_out,
            prompt_tokens = o.tokens.prompt,
            cached_tokens = o.tokens.cached,
            completion_tokens = o.tokens.completion,
            end = o.end,
            error = self.error,
            "access"
        );
    }
}

/// A new request id: 16 lowercase hex characters, unique in this process. A per-process random
/// seed plus a counter, through a bijective mix (splitmix64's finalizer): no system call and no
/// lock per request, and ids from different runs do not collide in practice.
pub fn new_request_id() -> HeaderValue {
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(rand::random::<u64>);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut z = seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let mut hex = [0u8; 16];
    for (i, b) in hex.iter_mut().enumerate() {
        *b = b"0123456789abcdef"[((z >> (60 - 4 * i)) & 0xf) as usize];
    }
    // Hex digits are always a valid header value.
    HeaderValue::from_bytes(&hex).unwrap_or(HeaderValue::from_static("0"))
}

/// The process's subscriber: `log.level` (or `env_filter`, `RUST_LOG`'s value, when given),
/// access lines on or off as `log.access` says whatever the level, text or JSON, colours only
/// when `ansi`. `app` passes the non-blocking stderr writer; tests pass one that captures.
pub fn subscriber<W>(
    log: &LogConfig,
    env_filter: Option<&str>,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = env_filter
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(&log.level));
    let access = if log.access {
        "access_log=info"
    } else {
        "access_log=off"
    };
    // A fixed, valid directive.
    let filter = match access.parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    match log.format {
        LogFormat::Text => Box::new(builder.finish()),
        LogFormat::Json => Box::new(builder.json().finish()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Capture {
        type Writer = Capture;
        fn make_writer(&'w self) -> Capture {
            self.clone()
        }
    }

    fn request(id: Option<&'static str>) -> http::Request<()> {
        let mut b = http::Request::post("/v1/chat/completions?key=secret");
        if let Some(id) = id {
            b = b.header(X_REQUEST_ID, id);
        }
        b.body(()).unwrap()
    }

    fn sample(req: &mut http::Request<()>) -> Entry {
        let mut e = Entry::begin(true, req, "chat").unwrap();
        e.phase = "warmup";
        e.target = "first_turn_prefix";
        e.rid = Some("0123456789ab".into());
        e.status = 200;
        e.upstream_status = Some(200);
        e
    }

    fn outcome() -> Outcome {
        Outcome {
            ttft: Some(Duration::from_micros(1500)),
            duration: Duration::from_millis(20),
            events: Some(6),
            bytes_out: 900,
            tokens: Tokens {
                prompt: Some(40),
                cached: Some(32),
                completion: Some(4),
            },
            end: "complete",
        }
    }

    fn render(log: &LogConfig, ansi: bool, entry: &Entry) -> String {
        let cap = Capture::default();
        let sub = subscriber(log, None, cap.clone(), ansi);
        tracing::subscriber::with_default(sub, || {
            tracing::info!("not an access line");
            entry.write(&outcome());
        });
        let out = cap.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn text_line_has_the_fields_and_no_colours() {
        let mut req = request(Some("client-id-1"));
        let e = sample(&mut req);
        let log = LogConfig {
            level: "warn".into(),
            ..LogConfig::default()
        };
        let text = render(&log, false, &e);
        assert!(!text.contains('\x1b'), "{text:?}");
        // `log.level = warn` hides the info line but not the access line.
        assert_eq!(text.lines().count(), 1, "{text}");
        for field in [
            " access_log: access ",
            "method=POST",
            "path=\"/v1/chat/completions\"",
            "route=\"chat\"",
            "status=200",
            "upstream_status=200",
            "phase=\"warmup\"",
            "target=\"first_turn_prefix\"",
            "rid=\"0123456789ab\"",
            "request_id=\"client-id-1\"",
            "ttft_us=1500",
            "duration_us=20000",
            "events=6",
            "bytes_out=900",
            "prompt_tokens=40",
            "cached_tokens=32",
            "completion_tokens=4",
            "end=\"complete\"",
        ] {
            assert!(text.contains(field), "{field} missing: {text}");
        }
        assert!(!text.contains("secret"), "{text}");
        // Unknown facts are left out, not written as empty.
        assert!(!text.contains("upstream_connect_us"), "{text}");
        assert!(!text.contains("bytes_in"), "{text}");
        // The client's id is kept, not replaced.
        assert_eq!(req.headers()[X_REQUEST_ID], "client-id-1");
        assert!(render(&log, true, &e).contains('\x1b'));
    }

    #[test]
    fn json_line_and_off_switch() {
        let mut req = request(None);
        let e = sample(&mut req);
        let generated = req.headers()[X_REQUEST_ID].to_str().unwrap().to_string();
        assert_eq!(generated.len(), 16);
        let log = LogConfig {
            format: LogFormat::Json,
            ..LogConfig::default()
        };
        let text = render(&log, false, &e);
        let line = text
            .lines()
            .find(|l| l.contains(r#""target":"access_log""#))
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["fields"]["request_id"], generated.as_str());
        assert_eq!(v["fields"]["cached_tokens"], 32);
        assert_eq!(v["fields"]["target"], "first_turn_prefix");
        let off = LogConfig {
            access: false,
            ..LogConfig::default()
        };
        assert!(!render(&off, false, &e).contains(" access_log: access "));
        let mut plain = http::Request::get("/x").body(()).unwrap();
        assert!(Entry::begin(false, &mut plain, "other").is_none());
        assert!(!plain.headers().contains_key(X_REQUEST_ID));
    }

    #[test]
    fn request_ids_are_distinct_hex() {
        let ids: std::collections::HashSet<_> = (0..10_000)
            .map(|_| new_request_id().to_str().unwrap().to_string())
            .collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids
            .iter()
            .all(|i| i.len() == 16 && i.bytes().all(|b| b.is_ascii_hexdigit())));
    }
}
