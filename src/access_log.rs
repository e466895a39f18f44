//! The access log and the request id: one line per data-port request, text or JSON as
//! `log.format` says (the same shape `tracing`'s formatter gives other lines), written when the
//! response body ends or is dropped, and the `x-request-id` the line is keyed by. Data workers
//! hold their lines and hand them over in batches ([`hold_lines_on_this_thread`]) to the writer
//! `app` installs (a background thread), so the request path neither writes nor wakes a thread
//! per line. Never logs a query string, a header value other than the request id and the
//! user agent (cut to [`crate::error::MAX_EXCERPT`] bytes, control characters escaped), or a
//! body.

use std::cell::RefCell;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use http::header::{HeaderName, HeaderValue};
use http::Method;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};
use crate::usage::Tokens;

/// The target access-log lines carry (as a `tracing` event's target would be written), so they
/// can be told from other log lines.
pub const TARGET: &str = "access_log";

/// A data worker hands its held lines over once this many bytes are waiting (about 100 lines),
/// or at the latest every [`FLUSH_PERIOD`].
const BATCH_BYTES: usize = 32 << 10;

/// How long a held line may wait on a quiet worker.
pub const FLUSH_PERIOD: Duration = Duration::from_millis(200);

/// Where lines go: set once per process (by `app`, or a test that reads the lines).
type Sink = Box<dyn Fn(&[u8]) + Send + Sync>;
static SINK: OnceLock<Sink> = OnceLock::new();

thread_local! {
    /// The lines this thread holds, when it holds them (data workers do).
    static HELD: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Sets where access lines go, for the rest of the process; `false` if it was already set.
/// `write` gets whole lines, many at a time, each ending in `\n`.
pub fn install(write: impl Fn(&[u8]) + Send + Sync + 'static) -> bool {
    SINK.set(Box::new(write)).is_ok()
}

/// Makes this thread hold its access lines and hand them to the sink in batches; the thread
/// must then call [`flush_this_thread`] now and then ([`flush_periodically`]) and when it ends.
pub fn hold_lines_on_this_thread() {
    HELD.with(|h| *h.borrow_mut() = Some(Vec::with_capacity(BATCH_BYTES + 1024)));
}

/// Hands the lines this thread holds to the sink.
pub fn flush_this_thread() {
    let Some(sink) = SINK.get() else { return };
    HELD.with(|h| {
        if let Some(buf) = h.borrow_mut().as_mut().filter(|b| !b.is_empty()) {
            sink(buf);
            buf.clear();
        }
    });
}

/// Flushes this thread's lines every [`FLUSH_PERIOD`], forever (a data worker's task).
pub async fn flush_periodically() {
    let mut tick = tokio::time::interval(FLUSH_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        flush_this_thread();
    }
}

/// The request-id header, passed on to the upstream and set on the response.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client `x-request-id` kept; a longer one is replaced (it is logged, echoed and
/// forwarded, so its size must not be the client's choice).
pub const MAX_REQUEST_ID: usize = 128;

/// Whether a client's request id is kept as it came: 1 to [`MAX_REQUEST_ID`] bytes, each visible
/// ASCII (`!` to `~`, RFC 5234 VCHAR).
pub fn is_usable_request_id(id: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID).contains(&id.len()) && id.iter().all(|b| (b'!'..=b'~').contains(b))
}

/// Phase, target and RID digest of an exchange.
pub type Labels = (&'static str, &'static str, Option<String>);

/// A field's key as each format writes it before the value (` key=`, `,"key":`), spelt out at
/// compile time so a field costs one copy, not three.
#[derive(Clone, Copy)]
struct Key {
    text: &'static str,
    json: &'static str,
}

macro_rules! key {
    ($k:literal) => {
        Key {
            text: concat!(" ", $k, "="),
            json: concat!(",\"", $k, "\":"),
        }
    };
}

