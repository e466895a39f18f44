//! `kvbust healthcheck`: one `GET` against the admin port, success only on `200`, for container
//! images that have no curl (Docker `HEALTHCHECK`, exec probes). Reads nothing but the status
//! line of that one response; never sends anything else.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("cannot connect to the admin port {addr}: {source} (is kvbust running, and is admin.addr right?)")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("GET http://{addr}{path}: {source}")]
    Io {
        addr: SocketAddr,
        path: String,
        source: std::io::Error,
    },
    #[error("GET http://{addr}{path}: not an HTTP response (`{line}`)")]
    NotHttp {
        addr: SocketAddr,
        path: String,
        line: String,
    },
    #[error("GET http://{addr}{path} answered {status}: {reason}")]
    Unhealthy {
        addr: SocketAddr,
        path: String,
        status: u16,
        reason: String,
    },
}

/// Where to reach an admin listener bound to `listen`: a wildcard bind (`0.0.0.0`, `::`) is
/// reached on the loopback address of the same family.
pub fn probe_addr(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// `GET path` on `addr` over HTTP/1.1; `Ok(status line)` when the answer is 200.
pub fn check(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String, HealthError> {
    let io = |source| HealthError::Io {
        addr,
        path: path.to_string(),
        source,
    };
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|source| HealthError::Connect { addr, source })?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kvbust-healthcheck\r\nConnection: close\r\n\r\n"
    )
    .map_err(io)?;
    // The status line and a little of the body (the reason for a 503) fit in one small read
    // loop; the admin port closes the connection after answering.
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while buf.len() < 4096 {
        let n = stream.read(&mut chunk).map_err(io)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf);
    let line = text.lines().next().unwrap_or("").trim().to_string();
    let status = line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| HealthError::NotHttp {
            addr,
            path: path.to_string(),
            line: line.chars().take(80).collect(),
        })?;
    if status == 200 {
        return Ok(line);
    }
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
    Err(HealthError::Unhealthy {
        addr,
        path: path.to_string(),
        status,
        reason: if body.is_empty() {
            line
        } else {
            body.chars().take(200).collect()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_binds_are_probed_on_loopback() {
        let p = |s: &str| probe_addr(s.parse().unwrap()).to_string();
        assert_eq!(p("0.0.0.0:9090"), "127.0.0.1:9090");
        assert_eq!(p("[::]:9090"), "[::1]:9090");
        assert_eq!(p("10.1.2.3:9090"), "10.1.2.3:9090");
        assert_eq!(p("127.0.0.1:1"), "127.0.0.1:1");
    }
}
