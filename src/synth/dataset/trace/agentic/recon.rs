//! The LCP-driven conversation reconstructor (AIPerf 0.13.0's `weka_synth_buf` and
//! `weka_tool_shape`): role segments built from hash-id blocks turn by turn, truncated at the
//! longest common prefix, with the assistant reply attributed from the previous turn's output
//! and each turn's delta messages. Owns segment state and block content; never reads files.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::synth::corpus::hash_blocks::{hash_id_seed, window};
use crate::synth::error::SynthError;
use crate::synth::rng::PyRandom;
use crate::synth::tokenizer::Tokenizer;

/// Block content for one trace's hash-id scope: one CPython generator re-seeded per hash id
/// (`HashIdRandomGenerator`), blocks cached, tails keyed by sha256 of their position.
pub struct Blocks<'a> {
    corpus: &'a [u32],
    base_seed: u64,
    scope: String,
    block_size: usize,
    /// The blocks seen lately, at most [`CACHED_TOKENS`] tokens in all: a block is a pure
    /// function of its seed, so one dropped is drawn again, identical (a TraceLab session of
    /// 200 fresh 10M-token rounds has 31M distinct blocks, 8 GB if all were kept).
    cache: HashMap<i64, Vec<u32>>,
    cached_tokens: usize,
    tokenizer: &'a Tokenizer,
}

/// Block tokens one [`Blocks`] keeps for reuse (16 MB of ids).
const CACHED_TOKENS: usize = 4 << 20;

impl<'a> Blocks<'a> {
    pub fn new(
        corpus: &'a [u32],
        base_seed: u64,
        scope: &str,
        block_size: usize,
        tokenizer: &'a Tokenizer,
    ) -> Self {
        Blocks {
            corpus,
            base_seed,
            scope: scope.to_owned(),
            block_size,
            cache: HashMap::new(),
            cached_tokens: 0,
            tokenizer,
        }
    }

    /// `_decode_block_tokens`: every hash id's `block_size` tokens, concatenated.
    pub fn tokens(&mut self, hash_ids: &[i64]) -> Vec<u32> {
        let mut out = Vec::with_capacity(hash_ids.len() * self.block_size);
        for &h in hash_ids {
            if let Some(block) = self.cache.get(&h) {
                out.extend_from_slice(block);
                continue;
            }
            let block = if self.corpus.is_empty() {
                Vec::new()
            } else {
                let mut rng = PyRandom::new(hash_id_seed(self.base_seed, &self.scope, h));
                let start = rng.randrange(self.corpus.len() as u64) as usize;
                window(self.corpus, start, self.block_size)
            };
            out.extend_from_slice(&block);
            if self.cached_tokens + block.len() > CACHED_TOKENS {
                self.cache.clear();
                self.cached_tokens = 0;
            }
            self.cached_tokens += block.len();
            self.cache.insert(h, block);
        }
        out
    }

    /// `sample_partial_tail_tokens(n, seed)`: a slice at an offset keyed by `sha256(seed)`.
    pub fn tail(&self, n: usize, seed: &str) -> Vec<u32> {
        if n == 0 {
            return Vec::new();
        }
        let digest = Sha256::digest(seed.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        let key = u64::from_be_bytes(first);
        let span = (self.corpus.len() as i64 - n as i64).max(1) as u64;
        let offset = (key % span) as usize;
        let end = (offset + n).min(self.corpus.len());
        self.corpus.get(offset..end).unwrap_or_default().to_vec()
    }

    fn text(&self, tokens: &[u32]) -> Result<String, SynthError> {
        self.tokenizer.decode(tokens)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Debug, Clone)]
struct Segment {
    role: Role,
    block_count: usize,
    tokens: Vec<u32>,
    content: String,
    /// A user segment answering the assistant's tool call before it: the turn it was made on.
    tool_result_turn: Option<usize>,
}

/// One emitted chat message (AIPerf's dict, in its key order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `{"role", "content"}`.
    Plain { role: Role, content: String },
    /// `{"role": "assistant", "content", "tool_calls": [{"id", "type": "function", "function":
    /// {"name": "recorded_tool", "arguments": "{}"}}]}`.
    ToolCall { content: String, call_id: String },
    /// `{"role": "tool", "tool_call_id", "content"}`.
    ToolResult { call_id: String, content: String },
}

