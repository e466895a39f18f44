//! The capture's files: rows put back in forwarding order and written as finished mooncake
//! rows to a hidden partial file, flushed within `capture.flush`, so a crash loses no more than
//! that. Its ids are keyed hashes (the capture key, or a key made for this process): the
//! partial never holds a value anyone without the key can test a prompt against. On rotation
//! the partial's ids are renamed into their final ones ([`ids::Renamer`]) in a finished file
//! renamed into place with its metadata, so a reader never sees half a file; a partial an
//! earlier run left is finished at start (or named, when it cannot be). Owns `capture.dir`;
//! never tokenizes and never sees a prompt's text.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::ids::{keyed_session, Renamer, Sharing};
use super::{Done, Key, Msg, Settings};
use crate::metrics::Metrics;

/// Rows that may wait behind one still-open request before it is given up on ("late").
const MAX_WAITING: usize = 65_536;
/// Distinct blocks a file may hold before it is finished early: the writer's memory bound
/// (about 100 bytes a block while the file is finished: 100 MB).
pub const MAX_FILE_BLOCKS: usize = 1 << 20;
/// At most one error line per this long about the same trouble (a folder that went away, a
/// full disk); the lines between are counted, not printed.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The metadata written beside each trace as `NAME.meta.json` (and beside a partial as
/// `.NAME.partial.meta.json`, what a later run finishes it with).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    /// `kvbust-capture`.
    pub format: String,
    pub version: u32,
    /// The file's time zero (its first row's arrival), in ms since the Unix epoch.
    pub start_unix_ms: u64,
    pub block_size: usize,
    /// The key's fingerprint (`None`: unkeyed, ids dense within this file only).
    pub key: Option<String>,
    pub chat_template: String,
    pub tokenizer: String,
    pub min_sessions_per_shared_block: usize,
    pub rows: u64,
}

pub const FORMAT: &str = "kvbust-capture";

/// A row as AIPerf reads it, members in this order: what the partial holds (keyed ids) and
/// what a finished file holds (renamed ids).
#[derive(Serialize, Deserialize)]
struct Row<'a> {
    #[serde(skip_serializing_if = "Option::is_none", borrow)]
    session_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<u64>,
    input_length: u64,
    output_length: u64,
    hash_ids: std::borrow::Cow<'a, [u64]>,
}

struct Open {
    name: String,
    partial: PathBuf,
    out: File,
    /// Rows written since the last flush, as bytes, and how many.
    buf: Vec<u8>,
    buffered: u64,
    /// Bytes and rows of the partial on disk.
    len: u64,
    rows: u64,
    last_flush: Instant,
    started: Instant,
    start_unix_ms: u64,
    /// Distinct blocks (the file's memory bound at finish).
    blocks: HashSet<u64>,
    /// Each row session's previous row's end (for `delay`).
    last_end: HashMap<u64, Instant>,
}

/// Says one error line per [`LOG_EVERY`], counting the ones it holds back.
#[derive(Default)]
struct Gate {
    last: Option<Instant>,
    held: u64,
}

impl Gate {
    fn error(&mut self, dir: &Path, what: &str) {
        if self.last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            self.held += 1;
            return;
        }
        let held = std::mem::take(&mut self.held);
        self.last = Some(Instant::now());
        tracing::error!(dir = %dir.display(), held_back = held, "capture: {what}");
    }
}

pub struct Writer {
    settings: Settings,
    metrics: Metrics,
    next_seq: u64,
    waiting: BTreeMap<u64, Box<Done>>,
    open: Option<Open>,
    files: u64,
    gate: Gate,
}

impl Writer {
    pub fn new(settings: Settings, metrics: Metrics) -> Self {
        Self {
            settings,
            metrics,
            next_seq: 0,
            waiting: BTreeMap::new(),
            open: None,
            files: 0,
            gate: Gate::default(),
        }
    }

