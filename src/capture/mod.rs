//! Capture: a replayable, privacy-preserving hash-id trace (mooncake rows, as AIPerf 0.13.0's
//! `mooncake_trace` loader reads them) of the traffic kvbust forwards. The cache model's worker
//! tokenizes each request once and hands a [`Pending`] row (lengths, block hashes, session) to
//! the request's ticket; when the response ends the ticket hands it here with the output length,
//! and one writer thread puts rows in forwarding order, into files it finishes and renames into
//! `capture.dir` ([`file`]). Only lengths, timings and the sharing structure are written: never
//! a byte of a prompt. Never on the request path, never tokenizes.

pub mod file;
pub mod ids;
pub mod merge;
pub mod turns;

use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
pub use ids::Key;

/// What a row's tokens are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendering {
    /// Each message's text on its own, no role or template (`capture.chat_template = "none"`):
    /// a prompt synthesis replays as one text counts as that text.
    Contents,
    /// The prompt as the cache model counts it, chat template included (`"auto"`); requests are
    /// then whole prompts, never split into a session's turns.
    AsModel,
}

/// The capture's settings, resolved from `[capture]` at start.
#[derive(Debug, Clone)]
pub struct Settings {
    pub dir: PathBuf,
    pub block_size: usize,
    pub rendering: Rendering,
    pub rotate: Duration,
    pub rotate_rows: u64,
    pub min_sessions: usize,
    /// `capture.key_file`'s key: finished files' ids stay keyed (and their metadata names it).
    pub key: Option<Key>,
    /// What block and session ids are keyed with from the first row on: `key`, or a key made
    /// for this process ([`Key::random`]), so no file, the partial included, holds an id
    /// anyone can compute from a known prompt or session header.
    pub hash_key: Key,
    /// `capture.flush`: rows reach the partial file within this long.
    pub flush: Duration,
    /// The tokenizer the rows were counted with, for the file's metadata.
    pub tokenizer: String,
}

/// A row as the model's worker computed it, waiting for its response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Forwarding order (rows are written in it).
    pub seq: u64,
    pub input_length: u64,
    /// Raw block hashes ([`ids::chain`]); renamed when the file is finished.
    pub blocks: Vec<u64>,
    /// The row's session; `None`: a request of its own.
    pub session: Option<u64>,
    /// A later turn of `session` (written with `delay`).
    pub follows: bool,
}

/// Why a request has no row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// A non-2xx answer, or none.
    Failed,
    /// The response did not end normally (the client went away, the upstream cut it).
    Cancelled,
}

impl Left {
    pub fn as_str(self) -> &'static str {
        match self {
            Left::Failed => "failed",
            Left::Cancelled => "cancelled",
        }
    }
}

/// A request whose response has ended.
#[derive(Debug, Clone)]
pub struct Done {
    pub pending: Pending,
    /// When the request arrived and when its response ended.
    pub at: Instant,
    pub end: Instant,
    /// The output length (the server's `completion_tokens`, else the streamed token events).
    pub output: Result<u64, Left>,
}

enum Msg {
    Row(Box<Done>),
    /// Finish the open file and stop.
    Finish,
}

/// The writer's handle: rows in, files out.
pub struct Capture {
    tx: Mutex<Option<Sender<Msg>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub settings: Settings,
}

impl Capture {
    /// Makes `capture.dir` and starts the writer thread.
    pub fn start(settings: Settings, metrics: Metrics) -> Result<Arc<Self>, String> {
        std::fs::create_dir_all(&settings.dir).map_err(|e| {
            format!(
                "capture.dir: cannot create {}: {e}; point it at a writable folder",
                settings.dir.display()
            )
        })?;
        let (tx, rx) = channel();
        let writer = file::Writer::new(settings.clone(), metrics);
        let handle = std::thread::Builder::new()
            .name("kvbust-capture".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| format!("cannot start the capture thread: {e}"))?;
        Ok(Arc::new(Self {
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(handle)),
            settings,
        }))
    }

    /// Hands a finished request to the writer. Never blocks.
    pub fn finished(&self, done: Done) {
        let tx = crate::sync::lock(&self.tx);
        if let Some(tx) = tx.as_ref() {
            let _ = tx.send(Msg::Row(Box::new(done)));
        }
    }

    /// Finishes the open file and waits for the writer (at shutdown, after the drain, when every
    /// request has handed in its row). Blocks: call it off the async runtime.
    pub fn finish(&self) {
        if let Some(tx) = crate::sync::lock(&self.tx).take() {
            let _ = tx.send(Msg::Finish);
        }
        if let Some(h) = crate::sync::lock(&self.writer).take() {
            let _ = h.join();
        }
    }
}
