//! The synthesized dataset: conversations, turns, and their JSONL forms; below it, the layer
//! that builds them (parameters, composer, cache-bust marker, exports, trace replay).
//! This file owns the data shapes and serialisation; must never generate content.

pub mod agentic_code;
pub mod composer;
pub mod export;
pub mod marker;
pub mod params;
pub mod trace;
pub mod trace_kind;

use serde::Serialize;

use crate::synth::dataset::trace::agentic::{Topology, TurnInfo};
use serde_json::value::RawValue;
use serde_json::Number;

/// One user turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Turn {
    /// The model this turn is sent to (AIPerf's `Turn.model`): `--model` on every turn, set by
    /// [`Dataset::assign_models`]; an agentic turn carries its own in `agentic`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The prompt text (empty for a verbatim `messages` / `payload` trace turn).
    pub text: String,
    /// The OSL for this turn, when one is configured.
    pub max_tokens: Option<u64>,
    /// When to send it, in ms from the start (traces); int or float as the trace wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<Number>,
    /// How long to wait after the previous turn, in ms (multi-turn traces).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<Number>,
    /// A trace's verbatim OpenAI `messages` (sent instead of `text`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_messages: Option<RawJson>,
    /// The `tools` that go with `raw_messages`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_tools: Option<RawJson>,
    /// A trace's complete request body, sent verbatim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_payload: Option<RawJson>,
    /// A trace's `extra`: members shallow-merged into the request body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_body: Option<RawJson>,
    /// An agentic trace's turn: its delta messages, model and topology links.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub agentic: Option<Box<TurnInfo>>,
}

/// A JSON value kept byte for byte as the input wrote it (member order included).
#[derive(Debug, Clone)]
pub struct RawJson(pub Box<RawValue>);

impl RawJson {
    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for RawJson {}

impl Serialize for RawJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// One conversation (AIPerf `Conversation`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Conversation {
    pub session_id: String,
    pub system_message: Option<String>,
    pub user_context_message: Option<String>,
    pub turns: Vec<Turn>,
    /// An agentic trace's conversation: where it sits in the agent tree.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub agentic: Option<Box<Topology>>,
}

/// The default of `kvbust synth --max-row-bytes`: the prompt text one conversation may hold.
/// A replay is built and written one conversation at a time, so this is what bounds its memory
/// (a conversation is held as tokens, as text and once more as it is written, so about three
/// times this); 256 MiB
/// is six times the largest single prompt a trace may ask for (10M tokens, about 40 MB of text),
/// and a real agentic session's deltas stay far below it.
pub const DEFAULT_MAX_ROW_BYTES: u64 = 256 << 20;

/// What a streamed replay's sink is handed: a conversation, and whether no turn of the whole
/// dataset has a timestamp or delay (known from the trace before any prompt is made; the
/// mooncake export then writes the simplest schedule, which it otherwise decides on the whole
/// dataset).
pub type Sink<'a> =
    dyn FnMut(Conversation, bool) -> Result<(), crate::synth::error::SynthError> + 'a;

/// Where a streamed replay hands each conversation, in output order, as soon as it is built:
/// `sink` writes it (or collects it), and no conversation may hold more than `max_row_bytes`
/// of prompt text (the build stops with an error naming the row before it holds more).
pub struct Out<'a> {
    pub sink: &'a mut Sink<'a>,
    pub max_row_bytes: u64,
    /// The hash-id blocks a trace that mints its own (TraceLab) may ask for in all.
    pub max_blocks: u64,
    /// Set by the builder before its first conversation: see [`Sink`].
    pub unscheduled: bool,
}

impl Out<'_> {
    /// Hands `conv` to the sink.
    pub fn emit(&mut self, conv: Conversation) -> Result<(), crate::synth::error::SynthError> {
        (self.sink)(conv, self.unscheduled)
    }
}

/// Collects a streamed build into a [`Dataset`] (the proxy serves its dataset from memory, so
/// nothing is capped there).
pub fn collect(
    build: impl FnOnce(&mut Out<'_>) -> Result<(), crate::synth::error::SynthError>,
) -> Result<Dataset, crate::synth::error::SynthError> {
    let mut conversations = Vec::new();
    let mut sink = |c: Conversation, _| {
        conversations.push(c);
        Ok(())
    };
    build(&mut Out {
        sink: &mut sink,
        max_row_bytes: u64::MAX,
        max_blocks: u64::MAX,
        unscheduled: false,
    })?;
    Ok(Dataset { conversations })
}

/// Why a conversation is refused for holding more than `cap` bytes of prompt text: what was
/// reached, where, and the two ways out.
pub fn row_too_large(session: &str, bytes: u64, turns: usize, cap: u64) -> String {
    format!(
        "conversation {session:?} holds {bytes} bytes of prompt text by its turn {turns}, more \
         than --max-row-bytes ({}); kvbust builds and writes one conversation at a time and \
         this caps what one may hold in memory (about three times it while it is written). Raise \
         --max-row-bytes if the machine has the memory, or cut the trace (--synthesis-max-isl \
         skips longer requests)",
        crate::units::ByteSize(cap)
    )
}

/// A whole synthetic dataset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dataset {
    pub conversations: Vec<Conversation>,
}

impl Dataset {
    /// `names` on every turn that has no model yet, in turn order round robin, as AIPerf's
    /// composer finalizes each turn (`_finalize_turn`, `--model-selection-strategy
    /// round_robin`, its default): one name goes on every turn. An agentic turn's own model
    /// (a trace's, mapped onto `--model`) stays.
    pub fn assign_models(&mut self, names: &[&str]) {
        if names.is_empty() {
            return;
        }
        let mut next = 0;
        for conv in &mut self.conversations {
            conv.assign_models(names, &mut next);
        }
    }
}

impl Conversation {
    /// [`Dataset::assign_models`] for one conversation, `next` carrying the round robin from
    /// the conversations before it (a streamed build assigns them one at a time).
    pub fn assign_models(&mut self, names: &[&str], next: &mut usize) {
        if names.is_empty() {
            return;
        }
        for turn in &mut self.turns {
            let slot = match turn.agentic.as_deref_mut() {
                Some(info) => &mut info.model,
                None => &mut turn.model,
            };
            if slot.is_none() {
                *slot = Some(names[*next % names.len()].to_owned());
                *next += 1;
            }
        }
    }
}

impl Conversation {
    /// One JSONL line (no newline): `session_id`, `system_message`, `user_context_message`,
    /// `turns[{text, max_tokens}]`.
    #[allow(clippy::expect_used)] // the invariant is named at the expect
    pub fn to_json_line(&self) -> String {
        // Serialising plain strings and integers cannot fail.
        serde_json::to_string(self).expect("conversation serialises")
    }
}