impl Message {
    pub fn role(&self) -> &'static str {
        match self {
            Message::Plain { role, .. } => role.as_str(),
            Message::ToolCall { .. } => "assistant",
            Message::ToolResult { .. } => "tool",
        }
    }

    pub fn content(&self) -> &str {
        match self {
            Message::Plain { content, .. }
            | Message::ToolCall { content, .. }
            | Message::ToolResult { content, .. } => content,
        }
    }
}

impl serde::Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        match self {
            Message::Plain { role, content } => {
                m.serialize_entry("role", role.as_str())?;
                m.serialize_entry("content", content)?;
            }
            Message::ToolCall { content, call_id } => {
                m.serialize_entry("role", "assistant")?;
                m.serialize_entry("content", content)?;
                m.serialize_entry(
                    "tool_calls",
                    &[serde_json::json!({"id": call_id, "type": "function",
                        "function": {"name": "recorded_tool", "arguments": "{}"}})],
                )?;
            }
            Message::ToolResult { call_id, content } => {
                m.serialize_entry("role", "tool")?;
                m.serialize_entry("tool_call_id", call_id)?;
                m.serialize_entry("content", content)?;
            }
        }
        m.end()
    }
}

/// A turn's emission: its new messages, or all of them after a cut into sent context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnDelta {
    pub messages: Vec<Message>,
    pub reset_context: bool,
}

/// A turn-0 prefix the recorded hash ids cannot hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixTooShort {
    pub prefix_blocks: usize,
    pub recorded: usize,
}

/// Walks one conversation's turns.
#[derive(Debug, Default)]
pub struct Reconstructor {
    block_size: usize,
    tool_shaped: bool,
    segments: Vec<Segment>,
    emitted: usize,
    last_disturbance: Option<usize>,
    turn_index: usize,
}

/// `(lcp, covered blocks, new blocks, synthesized tail tokens)` of one turn transition.
fn geometry(prev: &[i64], curr: &[i64], curr_in: usize, bs: usize) -> (usize, usize, usize, usize) {
    let m_full = curr_in / bs;
    let covered = curr.len().min(m_full);
    let missing = m_full.saturating_sub(curr.len()) * bs;
    let lcp = super::chains::lcp(prev, curr);
    (
        lcp,
        covered,
        covered.saturating_sub(lcp),
        curr_in % bs + missing,
    )
}

/// Pass-1 planner: per turn, the most assistant blocks it may take so that a later
/// block-aligned pull-back lands on a user block (`compute_asst_block_caps`).
pub fn asst_block_caps(turns: &[(&[i64], usize)], bs: usize) -> Vec<Option<usize>> {
    let n = turns.len();
    let mut caps: Vec<Option<usize>> = vec![None; n];
    let mut tile: Vec<usize> = Vec::new();
    let mut eff_lcp_per_turn = vec![0usize; n];
    for k in 0..n {
        let (hash_ids, in_tokens) = turns[k];
        let prev: &[i64] = if k > 0 { turns[k - 1].0 } else { &[] };
        let (lcp, covered, _, tail) = geometry(prev, hash_ids, in_tokens, bs);
        if k == 0 {
            tile = vec![0; covered];
            continue;
        }
        let eff = lcp.min(tile.len());
        eff_lcp_per_turn[k] = eff;
        let new_blocks = covered.saturating_sub(eff);
        if new_blocks == 0 && tail == 0 && eff >= 1 {
            let owner = tile[eff - 1];
            if owner != 0 {
                if let Some(bound) = (eff - 1).checked_sub(eff_lcp_per_turn[owner]) {
                    caps[owner] = Some(caps[owner].map_or(bound, |c| c.min(bound)));
                }
            }
        }
        tile.truncate(eff);
        tile.extend(std::iter::repeat_n(k, new_blocks));
    }
    caps
}

impl Reconstructor {
    pub fn new(block_size: usize, tool_shaped: bool) -> Self {
        Reconstructor {
            block_size,
            tool_shaped,
            ..Reconstructor::default()
        }
    }

    fn segment(
        blocks: &Blocks,
        role: Role,
        block_count: usize,
        tokens: Vec<u32>,
        tool_result_turn: Option<usize>,
    ) -> Result<Segment, SynthError> {
        Ok(Segment {
            role,
            block_count,
            content: blocks.text(&tokens)?,
            tokens,
            tool_result_turn,
        })
    }

