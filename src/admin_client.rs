//! kvbust's reach into a running kvbust's admin port, for `kvbust report` and `kvbust run`: `GET
//! /report`, `GET /runs`, `GET /runs/NAME`, `GET /config`, `POST /runs` and `POST
//! /runs/NAME/close`, each answer read whole (bounded) and parsed. The edge of the report: never
//! renders it, never calls anything else, sends the admin token only on the mutating calls. Also
//! reads a saved run file's bytes as the same report.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde::Serialize;

use crate::report::{Report, RunSummary, RUN_FILE_SCHEMA, SCHEMA};

/// The largest answer read: a report is a few rows and a few hundred buckets, far below this.
const MAX_BODY: usize = 32 << 20;

/// Where the report is: the URL shown in messages, and the address to dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportUrl {
    uri: Uri,
    /// `host:port` to connect to.
    dial: String,
}

impl std::fmt::Display for ReportUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.uri, f)
    }
}

impl ReportUrl {
    /// The report of the admin port `admin`, given as `http://host:port[/prefix]` or
    /// `host:port`; a URL already ending in `/report` is taken as it is. `Err` says what is wrong
    /// (for `--admin`).
    pub fn parse(admin: &str) -> Result<ReportUrl, String> {
        let admin = admin.trim();
        let full = if admin.contains("://") {
            admin.to_string()
        } else {
            format!("http://{admin}")
        };
        let uri: Uri = full
            .parse()
            .map_err(|e| format!("`{admin}` is not a URL ({e}); e.g. http://127.0.0.1:9090"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(format!(
                    "`{admin}`: the admin port serves plain HTTP; use http://"
                ))
            }
            _ => return Err(format!("`{admin}`: only http:// URLs reach the admin port")),
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("`{admin}` names no host; e.g. http://127.0.0.1:9090"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "`{admin}`: no user in the URL (reading the report needs no token)"
            ));
        }
        if uri.query().is_some() {
            return Err(format!("`{admin}`: no query string, please"));
        }
        let dial = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        );
        let base = uri.path().trim_end_matches('/');
        let path = if base.ends_with("/report") {
            base.to_string()
        } else {
            format!("{base}/report")
        };
        let uri = Uri::builder()
            .scheme("http")
            .authority(authority.as_str())
            .path_and_query(path)
            .build()
            .map_err(|e| format!("`{admin}`: {e}"))?;
        Ok(ReportUrl { uri, dial })
    }

    /// The same report, asked to wait up to `wait` for requests still open (in flight, or
    /// queued for the cache model) to be counted first (`GET /report?wait=`): a report taken
    /// the moment a benchmark ends then has all of it.
    pub fn waiting(&self, wait: Duration) -> ReportUrl {
        let path = format!("{}?wait={}ms", self.uri.path(), wait.as_millis());
        let mut parts = self.uri.clone().into_parts();
        parts.path_and_query = path.parse().ok();
        ReportUrl {
            uri: Uri::from_parts(parts).unwrap_or_else(|_| self.uri.clone()),
            dial: self.dial.clone(),
        }
    }

    /// The report of an admin port listening on `addr` (a wildcard address is reached on
    /// loopback, as `kvbust healthcheck` does).
    pub fn of_listener(addr: SocketAddr) -> ReportUrl {
        let addr = crate::healthcheck::probe_addr(addr);
        // A socket address is always a valid URL authority.
        Self::parse(&format!("http://{addr}")).unwrap_or_else(|_| ReportUrl {
            uri: Uri::from_static("http://127.0.0.1/report"),
            dial: addr.to_string(),
        })
    }
}

/// The admin port's root, as a [`ReportUrl`] names it: where `/runs` and `/config` hang from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// `host:port` as the URL gave it (the `Host` header).
    authority: String,
    /// The path prefix before `/report`, `/runs` (empty at the root; never ends in `/`).
    base: String,
    /// `host:port` to connect to.
    dial: String,
}

impl ReportUrl {
    /// The admin port this report is read from.
    pub fn admin(&self) -> Admin {
        let path = self.uri.path();
        let base = path.strip_suffix("/report").unwrap_or(path);
        Admin {
            authority: self.uri.authority().map_or("", |a| a.as_str()).to_string(),
            base: base.trim_end_matches('/').to_string(),
            dial: self.dial.clone(),
        }
    }
}

