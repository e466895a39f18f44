//! Header hygiene of a forwarded request: hop-by-hop headers out (and those `Connection`
//! names), kvbust's own `x-kvbust-*` and control headers out, `Host` kept or left to the
//! client, `X-Forwarded-For` / `X-Forwarded-Proto` in. Never touches a body, the URI or any
//! header it is not listed here to change.

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Whether `name` describes one connection, not the message (RFC 9110 §7.6.1): `connection`,
/// `keep-alive`, `proxy-connection`, `te`, `trailer`, `transfer-encoding`, `upgrade`. Told by
/// one look at the name's text (a `match` on it compares lengths first), without hashing.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names finds the hop-by-hop ones (each name comes once, so at most
    // seven): most messages carry none or only `Connection`, and a removal hashes each name.
    let mut hop: [Option<HeaderName>; 7] = Default::default();
    let mut n = 0;
    for k in headers.keys().filter(|k| is_hop_by_hop(k)) {
        if let Some(slot) = hop.get_mut(n) {
            *slot = Some(k.clone());
            n += 1;
        }
    }
    if n == 0 {
        return;
    }
    // The present names `Connection` lists: a name equals `HeaderName::from_bytes` of a trimmed
    // token when it equals the token but for case (names are lower case), so no token is parsed.
    let mut named: Vec<HeaderName> = Vec::new();
    let tokens = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for token in tokens {
        let token = token.trim();
        // A hop-by-hop name goes anyway: no need to look for it.
        if let Some(k) = headers
            .keys()
            .find(|k| k.as_str().eq_ignore_ascii_case(token) && !is_hop_by_hop(k))
        {
            named.push(k.clone());
        }
    }
    for name in named.iter().chain(hop.iter().flatten()) {
        headers.remove(name);
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// An address as `Display` writes it, as a header value; an IPv4 address (the usual peer)
/// without going through the formatter.
fn ip_value(ip: std::net::IpAddr) -> HeaderValue {
    let std::net::IpAddr::V4(v4) = ip else {
        // Digits, hex, colons and dots: always a valid value.
        return HeaderValue::from_str(&ip.to_string()).unwrap_or(HeaderValue::from_static(""));
    };
    let mut text = [0u8; 15];
    let mut n = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text[n] = b'.';
            n += 1;
        }
        let mut buf = itoa::Buffer::new();
        let digits = buf.format(octet).as_bytes();
        text[n..n + digits.len()].copy_from_slice(digits);
        n += digits.len();
    }
    HeaderValue::from_bytes(&text[..n]).unwrap_or(HeaderValue::from_static(""))
}

/// Prepares a client request's headers for the upstream.
/// `control`: kvbust's own request headers (configurable names), removed like every
/// `x-kvbust-*` header.
pub fn upstream_request_headers(
    headers: &mut HeaderMap,
    peer: SocketAddr,
    tls: bool,
    keep_host: bool,
    control: &[&str],
) {
    strip_hop_by_hop(headers);
    let ours =
        |k: &HeaderName| k.as_str().starts_with("x-kvbust-") || control.contains(&k.as_str());
    // Most requests carry none: then no list is built.
    if headers.keys().any(ours) {
        let kvbust: Vec<HeaderName> = headers.keys().filter(|k| ours(k)).cloned().collect();
        for k in kvbust {
            headers.remove(&k);
        }
    }
    if !keep_host {
        // The client sets Host (HTTP/1.1) or :authority (HTTP/2) from the upstream URI.
        headers.remove(header::HOST);
    }
    let value = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prev) if !prev.trim().is_empty() => {
            HeaderValue::from_str(&format!("{prev}, {}", peer.ip())).ok()
        }
        _ => Some(ip_value(peer.ip())),
    };
    if let Some(v) = value {
        headers.insert(X_FORWARDED_FOR, v);
    }
    let proto = X_FORWARDED_PROTO;
    if !headers.contains_key(&proto) {
        headers.insert(
            proto,
            HeaderValue::from_static(if tls { "https" } else { "http" }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_kvbust_headers_go_forwarded_headers_come() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::HOST, HeaderValue::from_static("proxy:8080"));
        h.insert("x-kvbust-phase", HeaderValue::from_static("warmup"));
        h.insert("x-correlation-id", HeaderValue::from_static("abc"));
        h.insert("authorization", HeaderValue::from_static("Bearer t"));
        h.insert("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        h.insert("x-bench-phase", HeaderValue::from_static("warmup"));
        upstream_request_headers(
            &mut h,
            "10.1.1.1:5555".parse().unwrap(),
            false,
            false,
            &["x-bench-phase"],
        );
        for gone in [
            "connection",
            "x-secret-hop",
            "keep-alive",
            "transfer-encoding",
            "host",
            "x-kvbust-phase",
            "x-bench-phase",
        ] {
            assert!(!h.contains_key(gone), "{gone} should be removed");
        }
        assert_eq!(h["x-correlation-id"], "abc");
        assert_eq!(h["authorization"], "Bearer t");
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 10.1.1.1");
        assert_eq!(h["x-forwarded-proto"], "http");
    }

    #[test]
    fn hop_by_hop_names_are_told_apart() {
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
        ] {
            assert!(is_hop_by_hop(&HeaderName::from_static(name)), "{name}");
        }
        for name in ["content-length", "host", "x-keep-alive", "tex", "date"] {
            assert!(!is_hop_by_hop(&HeaderName::from_static(name)), "{name}");
        }
    }

    #[test]
    fn connection_tokens_name_headers_in_any_case_and_spacing() {
        let mut h = HeaderMap::new();
        h.append(
            header::CONNECTION,
            HeaderValue::from_static(" X-Secret-Hop ,close"),
        );
        h.append(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("close", HeaderValue::from_static("2"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-stays", HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-stays"]);
    }

    #[test]
    fn forwarded_for_writes_addresses_as_display_does() {
        for ip in [
            "10.1.1.1",
            "0.0.0.0",
            "255.255.255.255",
            "127.0.0.1",
            "::1",
            "fe80::1",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(ip_value(ip), ip.to_string().as_str());
        }
    }

    #[test]
    fn keep_host_keeps_it() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("proxy:8080"));
        upstream_request_headers(&mut h, "[::1]:1".parse().unwrap(), true, true, &[]);
        assert_eq!(h["host"], "proxy:8080");
        assert_eq!(h["x-forwarded-for"], "::1");
        assert_eq!(h["x-forwarded-proto"], "https");
    }
}
