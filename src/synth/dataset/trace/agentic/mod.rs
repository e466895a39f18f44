//! Agentic coding traces, byte for byte as AIPerf 0.13.0 builds them: Weka kv-cache-tester
//! traces (`weka_trace`, one JSON file or a directory of them, or a SemiAnalysis cc-traces
//! JSON-lines export) and TraceLab rounds (`tracelab`, converted to Weka traces), with their
//! rows of the loader table ([`WEKA`], [`TRACELAB`]). Owns reading those inputs and the
//! topology shapes (branches, joins) of the dataset; the reconstruction lives in [`weka`].
//! Never touches the network.

pub mod chains;
pub mod recon;
pub mod schema;
pub mod tracelab;
pub mod weka;

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use recon::Message;

use crate::synth::dataset::trace::input::{self, TraceReader};
use crate::synth::error::{AgenticError, SynthError};

/// Where a conversation sits in the agent tree, in AIPerf's `Conversation` field names.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Topology {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_mode: Option<&'static str>,
    pub is_root: bool,
    pub agent_depth: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_conversation_id: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<Branch>,
}

/// AIPerf's delta context mode: each turn carries the synthesized reply to the previous turn
/// and its own new input; a client accumulates them (and starts over on `reset_context`).
pub const DELTAS_WITH_RESPONSES: &str = "deltas_with_responses";

impl Topology {
    pub fn root() -> Self {
        Topology {
            context_mode: Some(DELTAS_WITH_RESPONSES),
            is_root: true,
            agent_depth: 0,
            parent_conversation_id: None,
            branches: Vec::new(),
        }
    }

    pub fn child(parent: &str) -> Self {
        Topology {
            context_mode: Some(DELTAS_WITH_RESPONSES),
            is_root: false,
            agent_depth: 1,
            parent_conversation_id: Some(parent.to_owned()),
            branches: Vec::new(),
        }
    }
}

impl Eq for Topology {}

/// A SPAWN branch: children started after the turn that lists it (`dispatch_timing: post`).
#[derive(Debug, Clone, PartialEq)]
pub struct Branch {
    pub branch_id: String,
    pub child_conversation_ids: Vec<String>,
    /// No later turn waits for it.
    pub is_background: bool,
    pub start_timestamp_ms: f64,
}

impl Serialize for Branch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(6))?;
        m.serialize_entry("branch_id", &self.branch_id)?;
        m.serialize_entry("child_conversation_ids", &self.child_conversation_ids)?;
        m.serialize_entry("mode", "spawn")?;
        m.serialize_entry("dispatch_timing", "post")?;
        m.serialize_entry("is_background", &self.is_background)?;
        m.serialize_entry("start_timestamp_ms", &self.start_timestamp_ms)?;
        m.end()
    }
}

/// An agentic turn's own fields, in AIPerf's `Turn` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnInfo {
    /// The turn's delta messages (all of them when `reset_context`).
    pub messages: Vec<Message>,
    pub reset_context: bool,
    pub model: Option<String>,
    /// `tool_result` or `user_input` (None when the trace does not say).
    pub input_kind: Option<&'static str>,
    /// Branches started after this turn completes.
    pub branch_ids: Vec<String>,
    /// Branches this turn waits for (SPAWN_JOIN).
    pub prerequisites: Vec<String>,
}

impl Serialize for TurnInfo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("messages", &self.messages)?;
        if let Some(model) = &self.model {
            m.serialize_entry("model", model)?;
        }
        if let Some(k) = self.input_kind {
            m.serialize_entry("input_kind", k)?;
        }
        if !self.branch_ids.is_empty() {
            m.serialize_entry("branch_ids", &self.branch_ids)?;
        }
        if !self.prerequisites.is_empty() {
            let pre: Vec<serde_json::Value> = self
                .prerequisites
                .iter()
                .map(|b| serde_json::json!({"kind": "spawn_join", "branch_id": b}))
                .collect();
            m.serialize_entry("prerequisites", &pre)?;
        }
        if self.reset_context {
            m.serialize_entry("reset_context", &true)?;
        }
        m.end()
    }
}

