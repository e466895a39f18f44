//! The hash-id loaders, `mooncake_trace` and `bailian_trace`: AIPerf 0.13.0's
//! `CustomDatasetComposer` with their lines, sessions, turn order, `max_tokens`, timestamps,
//! delays and prompts built from hash-id blocks, byte for byte (BurstGPT rows are built here
//! too, as AIPerf builds them). Reads the trace file; never writes files and never draws from a
//! stream AIPerf does not draw from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::content::TraceContent;
use super::record::{self, Entry, Input};
use super::{input, synthesize, Build, Loader, Probe};
use crate::synth::corpus::hash_blocks::{self, HashBlocks, LayoutError};
use crate::synth::dataset::params::SynthParams;
use crate::synth::dataset::trace_kind::{BlockTerminator, TraceKind};
use crate::synth::dataset::{row_too_large, Conversation, Dataset, Out, Turn};
use crate::synth::error::{SynthError, TraceError};
use crate::synth::rng::uuid::uuid4;
use crate::synth::rng::DerivedRng;
use crate::synth::tokenizer::Tokenizer;

/// `mooncake_trace`: the fallback of detection (AIPerf's structural inference between the two
/// hash-id types lands here when bailian does not claim the line).
pub const MOONCAKE: Loader = Loader {
    kind: TraceKind::MooncakeTrace,
    can_load: |_| Ok(true),
    build: |b, content, out| build_file(b, TraceKind::MooncakeTrace, content, out),
};

/// `bailian_trace`: claims a first line only bailian's model accepts.
pub const BAILIAN: Loader = Loader {
    kind: TraceKind::BailianTrace,
    can_load: |p| Ok(hash_id_kind(p)? == TraceKind::BailianTrace),
    build: |b, content, out| build_file(b, TraceKind::BailianTrace, content, out),
};

/// Which of the two hash-id types the first line is (AIPerf's structural inference).
fn hash_id_kind(p: &Probe<'_>) -> Result<TraceKind, TraceError> {
    if p.first.is_some() || p.whole {
        return TraceFile::probe(p).detect(None);
    }
    // A first line longer than the prefix: read it as the type its keys resemble, whose loader
    // then reads it (within the record cap) and names what is wrong.
    match p.keys.iter().any(|k| k == "chat_id") {
        true => Ok(TraceKind::BailianTrace),
        false => Ok(TraceKind::MooncakeTrace),
    }
}

fn build_file(
    b: &Build<'_>,
    kind: TraceKind,
    content: &mut dyn TraceContent,
    out: &mut Out<'_>,
) -> Result<(), SynthError> {
    let mut file = TraceFile::read(b.path)?;
    let params = TraceParams::of(b.params, kind);
    let (kind, block_size, entries) = read_entries(&file, &params)?;
    // The entries hold all the replay reads of the lines (errors name lines by number), and
    // the lines were as large as the file.
    file.lines = Vec::new();
    build_entries(
        &file,
        kind,
        entries,
        &params,
        b.tokenizer,
        content,
        b.root_seed,
        block_size,
        out,
    )
}

/// Hash-id sequences decoded together, in parallel (bounds the sequences held at once).
const DECODE_BATCH: usize = 512;

/// Tokens of hash-id sequences held before they are decoded, whatever their number: 512 lines
/// of 10M tokens each would otherwise be 20 GB of token ids (4M tokens: 16 MB of ids and
/// about as much text).
const DECODE_TOKENS: usize = 4 << 20;

/// A trace file as read from disk: its bytes decide the hash-id scope.
#[derive(Debug, Clone)]
pub struct TraceFile {
    pub path: PathBuf,
    /// The first 16 hex digits of the file's sha256 (AIPerf's `trace_id`).
    pub trace_id: String,
    /// `(line number, stripped text)` of every non-blank line.
    pub lines: Vec<(usize, String)>,
}

/// Every non-blank line of `reader`, each within the record cap.
pub fn read_lines(mut reader: input::TraceReader) -> Result<Vec<(usize, String)>, TraceError> {
    let mut lines = Vec::new();
    while let Some(l) = reader.next_line()? {
        lines.push(l);
    }
    Ok(lines)
}