impl Admin {
    /// The URL of `path` (which starts with `/`) on this admin port.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}{path}", self.authority, self.base)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot connect to {url}: {source} (is kvbust running, and is --admin or admin.addr right?)")]
    Connect { url: String, source: std::io::Error },
    #[error("{call}: {source}")]
    Http { call: String, source: hyper::Error },
    #[error("{call}: no answer within {after:?} (raise --timeout?)")]
    Timeout { call: String, after: Duration },
    #[error("{call}: the answer is over {} MiB, not a kvbust answer", MAX_BODY >> 20)]
    TooLarge { call: String },
    #[error("{call} answered {status}{hint}: {body}")]
    Status {
        call: String,
        status: StatusCode,
        hint: String,
        body: String,
    },
    #[error("{call}: the answer is not a kvbust {what} ({reason}); is this kvbust's admin port?")]
    NotReport {
        call: String,
        what: &'static str,
        reason: String,
    },
    #[error("{call}: report schema {got}, but this kvbust reads schema {want}: use the kvbust version that served it", want = SCHEMA)]
    Schema { call: String, got: u64 },
}

/// A report as the admin port answered it: parsed, and its JSON text as sent.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub report: Report,
    pub json: String,
}

/// `GET url`, within `timeout` overall, parsed as a report of this kvbust's schema.
pub async fn fetch(url: &ReportUrl, timeout: Duration) -> Result<Fetched, FetchError> {
    let admin = url.admin();
    // The path as asked (`/report?wait=...`), below the admin port's prefix.
    let path = url
        .uri
        .path_and_query()
        .map_or("/report", |p| p.as_str())
        .strip_prefix(admin.base.as_str())
        .unwrap_or("/report")
        .to_string();
    let (call, body) = admin.call(Method::GET, &path, None, None, timeout).await?;
    report_of(call, &body)
}

/// What `POST /runs` carries: every field optional (the server's defaults stand).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OpenRun {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_requests: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reset_upstream_cache: bool,
}

impl Admin {
    /// `GET /runs`: every run the port holds. Taken as a JSON array, or an object whose `runs`
    /// is one.
    pub async fn runs(&self, timeout: Duration) -> Result<Vec<RunSummary>, FetchError> {
        let (call, body) = self.call(Method::GET, "/runs", None, None, timeout).await?;
        let invalid = |reason: String| FetchError::NotReport {
            call: call.clone(),
            what: "run list",
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let list = match value {
            serde_json::Value::Object(mut o) => o.remove("runs").unwrap_or_default(),
            v => v,
        };
        serde_json::from_value(list).map_err(|e| invalid(e.to_string()))
    }

    /// `GET /runs/NAME`: that run's report.
    pub async fn run_report(&self, name: &str, timeout: Duration) -> Result<Fetched, FetchError> {
        let (call, body) = self
            .call(Method::GET, &format!("/runs/{name}"), None, None, timeout)
            .await?;
        report_of(call, &body)
    }

    /// `POST /runs`: closes the current run and opens `open`. The answer (the closed run's
    /// report) is not read: a run `kvbust run` opens is judged by its own report.
    pub async fn open_run(
        &self,
        open: &OpenRun,
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<(), FetchError> {
        // Strings and numbers only: serde_json cannot fail on it.
        let body = serde_json::to_vec(open).unwrap_or_default();
        self.call(Method::POST, "/runs", Some(body), token, timeout)
            .await
            .map(drop)
    }

    /// `POST /runs/NAME/close`: the run's final report.
    pub async fn close_run(
        &self,
        name: &str,
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<Fetched, FetchError> {
        let path = format!("/runs/{name}/close");
        let (call, body) = self
            .call(Method::POST, &path, Some(Vec::new()), token, timeout)
            .await?;
        report_of(call, &body)
    }

    /// `GET /config`: the effective configuration as the port shows it (secrets redacted).
    pub async fn config(&self, timeout: Duration) -> Result<Bytes, FetchError> {
        self.call(Method::GET, "/config", None, None, timeout)
            .await
            .map(|(_, body)| body)
    }

    /// One call within `timeout`; its name (`GET http://...`) and the body of a 2xx answer.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<(String, Bytes), FetchError> {
        let call = format!("{method} {}", self.url(path));
        let (status, answer) =
            tokio::time::timeout(timeout, self.send(&call, method.clone(), path, body, token))
                .await
                .map_err(|_| FetchError::Timeout {
                    call: call.clone(),
                    after: timeout,
                })??;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&answer);
            return Err(FetchError::Status {
                hint: status_hint(status, &method, path),
                call,
                status,
                body: text.trim().chars().take(300).collect(),
            });
        }
        Ok((call, answer))
    }