/// Reads Weka traces: a `.json` file, a directory of them (sorted by name, as AIPerf globs
/// `*.json`), or a JSON-lines file with one trace per line (a SemiAnalysis cc-traces export).
/// Read as streams: a whole-file document, and each line, within the record cap.
pub fn read_weka(path: &Path) -> Result<Vec<weka::Source>, AgenticError> {
    let io = |source| AgenticError::Io {
        path: path.to_path_buf(),
        source,
    };
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(AgenticError::Input {
                origin: path.display().to_string(),
                trace_id: None,
                path: String::new(),
                message: "holds no *.json trace files".into(),
            });
        }
        return files.iter().map(|f| read_one(f)).collect();
    }
    let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase());
    let jsonl = name.is_some_and(|n| n.ends_with(".jsonl") || n.ends_with(".jsonl.gz"));
    // One object spanning the file, or one trace per line (what `datasets`' `to_json` writes).
    if !jsonl {
        let doc = TraceReader::open(path)
            .and_then(|mut r| r.read_document())
            .map_err(SynthError::from)?;
        // Longer than one record: only lines can be read, each within the cap.
        if let Some(bytes) = doc {
            let text = std::str::from_utf8(&bytes).map_err(|e| AgenticError::Input {
                origin: path.display().to_string(),
                trace_id: None,
                path: String::new(),
                message: format!("is not valid UTF-8 ({e})"),
            })?;
            match serde_json::from_str::<serde_json::Value>(text) {
                Ok(v) => return Ok(vec![source(path.display().to_string(), &v)?]),
                Err(e) if text.lines().filter(|l| !l.trim().is_empty()).count() < 2 => {
                    return Err(AgenticError::Input {
                        origin: path.display().to_string(),
                        trace_id: None,
                        path: String::new(),
                        message: format!("invalid JSON: {e}"),
                    })
                }
                Err(_) => {}
            }
        }
    }
    let mut reader = TraceReader::open(path).map_err(SynthError::from)?;
    let mut out = Vec::new();
    while let Some((line, text)) = reader.next_line().map_err(SynthError::from)? {
        let origin = format!("{}:{line}", path.display());
        let mut v = serde_json::from_str(&text).map_err(|e| AgenticError::Input {
            origin: origin.clone(),
            trace_id: None,
            path: String::new(),
            message: format!("invalid JSON: {e}"),
        })?;
        strip_nulls(&mut v);
        out.push(source(origin, &v)?);
    }
    Ok(out)
}

/// Drops null members, recursively. A dataset export stores every row with the union of
/// its columns, so an `"n"` request carries `"ttft": null`, `"agent_id": null` and so on; as
/// absent fields they mean what they meant in the trace.
fn strip_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

fn read_one(file: &Path) -> Result<weka::Source, AgenticError> {
    let origin = file.display().to_string();
    let bytes = TraceReader::open(file)
        .and_then(|mut r| r.read_document())
        .map_err(SynthError::from)?
        .ok_or_else(|| AgenticError::Input {
            origin: origin.clone(),
            trace_id: None,
            path: String::new(),
            message: format!(
                "is longer than {} MiB, kvbust's cap on one trace record",
                input::MAX_RECORD_BYTES >> 20
            ),
        })?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| AgenticError::Input {
        origin: origin.clone(),
        trace_id: None,
        path: String::new(),
        message: format!("invalid JSON: {e}"),
    })?;
    source(origin, &v)
}

fn source(origin: String, v: &serde_json::Value) -> Result<weka::Source, AgenticError> {
    match schema::parse(v) {
        Ok(trace) => Ok(weka::Source { origin, trace }),
        Err(e) => Err(AgenticError::Input {
            origin,
            trace_id: v.get("id").and_then(|i| i.as_str()).map(str::to_owned),
            path: e.path,
            message: format!("does not match the Weka trace schema: {}", e.message),
        }),
    }
}

/// Whether the top-level keys of a file's first object (see [`input::top_level_keys`]) are
/// Weka's: AIPerf's `can_load` validates the object against the schema, which needs `id`,
/// `block_size` and `requests`; kvbust takes any object with those three (so a broken trace
/// gets the Weka schema's error, not another type's), from a bounded prefix.
pub fn weka_keys(keys: &[String]) -> bool {
    ["id", "block_size", "requests"]
        .iter()
        .all(|k| keys.iter().any(|x| x == k))
}

/// The dataset AIPerf 0.13.0 builds for `--input-file PATH --custom-dataset-type weka_trace`,
/// with `content` supplying the corpus (coding by default, or sonnet).
/// `weka_trace`: a directory, or a first object with a Weka trace's keys.
pub const WEKA: super::Loader = super::Loader {
    kind: crate::synth::dataset::trace_kind::TraceKind::WekaTrace,
    can_load: |p| Ok(p.dir || weka_keys(&p.keys)),
    build: |b, content, out| build_weka(b.path, b.params, b.tokenizer, content, out),
};

/// `tracelab`: AIPerf's tracelab `can_load`, a first row holding TraceLab's distinctive keys,
/// which no mooncake or bailian line can (their loaders refuse the extra fields).
pub const TRACELAB: super::Loader = super::Loader {
    kind: crate::synth::dataset::trace_kind::TraceKind::Tracelab,
    can_load: |p| Ok(tracelab::tracelab_keys(&p.keys)),
    build: |b, content, out| build_tracelab(b.path, b.params, b.tokenizer, content, out),
};

pub fn build_weka(
    path: &Path,
    params: &crate::synth::dataset::params::SynthParams,
    tokenizer: &crate::synth::tokenizer::Tokenizer,
    content: &mut dyn crate::synth::dataset::trace::TraceContent,
    out: &mut crate::synth::dataset::Out<'_>,
) -> Result<(), crate::synth::error::SynthError> {
    let sources = read_weka(path)?;
    if params.isl_block_size.is_none() {
        if let Some(s) = sources
            .iter()
            .find(|s| s.trace.block_size as usize != weka::DEFAULT_BLOCK_SIZE)
        {
            tracing::warn!(
                trace = %s.trace.id,
                declared = s.trace.block_size,
                "the trace declares block_size {} but is replayed at {} tokens per hash id, as \
                 `aiperf profile` does (its weka_trace plugin passes 64 as an override); pass \
                 --isl-block-size {} to use the trace's own",
                s.trace.block_size,
                weka::DEFAULT_BLOCK_SIZE,
                s.trace.block_size
            );
        }
    }
    reconstruct(
        sources,
        params.isl_block_size,
        params,
        tokenizer,
        content,
        out,
    )
}

