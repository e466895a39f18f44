//! Proxy loops: an upstream that is kvbust's own data port (refused at start), and the `via`
//! entry kvbust adds to every forwarded request and refuses when it comes back to the same
//! instance (a loop through a name the start check could not see, e.g. a Service in front).
//! Owns the address comparison and the header value; never dials the upstream.

use std::net::{IpAddr, SocketAddr};

use http::header::VIA;
use http::{HeaderMap, HeaderValue};

/// This instance's `via` pseudonym, from a random number drawn once per process state
/// (two kvbusts chained on purpose each have their own).
pub fn via_token(random: u32) -> String {
    format!("kvbust-{random:08x}")
}

/// Whether a `via` entry of `headers` names `token`: the request has passed through this
/// instance already.
pub fn seen(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(VIA)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        // An entry is `protocol pseudonym [comment]`.
        .any(|entry| entry.split_whitespace().nth(1) == Some(token))
}

/// Appends `1.1 <token>` to the request's `via` (one header line, entries comma-joined).
pub fn add(headers: &mut HeaderMap, token: &str) {
    // Built in one string: on every request, so no formatter, list or second join.
    let mut joined = String::with_capacity(token.len() + 4);
    for v in headers.get_all(VIA).iter().filter_map(|v| v.to_str().ok()) {
        joined.push_str(v);
        joined.push_str(", ");
    }
    joined.push_str("1.1 ");
    joined.push_str(token);
    if let Ok(v) = HeaderValue::from_str(&joined) {
        headers.insert(VIA, v);
    }
}

/// The resolved upstream address that is kvbust's own data port `listen`, if any. A wildcard
/// `listen` (0.0.0.0 or ::) is every local address: `is_local` tells which those are.
pub fn own_address(
    listen: SocketAddr,
    resolved: &[SocketAddr],
    is_local: impl Fn(IpAddr) -> bool,
) -> Option<SocketAddr> {
    resolved.iter().copied().find(|a| {
        a.port() == listen.port()
            && (a.ip() == listen.ip() || (listen.ip().is_unspecified() && is_local(a.ip())))
    })
}

/// Whether `ip` is one of this host's addresses: a socket can be bound to it (loopback and
/// the wildcard count).
pub fn is_local_ip(ip: IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_own_listen_address_is_found_and_others_are_not() {
        let never = |_: IpAddr| false;
        let listen = addr("127.0.0.1:8080");
        assert_eq!(
            own_address(listen, &[addr("10.0.0.1:8080"), listen], never),
            Some(listen)
        );
        assert_eq!(own_address(listen, &[addr("127.0.0.1:8000")], never), None);
        // A wildcard listener is reached through any local address, not a remote one.
        let any = addr("0.0.0.0:8080");
        assert_eq!(
            own_address(any, &[addr("127.0.0.1:8080")], is_local_ip),
            Some(addr("127.0.0.1:8080"))
        );
        assert_eq!(own_address(any, &[addr("192.0.2.7:8080")], never), None);
    }

    #[test]
    fn loopback_is_local_and_a_documentation_address_is_not() {
        assert!(is_local_ip("127.0.0.1".parse().unwrap()));
        assert!(!is_local_ip("192.0.2.7".parse().unwrap()));
    }

    #[test]
    fn via_entries_are_appended_and_found_by_token() {
        let mut h = HeaderMap::new();
        h.append(
            VIA,
            HeaderValue::from_static("1.1 nginx, 1.0 squid (Squid/3)"),
        );
        h.append(VIA, HeaderValue::from_static("2 other"));
        assert!(!seen(&h, "kvbust-0000abcd"));
        add(&mut h, "kvbust-0000abcd");
        assert_eq!(h.get_all(VIA).iter().count(), 1);
        assert_eq!(
            h[VIA],
            "1.1 nginx, 1.0 squid (Squid/3), 2 other, 1.1 kvbust-0000abcd"
        );
        assert!(seen(&h, "kvbust-0000abcd"));
        // Another instance's entry is not this one's.
        assert!(!seen(&h, "kvbust-0000abce"));
        assert_eq!(via_token(0xabcd), "kvbust-0000abcd");
    }
}
