//! The pooled upstream client (TLS and HTTP/2 upstreams; plain HTTP/1.1 goes through
//! [`super::pool`]): where requests go (`Upstream`, its `upstream.authority` override and URI
//! joining), TLS set-up, and classifying transport errors. Never inspects bodies; a forwarded
//! request's headers are [`super::headers`].

use std::sync::Arc;

use http::header::HeaderValue;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::Uri;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::body::Body;
use crate::config::{Http2Mode, RootStore, UpstreamConfig, UpstreamUrl};
use crate::error::{causes, error_chain, ProxyError};

pub type UpstreamClient = Client<Dial, Body>;

/// The pooled client's connector: always dials the upstream URL's own scheme and address,
/// whatever authority a request names. `upstream.authority` then changes only what requests
/// say (`Host`, `:authority`, the pool key), while TLS still sees the URL's host, so SNI and the
/// certificate check stay `upstream.tls.server_name` or the URL's host.
#[derive(Clone)]
pub struct Dial {
    inner: HttpsConnector<HttpConnector>,
    to: Uri,
}

impl tower_service::Service<Uri> for Dial {
    type Response = <HttpsConnector<HttpConnector> as tower_service::Service<Uri>>::Response;
    type Error = <HttpsConnector<HttpConnector> as tower_service::Service<Uri>>::Error;
    type Future = <HttpsConnector<HttpConnector> as tower_service::Service<Uri>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, _requested: Uri) -> Self::Future {
        // Every request of this client goes to the one upstream (see `Upstream::join`).
        self.inner.call(self.to.clone())
    }
}

impl Upstream {
    /// Whether requests go over kvbust's own HTTP/1.1 connections ([`super::pool`]): a
    /// plain-http upstream not forced to HTTP/2.
    pub fn is_direct(&self, mode: Http2Mode) -> bool {
        self.scheme == Scheme::HTTP && mode != Http2Mode::Always
    }

    /// The request target for a direct HTTP/1.1 connection: origin form (path and query).
    pub fn origin_form(&self, pq: Option<&PathAndQuery>) -> Result<Uri, ProxyError> {
        Ok(Uri::from(self.path_and_query(pq)?))
    }
}

/// Where requests go: the upstream's scheme and authority plus an optional base path.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub scheme: Scheme,
    /// The address connections are made to (the URL's authority).
    pub authority: Authority,
    /// What requests name as their host (`Host` in HTTP/1.1, `:authority` in HTTP/2): the
    /// URL's authority, or `upstream.authority` when set (see [`Upstream::with_authority`]).
    pub request_authority: Authority,
    /// Without a trailing slash; empty for a bare host.
    pub base_path: String,
    pub display: String,
    /// `Host` for origin-form requests: the authority without any user-info (a password in the
    /// URL must never reach the upstream as part of `Host`).
    pub host_header: HeaderValue,
}

type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why the upstream client could not be set up at start. Each names the key to fix and keeps
/// its cause (`config::validate` has already checked the URL, so these are rare).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamSetupError {
    /// `url` is shown with any password redacted.
    #[error("upstream.url `{url}` {problem}")]
    Url {
        url: String,
        problem: &'static str,
        #[source]
        source: Option<Cause>,
    },
    #[error("upstream.authority `{value}` is not a valid host[:port]")]
    Authority {
        value: String,
        #[source]
        source: Cause,
    },
    #[error(transparent)]
    TlsFile(#[from] crate::tls::TlsError),
    #[error("{key}: {problem}")]
    Tls {
        key: &'static str,
        problem: &'static str,
        #[source]
        source: Option<rustls::Error>,
    },
}

impl Upstream {
    /// The upstream of a URL parsed at config validation.
    pub fn from_url(url: &UpstreamUrl) -> Result<Self, UpstreamSetupError> {
        // Requests name the host without user-info too: HTTP/2 sends the URI's authority as
        // `:authority` verbatim.
        let host_header =
            HeaderValue::from_str(url.host().as_str()).map_err(|e| UpstreamSetupError::Url {
                url: url.display().to_string(),
                problem: "has an invalid host",
                source: Some(Box::new(e)),
            })?;
        Ok(Self {
            host_header,
            scheme: url.scheme().clone(),
            request_authority: url.host().clone(),
            authority: url.authority().clone(),
            base_path: url.base_path().to_string(),
            display: url.display().to_string(),
        })
    }

    /// Sends `Host` / `:authority` as `authority` (`upstream.authority`) instead of the URL's,
    /// while connections still go to the URL's address. `None` keeps the URL's.
    pub fn with_authority(mut self, authority: Option<&str>) -> Result<Self, UpstreamSetupError> {
        if let Some(a) = authority {
            let invalid = |source: Cause| UpstreamSetupError::Authority {
                value: a.to_string(),
                source,
            };
            self.request_authority = a
                .parse()
                .map_err(|e: http::uri::InvalidUri| invalid(Box::new(e)))?;
            self.host_header = HeaderValue::from_str(a).map_err(|e| invalid(Box::new(e)))?;
        }
        Ok(self)
    }