    /// Finishes the partials an earlier run left, then writes rows until told to finish (or
    /// every sender is gone); flushes within `capture.flush` and checks the time-based rotation
    /// at least once a second.
    pub(super) fn run(mut self, rx: Receiver<Msg>) {
        finish_stale(&self.settings, &self.metrics);
        loop {
            // Woken when the open file's flush falls due (at least once a second, for the
            // rotation), so a buffered row waits no longer than `capture.flush`.
            let due = self.open.as_ref().map_or(Duration::from_secs(1), |o| {
                self.settings.flush.saturating_sub(o.last_flush.elapsed())
            });
            match rx.recv_timeout(due.min(Duration::from_secs(1))) {
                Ok(Msg::Row(done)) => self.take(done),
                Ok(Msg::Finish) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if self
                .open
                .as_ref()
                .is_some_and(|o| o.last_flush.elapsed() >= self.settings.flush)
            {
                self.flush();
            }
            if self
                .open
                .as_ref()
                .is_some_and(|o| o.started.elapsed() >= self.settings.rotate)
            {
                self.rotate();
            }
        }
        // Whatever still waits behind a request that never ended goes out in order.
        while let Some((_, done)) = self.waiting.pop_first() {
            self.write(*done);
        }
        self.rotate();
    }

    fn take(&mut self, done: Box<Done>) {
        self.waiting.insert(done.pending.seq, done);
        loop {
            let next = match self.waiting.first_key_value() {
                Some((&seq, _)) if seq == self.next_seq => seq,
                Some((&seq, _)) if self.waiting.len() > MAX_WAITING => {
                    let skipped = seq - self.next_seq;
                    self.lost("late", skipped);
                    seq
                }
                _ => break,
            };
            if let Some(done) = self.waiting.remove(&next) {
                self.next_seq = next + 1;
                self.write(*done);
            }
        }
    }

    fn lost(&self, reason: &str, rows: u64) {
        if rows > 0 {
            self.metrics
                .capture_dropped
                .with_label_values(&[reason])
                .inc_by(rows);
        }
    }

    fn write(&mut self, done: Done) {
        let output = match done.output {
            Ok(n) => n,
            Err(left) => return self.lost(left.as_str(), 1),
        };
        if self.open.is_none() {
            match self.create(done.at) {
                Ok(o) => self.open = Some(o),
                Err(e) => {
                    self.lost("io_error", 1);
                    let what = format!("cannot start a file: {e}; rows are lost until it can");
                    return self.gate.error(&self.settings.dir, &what);
                }
            }
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        let p = &done.pending;
        // A later turn whose session started in an earlier file is written as a first turn.
        let prev = p
            .session
            .filter(|_| p.follows)
            .and_then(|s| open.last_end.get(&s).copied());
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let (timestamp, delay) = match prev {
            Some(end) => (None, Some(ms(done.at.saturating_duration_since(end)))),
            None => (
                Some(ms(done.at.saturating_duration_since(open.started))),
                None,
            ),
        };
        if let Some(s) = p.session {
            open.last_end.insert(s, done.end);
        }
        open.blocks.extend(p.blocks.iter().copied());
        let key = &self.settings.hash_key;
        let row = Row {
            session_id: p
                .session
                .map(|s| format!("{:014x}", keyed_session(key, s)).into()),
            timestamp,
            delay,
            input_length: p.input_length,
            output_length: output,
            hash_ids: (&p.blocks[..]).into(),
        };
        // Serializing plain numbers and strings into a Vec cannot fail.
        if serde_json::to_writer(&mut open.buf, &row).is_err() {
            return self.lost("io_error", 1);
        }
        open.buf.push(b'\n');
        open.buffered += 1;
        let full = open.rows + open.buffered >= self.settings.rotate_rows
            || open.blocks.len() >= MAX_FILE_BLOCKS;
        if full {
            self.rotate();
        }
    }

    /// Writes the rows buffered since the last flush to the partial. Rows it cannot write are
    /// counted lost (`io_error`) and cut off again, so the partial stays whole rows; a partial
    /// whose folder went away is counted lost (`vanished`) and a new one starts with the next
    /// row, in the folder made again.
    fn flush(&mut self) {
        let Some(open) = self.open.as_mut() else {
            return;
        };
        open.last_flush = Instant::now();
        if !open.partial.exists() {
            let (rows, name) = (open.rows + open.buffered, open.name.clone());
            self.open = None;
            self.lost("vanished", rows);
            let what = format!(
                "{name}'s partial file is gone (capture.dir removed?): its {rows} rows are lost; \
                 a new file starts in the folder made again"
            );
            return self.gate.error(&self.settings.dir, &what);
        }
        if open.buf.is_empty() {
            return;
        }
        match open.out.write_all(&open.buf) {
            Ok(()) => {
                open.len += open.buf.len() as u64;
                open.rows += open.buffered;
                self.metrics.capture_rows.inc_by(open.buffered);
            }
            Err(e) => {
                let rows = open.buffered;
                let cut = open.out.set_len(open.len).is_ok();
                if !cut {
                    // Half a row may stand at its end: the file is finished as it is.
                    self.open = None;
                }
                self.lost("io_error", rows);
                let what = format!("cannot write {rows} rows: {e}; they are lost");
                self.gate.error(&self.settings.dir, &what);
            }
        }
        if let Some(open) = self.open.as_mut() {
            open.buf.clear();
            open.buffered = 0;
        }
    }

    fn create(&mut self, first: Instant) -> std::io::Result<Open> {
        let now = SystemTime::now() - first.elapsed();
        let start_unix_ms = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let stamp: String = humantime::format_rfc3339_millis(now)
            .to_string()
            .chars()
            .filter(|c| *c != ':' && *c != '-')
            .collect();
        self.files += 1;
        let name = format!("capture-{stamp}-{}-{}", std::process::id(), self.files);
        let dir = &self.settings.dir;
        // Made again when it went away since the start.
        std::fs::create_dir_all(dir)?;
        let partial = dir.join(format!(".{name}.partial"));
        let meta = self.meta(start_unix_ms, 0);
        std::fs::write(partial_meta(&partial), serde_json::to_vec_pretty(&meta)?)?;
        Ok(Open {
            out: File::create(&partial)?,
            buf: Vec::new(),
            buffered: 0,
            len: 0,
            rows: 0,
            last_flush: Instant::now(),
            name,
            partial,
            started: first,
            start_unix_ms,
            blocks: HashSet::new(),
            last_end: HashMap::new(),
        })
    }

    fn meta(&self, start_unix_ms: u64, rows: u64) -> Meta {
        let s = &self.settings;
        Meta {
            format: FORMAT.into(),
            version: 1,
            start_unix_ms,
            block_size: s.block_size,
            key: s.key.as_ref().map(Key::fingerprint),
            chat_template: match s.rendering {
                super::Rendering::Contents => "none".into(),
                super::Rendering::AsModel => "auto".into(),
            },
            tokenizer: s.tokenizer.clone(),
            min_sessions_per_shared_block: s.min_sessions,
            rows,
        }
    }

    /// Finishes the open file (if any), its last rows flushed first. One that cannot be
    /// finished (a full disk) stays a partial, every row it has on disk kept, for the next
    /// start to finish.
    fn rotate(&mut self) {
        self.flush();
        let Some(open) = self.open.take() else {
            return;
        };
        let meta = self.meta(open.start_unix_ms, open.rows);
        drop(open.out);
        match finish(
            &self.settings.dir,
            &open.name,
            &meta,
            self.settings.key.as_ref(),
        ) {
            Ok(()) => self.metrics.capture_files.inc(),
            Err(e) => {
                let what = format!(
                    "cannot finish {}: {e}; its {} rows stay in {}, which the next start \
                     finishes",
                    open.name,
                    open.rows,
                    open.partial.display()
                );
                self.gate.error(&self.settings.dir, &what);
            }
        }
    }
}

/// `.NAME.partial` → `.NAME.partial.meta.json`.
fn partial_meta(partial: &Path) -> PathBuf {
    let name = partial.file_name().and_then(|n| n.to_str()).unwrap_or("");
    partial.with_file_name(format!("{name}.meta.json"))
}

/// Finishes the partial `.NAME.partial` in `dir` into `NAME.jsonl` and `NAME.meta.json`:
/// renamed ids written under temporary names, renamed into place (metadata first), then the
/// partial removed. On any error the temporary files go and the partial stays.
fn finish(dir: &Path, name: &str, meta: &Meta, key: Option<&Key>) -> std::io::Result<()> {
    let partial = dir.join(format!(".{name}.partial"));
    let tmp = dir.join(format!(".{name}.jsonl.tmp"));
    let meta_tmp = dir.join(format!(".{name}.meta.json.tmp"));
    let out = dir.join(format!("{name}.jsonl"));
    let done = (|| {
        let sharing = sharing_of(&partial, meta.min_sessions_per_shared_block)?;
        let mut w = BufWriter::new(File::create(&tmp)?);
        let input = BufReader::new(File::open(&partial)?);
        let rows = rename_rows(input, &mut w, &sharing, key)?;
        w.flush()?;
        w.get_ref().sync_all()?;
        drop(w);
        let meta = Meta {
            rows,
            ..meta.clone()
        };
        std::fs::write(&meta_tmp, serde_json::to_vec_pretty(&meta)?)?;
        std::fs::rename(&meta_tmp, meta_path(&out))?;
        std::fs::rename(&tmp, &out)?;
        tracing::info!(file = %out.display(), rows, "capture: file finished");
        Ok(())
    })();
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_file(&meta_tmp);
        return done;
    }
    let _ = std::fs::remove_file(partial_meta(&partial));
    std::fs::remove_file(&partial)
}

/// Who sent each block of a partial: a row's session, or the row itself when it has none.
fn sharing_of(partial: &Path, k: usize) -> std::io::Result<Sharing> {
    let mut sharing = Sharing::new(k);
    for (i, line) in BufReader::new(File::open(partial)?).lines().enumerate() {
        let line = line?;
        let row: Row = serde_json::from_str(&line).map_err(std::io::Error::other)?;
        let sharer = sharer(&row, i);
        for &b in row.hash_ids.iter() {
            sharing.note(b, sharer);
        }
    }
    Ok(sharing)
}

/// Who counts as a session for `min_sessions_per_shared_block`: the row's keyed session id, or
/// (a request of its own) a value no keyed id takes (those stay below 2^53).
fn sharer(row: &Row<'_>, index: usize) -> u64 {
    row.session_id
        .as_deref()
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .unwrap_or(u64::MAX - index as u64)
}

/// The partials an earlier run left in `settings.dir` (its pid no longer running): each is
/// finished with the metadata it was started with, or, when that cannot be (no metadata, or a
/// key other than this run's), named in an error and left as it is.
fn finish_stale(settings: &Settings, metrics: &Metrics) {
    let Ok(entries) = std::fs::read_dir(&settings.dir) else {
        return;
    };
    let mine = std::process::id();
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(name) = file
            .to_str()
            .and_then(|n| n.strip_prefix('.'))
            .and_then(|n| n.strip_suffix(".partial"))
        else {
            continue;
        };
        let pid = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| p == mine || Path::new(&format!("/proc/{p}")).exists()) {
            continue;
        }
        let path = e.path();
        let meta: Result<Meta, String> = std::fs::read(partial_meta(&path))
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
        let fingerprint = settings.key.as_ref().map(Key::fingerprint);
        let result = match meta {
            Err(e) => Err(format!("its metadata cannot be read ({e})")),
            Ok(m) if m.key.is_some() && m.key != fingerprint => Err(format!(
                "it was captured under key {}, not this run's capture.key_file",
                m.key.as_deref().unwrap_or_default()
            )),
            Ok(m) => {
                finish(&settings.dir, name, &m, settings.key.as_ref()).map_err(|e| e.to_string())
            }
        };
        match result {
            Ok(()) => {
                metrics.capture_files.inc();
                tracing::warn!(file = %path.display(), "capture: finished a partial an earlier run left (it stopped without finishing it)");
            }
            Err(why) => tracing::error!(
                file = %path.display(),
                "capture: a partial an earlier run left cannot be finished: {why}; its rows are \
                 mooncake rows with keyed ids, left as they are"
            ),
        }
    }
}

