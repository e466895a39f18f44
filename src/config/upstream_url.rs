//! `upstream.url` as a typed value: parsed and checked once, at config validation, into the
//! scheme, the address connections go to, the host requests name and the base path. Owns the
//! URL's syntax rules and the `/v1` base-path trap; never opens a connection.

use http::uri::{Authority, Scheme};
use http::Uri;

use super::{redact_url, ConfigError};

const KEY: &str = "upstream.url";

/// A checked `upstream.url`: `http` or `https`, with a host, without a query string.
#[derive(Debug, Clone)]
pub struct UpstreamUrl {
    scheme: Scheme,
    /// The authority as written (with any user-info): the address connections are made to.
    authority: Authority,
    /// The authority without user-info: what requests name as their host.
    host: Authority,
    /// Without a trailing slash; empty for a bare host.
    base_path: String,
    /// The URL as written, without a trailing slash and with any password redacted.
    display: String,
}

impl UpstreamUrl {
    /// Parses `url`; errors name `upstream.url`, say how to fix it and never repeat a password
    /// given in the URL.
    pub fn parse(url: &str) -> Result<Self, ConfigError> {
        let shown = redact_url(url);
        let uri: Uri = url.parse().map_err(|e| {
            ConfigError::new(
                KEY,
                format!("`{shown}` is not a URL ({e}); write e.g. http://127.0.0.1:8000"),
            )
        })?;
        let scheme = match uri.scheme() {
            Some(s) if matches!(s.as_str(), "http" | "https") => s.clone(),
            _ => {
                return Err(ConfigError::new(
                    KEY,
                    format!("`{shown}` must start with http:// or https://"),
                ))
            }
        };
        let Some(authority) = uri.authority().cloned() else {
            return Err(ConfigError::new(KEY, format!("`{shown}` has no host")));
        };
        if uri.query().is_some() {
            return Err(ConfigError::new(KEY, "must not carry a query string"));
        }
        let host_port = authority
            .as_str()
            .rsplit_once('@')
            .map_or(authority.as_str(), |(_, h)| h);
        let host = host_port
            .parse()
            .map_err(|e| ConfigError::new(KEY, format!("`{shown}` has an invalid host ({e})")))?;
        Ok(UpstreamUrl {
            base_path: uri.path().trim_end_matches('/').to_string(),
            display: redact_url(url.trim_end_matches('/')),
            scheme,
            authority,
            host,
        })
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// The authority as written (with any user-info): the address connections are made to.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The authority without user-info, so a password never reaches the upstream in `Host`.
    pub fn host(&self) -> &Authority {
        &self.host
    }

    /// The URL's path without a trailing slash; empty for a bare host.
    pub fn base_path(&self) -> &str {
        &self.base_path
    }

    /// The URL for people: no trailing slash, any password redacted.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// Refuses a base path with a `/v1` segment. Clients send `/v1/...` themselves and the URL's
    /// path is a prefix, so `http://h:8000/v1` (an OpenAI SDK's `base_url`) would send every
    /// request to `/v1/v1/...`: a 404 at best, a different route at worst. Refused rather than
    /// stripped so the configuration says exactly where requests go.
    pub fn check_base_path(&self) -> Result<(), ConfigError> {
        let path = self.base_path();
        let segments: Vec<&str> = path.split('/').collect();
        let Some(i) = segments.iter().position(|s| *s == "v1") else {
            return Ok(());
        };
        // Shown without any user-info, so a password in the URL is never printed.
        let host = self.host.as_str();
        let scheme = self.scheme().as_str();
        let root = format!("{scheme}://{host}{}", segments[..i].join("/"));
        Err(ConfigError::new(
            KEY,
            format!(
                "`{scheme}://{host}{path}` has the path {path}, but clients already send /v1/..., \
                 so requests would go to {path}/v1/chat/completions. upstream.url is the server's \
                 root, not an OpenAI SDK's base_url: set it to {root}"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_a_url_with_user_info_and_a_base_path() {
        let u = UpstreamUrl::parse("https://u:s3cret@gw.example:8443/openai/").unwrap();
        assert_eq!(u.scheme(), &Scheme::HTTPS);
        assert_eq!(u.authority().as_str(), "u:s3cret@gw.example:8443");
        assert_eq!(u.host().as_str(), "gw.example:8443");
        assert_eq!(u.base_path(), "/openai");
        assert_eq!(u.display(), "https://u:<redacted>@gw.example:8443/openai");
        let bare = UpstreamUrl::parse("http://h:1/").unwrap();
        assert_eq!((bare.base_path(), bare.display()), ("", "http://h:1"));
    }

    #[test]
    fn refusals_name_the_key_and_never_the_password() {
        for (url, says) in [
            ("ftp://u:s3cret@h:1", "must start with http:// or https://"),
            ("http://u:s3cret@h:1/?a=1", "must not carry a query string"),
            ("/just/a/path", "must start with http://"),
            ("http://u:s3cret@h :1", "is not a URL"),
        ] {
            let e = UpstreamUrl::parse(url).unwrap_err();
            assert_eq!(e.key, "upstream.url", "{url}");
            assert!(e.message.contains(says), "{url}: {e}");
            assert!(!e.message.contains("s3cret"), "{url}: {e}");
        }
    }
}