    /// One HTTP/1.1 request; the status and the whole body.
    async fn send(
        &self,
        call: &str,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        token: Option<&str>,
    ) -> Result<(StatusCode, Bytes), FetchError> {
        let http = |source| FetchError::Http {
            call: call.to_string(),
            source,
        };
        let stream = tokio::net::TcpStream::connect(self.dial.as_str())
            .await
            .map_err(|source| FetchError::Connect {
                url: self.url(path),
                source,
            })?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        // The connection runs beside the request; it ends when the response body has been read.
        let conn = tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(header::HOST, self.authority.as_str())
            .header(header::USER_AGENT, "kvbust-admin-client")
            .header(header::ACCEPT, "application/json");
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(token) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| FetchError::NotReport {
                call: call.to_string(),
                what: "answer",
                reason: format!("cannot build the request: {e}"),
            })?;
        let resp = send.send_request(req).await.map_err(http)?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(e) => http(*e),
                Err(_) => FetchError::TooLarge {
                    call: call.to_string(),
                },
            })?
            .to_bytes();
        conn.abort();
        Ok((status, body))
    }
}

/// What an error status most likely means, for the message.
fn status_hint(status: StatusCode, method: &Method, path: &str) -> String {
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            " (the admin port wants its token: set admin.token, or KVBUST_ADMIN__TOKEN, to the server's)".into()
        }
        StatusCode::NOT_FOUND if path.starts_with("/runs/") => {
            " (no run of that name is held; `kvbust report --runs` lists those that are)".into()
        }
        StatusCode::NOT_FOUND => {
            let path = path.split('?').next().unwrap_or(path);
            format!(" (not kvbust's admin port, or a kvbust without {method} {path})")
        }
        _ => String::new(),
    }
}

/// A 2xx body as a report of this kvbust's schema.
fn report_of(call: String, body: &[u8]) -> Result<Fetched, FetchError> {
    let report = parse(body).map_err(|e| match e {
        Parsed::Schema(got) => FetchError::Schema {
            call: call.clone(),
            got,
        },
        Parsed::Invalid(reason) => FetchError::NotReport {
            call: call.clone(),
            what: "report",
            reason,
        },
    })?;
    // Valid JSON is valid UTF-8.
    let json = String::from_utf8_lossy(body).into_owned();
    Ok(Fetched { report, json })
}

/// A saved run as `kvbust report FILE` reads it: a run file (`{"kvbust_run": 1, ...,
/// "report": ...}`) or a bare report (`GET /report`'s answer saved as it came). `Err` says why
/// it is neither.
pub fn read_run_file(bytes: &[u8]) -> Result<Report, String> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON ({e}), not a run file"))?;
    let report = match value.get("kvbust_run") {
        None => value,
        Some(v) if v.as_u64() == Some(u64::from(RUN_FILE_SCHEMA)) => value
            .get("report")
            .cloned()
            .ok_or("a run file without its `report`")?,
        Some(v) => {
            return Err(format!(
                "run file schema {v}, but this kvbust reads {RUN_FILE_SCHEMA}: use the kvbust version that wrote it"
            ))
        }
    };
    // Checked as an answer of the admin port is: its schema first.
    parse_value(report).map_err(|e| match e {
        Parsed::Schema(got) => format!(
            "report schema {got}, but this kvbust reads schema {SCHEMA}: use the kvbust version that wrote it"
        ),
        Parsed::Invalid(reason) => format!("not a kvbust run file: {reason}"),
    })
}

enum Parsed {
    Schema(u64),
    Invalid(String),
}

/// The body as a report: its schema read first, so a report of another version says so rather
/// than failing on a field.
fn parse(body: &[u8]) -> Result<Report, Parsed> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        let start: String = String::from_utf8_lossy(body).chars().take(60).collect();
        Parsed::Invalid(format!("not JSON: {e}; it starts `{}`", start.trim()))
    })?;
    parse_value(value)
}