impl TraceFile {
    /// The probed first line as a one-line file, for detection.
    fn probe(p: &Probe<'_>) -> Self {
        TraceFile {
            path: p.path.to_path_buf(),
            trace_id: String::new(),
            lines: p
                .first
                .map(|(n, l)| (n, l.to_owned()))
                .into_iter()
                .collect(),
        }
    }

    /// Reads `path` as a stream (gunzipped when it is gzip): UTF-8, universal newlines, blank
    /// lines skipped, each line within [`input::MAX_RECORD_BYTES`].
    pub fn read(path: &Path) -> Result<Self, TraceError> {
        let lines = read_lines(input::TraceReader::open(path)?)?;
        Ok(TraceFile {
            path: path.to_path_buf(),
            // AIPerf hashes the file as it is on disk (compressed, for a .gz).
            trace_id: input::trace_id_of(path)?,
            lines,
        })
    }

    /// The same from bytes already in memory (`path` is used for messages only).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self, TraceError> {
        let reader = input::TraceReader::from_read(
            path,
            std::io::Cursor::new(bytes.to_vec()),
            input::Limits::default(),
        )?;
        Ok(TraceFile {
            path: path.to_path_buf(),
            trace_id: hash_blocks::trace_id(bytes),
            lines: read_lines(reader)?,
        })
    }

    fn line_error(&self, line: usize, message: impl Into<String>) -> TraceError {
        TraceError::Line {
            path: self.path.clone(),
            line,
            message: message.into(),
        }
    }

    /// The loader for this file: `kind` when given, else the one that accepts the first line
    /// (AIPerf's structural inference between the two).
    pub fn detect(&self, kind: Option<TraceKind>) -> Result<TraceKind, TraceError> {
        if let Some(k) = kind {
            return Ok(k);
        }
        let Some((line, text)) = self.lines.first() else {
            return Err(self.empty("a mooncake_trace or bailian_trace"));
        };
        let ok: Vec<TraceKind> = [TraceKind::MooncakeTrace, TraceKind::BailianTrace]
            .into_iter()
            .filter(|k| record::parse(*k, *line, text).is_ok())
            .collect();
        match ok.as_slice() {
            [k] => Ok(*k),
            // Neither accepts it: read it as the type it resembles, whose error names the field.
            [] if text.contains("\"chat_id\"") => Ok(TraceKind::BailianTrace),
            [] => Ok(TraceKind::MooncakeTrace),
            _ => Err(self.line_error(
                *line,
                "both mooncake_trace and bailian_trace accept this line; pass \
                 --custom-dataset-type",
            )),
        }
    }

    fn empty(&self, kind: &str) -> TraceError {
        TraceError::Empty {
            path: self.path.clone(),
            kind: kind.to_owned(),
        }
    }

    /// Every line parsed as `kind`; the first bad line stops it with its field named.
    pub fn entries(&self, kind: TraceKind) -> Result<Vec<Entry>, TraceError> {
        if self.lines.is_empty() {
            return Err(self.empty(kind.as_str()));
        }
        self.lines
            .iter()
            .map(|(line, text)| {
                record::parse(kind, *line, text).map_err(|(field, why)| {
                    let hint = if record::parse(kind.other(), *line, text).is_ok() {
                        format!(
                            "; this looks like a {} line: pass --custom-dataset-type {}",
                            kind.other(),
                            kind.other()
                        )
                    } else {
                        String::new()
                    };
                    let what = if field.is_empty() {
                        "the line".to_owned()
                    } else {
                        format!("field `{field}`")
                    };
                    self.line_error(*line, format!("{kind} {what} {why}{hint}"))
                })
            })
            .collect()
    }
}

/// What shapes a trace dataset besides the file.
#[derive(Debug, Clone, Default)]
pub struct TraceParams {
    /// `--custom-dataset-type` (None: detected from the first line).
    pub kind: Option<TraceKind>,
    /// `--isl-block-size` (None: 512 for mooncake, 16 for bailian).
    pub isl_block_size: Option<usize>,
    pub random_seed: Option<u64>,
    pub terminator: BlockTerminator,
    /// `--osl` / `--osl-stddev`: `max_tokens` for lines without `output_length`.
    pub osl: Option<u64>,
    pub osl_stddev: f64,
    /// `--system-prompt`, given to every conversation.
    pub system_prompt: Option<String>,
    /// The `--synthesis-*` multipliers (AIPerf's Synthesizer runs when one is not 1).
    pub multipliers: synthesize::Multipliers,
    /// `--synthesis-max-isl`: lines with a longer `input_length` are skipped (before the
    /// Synthesizer, which also clamps its new lengths to it).
    pub max_isl: Option<i64>,
    /// `--synthesis-max-osl`: output lengths are capped to it after the Synthesizer.
    pub max_osl: Option<i64>,
}

