//! `kvbust report`'s reach into a running kvbust: one `GET {admin}/report` on the admin port, its
//! answer read whole (bounded) and parsed as a [`Report`]. The edge of the report: never renders
//! it, never sends anything but that one request (reading the report needs no admin token).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

use crate::report::{Report, SCHEMA};

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

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot connect to {url}: {source} (is kvbust running, and is --admin or admin.addr right?)")]
    Connect { url: String, source: std::io::Error },
    #[error("GET {url}: {source}")]
    Http { url: String, source: hyper::Error },
    #[error("GET {url}: no answer within {after:?} (raise --timeout?)")]
    Timeout { url: String, after: Duration },
    #[error("GET {url}: the answer is over {} MiB, not a kvbust report", MAX_BODY >> 20)]
    TooLarge { url: String },
    #[error("GET {url} answered {status}{hint}: {body}")]
    Status {
        url: String,
        status: StatusCode,
        hint: &'static str,
        body: String,
    },
    #[error(
        "GET {url}: the answer is not a kvbust report ({reason}); is this kvbust's admin port?"
    )]
    NotReport { url: String, reason: String },
    #[error("GET {url}: report schema {got}, but this kvbust reads schema {want}: use the kvbust version that served it", want = SCHEMA)]
    Schema { url: String, got: u64 },
}

/// What `GET /report` answered: the report, and its JSON text as sent.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub report: Report,
    pub json: String,
}

/// `GET url`, within `timeout` overall, parsed as a report of this kvbust's schema.
pub async fn fetch(url: &ReportUrl, timeout: Duration) -> Result<Fetched, FetchError> {
    let shown = url.to_string();
    let (status, body) = tokio::time::timeout(timeout, get(url))
        .await
        .map_err(|_| FetchError::Timeout {
            url: shown.clone(),
            after: timeout,
        })??;
    if status != StatusCode::OK {
        let text = String::from_utf8_lossy(&body);
        return Err(FetchError::Status {
            url: shown,
            status,
            hint: if status == StatusCode::NOT_FOUND {
                " (not kvbust's admin port, or a kvbust without GET /report)"
            } else {
                ""
            },
            body: text.trim().chars().take(300).collect(),
        });
    }
    let report = parse(&body).map_err(|e| match e {
        Parsed::Schema(got) => FetchError::Schema { url: shown, got },
        Parsed::Invalid(reason) => FetchError::NotReport { url: shown, reason },
    })?;
    // Valid JSON is valid UTF-8.
    let json = String::from_utf8_lossy(&body).into_owned();
    Ok(Fetched { report, json })
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
    let schema = value
        .get("schema")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| Parsed::Invalid("no `schema` number".into()))?;
    if schema != u64::from(SCHEMA) {
        return Err(Parsed::Schema(schema));
    }
    serde_json::from_value(value).map_err(|e| Parsed::Invalid(e.to_string()))
}

/// One HTTP/1.1 GET; the status and the whole body.
async fn get(url: &ReportUrl) -> Result<(StatusCode, Bytes), FetchError> {
    let shown = url.to_string();
    let http = |source| FetchError::Http {
        url: shown.clone(),
        source,
    };
    let stream = tokio::net::TcpStream::connect(url.dial.as_str())
        .await
        .map_err(|source| FetchError::Connect {
            url: shown.clone(),
            source,
        })?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    // The connection runs beside the request; it ends when the response body has been read.
    let conn = tokio::spawn(conn);
    let host = url.uri.authority().map_or("", |a| a.as_str()).to_string();
    let path = url
        .uri
        .path_and_query()
        .map_or("/report", |p| p.as_str())
        .to_string();
    let req = Request::get(path)
        .header(header::HOST, host)
        .header(header::USER_AGENT, "kvbust-report")
        .header(header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| FetchError::NotReport {
            url: shown.clone(),
            reason: format!("cannot build the request: {e}"),
        })?;
    let resp = send.send_request(req).await.map_err(http)?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| match e.downcast::<hyper::Error>() {
            Ok(e) => http(*e),
            Err(_) => FetchError::TooLarge { url: shown.clone() },
        })?
        .to_bytes();
    conn.abort();
    Ok((status, body))
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
}