/// What the request path knows of one request, for its access-log line.
pub struct Entry {
    format: LogFormat,
    method: Method,
    /// The path of the client's request target, copied. This and the request id and user agent
    /// are copies because hyper parses a request's target and header values as slices of the
    /// connection's read buffer: an entry holding one while the response streams keeps that
    /// buffer from being reused, and hyper's next read then allocates a second one (8–16 KiB
    /// more per open stream).
    path: Box<str>,
    pub route: &'static str,
    pub phase: &'static str,
    pub target: &'static str,
    pub rid: Option<String>,
    request_id: HeaderValue,
    /// The client's address (ip:port) as the connection came; behind a load balancer, its own.
    client: std::net::SocketAddr,
    user_agent: Option<HeaderValue>,
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
    /// The run the request belonged to, and the cache model's prediction for it (filled when
    /// the model took the request: the line then waits for it).
    pub run: Option<String>,
    pub predicted: Option<Predicted>,
}

/// The cache model's figure for one request, beside the server's `cached_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Predicted {
    pub cached_tokens: u64,
    /// Who put the larger share of the reused blocks there: `same_session`, `other_session`,
    /// `warmup`, or `none` (no hit).
    pub source: &'static str,
}

impl Entry {
    /// The entry of a request, or `None` when `log.access` is off (then nothing else is done
    /// for the access log, request ids included). Takes the client's `x-request-id`, or sets a
    /// new one on the request so the upstream sees the id the line carries.
    pub fn begin<B>(
        log: &LogConfig,
        req: &mut http::Request<B>,
        client: std::net::SocketAddr,
        route: &'static str,
    ) -> Option<Entry> {
        if !log.access {
            return None;
        }
        let headers = req.headers_mut();
        let request_id = match headers.get(&X_REQUEST_ID) {
            // A copy, not a clone: see `Entry::path`.
            Some(v) if is_usable_request_id(v.as_bytes()) => {
                let kept =
                    HeaderValue::from_bytes(v.as_bytes()).unwrap_or_else(|_| new_request_id());
                // Only the id that was checked goes on: `insert` drops any second value.
                if headers.get_all(&X_REQUEST_ID).iter().nth(1).is_some() {
                    headers.insert(X_REQUEST_ID, kept.clone());
                }
                kept
            }
            given => {
                let v = new_request_id();
                if let Some(bad) = given.filter(|g| !g.is_empty()) {
                    // Logged, or the client could not tell why its id is not on the line.
                    tracing::info!(
                        client = %client,
                        given_len = bad.len(),
                        given = crate::error::excerpt(bad.as_bytes()).as_str(),
                        new = v.to_str().unwrap_or_default(),
                        "x-request-id replaced: over {MAX_REQUEST_ID} bytes or not visible ASCII"
                    );
                }
                headers.insert(X_REQUEST_ID, v.clone());
                v
            }
        };
        let bytes_in = headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Some(Entry {
            format: log.format,
            method: req.method().clone(),
            path: req.uri().path().into(),
            route,
            phase: "none",
            target: "none",
            rid: None,
            request_id,
            client,
            user_agent: req
                .headers()
                .get(http::header::USER_AGENT)
                .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()),
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
            .get::<crate::upstream::pool::UpstreamConnect>()
            .map(|c| c.0);
        // One lookup: set only when the upstream did not.
        if let http::header::Entry::Vacant(slot) = resp.headers.entry(X_REQUEST_ID) {
            slot.insert(self.request_id.clone());
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
            run: None,
            predicted: None,
        });
    }

    /// The id to set on the response.
    pub fn request_id(&self) -> &HeaderValue {
        &self.request_id
    }

    /// Writes the line: into this thread's held lines, or straight to the sink.
    pub fn write(&self, o: &Outcome) {
        let Some(sink) = SINK.get() else { return };
        // `try_with`: a line written while this thread's locals are being torn down goes out
        // at once instead of panicking.
        let held = HELD.try_with(|h| match h.borrow_mut().as_mut() {
            Some(buf) => {
                self.render(buf, o, SystemTime::now());
                if buf.len() >= BATCH_BYTES {
                    sink(buf);
                    buf.clear();
                }
                true
            }
            None => false,
        });
        if held != Ok(true) {
            let mut line = Vec::with_capacity(512);
            self.render(&mut line, o, SystemTime::now());
            sink(&line);
        }
    }