impl TraceParams {
    /// The trace flags of a run's `params`, for a trace of `kind`.
    pub fn of(params: &SynthParams, kind: TraceKind) -> Self {
        TraceParams {
            kind: Some(kind),
            isl_block_size: params.isl_block_size,
            random_seed: params.random_seed,
            terminator: params.trace_block_terminator,
            osl: params.osl,
            osl_stddev: params.osl_stddev,
            system_prompt: params.system_prompt.clone(),
            multipliers: params.multipliers(),
            max_isl: params.synthesis_max_isl.map(|m| m as i64),
            max_osl: params.synthesis_max_osl.map(|m| m as i64),
        }
    }
}

/// Groups entries into sessions in AIPerf's order: mooncake by `session_id` (or a fresh id per
/// line), bailian by the root of each `parent_chat_id` chain, sorted by `turn`.
fn group(kind: TraceKind, entries: Vec<Entry>, seeded: bool) -> Vec<(String, Vec<Entry>)> {
    let mut order: Vec<(String, Vec<Entry>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut push = |key: String, e: Entry, order: &mut Vec<(String, Vec<Entry>)>| {
        let i = *index.entry(key.clone()).or_insert_with(|| {
            order.push((key, Vec::new()));
            order.len() - 1
        });
        order[i].1.push(e);
    };
    match kind {
        TraceKind::BailianTrace => {
            let parent: HashMap<i64, i64> = entries
                .iter()
                .filter_map(|e| e.chat.map(|c| (c.chat_id, c.parent_chat_id)))
                .collect();
            let mut roots: HashMap<i64, i64> = HashMap::new();
            for e in entries {
                let id = e.chat.map_or(-1, |c| c.chat_id);
                let root = find_root(id, &parent, &mut roots);
                push(root.to_string(), e, &mut order);
            }
            for (_, turns) in &mut order {
                // A stable sort, as Python's list.sort.
                turns.sort_by_key(|e| e.chat.map_or(1, |c| c.turn));
            }
        }
        // BurstGPT rows are independent requests: one session each, named as mooncake's.
        _ => {
            let mut counter = 0usize;
            for e in entries {
                let key = match &e.session_id {
                    Some(s) => s.clone(),
                    None if seeded => {
                        counter += 1;
                        format!("session_{:06}", counter - 1)
                    }
                    None => uuid4(),
                };
                push(key, e, &mut order);
            }
        }
    }
    order
}

/// Bailian's `find_root`: follow parents until a root (-1), a missing or self parent, or a
/// cycle; caches the walked path (path compression), exactly as AIPerf.
fn find_root(chat_id: i64, parent: &HashMap<i64, i64>, cache: &mut HashMap<i64, i64>) -> i64 {
    if let Some(r) = cache.get(&chat_id) {
        return *r;
    }
    let mut path = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut current = chat_id;
    while let Some(&p) = parent.get(&current) {
        if p == -1 || !seen.insert(current) {
            break;
        }
        if p == current || !parent.contains_key(&p) {
            break;
        }
        path.push(current);
        current = p;
    }
    for node in path {
        cache.insert(node, current);
    }
    cache.insert(chat_id, current);
    current
}

/// Mooncake's rule: a session is all verbatim (`messages` or `payload`, not both) or all
/// synthesized/text.
fn check_session(file: &TraceFile, sid: &str, entries: &[Entry]) -> Result<(), TraceError> {
    let is_msg = |e: &&Entry| matches!(e.input, Input::Messages { .. });
    let is_payload = |e: &&Entry| matches!(e.input, Input::Payload(_));
    let msgs: Vec<&Entry> = entries.iter().filter(is_msg).collect();
    let payloads: Vec<&Entry> = entries.iter().filter(is_payload).collect();
    if let (Some(m), Some(p)) = (msgs.first(), payloads.first()) {
        return Err(file.line_error(
            m.line.max(p.line),
            format!(
                "session {sid:?} mixes {} `messages` line(s) and {} `payload` line(s) (lines {} \
                 and {}); each session must use exactly one mode",
                msgs.len(),
                payloads.len(),
                m.line,
                p.line
            ),
        ));
    }
    let verbatim = msgs.len() + payloads.len();
    if verbatim > 0 && verbatim < entries.len() {
        let first_raw = msgs.first().or(payloads.first()).map_or(0, |e| e.line);
        let other = entries
            .iter()
            .find(|e| matches!(e.input, Input::Length(_) | Input::Text(_)))
            .map_or(0, |e| e.line);
        return Err(file.line_error(
            first_raw.max(other),
            format!(
                "session {sid:?} mixes raw `messages`/`payload` lines (line {first_raw}) with \
                 synthesized or text prompts (line {other}); AIPerf does not support mixed \
                 mooncake sessions: give them different session_ids"
            ),
        ));
    }
    Ok(())
}

/// Builds the dataset AIPerf 0.13.0 builds for this trace file, with `content` supplying the
/// prompt corpus (made under the same `root_seed`).
pub fn build(
    file: &TraceFile,
    params: &TraceParams,
    tokenizer: &Tokenizer,
    content: &mut dyn TraceContent,
    root_seed: u64,
) -> Result<Dataset, SynthError> {
    crate::synth::dataset::collect(|out| {
        build_into(file, params, tokenizer, content, root_seed, out)
    })
}

/// [`build`], each conversation handed to `out` as soon as its prompts are decoded.
pub fn build_into(
    file: &TraceFile,
    params: &TraceParams,
    tokenizer: &Tokenizer,
    content: &mut dyn TraceContent,
    root_seed: u64,
    out: &mut Out<'_>,
) -> Result<(), SynthError> {
    let (kind, block_size, entries) = read_entries(file, params)?;
    build_entries(
        file, kind, entries, params, tokenizer, content, root_seed, block_size, out,
    )
}

/// The file's type, block size and entries (those `--synthesis-max-isl` keeps).
fn read_entries(
    file: &TraceFile,
    params: &TraceParams,
) -> Result<(TraceKind, usize, Vec<Entry>), SynthError> {
    let kind = file.detect(params.kind)?;
    let block_size = params
        .isl_block_size
        .unwrap_or_else(|| kind.default_block_size());
    if block_size == 0 {
        return Err(SynthError::invalid("--isl-block-size must be at least 1"));
    }
    let mut entries = file.entries(kind)?;
    if let Some(max) = params.max_isl {
        // AIPerf's `_filter_and_cap_trace`, before sessions are formed (mooncake's session
        // counter only counts the lines kept).
        entries.retain(|e| !matches!(e.input, Input::Length(n) if n > max));
    }
    Ok((kind, block_size, entries))
}

/// AIPerf's synthesis step of `load_dataset`: the Synthesizer when a multiplier is set, then
/// the `--synthesis-max-osl` cap.
fn reshape(
    file: &TraceFile,
    kind: TraceKind,
    sessions: &mut [(String, Vec<Entry>)],
    params: &TraceParams,
    root_seed: u64,
    block_size: usize,
) -> Result<(), TraceError> {
    if params.multipliers.is_active() {
        let mut rng = DerivedRng::derive(root_seed, synthesize::RNG_STREAM).py;
        let limits = (params.max_isl, params.max_osl);
        synthesize::synthesize(
            sessions,
            kind,
            &params.multipliers,
            block_size,
            limits,
            &mut rng,
        )
        .map_err(|e| {
            file.line_error(
                e.line,
                format!(
                    "field `input_length` {} is shorter than the line's shared prefix blocks                      ({} tokens at --isl-block-size {block_size}), so the synthesis multipliers                      cannot split it into prefix and prompt (AIPerf refuses it too); fix the                      line or check --isl-block-size",
                    e.input_length, e.prefix_tokens
                ),
            )
        })?;
        // The multipliers scale lengths that were within the ceiling when read.
        for e in sessions.iter().flat_map(|(_, es)| es.iter()) {
            let lengths = [("input_length", Some(&e.input)), ("output_length", None)];
            for (field, input) in lengths {
                let n = match input {
                    Some(Input::Length(n)) => *n,
                    Some(_) => continue,
                    None => e.output_length.unwrap_or(0),
                };
                if let Some(why) = input::over_ceiling(n) {
                    return Err(file.line_error(
                        e.line,
                        format!(
                            "field `{field}` after the --synthesis-* multipliers {why}; lower \
                             the multipliers or pass --synthesis-max-isl/--synthesis-max-osl"
                        ),
                    ));
                }
            }
        }
    }
    if let Some(cap) = params.max_osl {
        for e in sessions.iter_mut().flat_map(|(_, es)| es.iter_mut()) {
            e.output_length = e.output_length.map(|n| n.min(cap));
        }
    }
    Ok(())
}

/// [`build`] for entries already read (a BurstGPT CSV's rows, say), in `file`'s hash-id scope.
#[allow(
    clippy::too_many_arguments,
    reason = "the replay's inputs, each from a different owner (the file, its rows, the flags, the content, the seed, the block size BurstGPT fixes); a struct would only carry them one call"
)]
pub fn build_entries(
    file: &TraceFile,
    kind: TraceKind,
    entries: Vec<Entry>,
    params: &TraceParams,
    tokenizer: &Tokenizer,
    content: &mut dyn TraceContent,
    root_seed: u64,
    block_size: usize,
    out: &mut Out<'_>,
) -> Result<(), SynthError> {
    let mut sessions = group(kind, entries, params.random_seed.is_some());
    reshape(file, kind, &mut sessions, params, root_seed, block_size)?;
    if kind == TraceKind::MooncakeTrace {
        for (sid, entries) in &sessions {
            check_session(file, sid, entries)?;
        }
    }
    out.unscheduled = sessions
        .iter()
        .flat_map(|(_, es)| es)
        .all(|e| e.timestamp.is_none() && e.delay.is_none());
    Replay {
        file,
        params,
        tokenizer,
        block_size,
        max_tokens_rng: DerivedRng::derive(root_seed, "composer.turn.max_tokens").py,
        batch: Vec::new(),
        seqs: Vec::new(),
        seq_tokens: 0,
    }
    .run(sessions, content, out)
}

