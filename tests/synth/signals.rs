//! Issue 42 (3): `kvbust synth` stopped by SIGTERM while it writes its output removes its
//! hidden temporary file and exits 143 (130 for SIGINT), as a shell reports those signals.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::synth_common::fresh_scratch;

/// Starts `kvbust synth` writing `entries` conversations into `dir`, waits until its
/// temporary file is there, then sends `signal`. `None`: it finished before the file was
/// seen (the machine was faster than the poll); else its exit code and what it left.
fn interrupted(
    dir: &std::path::Path,
    entries: u32,
    signal: &str,
) -> Option<(Option<i32>, Vec<String>)> {
    let out = dir.join("out.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") {
            cmd.env_remove(k);
        }
    }
    let n = entries.to_string();
    let mut child = cmd
        .args(["synth", "--isl", "4000", "--osl", "4", "--random-seed", "1"])
        .args(["--num-dataset-entries", &n, "--no-corpus-cache", "-o"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kvbust runs");
    let tmp_seen = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
    };
    // A bound on a "never happens" (the synthesis hangs), not a measurement.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if tmp_seen(dir) {
            break;
        }
        if child.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    if status.success() {
        return None;
    }
    let left = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    Some((status.code(), left))
}

#[test]
fn a_signal_while_writing_removes_the_temporary_file() {
    for (signal, code) in [("-TERM", 143), ("-INT", 130)] {
        let dir = fresh_scratch("signals", &signal[1..]);
        // Larger each time the write ended before the signal came.
        let got = [4_000, 16_000, 64_000]
            .into_iter()
            .find_map(|n| interrupted(&dir, n, signal))
            .expect("the signal came while the output was written");
        assert_eq!(got, (Some(code), Vec::<String>::new()), "{signal}");
    }
}