    /// Appends the line (with its `\n`) to `out`.
    fn render(&self, out: &mut Vec<u8>, o: &Outcome, at: SystemTime) {
        let us = |d: Duration| d.as_micros() as u64;
        let mut line = Line::start(out, self.format, at);
        line.text(key!("method"), self.method.as_str());
        line.text(key!("path"), &self.path);
        line.word(key!("route"), self.route);
        line.num(key!("status"), Some(u64::from(self.status)));
        line.num(key!("upstream_status"), self.upstream_status.map(u64::from));
        line.word(key!("phase"), self.phase);
        line.word(key!("target"), self.target);
        if let Some(rid) = &self.rid {
            line.text(key!("rid"), rid);
        }
        let id = self.request_id.to_str().unwrap_or("(not visible ASCII)");
        line.text(key!("request_id"), id);
        let mut client = [0u8; 64];
        line.text(key!("client"), socket_addr(&self.client, &mut client));
        if let Some(ua) = &self.user_agent {
            let ua = ua.as_bytes();
            // What `excerpt` makes of short printable ASCII is the text itself, so that (the
            // usual user agent) is written without the copy; the length is checked first.
            let plain = ua.len() <= crate::error::MAX_EXCERPT
                && ua.iter().all(|b| (0x20..0x7f).contains(b));
            match plain.then(|| std::str::from_utf8(ua).ok()).flatten() {
                Some(text) => line.text(key!("user_agent"), text),
                None => line.text(key!("user_agent"), &crate::error::excerpt(ua)),
            }
        }
        line.num(key!("upstream_connect_us"), self.upstream_connect.map(us));
        line.num(key!("ttft_us"), o.ttft.map(us));
        line.num(key!("duration_us"), Some(us(o.duration)));
        line.num(key!("events"), o.events);
        line.num(key!("bytes_in"), self.bytes_in);
        line.num(key!("bytes_out"), Some(o.bytes_out));
        line.num(key!("prompt_tokens"), o.tokens.prompt);
        line.num(key!("cached_tokens"), o.tokens.cached);
        line.num(key!("completion_tokens"), o.tokens.completion);
        if let Some(p) = &o.predicted {
            line.num(key!("predicted_cached_tokens"), Some(p.cached_tokens));
            line.word(key!("reuse_source"), p.source);
        }
        if let Some(run) = &o.run {
            line.text(key!("run"), run);
        }
        line.word(key!("end"), o.end);
        if let Some(e) = self.error {
            line.word(key!("error"), e);
        }
        line.end();
    }
}

/// `addr` as `Display` writes it, into `buf` and without the formatting machinery for IPv4 (the
/// usual case); IPv6 goes through `Display`. 64 bytes hold the longest IPv6 socket address
/// (scope id included).
fn socket_addr<'b>(addr: &std::net::SocketAddr, buf: &'b mut [u8; 64]) -> &'b str {
    let mut out = std::io::Cursor::new(&mut buf[..]);
    match addr {
        std::net::SocketAddr::V4(a) => {
            let mut n = itoa::Buffer::new();
            for (i, octet) in a.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b".");
                }
                let _ = out.write_all(n.format(octet).as_bytes());
            }
            let _ = out.write_all(b":");
            let _ = out.write_all(n.format(a.port()).as_bytes());
        }
        std::net::SocketAddr::V6(a) => {
            let _ = write!(out, "{a}");
        }
    }
    let len = out.position() as usize;
    // Only ASCII digits, dots, colons, brackets, hex and `%` were written.
    std::str::from_utf8(&buf[..len]).unwrap_or("")
}

/// One line being written, field by field, in the layout `tracing`'s formatter gives an event
/// `info!(target: "access_log", field = value, ..., "access")`: text
/// `<time>  INFO access_log: access method=POST path="/v1/..." status=200 ...`, or JSON
/// `{"timestamp":..,"level":"INFO","fields":{"message":"access",...},"target":"access_log"}`.
/// A field without a value is left out. The method is written bare in text, as `%` did.
struct Line<'a> {
    out: &'a mut Vec<u8>,
    json: bool,
}