    /// The upstream URI for a client request's path and query. Its authority is the request
    /// authority; the client's [`Dial`] connects to the URL's address whatever it says.
    pub fn join(&self, pq: Option<&PathAndQuery>) -> Result<Uri, ProxyError> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.request_authority.clone())
            .path_and_query(self.path_and_query(pq)?)
            .build()
            .map_err(invalid_target)
    }

    /// The client's path and query under the base path. Without a base path the client's own
    /// (shared, already parsed) value is reused rather than copied and parsed again.
    fn path_and_query(&self, pq: Option<&PathAndQuery>) -> Result<PathAndQuery, ProxyError> {
        match (pq, self.base_path.is_empty()) {
            (Some(pq), true) => Ok(pq.clone()),
            (None, true) => Ok(PathAndQuery::from_static("/")),
            (pq, false) => {
                let pq = pq.map(|p| p.as_str()).unwrap_or("/");
                PathAndQuery::try_from(format!("{}{}", self.base_path, pq)).map_err(invalid_target)
            }
        }
    }
}

impl Upstream {
    /// The URL's scheme and address, as the connector wants them.
    fn dial_uri(&self) -> Uri {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(PathAndQuery::from_static("/"));
        // Scheme, authority and path all come from a parsed URI, so the parts are complete.
        Uri::from_parts(parts).unwrap_or_default()
    }
}

fn invalid_target(e: impl std::fmt::Display) -> ProxyError {
    ProxyError::bad_request(
        "invalid_uri",
        format!("request target cannot be forwarded: {e}"),
    )
}

/// Builds one worker's pooled client for `upstream`: keep-alive, HTTP/2 by ALPN (or prior
/// knowledge when configured). `tls` comes from [`tls_config`], checked once at start.
pub fn build_client(
    cfg: &UpstreamConfig,
    tls: Arc<rustls::ClientConfig>,
    upstream: &Upstream,
) -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(cfg.connect_timeout));
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((*tls).clone())
        .https_or_http();
    // `validate` checked that the name parses; an unparsable one would keep the URL's host.
    if let Some(Ok(name)) = cfg
        .tls
        .server_name
        .as_ref()
        .map(|n| rustls::pki_types::ServerName::try_from(n.clone()))
    {
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let inner = match cfg.http2 {
        Http2Mode::Auto => builder.enable_all_versions().wrap_connector(http),
        Http2Mode::Always => builder.enable_http2().wrap_connector(http),
        Http2Mode::Never => builder.enable_http1().wrap_connector(http),
    };
    let connector = Dial {
        inner,
        to: upstream.dial_uri(),
    };
    let mut b = Client::builder(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(cfg.pool_idle_timeout)
        .pool_max_idle_per_host(cfg.pool_max_idle_per_host)
        .http2_only(cfg.http2 == Http2Mode::Always)
        .http2_adaptive_window(true)
        .http2_keep_alive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keep_alive_while_idle(false);
    b.build(connector)
}

/// The upstream TLS settings; every error names the key to fix.
pub fn tls_config(cfg: &UpstreamConfig) -> Result<rustls::ClientConfig, UpstreamSetupError> {
    let provider = crate::tls::provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| UpstreamSetupError::Tls {
            key: "upstream.tls",
            problem: "no usable protocol version",
            source: Some(e),
        })?;
    // A client certificate for upstreams that require one (mTLS).
    let identity = match (&cfg.tls.client_cert, &cfg.tls.client_key) {
        (Some(cert), Some(key)) => Some((
            crate::tls::load_certs("upstream.tls.client_cert", cert)?,
            crate::tls::load_key("upstream.tls.client_key", key)?,
        )),
        _ => None,
    };
    let finish =
        |b: rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>| {
            match identity {
                Some((chain, key)) => {
                    b.with_client_auth_cert(chain, key)
                        .map_err(|e| UpstreamSetupError::Tls {
                            key: "upstream.tls.client_key",
                            problem: "does not match upstream.tls.client_cert",
                            source: Some(e),
                        })
                }
                None => Ok(b.with_no_client_auth()),
            }
        };
    if cfg.tls.insecure_skip_verify {
        tracing::warn!(
            "upstream.tls.insecure_skip_verify is ON: the upstream's certificate is NOT verified; \
             anyone on the path can read and change traffic. Use upstream.tls.ca_file instead."
        );
        return finish(
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider))),
        );
    }
    let mut roots = rustls::RootCertStore::empty();
    match cfg.tls.roots {
        RootStore::Webpki => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        RootStore::Native => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!("upstream.tls.roots=native: {e}");
            }
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 && cfg.tls.ca_file.is_none() {
                return Err(UpstreamSetupError::Tls {
                    key: "upstream.tls.roots",
                    problem: "\"native\" found no usable system certificates; use roots = \"webpki\" or set upstream.tls.ca_file",
                    source: None,
                });
            }
        }
    }
    if let Some(path) = &cfg.tls.ca_file {
        let extra = crate::tls::load_roots("upstream.tls.ca_file", path)?;
        roots.roots.extend(extra.roots);
    }
    finish(builder.with_root_certificates(roots))
}