/// A JSON value as a report, its schema read first.
fn parse_value(value: serde_json::Value) -> Result<Report, Parsed> {
    let schema = value
        .get("schema")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| Parsed::Invalid("no `schema` number".into()))?;
    if schema != u64::from(SCHEMA) {
        return Err(Parsed::Schema(schema));
    }
    serde_json::from_value(value).map_err(|e| Parsed::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_urls() {
        let p = |s: &str| ReportUrl::parse(s).map(|u| (u.to_string(), u.dial));
        let ok = |url: &str, dial: &str| Ok((url.to_string(), dial.to_string()));
        assert_eq!(
            p("http://127.0.0.1:9090"),
            ok("http://127.0.0.1:9090/report", "127.0.0.1:9090")
        );
        assert_eq!(
            p("127.0.0.1:9090/"),
            ok("http://127.0.0.1:9090/report", "127.0.0.1:9090")
        );
        assert_eq!(
            p("http://[::1]:9090"),
            ok("http://[::1]:9090/report", "[::1]:9090")
        );
        assert_eq!(
            p("http://kvbust:9090/report"),
            ok("http://kvbust:9090/report", "kvbust:9090")
        );
        assert_eq!(
            p("http://gw/kvbust/"),
            ok("http://gw/kvbust/report", "gw:80")
        );
        for bad in [
            "https://h:1",
            "ftp://h:1",
            "http://u:p@h:1",
            "http://h:1/?x=1",
            "http://",
        ] {
            assert!(ReportUrl::parse(bad).is_err(), "{bad}");
        }
        assert!(ReportUrl::parse("https://h:1")
            .unwrap_err()
            .contains("plain HTTP"));
        let l = ReportUrl::of_listener("0.0.0.0:9090".parse().unwrap());
        assert_eq!(l.to_string(), "http://127.0.0.1:9090/report");
        let l = ReportUrl::of_listener("[::]:9090".parse().unwrap());
        assert_eq!(l.to_string(), "http://[::1]:9090/report");
    }

    #[test]
    fn answers_that_are_not_a_report() {
        let invalid = |b: &[u8]| match parse(b) {
            Err(Parsed::Invalid(why)) => why,
            _ => panic!("accepted {}", String::from_utf8_lossy(b)),
        };
        assert!(invalid(b"<html>hello</html>").contains("not JSON"));
        assert!(invalid(b"{\"status\":\"ok\"}").contains("schema"));
        assert!(invalid(b"{\"schema\":2}").contains("missing field"));
        assert!(matches!(parse(b"{\"schema\":1}"), Err(Parsed::Schema(1))));
        let good = serde_json::to_vec(&crate::report::render::fixtures::one_phase()).unwrap();
        assert!(parse(&good).is_ok());
    }

    #[test]
    fn run_files_and_bare_reports_read_back() {
        let r = crate::report::render::fixtures::two_phases();
        let file = crate::report::RunFile {
            kvbust_run: RUN_FILE_SCHEMA,
            config_digest: "00".repeat(32),
            report: r.clone(),
        };
        let back = |v: &[u8]| read_run_file(v);
        // The figures as a reader of the JSON text gets them (floats parsed once).
        let text = serde_json::to_vec(&r).unwrap();
        let r: crate::report::Report = serde_json::from_slice(&text).unwrap();
        assert_eq!(back(&serde_json::to_vec(&file).unwrap()), Ok(r.clone()));
        assert_eq!(back(&text), Ok(r));
        assert!(back(b"{\"kvbust_run\":2}")
            .unwrap_err()
            .contains("run file schema 2"));
        assert!(back(b"{\"kvbust_run\":1}")
            .unwrap_err()
            .contains("without its `report`"));
        assert!(back(b"{\"kvbust_run\":1,\"report\":{\"schema\":1}}")
            .unwrap_err()
            .contains("report schema 1"));
        assert!(back(b"[1,2]")
            .unwrap_err()
            .contains("not a kvbust run file"));
        assert!(back(b"nope").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn admin_paths_keep_the_prefix() {
        let a = ReportUrl::parse("http://gw:8/kvbust/").unwrap().admin();
        assert_eq!(a.url("/runs/c8/close"), "http://gw:8/kvbust/runs/c8/close");
        let a = ReportUrl::parse("127.0.0.1:9090").unwrap().admin();
        assert_eq!(a.url("/runs"), "http://127.0.0.1:9090/runs");
        assert_eq!(
            status_hint(StatusCode::NOT_FOUND, &Method::GET, "/runs/x"),
            " (no run of that name is held; `kvbust report --runs` lists those that are)"
        );
        assert!(
            status_hint(StatusCode::UNAUTHORIZED, &Method::POST, "/runs")
                .contains("KVBUST_ADMIN__TOKEN")
        );
        let open = OpenRun {
            name: Some("c8".into()),
            ..OpenRun::default()
        };
        assert_eq!(serde_json::to_string(&open).unwrap(), "{\"name\":\"c8\"}");
    }
}