impl<'a> Line<'a> {
    fn start(out: &'a mut Vec<u8>, format: LogFormat, at: SystemTime) -> Self {
        let json = format == LogFormat::Json;
        if json {
            out.extend_from_slice(b"{\"timestamp\":\"");
            timestamp(out, at);
            out.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"message\":\"access\"");
        } else {
            timestamp(out, at);
            out.extend_from_slice(b"  INFO ");
            out.extend_from_slice(TARGET.as_bytes());
            out.extend_from_slice(b": access");
        }
        Line { out, json }
    }

    fn key(&mut self, key: Key) {
        let k = if self.json { key.json } else { key.text };
        self.out.extend_from_slice(k.as_bytes());
    }

    fn text(&mut self, key: Key, value: &str) {
        self.key(key);
        if self.json {
            // Writing a str into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *self.out, value);
        } else if key.text == " method=" {
            self.out.extend_from_slice(value.as_bytes());
        } else {
            debug_quoted(self.out, value);
        }
    }

    /// A fixed word of kvbust's own (a label, an end, an error code): ASCII letters, digits, `_`
    /// and `-`, so quoted as it is in either format, with no scan for characters to escape.
    fn word(&mut self, key: Key, value: &'static str) {
        debug_assert!(value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
        self.key(key);
        self.out.push(b'"');
        self.out.extend_from_slice(value.as_bytes());
        self.out.push(b'"');
    }

    fn num(&mut self, key: Key, value: Option<u64>) {
        if let Some(v) = value {
            self.key(key);
            self.out
                .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        }
    }

    fn end(self) {
        if self.json {
            self.out.extend_from_slice(b"},\"target\":\"");
            self.out.extend_from_slice(TARGET.as_bytes());
            self.out.extend_from_slice(b"\"}\n");
        } else {
            self.out.push(b'\n');
        }
    }
}

/// `value` quoted and escaped as Rust's `{:?}` writes a string (what `tracing` writes for a
/// `&str` field in text), so a quote or a control character cannot break the line.
fn debug_quoted(out: &mut Vec<u8>, value: &str) {
    out.push(b'"');
    // The usual case, printable ASCII with nothing to escape, in one copy.
    if value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
        return;
    }
    for c in value.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\0' => out.extend_from_slice(b"\\0"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => {
                let mut b = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// RFC 3339 UTC with microseconds, `2026-11-30T20:01:17.025766Z`, as `tracing`'s default timer.
/// The date and time of day change once a second: each thread keeps the last second's text, so
/// `humantime` formats a date once a second and a line only adds its microseconds.
fn timestamp(out: &mut Vec<u8>, at: SystemTime) {
    thread_local! {
        static SECOND: std::cell::Cell<(u64, [u8; 19])> = const { std::cell::Cell::new((u64::MAX, [0; 19])) };
    }
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let secs = since.as_secs();
    let text = SECOND
        .try_with(|kept| match kept.get() {
            (s, text) if s == secs => text,
            _ => {
                let text = date_time(secs);
                kept.set((secs, text));
                text
            }
        })
        .unwrap_or_else(|_| date_time(secs));
    out.extend_from_slice(&text);
    out.push(b'.');
    // `{:06}` of the microseconds, without the formatting machinery.
    let micros = since.subsec_micros();
    for i in (0..6).rev() {
        out.push(b'0' + (micros / 10u32.pow(i) % 10) as u8);
    }
    out.push(b'Z');
}

/// The last second `humantime` can write: 9999-12-31T23:59:59Z (a four-digit year).
const LAST_SECOND: u64 = 253_402_300_799;