/// `x.jsonl` → `x.meta.json` (beside it).
pub fn meta_path(trace: &Path) -> PathBuf {
    let stem = trace
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| n.strip_suffix(".jsonl").unwrap_or(n))
        .unwrap_or("trace");
    trace.with_file_name(format!("{stem}.meta.json"))
}

/// Copies the partial's rows to `out` with their final ids and session ids; how many.
fn rename_rows(
    input: impl BufRead,
    out: &mut impl Write,
    sharing: &Sharing,
    key: Option<&Key>,
) -> std::io::Result<u64> {
    let mut renamer = Renamer::new(sharing, key);
    let mut ids = Vec::new();
    let mut n = 0;
    for (i, line) in input.lines().enumerate() {
        let line = line?;
        let raw: Row = serde_json::from_str(&line).map_err(std::io::Error::other)?;
        let sharer = sharer(&raw, i);
        ids.clear();
        ids.extend(raw.hash_ids.iter().map(|&b| renamer.block(b, sharer)));
        let session = raw.session_id.as_deref().map(|s| renamer.session(s));
        let row = Row {
            session_id: session.map(Into::into),
            hash_ids: (&ids[..]).into(),
            ..raw
        };
        serde_json::to_writer(&mut *out, &row)?;
        out.write_all(b"\n")?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{ids, Pending, Rendering};

    /// A folder of the test's own, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let d = crate::test_support::test_dir().join(name);
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn settings(dir: &Path, key: Option<Key>) -> Settings {
        Settings {
            dir: dir.to_path_buf(),
            block_size: 4,
            rendering: Rendering::Contents,
            rotate: Duration::from_secs(3600),
            rotate_rows: 1000,
            min_sessions: 1,
            hash_key: key.clone().unwrap_or_else(Key::random),
            key,
            tokenizer: "builtin".into(),
            flush: Duration::from_secs(1),
        }
    }

    /// A finished request of `session` (a header digest) whose prompt was `tokens`.
    fn done(seq: u64, session: Option<u64>, tokens: &[u32], s: &Settings) -> Done {
        let at = Instant::now();
        Done {
            pending: Pending {
                seq,
                input_length: tokens.len() as u64,
                blocks: ids::chain(tokens, s.block_size, Some(&s.hash_key)),
                session,
                follows: false,
            },
            at,
            end: at,
            output: Ok(3),
        }
    }

    fn lines(p: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn only(dir: &Path, suffix: &str) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_str().unwrap().ends_with(suffix))
            .collect();
        v.sort();
        v
    }

    /// Moves this process's partial (and its metadata) under a pid no process has, as a run
    /// killed before it finished its file leaves it.
    fn orphan(partial: &Path) -> PathBuf {
        let name = partial.file_name().unwrap().to_str().unwrap();
        let dead = name.replace(&format!("-{}-", std::process::id()), "-999999999-");
        let to = partial.with_file_name(dead);
        std::fs::rename(partial_meta(partial), partial_meta(&to)).unwrap();
        std::fs::rename(partial, &to).unwrap();
        to
    }

    const DIGEST: u64 = 0x1234_5678;

    /// Issue 42 (2): once flushed, rows are on disk as mooncake rows (counted there), their
    /// ids keyed with the process's own key: not the fixed-key hashes anyone can compute from
    /// a known prompt, nor the session's digest; a second process keys differently.
    #[test]
    fn flushed_rows_are_mooncake_rows_with_keyed_ids_on_disk() {
        let dir = Scratch::new("flushed");
        let tokens: Vec<u32> = (0..10).collect();
        let mut seen = Vec::new();
        for _ in 0..2 {
            let m = Metrics::new();
            let s = settings(dir.path(), None);
            let mut w = Writer::new(s.clone(), m.clone());
            w.take(Box::new(done(0, Some(DIGEST), &tokens, &s)));
            assert_eq!(m.capture_rows.get(), 0, "buffered, not on disk yet");
            w.flush();
            assert_eq!(m.capture_rows.get(), 1);
            let partial = w.open.as_ref().unwrap().partial.clone();
            let rows = lines(&partial);
            assert_eq!(rows.len(), 1);
            let r = &rows[0];
            assert_eq!(r["input_length"], 10);
            assert_eq!(r["output_length"], 3);
            assert!(r["timestamp"].is_u64());
            let ids: Vec<u64> = serde_json::from_value(r["hash_ids"].clone()).unwrap();
            assert_eq!(ids.len(), 3);
            let fixed = ids::chain(&tokens, 4, None);
            assert!(ids.iter().all(|i| !fixed.contains(i)), "{ids:?} {fixed:?}");
            let sid = r["session_id"].as_str().unwrap().to_string();
            assert_ne!(u64::from_str_radix(&sid, 16).unwrap(), DIGEST);
            seen.push((ids, sid));
            drop(w);
            std::fs::remove_file(partial_meta(&partial)).unwrap();
            std::fs::remove_file(&partial).unwrap();
        }
        assert_ne!(seen[0], seen[1], "each process keys its ids its own way");
    }

    /// Issue 42 (2): a partial a killed run left is finished by the next start, dense ids and
    /// all, with every row it had flushed.
    #[test]
    fn a_restart_finishes_the_partial_a_killed_run_left() {
        let dir = Scratch::new("restart");
        let s = settings(dir.path(), None);
        let mut w = Writer::new(s.clone(), Metrics::new());
        let shared: Vec<u32> = (0..8).collect();
        w.take(Box::new(done(0, Some(1), &shared, &s)));
        w.take(Box::new(done(1, Some(2), &shared, &s)));
        w.take(Box::new(done(2, None, &[9, 9, 9], &s)));
        w.flush();
        let partial = w.open.as_ref().unwrap().partial.clone();
        // Killed: nothing finishes it.
        std::mem::forget(w);
        let orphaned = orphan(&partial);
        let m = Metrics::new();
        let (tx, rx) = std::sync::mpsc::channel();
        tx.send(Msg::Finish).unwrap();
        Writer::new(settings(dir.path(), None), m.clone()).run(rx);
        assert!(!orphaned.exists());
        assert!(!partial_meta(&orphaned).exists());
        let files = only(dir.path(), ".jsonl");
        assert_eq!(files.len(), 1, "{files:?}");
        let rows = lines(&files[0]);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0]["hash_ids"], serde_json::json!([0, 1]));
        assert_eq!(rows[1]["hash_ids"], serde_json::json!([0, 1]));
        assert_eq!(rows[2]["hash_ids"], serde_json::json!([2]));
        assert_eq!(rows[0]["session_id"], "s0");
        assert_eq!(rows[1]["session_id"], "s1");
        let meta: Meta =
            serde_json::from_slice(&std::fs::read(meta_path(&files[0])).unwrap()).unwrap();
        assert_eq!(meta.rows, 3);
        assert_eq!(m.capture_files.get(), 1);
    }

    /// A partial keyed with another key than this run's cannot be finished right: it is left
    /// as it is (and named in the log).
    #[test]
    fn a_stale_partial_under_another_key_is_left_as_it_is() {
        let dir = Scratch::new("otherkey");
        let k1 = Key::new(vec![1; 32]).unwrap();
        let s = settings(dir.path(), Some(k1));
        let mut w = Writer::new(s.clone(), Metrics::new());
        w.take(Box::new(done(0, None, &[1, 2, 3], &s)));
        w.flush();
        let partial = w.open.as_ref().unwrap().partial.clone();
        std::mem::forget(w);
        let orphaned = orphan(&partial);
        let (tx, rx) = std::sync::mpsc::channel();
        tx.send(Msg::Finish).unwrap();
        let k2 = Key::new(vec![2; 32]).unwrap();
        Writer::new(settings(dir.path(), Some(k2)), Metrics::new()).run(rx);
        assert!(orphaned.exists());
        assert!(only(dir.path(), ".jsonl").is_empty());
    }

    /// Issue 42 (2): a file that cannot be finished (here its metadata cannot be written, as
    /// on a full disk) keeps every row in its partial and leaves no temporary file; the next
    /// start finishes it.
    #[test]
    fn a_file_that_cannot_be_finished_keeps_its_rows_in_the_partial() {
        let dir = Scratch::new("unfinished");
        let s = settings(dir.path(), None);
        let mut w = Writer::new(s.clone(), Metrics::new());
        for i in 0..5 {
            w.take(Box::new(done(i, None, &[i as u32; 6], &s)));
        }
        let open = w.open.as_ref().unwrap();
        let (partial, name) = (open.partial.clone(), open.name.clone());
        // The metadata's temporary name is taken by a folder: writing it fails.
        let blocker = dir.path().join(format!(".{name}.meta.json.tmp"));
        std::fs::create_dir(&blocker).unwrap();
        w.rotate();
        assert_eq!(lines(&partial).len(), 5, "every row kept");
        assert!(!dir.path().join(format!(".{name}.jsonl.tmp")).exists());
        assert!(only(dir.path(), ".jsonl").is_empty());
        std::fs::remove_dir(&blocker).unwrap();
        let orphaned = orphan(&partial);
        let (tx, rx) = std::sync::mpsc::channel();
        tx.send(Msg::Finish).unwrap();
        Writer::new(settings(dir.path(), None), Metrics::new()).run(rx);
        assert!(!orphaned.exists());
        let files = only(dir.path(), ".jsonl");
        assert_eq!(lines(&files[0]).len(), 5);
    }

    /// Issue 42 (2): the folder removed under a running capture: the rows the file had are
    /// counted lost (`vanished`), the folder is made again and the next rows reach a new file.
    #[test]
    fn a_removed_folder_is_made_again_and_the_lost_rows_counted() {
        let root = Scratch::new("removed");
        let dir = root.path().join("captures");
        let s = settings(&dir, None);
        let m = Metrics::new();
        let mut w = Writer::new(s.clone(), m.clone());
        w.take(Box::new(done(0, None, &[1, 2], &s)));
        w.take(Box::new(done(1, None, &[3, 4], &s)));
        w.flush();
        std::fs::remove_dir_all(&dir).unwrap();
        w.take(Box::new(done(2, None, &[5, 6], &s)));
        w.flush();
        let lost = m.capture_dropped.with_label_values(&["vanished"]).get();
        assert_eq!(lost, 3, "two on disk, one buffered");
        w.take(Box::new(done(3, None, &[7, 8], &s)));
        w.rotate();
        let files = only(&dir, ".jsonl");
        assert_eq!(files.len(), 1);
        assert_eq!(lines(&files[0]).len(), 1);
        assert_eq!(m.capture_rows.get(), 3, "on disk at some point: 2, then 1");
    }
}