/// Accepts any certificate; only reachable through `insecure_skip_verify`.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Turns a client error into the proxy error the user sees (502 or 504).
pub fn classify(
    err: hyper_util::client::legacy::Error,
    upstream: &Upstream,
    connect_timeout: std::time::Duration,
) -> ProxyError {
    if let Some(client) = crate::conn::client_fault_in(&err) {
        return client;
    }
    let detail = with_tls_hint(&err);
    if err.is_connect() {
        if is_timeout(&err) {
            return ProxyError::UpstreamTimeout {
                stage: "accept the connection",
                after: connect_timeout,
            };
        }
        return ProxyError::UpstreamConnect {
            upstream: upstream.display.clone(),
            detail,
        };
    }
    ProxyError::UpstreamBroken(detail)
}

/// `err`'s cause chain, followed by the fix when a TLS handshake failed in a way kvbust knows.
pub fn with_tls_hint(err: &(dyn std::error::Error + 'static)) -> String {
    let chain = error_chain(err);
    match tls_hint(err) {
        Some(hint) => format!("{chain} ({hint})"),
        None => chain,
    }
}

/// What to change when a TLS handshake with the upstream failed: a plain-HTTP server behind an
/// `https://` URL, or a certificate the trusted roots do not vouch for.
pub fn tls_hint(err: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    use rustls::{CertificateError, Error, InvalidMessage};
    match find_rustls(err)? {
        Error::InvalidMessage(InvalidMessage::InvalidContentType) => {
            Some("the upstream does not speak TLS: use http:// in upstream.url")
        }
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => Some(
            "the upstream's certificate is signed by an issuer kvbust does not trust: set \
             upstream.tls.ca_file to the PEM of the CA that signed it",
        ),
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => Some(
            "the upstream's certificate does not name the host in upstream.url: set \
             upstream.tls.server_name to a name the certificate holds",
        ),
        _ => None,
    }
}

/// The rustls error among `err`'s causes. tokio-rustls hands it inside an io::Error (perhaps
/// wrapped in another), whose `source` skips the error it holds: those are opened too.
fn find_rustls<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    causes(err).find_map(|e| {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        let inner = e.downcast_ref::<std::io::Error>()?.get_ref()?;
        find_rustls(inner)
    })
}

/// Whether `err` or any error it wraps is an I/O timeout (the connector's connect timeout).
fn is_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    causes(err).any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    })
}

/// An exchange that failed after the request was handed to the upstream connection: the
/// client's body stalling, misframed or cut short is the client's fault, anything else the
/// upstream's.
pub(super) fn broken(err: &hyper::Error) -> ProxyError {
    crate::conn::client_fault_in(err)
        .unwrap_or_else(|| ProxyError::UpstreamBroken(error_chain(err)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The upstream of `url`, parsed as config validation does.
    fn upstream(url: &str) -> Upstream {
        Upstream::from_url(&UpstreamUrl::parse(url).unwrap()).unwrap()
    }

    #[test]
    fn joins_paths_with_and_without_base() {
        let u = upstream("http://10.0.0.1:8000");
        let pq: PathAndQuery = "/v1/chat/completions?x=1".parse().unwrap();
        assert_eq!(
            u.join(Some(&pq)).unwrap().to_string(),
            "http://10.0.0.1:8000/v1/chat/completions?x=1"
        );
        let u = upstream("https://h/prefix/");
        assert_eq!(
            u.join(Some(&pq)).unwrap().to_string(),
            "https://h/prefix/v1/chat/completions?x=1"
        );
        assert_eq!(u.join(None).unwrap().to_string(), "https://h/prefix/");
    }

    #[test]
    fn an_authority_override_changes_the_request_uri_not_the_dialled_address() {
        let pq: PathAndQuery = "/v1/models".parse().unwrap();
        let u = upstream("https://10.0.0.1:8443/prefix")
            .with_authority(Some("model.example:9000"))
            .unwrap();
        assert_eq!(
            u.join(Some(&pq)).unwrap().to_string(),
            "https://model.example:9000/prefix/v1/models"
        );
        assert_eq!(u.dial_uri().to_string(), "https://10.0.0.1:8443/");
        assert_eq!(u.host_header, "model.example:9000");
        let plain = upstream("http://h:1").with_authority(None).unwrap();
        assert_eq!(plain.request_authority, plain.authority);
        // A password in the URL never reaches the upstream, as Host or as :authority.
        let secret = upstream("http://u:s3cret@h:1");
        assert_eq!(secret.request_authority, "h:1");
        assert_eq!(secret.host_header, "h:1");
        assert_eq!(secret.join(None).unwrap().to_string(), "http://h:1/");
        assert!(upstream("http://h:1")
            .with_authority(Some("bad host"))
            .is_err());
    }
}