/// `YYYY-MM-DDTHH:MM:SS` of a second since the epoch (UTC); a later second than year 9999's
/// last is written as that one.
fn date_time(secs: u64) -> [u8; 19] {
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(secs.min(LAST_SECOND));
    // `2026-11-30T20:01:17Z`: the 19 bytes before the `Z`. Writing 20 bytes into a 20-byte
    // buffer cannot run short, and the second is in humantime's range.
    let mut text = [0u8; 20];
    let _ = write!(&mut text[..], "{}", humantime::format_rfc3339_seconds(at));
    let mut date = [0u8; 19];
    date.copy_from_slice(&text[..19]);
    date
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

/// The process's subscriber for every line but the access lines (see [`install`]): `log.level`
/// (or `env_filter`, `RUST_LOG`'s value, when given), text or JSON, colours only when `ansi`. `app` passes the non-blocking stderr writer; tests pass one that captures.
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

    fn request(id: Option<&str>, path: &str) -> http::Request<()> {
        let mut b = http::Request::post(path);
        if let Some(id) = id {
            b = b
                .header(X_REQUEST_ID, id)
                .header("user-agent", "OpenAI/Python 1.99.1");
        }
        b.body(()).unwrap()
    }

    fn peer() -> std::net::SocketAddr {
        "192.0.2.7:51234".parse().unwrap()
    }

    fn log(format: LogFormat) -> LogConfig {
        LogConfig {
            format,
            ..LogConfig::default()
        }
    }

    fn sample(req: &mut http::Request<()>, format: LogFormat) -> Entry {
        let mut e = Entry::begin(&log(format), req, peer(), "chat").unwrap();
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
            run: None,
            predicted: None,
        }
    }

    fn rendered(entry: &Entry, o: &Outcome) -> String {
        let mut out = Vec::new();
        let at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_764_532_877_025_766);
        entry.render(&mut out, o, at);
        String::from_utf8(out).unwrap()
    }

    /// The line `tracing`'s own formatter writes for the same fields (the way the access log
    /// was written before it was batched): what the rendered line must equal.
    fn via_tracing(format: LogFormat, e: &Entry, o: &Outcome) -> String {
        let cap = Capture::default();
        let sub = subscriber(&log(format), None, cap.clone(), false);
        let us = |d: Duration| d.as_micros() as u64;
        tracing::subscriber::with_default(sub, || {
            tracing::info!(
                target: TARGET,
                method = %e.method,
                path = &*e.path,
                route = e.route,
                status = e.status,
                upstream_status = e.upstream_status,
                phase = e.phase,
                target = e.target,
                rid = e.rid.as_deref(),
                request_id = e.request_id.to_str().unwrap_or("(not visible ASCII)"),
                client = e.client.to_string(),
                user_agent = e.user_agent.as_ref().map(|u| crate::error::excerpt(u.as_bytes())),
                upstream_connect_us = e.upstream_connect.map(us),
                ttft_us = o.ttft.map(us),
                duration_us = us(o.duration),
                events = o.events,
                bytes_in = e.bytes_in,
                bytes_out = o.bytes_out,
                prompt_tokens = o.tokens.prompt,
                cached_tokens = o.tokens.cached,
                completion_tokens = o.tokens.completion,
                end = o.end,
                error = e.error,
                "access"
            );
        });
        let out = cap.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    /// Drops the timestamp, which differs between the two writers.
    fn untimed(format: LogFormat, line: &str) -> serde_json::Value {
        match format {
            LogFormat::Text => serde_json::Value::String(line.split_once(' ').unwrap().1.into()),
            LogFormat::Json => {
                let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
                v.as_object_mut().unwrap().remove("timestamp").unwrap();
                v
            }
        }
    }

    #[test]
    fn lines_are_what_tracing_would_write() {
        for format in [LogFormat::Text, LogFormat::Json] {
            // A full line; one with most facts unknown; one whose path and id need escaping.
            let mut full = request(Some("client-id-1"), "/v1/chat/completions?key=secret");
            let full = sample(&mut full, format);
            let mut sparse = request(None, "/v1/models");
            let mut sparse = Entry::begin(&log(format), &mut sparse, peer(), "other").unwrap();
            sparse.status = 502;
            sparse.error = Some("upstream_connect");
            let mut odd = request(Some(r#"a"b\c"#), "/v1/%22quoted%22/\"x\"");
            let mut odd = sample(&mut odd, format);
            odd.upstream_connect = Some(Duration::from_micros(75));
            odd.bytes_in = Some(12);
            let bare = Outcome {
                ttft: None,
                events: None,
                tokens: Tokens::default(),
                end: "client_disconnect",
                run: None,
                predicted: None,
                ..outcome()
            };
            for (e, o) in [(&full, outcome()), (&sparse, bare), (&odd, outcome())] {
                let ours = rendered(e, &o);
                let theirs = via_tracing(format, e, &o);
                assert_eq!(ours.lines().count(), 1, "{ours}");
                assert!(ours.ends_with('\n'));
                assert_eq!(
                    untimed(format, &ours),
                    untimed(format, &theirs),
                    "{format:?}"
                );
                if format == LogFormat::Text {
                    // Text must match byte for byte (JSON was compared as values above).
                    assert_eq!(
                        ours.split_once(' ').unwrap().1,
                        theirs.split_once(' ').unwrap().1
                    );
                }
            }
        }
    }

    #[test]
    fn text_line_has_the_fields_and_no_query_or_colours() {
        let mut req = request(Some("client-id-1"), "/v1/chat/completions?key=secret");
        let e = sample(&mut req, LogFormat::Text);
        let text = rendered(&e, &outcome());
        assert!(
            text.starts_with("2025-11-30T20:01:17.025766Z  INFO access_log: access method=POST path=\"/v1/chat/completions\" route=\"chat\" status=200"),
            "{text}"
        );
        assert!(!text.contains('\x1b') && !text.contains("secret"), "{text}");
        // Unknown facts are left out, not written as empty.
        assert!(!text.contains("upstream_connect_us") && !text.contains("bytes_in"));
        // The client's id is kept, not replaced.
        assert_eq!(req.headers()[X_REQUEST_ID], "client-id-1");
        // Who sent it: the connection's address and the user agent.
        assert!(
            text.contains(" request_id=\"client-id-1\" client=\"192.0.2.7:51234\" user_agent=\"OpenAI/Python 1.99.1\" "),
            "{text}"
        );
    }

    #[test]
    fn a_long_or_odd_user_agent_is_cut_and_escaped() {
        let mut req = http::Request::post("/v1/chat/completions")
            .header("user-agent", format!("x\ty{}", "z".repeat(300)))
            .body(())
            .unwrap();
        let e = Entry::begin(&log(LogFormat::Json), &mut req, peer(), "chat").unwrap();
        let v: serde_json::Value = serde_json::from_str(&rendered(&e, &outcome())).unwrap();
        let ua = v["fields"]["user_agent"].as_str().unwrap();
        assert!(ua.starts_with("x\\ty") && ua.ends_with('…'), "{ua}");
        assert!(ua.len() < 220, "{}", ua.len());
        assert_eq!(v["fields"]["client"], "192.0.2.7:51234");
    }

    #[test]
    fn a_new_request_id_goes_on_the_request_and_the_off_switch_sets_none() {
        let mut req = request(None, "/v1/chat/completions");
        let e = sample(&mut req, LogFormat::Json);
        let generated = req.headers()[X_REQUEST_ID].to_str().unwrap().to_string();
        assert_eq!(generated.len(), 16);
        let v: serde_json::Value = serde_json::from_str(&rendered(&e, &outcome())).unwrap();
        assert_eq!(v["fields"]["request_id"], generated.as_str());
        assert_eq!(v["target"], TARGET);
        let off = LogConfig {
            access: false,
            ..LogConfig::default()
        };
        let mut plain = http::Request::get("/x").body(()).unwrap();
        assert!(Entry::begin(&off, &mut plain, peer(), "other").is_none());
        assert!(!plain.headers().contains_key(X_REQUEST_ID));
    }

    #[test]
    fn a_long_or_invisible_request_id_is_replaced_and_the_replacement_logged() {
        let long = "a".repeat(MAX_REQUEST_ID + 1);
        let kept = "k".repeat(MAX_REQUEST_ID);
        for (given, replaced) in [
            (long.as_bytes(), true),
            (b"has space".as_slice(), true),
            (b"tab\tid".as_slice(), true),
            ("caf\u{e9}".as_bytes(), true),
            (kept.as_bytes(), false),
            (b"client-id-1".as_slice(), false),
        ] {
            let mut req = http::Request::post("/v1/chat/completions")
                .header(X_REQUEST_ID, HeaderValue::from_bytes(given).unwrap())
                .body(())
                .unwrap();
            let cap = Capture::default();
            let sub = subscriber(&log(LogFormat::Text), None, cap.clone(), false);
            let e = tracing::subscriber::with_default(sub, || {
                Entry::begin(&log(LogFormat::Json), &mut req, peer(), "chat").unwrap()
            });
            let logged = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
            let sent = req.headers()[X_REQUEST_ID].as_bytes().to_vec();
            let what = String::from_utf8_lossy(given).into_owned();
            assert_eq!(sent, e.request_id().as_bytes(), "{what}");
            if replaced {
                assert_eq!(sent.len(), 16, "{what}: a new id goes upstream");
                let line = format!(
                    "x-request-id replaced: over 128 bytes or not visible ASCII client=192.0.2.7:51234 given_len={} given=",
                    given.len()
                );
                assert!(logged.contains(&line), "{what}: {logged}");
                let new = format!(" new=\"{}\"", e.request_id().to_str().unwrap());
                assert!(logged.contains(&new), "{what}: {logged}");
                assert!(logged.len() < 600, "{what}: the log line is bounded too");
            } else {
                assert_eq!(sent, given, "{what}: kept as it came");
                assert!(logged.is_empty(), "{logged}");
            }
        }
    }

    #[test]
    fn client_addresses_are_written_as_display_writes_them() {
        for addr in [
            "127.0.0.1:8080",
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "[::1]:443",
            "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff%4294967295]:65535",
        ] {
            let a: std::net::SocketAddr = addr.parse().unwrap();
            let mut buf = [0u8; 64];
            assert_eq!(socket_addr(&a, &mut buf), a.to_string());
        }
    }

    #[test]
    fn timestamps_are_utc_rfc3339_with_microseconds() {
        for (micros, want) in [
            (0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400_000_001, "2000-02-29T00:00:00.000001Z"),
            (1_764_532_877_025_766, "2025-11-30T20:01:17.025766Z"),
            (4_102_444_799_999_999, "2099-12-31T23:59:59.999999Z"),
            // Past year 9999 (humantime's last), the last second it can write.
            (u64::MAX, "9999-12-31T23:59:59.551615Z"),
        ] {
            let mut out = Vec::new();
            timestamp(
                &mut out,
                SystemTime::UNIX_EPOCH + Duration::from_micros(micros),
            );
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }

    /// Lines the process-wide sink received (this test binary installs one that keeps them).
    fn sunk() -> String {
        static LINES: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
        let lines = LINES.get_or_init(|| {
            let lines = Arc::new(Mutex::new(Vec::new()));
            let l = lines.clone();
            assert!(install(move |b| l.lock().unwrap().extend_from_slice(b)));
            lines
        });
        String::from_utf8(lines.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_holding_thread_hands_lines_over_when_flushed_or_full() {
        sunk();
        std::thread::spawn(|| {
            hold_lines_on_this_thread();
            let id = new_request_id();
            let mut req = request(Some(id.to_str().unwrap()), "/v1/chat/completions");
            let e = sample(&mut req, LogFormat::Text);
            e.write(&outcome());
            let id = id.to_str().unwrap();
            assert!(!sunk().contains(id), "held until flushed");
            flush_this_thread();
            assert_eq!(sunk().matches(id).count(), 1);
            // Enough lines to fill a batch go over without a flush.
            let n = BATCH_BYTES / rendered(&e, &outcome()).len() + 1;
            for _ in 0..n {
                e.write(&outcome());
            }
            assert!(sunk().matches(id).count() > 1);
        })
        .join()
        .unwrap();
        // A thread that does not hold lines writes each at once.
        let id = new_request_id();
        let mut req = request(Some(id.to_str().unwrap()), "/v1/chat/completions");
        sample(&mut req, LogFormat::Json).write(&outcome());
        assert!(sunk().contains(id.to_str().unwrap()));
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