    /// Turn 0: one system segment for the declared tool + system prefix (whole blocks), the
    /// rest user content, missing blocks and the partial tail synthesized.
    pub fn init_turn_0(
        &mut self,
        blocks: &mut Blocks,
        hash_ids: &[i64],
        in_tokens: usize,
        tool_tokens: usize,
        system_tokens: usize,
        seed: &str,
    ) -> Result<Result<(), PrefixTooShort>, SynthError> {
        let bs = self.block_size;
        let m_full = in_tokens / bs;
        let partial = in_tokens - m_full * bs;
        let covered = m_full.min(hash_ids.len());
        let missing = (m_full - covered) * bs;
        let mut cursor = 0;
        let mut segs = Vec::new();
        if tool_tokens > 0 || system_tokens > 0 {
            let mut prefix_blocks = (tool_tokens + system_tokens).div_ceil(bs);
            if prefix_blocks > 0 {
                if prefix_blocks > hash_ids.len() {
                    return Ok(Err(PrefixTooShort {
                        prefix_blocks,
                        recorded: hash_ids.len(),
                    }));
                }
                prefix_blocks = prefix_blocks.min(covered);
            }
            if prefix_blocks > 0 {
                let t = blocks.tokens(&hash_ids[..prefix_blocks]);
                segs.push(Self::segment(blocks, Role::System, prefix_blocks, t, None)?);
                cursor = prefix_blocks;
            }
        }
        let user_blocks = covered - cursor;
        let mut user = blocks.tokens(&hash_ids[cursor..cursor + user_blocks]);
        if missing + partial > 0 {
            user.extend(blocks.tail(missing + partial, seed));
        }
        if !user.is_empty() || segs.is_empty() {
            segs.push(Self::segment(blocks, Role::User, user_blocks, user, None)?);
        }
        self.turn_index = 0;
        self.segments = segs;
        self.emitted = 0;
        self.last_disturbance = None;
        Ok(Ok(()))
    }

