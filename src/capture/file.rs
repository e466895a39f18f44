//! The capture's files: rows put back in forwarding order, written with raw block hashes to a
//! hidden partial file, and on rotation renamed into their final ids ([`ids::Renamer`]) in a
//! finished file that is renamed into place with its metadata, so a reader never sees half a
//! file. Owns `capture.dir`; never tokenizes and never sees a prompt's text.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::ids::{Renamer, Sharing};
use super::{Done, Msg, Settings};
use crate::metrics::Metrics;

/// Rows that may wait behind one still-open request before it is given up on ("late").
const MAX_WAITING: usize = 65_536;
/// Distinct blocks a file may hold before it is finished early: the writer's memory bound
/// (about 100 bytes a block while the file is open: 100 MB).
pub const MAX_FILE_BLOCKS: usize = 1 << 20;

/// The metadata written beside each trace as `NAME.meta.json`.
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

/// A row in the partial file (raw hashes and session keys, renamed at the end).
#[derive(Serialize, Deserialize)]
struct Raw {
    /// ms from the file's start, or after the session's previous row's end.
    ms: u64,
    follows: bool,
    input: u64,
    output: u64,
    blocks: Vec<u64>,
    session: Option<u64>,
    /// Who counts as a session for `min_sessions_per_shared_block` (a request of its own is one).
    sharer: u64,
}

/// A finished row as AIPerf reads it, members in this order.
#[derive(Serialize)]
struct Row<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<u64>,
    input_length: u64,
    output_length: u64,
    hash_ids: &'a [u64],
}

struct Open {
    name: String,
    partial: PathBuf,
    out: BufWriter<File>,
    started: Instant,
    start_unix_ms: u64,
    rows: u64,
    sharing: Sharing,
    /// Each row session's previous row's end (for `delay`).
    last_end: HashMap<u64, Instant>,
}

pub struct Writer {
    settings: Settings,
    metrics: Metrics,
    next_seq: u64,
    waiting: BTreeMap<u64, Box<Done>>,
    open: Option<Open>,
    files: u64,
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
        }
    }

    /// Writes rows until told to finish (or every sender is gone); checks the time-based
    /// rotation once a second.
    pub(super) fn run(mut self, rx: Receiver<Msg>) {
        loop {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(Msg::Row(done)) => self.take(done),
                Ok(Msg::Finish) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
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
                    self.metrics
                        .capture_dropped
                        .with_label_values(&["late"])
                        .inc_by(skipped);
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

    fn write(&mut self, done: Done) {
        let output = match done.output {
            Ok(n) => n,
            Err(left) => {
                self.metrics
                    .capture_dropped
                    .with_label_values(&[left.as_str()])
                    .inc();
                return;
            }
        };
        if self.open.is_none() {
            match self.create(done.at) {
                Ok(o) => self.open = Some(o),
                Err(e) => return self.io_error(&e),
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
        let (ms, follows) = match prev {
            Some(end) => (done.at.saturating_duration_since(end).as_millis(), true),
            None => (
                done.at.saturating_duration_since(open.started).as_millis(),
                false,
            ),
        };
        if let Some(s) = p.session {
            open.last_end.insert(s, done.end);
        }
        let sharer = p.session.unwrap_or(u64::MAX - p.seq);
        for &b in &p.blocks {
            open.sharing.note(b, sharer);
        }
        let raw = Raw {
            ms: u64::try_from(ms).unwrap_or(u64::MAX),
            follows,
            input: p.input_length,
            output,
            blocks: p.blocks.clone(),
            session: p.session,
            sharer,
        };
        let line = serde_json::to_vec(&raw).map_err(std::io::Error::other);
        let wrote = line.and_then(|mut l| {
            l.push(b'\n');
            open.out.write_all(&l)
        });
        if let Err(e) = wrote {
            return self.io_error(&e);
        }
        open.rows += 1;
        self.metrics.capture_rows.inc();
        if open.rows >= self.settings.rotate_rows || open.sharing.blocks() >= MAX_FILE_BLOCKS {
            self.rotate();
        }
    }

    fn io_error(&self, e: &std::io::Error) {
        self.metrics
            .capture_dropped
            .with_label_values(&["io_error"])
            .inc();
        tracing::error!(dir = %self.settings.dir.display(), "capture: {e}; the row is lost");
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
        let partial = self.settings.dir.join(format!(".{name}.partial"));
        Ok(Open {
            out: BufWriter::new(File::create(&partial)?),
            name,
            partial,
            started: first,
            start_unix_ms,
            rows: 0,
            sharing: Sharing::new(self.settings.min_sessions),
            last_end: HashMap::new(),
        })
    }

    /// Finishes the open file (if any): renames its rows' ids, writes it and its metadata under
    /// temporary names, and renames both into place, metadata first.
    fn rotate(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        match self.finish(open) {
            Ok(()) => self.metrics.capture_files.inc(),
            Err(e) => {
                tracing::error!(dir = %self.settings.dir.display(), "capture: cannot finish a file: {e}");
            }
        }
    }

    fn finish(&self, mut open: Open) -> std::io::Result<()> {
        open.out.flush()?;
        drop(open.out);
        let dir = &self.settings.dir;
        let tmp = dir.join(format!(".{}.jsonl.tmp", open.name));
        {
            let mut out = BufWriter::new(File::create(&tmp)?);
            let input = BufReader::new(File::open(&open.partial)?);
            rename_rows(input, &mut out, &open.sharing, self.settings.key.as_ref())?;
            out.flush()?;
            out.get_ref().sync_all()?;
        }
        let s = &self.settings;
        let meta = Meta {
            format: FORMAT.into(),
            version: 1,
            start_unix_ms: open.start_unix_ms,
            block_size: s.block_size,
            key: s.key.as_ref().map(|k| k.fingerprint()),
            chat_template: match s.rendering {
                super::Rendering::Contents => "none".into(),
                super::Rendering::AsModel => "auto".into(),
            },
            tokenizer: s.tokenizer.clone(),
            min_sessions_per_shared_block: s.min_sessions,
            rows: open.rows,
        };
        let meta_tmp = dir.join(format!(".{}.meta.json.tmp", open.name));
        std::fs::write(&meta_tmp, serde_json::to_vec_pretty(&meta)?)?;
        std::fs::rename(
            &meta_tmp,
            meta_path(&dir.join(format!("{}.jsonl", open.name))),
        )?;
        std::fs::rename(&tmp, dir.join(format!("{}.jsonl", open.name)))?;
        std::fs::remove_file(&open.partial)?;
        tracing::info!(
            file = %dir.join(format!("{}.jsonl", open.name)).display(),
            rows = open.rows,
            "capture: file finished"
        );
        Ok(())
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

/// Copies the partial file's rows to `out` with their final ids and session ids.
fn rename_rows(
    input: impl BufRead,
    out: &mut impl Write,
    sharing: &Sharing,
    key: Option<&super::Key>,
) -> std::io::Result<()> {
    let mut renamer = Renamer::new(sharing, key);
    let mut ids = Vec::new();
    for line in input.lines() {
        let raw: Raw = serde_json::from_str(&line?).map_err(std::io::Error::other)?;
        ids.clear();
        ids.extend(raw.blocks.iter().map(|&b| renamer.block(b, raw.sharer)));
        let session = raw.session.map(|s| renamer.session(s));
        let row = Row {
            session_id: session.as_deref(),
            timestamp: (!raw.follows).then_some(raw.ms),
            delay: raw.follows.then_some(raw.ms),
            input_length: raw.input,
            output_length: raw.output,
            hash_ids: &ids,
        };
        serde_json::to_writer(&mut *out, &row)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}