fn entries_len(batch: &[Pending]) -> usize {
    batch.last().map_or(0, |p| p.entries.len())
}

/// A session whose prompts are being made: its lines, and each line's text once known.
struct Pending {
    sid: String,
    entries: Vec<Entry>,
    texts: Vec<Option<String>>,
    /// Bytes of text decoded so far (checked against the row cap as they come).
    bytes: u64,
}

/// The replay of a hash-id trace's sessions, conversation by conversation: prompts are made in
/// AIPerf's request order (one flat order, session by session), hash-id sequences decoded in
/// parallel batches (they make no draws when decoded), and each session handed on once all its
/// prompts are text, so only a batch of sessions is ever held, never the dataset.
struct Replay<'a> {
    file: &'a TraceFile,
    params: &'a TraceParams,
    tokenizer: &'a Tokenizer,
    block_size: usize,
    /// `max_tokens` drawn around `--osl`, in conversation order (its own stream).
    max_tokens_rng: crate::synth::rng::PyRandom,
    batch: Vec<Pending>,
    /// ((session in `batch`, line in it), tokens) waiting to be decoded.
    seqs: Vec<((usize, usize), Vec<u32>)>,
    seq_tokens: usize,
}

impl Replay<'_> {
    fn run(
        mut self,
        sessions: Vec<(String, Vec<Entry>)>,
        content: &mut dyn TraceContent,
        out: &mut Out<'_>,
    ) -> Result<(), SynthError> {
        let separator = match self.params.terminator {
            BlockTerminator::Aiperf => self
                .tokenizer
                .bos_token_id()
                .or(self.tokenizer.eos_token_id()),
            BlockTerminator::None => None,
        };
        let mut blocks =
            HashBlocks::new(content.corpus_seed(), self.file.trace_id.clone(), separator);
        let corpus = content.block_corpus();
        for (sid, entries) in sessions {
            self.batch.push(Pending {
                sid,
                texts: Vec::with_capacity(entries.len()),
                entries,
                bytes: 0,
            });
            let lines = entries_len(&self.batch);
            for i in 0..lines {
                // This session is always the batch's last (those before it may have gone).
                let at = self.batch.len() - 1;
                let e = &self.batch[at].entries[i];
                let text = match &e.input {
                    Input::Text(t) => Some(t.clone()),
                    Input::Messages { .. } | Input::Payload(_) => Some(String::new()),
                    Input::Length(n) if e.hash_ids.is_empty() => Some(content.plain_prompt(*n)?),
                    Input::Length(n) => {
                        let seq = blocks
                            .token_sequence(
                                corpus.tokens(),
                                *n,
                                &e.hash_ids,
                                self.block_size,
                                e.line,
                                &mut |k| content.sample_tokens(k),
                            )
                            .map_err(|err| layout_error(self.file, e, *n, self.block_size, err))?;
                        self.seq_tokens += seq.len();
                        self.seqs.push(((at, i), seq));
                        None
                    }
                };
                let p = &mut self.batch[at];
                p.bytes += text.as_ref().map_or(0, |t| t.len() as u64);
                p.texts.push(text);
                self.check_row(at, i, out.max_row_bytes)?;
                if self.seqs.len() >= DECODE_BATCH || self.seq_tokens >= DECODE_TOKENS {
                    self.decode()?;
                    self.check_row(at, i, out.max_row_bytes)?;
                    // Every session before this one is whole text now.
                    self.emit(at, out)?;
                }
            }
        }
        self.decode()?;
        let done = self.batch.len();
        self.emit(done, out)
    }

    /// Decodes the waiting sequences into their lines' texts.
    fn decode(&mut self) -> Result<(), SynthError> {
        let tokenizer = self.tokenizer;
        let decoded: Vec<String> = self
            .seqs
            .par_iter()
            .map(|(_, seq)| tokenizer.decode(seq))
            .collect::<Result<_, _>>()?;
        for (((s, i), _), text) in self.seqs.drain(..).zip(decoded) {
            let p = &mut self.batch[s];
            p.bytes += text.len() as u64;
            p.texts[i] = Some(text);
        }
        self.seq_tokens = 0;
        Ok(())
    }

    /// Refuses session `at` once its text passes `cap`, naming the line that took it over.
    fn check_row(&self, at: usize, i: usize, cap: u64) -> Result<(), SynthError> {
        let p = &self.batch[at];
        if p.bytes <= cap {
            return Ok(());
        }
        let line = p.entries[i].line;
        Err(self
            .file
            .line_error(line, row_too_large(&p.sid, p.bytes, i + 1, cap))
            .into())
    }

    /// Hands on the first `n` sessions of the batch (all their texts decoded), in order.
    fn emit(&mut self, n: usize, out: &mut Out<'_>) -> Result<(), SynthError> {
        let osl_stddev = self.params.osl_stddev.trunc();
        for p in self.batch.drain(..n) {
            let mut turns = Vec::with_capacity(p.entries.len());
            for (e, text) in p.entries.into_iter().zip(p.texts) {
                let max_tokens = match (e.output_length, self.params.osl) {
                    // At least 1: checked when the line was read.
                    (Some(n), _) => Some(n as u64),
                    (None, Some(m)) if m > 0 => Some(
                        self.max_tokens_rng
                            .sample_positive_normal_integer(m as f64, osl_stddev)
                            .max(1),
                    ),
                    _ => None,
                };
                let (raw_messages, raw_tools, raw_payload) = match e.input {
                    Input::Messages { messages, tools } => (Some(messages), tools, None),
                    Input::Payload(p) => (None, None, Some(p)),
                    _ => (None, None, None),
                };
                turns.push(Turn {
                    model: None,
                    text: text.unwrap_or_default(),
                    max_tokens,
                    timestamp: e.timestamp,
                    delay: e.delay,
                    raw_messages,
                    raw_tools,
                    raw_payload,
                    extra_body: e.extra,
                    agentic: None,
                });
            }
            out.emit(Conversation {
                session_id: p.sid,
                system_message: self.params.system_prompt.clone(),
                user_context_message: None,
                turns,
                agentic: None,
            })?;
        }
        // The sequences waiting point into the sessions left, now `n` places earlier.
        for ((s, _), _) in &mut self.seqs {
            *s -= n;
        }
        Ok(())
    }
}