    /// Turn k: truncate at the LCP with the previous turn, synthesize the new region, give
    /// `ceil(prev_out / bs)` blocks of it to the assistant and the rest to the user.
    #[allow(
        clippy::too_many_arguments,
        reason = "AIPerf's `advance_turn` arguments one for one, so the port reads against it line by line"
    )]
    pub fn advance_turn(
        &mut self,
        blocks: &mut Blocks,
        prev_hash_ids: &[i64],
        prev_out_tokens: usize,
        curr_hash_ids: &[i64],
        curr_in_tokens: usize,
        seed: &str,
        is_tool_result: bool,
        max_asst_blocks: Option<usize>,
    ) -> Result<(), SynthError> {
        let bs = self.block_size;
        let (lcp, covered, new_blocks, tail_n) =
            geometry(prev_hash_ids, curr_hash_ids, curr_in_tokens, bs);
        self.last_disturbance = self.truncate(blocks, lcp)?;
        let new_ids = curr_hash_ids.get(lcp..covered).unwrap_or_default();
        let mut region = blocks.tokens(new_ids);
        if tail_n > 0 {
            region.extend(blocks.tail(tail_n, seed));
        }
        self.turn_index += 1;
        let mut target = prev_out_tokens.div_ceil(bs);
        if !self.segments.iter().any(|s| s.role == Role::User) {
            // Context loss: the conversation resumes at a user turn.
            target = 0;
        }
        let mut asst = target.min(new_blocks);
        if let Some(cap) = max_asst_blocks {
            asst = asst.min(cap);
        }
        if tail_n == 0 && asst == new_blocks && asst > 0 {
            // Every turn ends with a user message: hand the last block back to the user.
            asst -= 1;
        }
        let cut = (asst * bs).min(region.len());
        let user_tokens = region.split_off(cut);
        if asst > 0 {
            self.segments
                .push(Self::segment(blocks, Role::Assistant, asst, region, None)?);
        }
        if !user_tokens.is_empty() {
            let mark = is_tool_result.then_some(self.turn_index);
            self.segments.push(Self::segment(
                blocks,
                Role::User,
                new_blocks - asst,
                user_tokens,
                mark,
            )?);
        }
        Ok(())
    }

    /// `truncate_synth_buf_at_block`: cut the segments to `target` blocks; the earliest
    /// segment index changed or removed.
    fn truncate(&mut self, blocks: &Blocks, target: usize) -> Result<Option<usize>, SynthError> {
        let bs = self.block_size;
        let segs = &mut self.segments;
        if target == 0 {
            let had = !segs.is_empty();
            segs.clear();
            return Ok(had.then_some(0));
        }
        let mut cursor = 0;
        for i in 0..segs.len() {
            let count = segs[i].block_count;
            if cursor + count < target {
                cursor += count;
                continue;
            }
            if cursor + count == target {
                let mut disturbed = None;
                let overhang = segs[i].tokens.len().saturating_sub(count * bs);
                if overhang > 0 {
                    let keep = segs[i].tokens.len() - overhang;
                    segs[i].tokens.truncate(keep);
                    segs[i].content = blocks.text(&segs[i].tokens)?;
                    disturbed = Some(i);
                }
                let past = i + 1 < segs.len();
                segs.truncate(i + 1);
                if disturbed.is_none() && past {
                    disturbed = Some(i + 1);
                }
                return Ok(disturbed);
            }
            if cursor == target {
                segs.truncate(i);
                return Ok(Some(i));
            }
            let kept = target - cursor;
            let keep = segs[i].tokens.len().min(kept * bs);
            segs[i].block_count = kept;
            segs[i].tokens.truncate(keep);
            segs[i].content = blocks.text(&segs[i].tokens)?;
            segs.truncate(i + 1);
            return Ok(Some(i));
        }
        Ok(None)
    }

    /// The messages this turn sends: all segments on the first turn or after a cut into
    /// context already sent (`reset_context`), else the ones added since.
    pub fn turn_delta(&mut self) -> TurnDelta {
        let disturbed = self.last_disturbance.is_some_and(|d| d < self.emitted);
        let (from, reset) = if self.emitted == 0 || disturbed {
            (0, self.emitted != 0 && disturbed)
        } else {
            (self.emitted, false)
        };
        let window = &mut self.segments[from..];
        if self.tool_shaped {
            // A mark that cannot pair now ships plain, and stays plain on re-emission.
            for i in 0..window.len() {
                if window[i].tool_result_turn.is_some()
                    && window[i].role == Role::User
                    && (i == 0 || window[i - 1].role != Role::Assistant)
                {
                    window[i].tool_result_turn = None;
                }
            }
        }
        let mut messages: Vec<Message> = window
            .iter()
            .map(|s| Message::Plain {
                role: s.role,
                content: s.content.clone(),
            })
            .collect();
        if self.tool_shaped {
            for i in 1..window.len() {
                let Some(turn) = window[i].tool_result_turn else {
                    continue;
                };
                if window[i].role != Role::User || window[i - 1].role != Role::Assistant {
                    continue;
                }
                let call_id = format!("call_turn_{turn}");
                let prev = std::mem::replace(
                    &mut messages[i - 1],
                    Message::Plain {
                        role: Role::User,
                        content: String::new(),
                    },
                );
                messages[i - 1] = Message::ToolCall {
                    content: prev.content().to_owned(),
                    call_id: call_id.clone(),
                };
                messages[i] = Message::ToolResult {
                    call_id,
                    content: window[i].content.clone(),
                };
            }
        }
        self.emitted = self.segments.len();
        self.last_disturbance = None;
        TurnDelta {
            messages,
            reset_context: reset,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_keep_a_pulled_back_boundary_on_a_user_block() {
        // Turn 1 appends blocks 2..5; turn 2 pulls back to 3 blocks with nothing new, so the
        // block at index 2 (owned by turn 1) must stay user: turn 1 may give the assistant at
        // most 3 - 1 - lcp(1) = 0 blocks.
        let t0: &[i64] = &[1, 2];
        let t1: &[i64] = &[1, 2, 3, 4, 5];
        let t2: &[i64] = &[1, 2, 3];
        let caps = asst_block_caps(&[(t0, 128), (t1, 320), (t2, 192)], 64);
        assert_eq!(caps, vec![None, Some(0), None]);
    }

    #[test]
    fn tails_are_keyed_by_seed_and_clipped_to_the_corpus() {
        let corpus: Vec<u32> = (0..100).collect();
        let tok = Tokenizer::default_qwen3().unwrap();
        let b = Blocks::new(&corpus, 1, "t", 4, &tok);
        let digest = Sha256::digest(b"s:turn_0:partial_tail");
        let key = u64::from_be_bytes(digest[..8].try_into().unwrap());
        let off = (key % 95) as u32;
        assert_eq!(
            b.tail(5, "s:turn_0:partial_tail"),
            (off..off + 5).collect::<Vec<_>>()
        );
        assert_eq!(b.tail(150, "x").len(), 100);
        assert!(b.tail(0, "x").is_empty());
    }
}