/// The dataset AIPerf 0.13.0 builds for `--input-file PATH --custom-dataset-type tracelab`:
/// TraceLab rounds converted to Weka traces with block ids synthesized at `--isl-block-size`
/// (default 64), then the Weka reconstruction at that same size.
pub fn build_tracelab(
    path: &Path,
    params: &crate::synth::dataset::params::SynthParams,
    tokenizer: &crate::synth::tokenizer::Tokenizer,
    content: &mut dyn crate::synth::dataset::trace::TraceContent,
    out: &mut crate::synth::dataset::Out<'_>,
) -> Result<(), crate::synth::error::SynthError> {
    let block_size = params
        .isl_block_size
        .unwrap_or(tracelab::DEFAULT_BLOCK_SIZE);
    let sources = tracelab::read_capped(path, block_size, params.strict, out.max_blocks)?;
    reconstruct(sources, Some(block_size), params, tokenizer, content, out)
}

/// `WekaTraceLoader.convert_to_conversations` on parsed traces, with the run's flags.
fn reconstruct(
    sources: Vec<weka::Source>,
    block_size: Option<usize>,
    params: &crate::synth::dataset::params::SynthParams,
    tokenizer: &crate::synth::tokenizer::Tokenizer,
    content: &mut dyn crate::synth::dataset::trace::TraceContent,
    out: &mut crate::synth::dataset::Out<'_>,
) -> Result<(), crate::synth::error::SynthError> {
    let settings = weka::Settings {
        block_size,
        max_isl: params.synthesis_max_isl.map(|x| x as i64),
        max_osl: params.synthesis_max_osl.map(|x| x as i64),
        max_context_length: params.max_context_length.map(|x| x as i64),
        max_traces: params.num_dataset_entries,
        inter_turn_delay_cap_seconds: params.inter_turn_delay_cap_seconds,
        trace_idle_gap_cap_seconds: params.trace_idle_gap_cap_seconds,
        use_think_time_only: params.use_think_time_only,
        tool_shaped_messages: params.tool_shaped_messages,
        model_names: params
            .model
            .as_deref()
            .map(|m| {
                m.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
        max_row_bytes: out.max_row_bytes,
        ..weka::Settings::default()
    };
    let corpus = content.block_corpus();
    weka::build_into(
        sources,
        &settings,
        weka::Corpus {
            tokens: corpus.tokens(),
            seed: content.corpus_seed(),
        },
        tokenizer,
        out,
    )
}

/// The whole context turn `k` of an agentic conversation sends (`deltas_with_responses`):
/// every turn's delta messages from the last `reset_context` turn at or before `k`, in order.
/// Empty when the turn is not agentic.
pub fn context(conv: &crate::synth::dataset::Conversation, k: usize) -> Vec<&Message> {
    let Some(turns) = conv.turns.get(..=k) else {
        return Vec::new();
    };
    let infos: Vec<&TurnInfo> = turns.iter().filter_map(|t| t.agentic.as_deref()).collect();
    if infos.len() != turns.len() {
        return Vec::new();
    }
    let start = infos.iter().rposition(|i| i.reset_context).unwrap_or(0);
    infos[start..]
        .iter()
        .flat_map(|i| i.messages.iter())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{Conversation, Turn};

    fn turn(reset: bool, contents: &[(recon::Role, &str)]) -> Turn {
        Turn {
            agentic: Some(Box::new(TurnInfo {
                messages: contents
                    .iter()
                    .map(|(role, c)| Message::Plain {
                        role: *role,
                        content: (*c).to_owned(),
                    })
                    .collect(),
                reset_context: reset,
                model: None,
                input_kind: None,
                branch_ids: Vec::new(),
                prerequisites: Vec::new(),
            })),
            ..Turn::default()
        }
    }

    #[test]
    fn context_accumulates_deltas_and_restarts_at_a_reset() {
        use recon::Role::{Assistant, System, User};
        let conv = Conversation {
            session_id: "s".into(),
            system_message: None,
            user_context_message: None,
            turns: vec![
                turn(false, &[(System, "S"), (User, "u0")]),
                turn(false, &[(Assistant, "a0"), (User, "u1")]),
                turn(true, &[(System, "S"), (User, "v")]),
                turn(false, &[(Assistant, "a2"), (User, "u3")]),
            ],
            agentic: None,
        };
        let text = |k| {
            context(&conv, k)
                .iter()
                .map(|m| m.content())
                .collect::<Vec<_>>()
        };
        assert_eq!(text(1), ["S", "u0", "a0", "u1"]);
        assert_eq!(text(2), ["S", "v"]);
        assert_eq!(text(3), ["S", "v", "a2", "u3"]);
        assert!(text(4).is_empty());
    }
}