fn layout_error(
    file: &TraceFile,
    e: &Entry,
    n: i64,
    block_size: usize,
    err: LayoutError,
) -> TraceError {
    let m = e.hash_ids.len();
    let message = match err {
        LayoutError::NotPositive => format!(
            "field `input_length` is {n}, but a line with hash_ids needs a positive input_length"
        ),
        LayoutError::FinalBlock { final_size } => format!(
            "field `input_length` {n} does not fit {m} hash_ids of {block_size} tokens: the last \
             block would hold {final_size} tokens (must be 1..={block_size}); check \
             --isl-block-size (default {} for this trace type)",
            match e.chat {
                Some(_) => TraceKind::BailianTrace.default_block_size(),
                None => TraceKind::MooncakeTrace.default_block_size(),
            }
        ),
        LayoutError::SizeConflict {
            hash_id,
            size,
            first_size,
            first_line,
        } => format!(
            "field `hash_ids`: hash_id {hash_id} is needed at {size} tokens here but was built \
             at {first_size} tokens on line {first_line}; a hash_id maps to one fixed block \
             size, so the trace is corrupt or --isl-block-size ({block_size}) disagrees with \
             the recorded blocks"
        ),
    };
    file.line_error(e.line, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> TraceFile {
        TraceFile::from_bytes(Path::new("t.jsonl"), text.as_bytes()).unwrap()
    }

    fn sessions(f: &TraceFile) -> Vec<(String, Vec<Entry>)> {
        let entries = f.entries(TraceKind::MooncakeTrace).unwrap();
        group(TraceKind::MooncakeTrace, entries, true)
    }

    #[test]
    fn lines_and_numbers() {
        let f = file("\n{\"a\":1}\r\n  \r{\"b\":2}\n");
        assert_eq!(
            f.lines,
            vec![(2, "{\"a\":1}".to_owned()), (4, "{\"b\":2}".to_owned())]
        );
        let e = TraceFile::from_bytes(Path::new("x"), b"{}\n\xff\n").unwrap_err();
        assert_eq!(e.to_string(), "x:2: is not valid UTF-8");
        let e = file("\n\n").entries(TraceKind::MooncakeTrace).unwrap_err();
        assert!(
            e.to_string().starts_with("t.jsonl holds no trace lines"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_line_and_field_and_hint_the_other_kind() {
        let f = file("{\"input_length\": 5}\n\n{\"chat_id\":1,\"timestamp\":1,\"input_length\":3,\"output_length\":2,\"type\":\"text\"}\n");
        let e = f.entries(TraceKind::MooncakeTrace).unwrap_err().to_string();
        assert!(
            e.starts_with("t.jsonl:3: mooncake_trace field `type`")
                && e.ends_with("pass --custom-dataset-type bailian_trace"),
            "{e}"
        );
        assert_eq!(f.detect(None).unwrap(), TraceKind::MooncakeTrace);
    }

    #[test]
    fn bailian_roots_follow_aiperf() {
        let parent: HashMap<i64, i64> = [(1, -1), (2, 1), (3, 2), (4, 99), (5, 6), (6, 5)]
            .into_iter()
            .collect();
        let mut cache = HashMap::new();
        assert_eq!(find_root(3, &parent, &mut cache), 1);
        assert_eq!(find_root(4, &parent, &mut cache), 4);
        // A cycle stops where it closes.
        assert_eq!(find_root(5, &parent, &mut cache), 5);
        assert_eq!(cache.get(&2), Some(&1));
    }

    #[test]
    fn mooncake_sessions_keep_first_appearance_order() {
        let f = file(
            "{\"input_length\":1,\"session_id\":\"b\"}\n{\"input_length\":1}\n{\"input_length\":1,\"session_id\":\"a\"}\n{\"input_length\":2,\"session_id\":\"b\"}\n{\"input_length\":1}\n",
        );
        let g = sessions(&f);
        let keys: Vec<(&str, usize)> = g.iter().map(|(k, v)| (k.as_str(), v.len())).collect();
        assert_eq!(
            keys,
            [
                ("b", 2),
                ("session_000000", 1),
                ("a", 1),
                ("session_000001", 1)
            ]
        );
    }

    #[test]
    fn mixed_sessions_are_refused() {
        let f = file(
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"session_id\":\"s\"}\n{\"text_input\":\"y\",\"session_id\":\"s\"}\n",
        );
        let g = sessions(&f);
        let e = check_session(&f, &g[0].0, &g[0].1).unwrap_err().to_string();
        assert!(e.starts_with("t.jsonl:2: session \"s\" mixes"), "{e}");
    }
}
