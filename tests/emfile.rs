//! Out of file descriptors (issue 14): the accept loops back off instead of spinning, and serve
//! again once descriptors free up. Alone in its test binary because it lowers the whole
//! process's descriptor limit (with util-linux `prlimit`, so the test needs no unsafe code).
// Test code: a panic is the failure report (Cargo.toml denies these in the library).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::io::{Read, Seek};
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use common::*;

/// The process's user + system CPU time so far, in clock ticks (1/100 s on Linux).
fn cpu_ticks(stat: &mut std::fs::File) -> u64 {
    // Re-reading an open procfs file gives fresh values and needs no new descriptor.
    stat.rewind().unwrap();
    let mut s = String::new();
    stat.read_to_string(&mut s).unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn highest_open_fd() -> u32 {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .max()
        .unwrap()
}

/// This process's open-file limit, one column of `prlimit` (`SOFT` or `HARD`): a number or
/// `unlimited`.
fn nofile(column: &str) -> String {
    let out = Command::new("prlimit")
        .args(["--pid", &std::process::id().to_string(), "--nofile"])
        .arg(format!("--output={column}"))
        .arg("--noheadings")
        .output()
        .expect("prlimit (util-linux) runs")
        .stdout;
    String::from_utf8(out).unwrap().trim().to_string()
}

fn set_nofile(soft: u64, hard: &str) {
    let ok = Command::new("prlimit")
        .arg("--pid")
        .arg(std::process::id().to_string())
        .arg(format!("--nofile={soft}:{hard}"))
        .status()
        .expect("prlimit (util-linux) runs")
        .success();
    assert!(ok, "prlimit set the limit");
}

/// One `GET /healthz` on its own connection, closed after; the whole response.
async fn healthz(addr: std::net::SocketAddr) -> Vec<u8> {
    healthz_on(&mut tokio::net::TcpStream::connect(addr).await.unwrap()).await
}

async fn healthz_on(conn: &mut tokio::net::TcpStream) -> Vec<u8> {
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut resp = Vec::new();
    conn.read_to_end(&mut resp).await.unwrap();
    resp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_accept_loops_back_off_and_recover() {
    let h = start(|c| c.listen.workers = 1).await;
    // The admin port answers only once every data worker runs (each needs descriptors for its
    // event loop), so from here on nothing in kvbust still has to open one to start.
    assert!(healthz(h.admin_addr).await.starts_with(b"HTTP/1.1 200"));
    let hard = nofile("HARD");
    let soft: u64 = nofile("SOFT").parse().unwrap_or(4096);
    let mut stat = std::fs::File::open("/proc/self/stat").unwrap();
    // Sockets made now, connected once no descriptor is left: the servers' accepts must fail.
    let to_admin = TcpSocket::new_v4().unwrap();
    let to_data = TcpSocket::new_v4().unwrap();

    // No descriptor numbers above the highest in use, and every hole below it filled.
    set_nofile(u64::from(highest_open_fd()) + 1, &hard);
    let mut fillers = Vec::new();
    while let Ok(s) = TcpSocket::new_v4() {
        fillers.push(s);
    }
    let mut admin = to_admin.connect(h.admin_addr).await.unwrap();
    let _data = to_data.connect(h.proxy_addr).await.unwrap();

    // Both listeners now hold a connection they cannot accept. Spinning would burn a core.
    let before = cpu_ticks(&mut stat);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = cpu_ticks(&mut stat) - before;
    assert!(
        used <= 10,
        "{used} ticks of CPU in 1 s while out of descriptors"
    );

    // Descriptors come back: the pending connections are accepted and served. Dropping the
    // fillers alone is not enough: when the descriptor table had only one hole, the data
    // port's accept could take the one freed descriptor and leave the admin port starving
    // (CI saw exactly that), so the limit is raised back as well.
    drop(fillers);
    set_nofile(soft, &hard);
    let Ok(resp) = tokio::time::timeout(HANG, healthz_on(&mut admin)).await else {
        // Which failed: the pending connection alone, or accepting at all?
        let fresh = tokio::time::timeout(Duration::from_secs(5), healthz(h.admin_addr)).await;
        panic!(
            "the pending connection was not served 20 s after recovery; server task ended: {}; \
             a new connection: {:?}",
            h.server_ended(),
            fresh.map(|r| String::from_utf8_lossy(&r)
                .lines()
                .next()
                .map(str::to_owned))
        );
    };
    assert!(
        resp.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    h.shutdown().await;
}
