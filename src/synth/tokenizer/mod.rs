//! A HuggingFace tokenizer as AIPerf sees it through transformers 5: encode without special
//! tokens, decode keeping them, base vocab size, declared special ids, BOS and chat template.
//! Owns tokenizer loading and these facts; must never fetch anything over the network. Below
//! it: the exact local re-encode, its piece memo, and chat-template rendering.

pub mod bpe;
pub mod chat_template;
pub mod piece_memo;
pub mod pyjinja;
pub mod reencode;

use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::SynthError;
use piece_memo::{IdHasher, PieceMemo};

const QWEN3_TOKENIZER_JSON: &[u8] =
    include_bytes!("../../../assets/tokenizers/qwen3/tokenizer.json");
const QWEN3_TOKENIZER_CONFIG: &[u8] =
    include_bytes!("../../../assets/tokenizers/qwen3/tokenizer_config.json");

/// The attribute order of HF's `all_special_ids`.
const SPECIAL_ATTRIBUTES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Split regexes for which the re-encode shortcut's safe-position argument holds (Qwen2/Qwen3 and Llama-3).
const KNOWN_SPLIT_PATTERNS: [&str; 2] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Per-id flag ([`Tokenizer::boundary_flags`]): the token's bytes start with a space (added
/// tokens get no flags, so they never border a safe position).
pub const STARTS_WITH_SPACE: u8 = 1;
/// Per-id flag: the token's bytes end with an ASCII letter.
pub const ENDS_WITH_LETTER: u8 = 2;
/// Per-id flag: the token's bytes start with a whole dense letter ([`is_dense_letter`]); only
/// set when [`Tokenizer::letter_cut`] is available.
pub const STARTS_WITH_DENSE: u8 = 4;
/// Per-id flag: the token's bytes end with a whole dense letter, lead byte included.
pub const ENDS_WITH_DENSE: u8 = 8;

/// A "dense letter": a CJK ideograph (Unified, Extension A), hiragana, katakana or a Hangul
/// syllable, given as its 3 UTF-8 bytes. All are `\p{L}`, starters (ccc 0, NFC_QC Yes) and
/// never the second half of a canonical composition, so NFC never acts across the boundary
/// before one; scripts written without spaces, whose long letter runs are single pre-tokens.
pub fn is_dense_letter(b: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(b) else {
        return false;
    };
    let mut chars = s.chars();
    let (Some(c), None) = (chars.next(), chars.next()) else {
        return false;
    };
    matches!(c, '\u{3041}'..='\u{3096}' | '\u{30A1}'..='\u{30FA}' | '\u{3400}'..='\u{4DBF}'
        | '\u{4E00}'..='\u{9FFF}' | '\u{AC00}'..='\u{D7A3}')
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Where BPE merges may cross the boundary between two dense letters `c1 | c2` inside one
/// pre-token. A cut there is merge-safe when no vocabulary token can lie across it: a token
/// `t = L ++ R` lies across it when `L` is consistent with ending in `c1` (`L` ends with all of
/// `c1`, or `L` is a tail of `c1`'s bytes) and `R` with starting with `c2`. Tokens are keyed by
/// the part of `c1`/`c2` they pin down (1–3 tail bytes of `c1`, 1–3 head bytes of `c2`); a cut
/// is safe when none of the 9 keys of `(c1, c2)` is present. Merge results are tokens, so no
/// merge can then join symbols across the cut, and BPE of the pre-token is the BPE of its two
/// sides, concatenated.
struct LetterCuts {
    keys: HashSet<u64, BuildHasherDefault<IdHasher>>,
    /// Bit `4 * tail_len + head_len`: some key of these lengths exists (skips empty lookups).
    lengths: u16,
}

impl LetterCuts {
    fn key(tail: &[u8], head: &[u8]) -> u64 {
        let pack = |b: &[u8]| b.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x));
        (tail.len() as u64) << 60 | pack(tail) << 32 | (head.len() as u64) << 28 | pack(head)
    }

    fn build(table: &ByteTable) -> Self {
        let mut keys: HashSet<u64, BuildHasherDefault<IdHasher>> = HashSet::default();
        let mut lengths = 0u16;
        for id in 0..table.present.len() as u32 {
            let Some(t) = table.token(id) else { continue };
            for k in 1..t.len() {
                let (l, r) = t.split_at(k);
                let tail = if l.len() >= 3 { &l[l.len() - 3..] } else { l };
                let tail_ok = if tail.len() == 3 {
                    is_dense_letter(tail)
                } else {
                    tail.iter().all(|&b| is_continuation(b))
                };
                let head = if r.len() >= 3 { &r[..3] } else { r };
                let head_ok = if head.len() == 3 {
                    is_dense_letter(head)
                } else {
                    (0xE3..=0xED).contains(&head[0])
                        && head[1..].iter().all(|&b| is_continuation(b))
                };
                if tail_ok && head_ok {
                    keys.insert(Self::key(tail, head));
                    lengths |= 1 << (4 * tail.len() + head.len());
                }
            }
        }
        LetterCuts { keys, lengths }
    }

    /// No token can lie across `c1 | c2` (both 3-byte dense letters).
    fn safe(&self, c1: &[u8], c2: &[u8]) -> bool {
        for tl in 1..=3 {
            for hl in 1..=3 {
                if self.lengths & (1 << (4 * tl + hl)) != 0
                    && self.keys.contains(&Self::key(&c1[3 - tl..], &c2[..hl]))
                {
                    return false;
                }
            }
        }
        true
    }
}

/// The split regex of a pipeline whose pre-token boundaries [`crate::synth::tokenizer::reencode`] (and the
/// coding corpus's fast encode) may rely on: NFC or no normalizer, the split regex of Qwen2's or
/// Llama-3's (with `\p{N}{1,3}`) then ByteLevel without prefix space, BPE without dropout, a
/// ByteLevel decoder, and no added token that strips, is single-word or holds a letter
/// followed by a space. `None` for any other pipeline.
pub fn split_pattern(tok: &tokenizers::Tokenizer) -> Option<&'static str> {
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.unwrap_or_default();
    let normalizer = json(serde_json::to_value(tok.get_normalizer()));
    let normalizer_ok = normalizer.is_null() || normalizer["type"] == "NFC";
    let pre = json(serde_json::to_value(tok.get_pre_tokenizer()));
    let pattern = KNOWN_SPLIT_PATTERNS
        .into_iter()
        .find(|&p| pre["pretokenizers"][0]["pattern"]["Regex"].as_str() == Some(p));
    let pre_ok = pre["type"] == "Sequence"
        && pre["pretokenizers"].as_array().is_some_and(|steps| {
            steps.len() == 2
                && steps[0]["type"] == "Split"
                && steps[0]["behavior"] == "Isolated"
                && steps[0]["invert"] == false
                && steps[0]["pattern"]["Regex"]
                    .as_str()
                    .is_some_and(|p| KNOWN_SPLIT_PATTERNS.contains(&p))
                && steps[1]["type"] == "ByteLevel"
                && steps[1]["add_prefix_space"] == false
                && steps[1]["use_regex"] == false
        });
    let decoder = json(serde_json::to_value(tok.get_decoder()));
    let decoder_ok = decoder["type"] == "ByteLevel";
    let model_ok =
        matches!(tok.get_model(), tokenizers::ModelWrapper::BPE(bpe) if bpe.dropout.is_none());
    let added_ok = tok.get_added_tokens_decoder().values().all(|t| {
        let b = t.content.as_bytes();
        !t.lstrip
            && !t.rstrip
            && !t.single_word
            && !b
                .windows(2)
                .any(|w| w[0].is_ascii_alphabetic() && w[1] == b' ')
    });
    (normalizer_ok && pre_ok && decoder_ok && model_ok && added_ok)
        .then_some(pattern)
        .flatten()
}

/// A loaded tokenizer plus the facts synthesis needs.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    vocab_size: usize,
    all_special_ids: Vec<u32>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<u32>,
    chat_template: Option<String>,
    num_special_tokens_to_add: usize,
    fingerprint: String,
    fast_reencode: bool,
    boundary_flags: OnceLock<Option<Vec<u8>>>,
    byte_table: OnceLock<Option<ByteTable>>,
    letter_cuts: OnceLock<Option<LetterCuts>>,
    piece_memo: PieceMemo,
}

/// Every id's bytes, for decoding byte-level BPE without per-token allocations.
#[derive(Debug, PartialEq)]
struct ByteTable {
    /// `bytes[offsets[id]..offsets[id + 1]]` are the id's bytes.
    offsets: Vec<u32>,
    bytes: Vec<u8>,
    /// Whether the id exists (unknown ids are skipped by decode, as `tokenizers` does).
    present: Vec<bool>,
}

/// GPT-2's byte ↔ unicode alphabet of the ByteLevel decoder: the char that stands for each byte.
#[allow(clippy::expect_used)] // the invariant is named at the expect
pub(crate) fn byte_level_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            extra += 1;
            // 256 + n is below 0x200, always a valid scalar value.
            char::from_u32(255 + extra).expect("valid char")
        };
    }
    table
}

impl ByteTable {
    /// `tok.get_vocab_size(true)`, the table's length (the model's tokens and the added ones
    /// not among them), without the copy of the whole vocabulary that call makes.
    fn total(tok: &tokenizers::Tokenizer) -> usize {
        use tokenizers::Model;
        let model = tok.get_model();
        let added = tok.get_added_vocabulary().get_vocab();
        model.get_vocab_size()
            + added
                .keys()
                .filter(|t| model.token_to_id(t).is_none())
                .count()
    }

    /// The table of `tok.id_to_token` for every id below [`ByteTable::total`].
    fn build(tok: &tokenizers::Tokenizer) -> Self {
        Self::from_tokens(Self::total(tok), |id| {
            tok.id_to_token(id).map(std::borrow::Cow::Owned)
        })
    }

    /// [`ByteTable::build`] from the model's tokens by id as the fast load read them (the same
    /// strings `id_to_token` would copy out: an added token's content, else the model's token).
    fn build_with(tok: &tokenizers::Tokenizer, model_tokens: &fast_load::ModelTokens) -> Self {
        let added = tok.get_added_vocabulary().get_added_tokens_decoder();
        Self::from_tokens(Self::total(tok), |id| match added.get(&id) {
            Some(t) => Some(std::borrow::Cow::Borrowed(t.content.as_str())),
            None => model_tokens.get(id).map(std::borrow::Cow::Borrowed),
        })
    }

    /// Mirrors the ByteLevel decoder: a token whose chars all belong to the byte alphabet
    /// becomes those bytes, any other token its own UTF-8 bytes.
    fn from_tokens<'a>(
        total: usize,
        token_of: impl Fn(u32) -> Option<std::borrow::Cow<'a, str>>,
    ) -> Self {
        // Every alphabet char is below U+0200, so a flat table inverts it.
        let mut inverse = [None::<u8>; 0x200];
        for (b, c) in byte_level_alphabet().iter().enumerate() {
            inverse[*c as usize] = Some(b as u8);
        }
        let mut offsets = Vec::with_capacity(total + 1);
        let mut bytes = Vec::with_capacity(total * 7);
        let mut present = vec![false; total];
        offsets.push(0u32);
        for (id, slot) in present.iter_mut().enumerate() {
            if let Some(token) = token_of(id as u32) {
                *slot = true;
                let start = bytes.len();
                let all_mapped =
                    token
                        .chars()
                        .all(|c| match inverse.get(c as usize).copied().flatten() {
                            Some(b) => {
                                bytes.push(b);
                                true
                            }
                            None => false,
                        });
                if !all_mapped {
                    bytes.truncate(start);
                    bytes.extend_from_slice(token.as_bytes());
                }
            }
            offsets.push(bytes.len() as u32);
        }
        ByteTable {
            offsets,
            bytes,
            present,
        }
    }

    fn token(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if !*self.present.get(i)? {
            return None;
        }
        Some(&self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut out = Vec::with_capacity(ids.len() * 5);
        for &id in ids {
            if let Some(b) = self.token(id) {
                out.extend_from_slice(b);
            }
        }
        match String::from_utf8(out) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("all_special_ids", &self.all_special_ids)
            .field("bos_token_id", &self.bos_token_id)
            .field("num_special_tokens_to_add", &self.num_special_tokens_to_add)
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

fn token_string(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// The id of the token `tokenizer_config.json` names under `attr` (`bos_token`, say).
fn attr_id(inner: &tokenizers::Tokenizer, config: &Value, attr: &str) -> Option<u32> {
    config
        .get(attr)
        .and_then(token_string)
        .and_then(|name| inner.token_to_id(name))
}

/// HF's `all_special_ids`: the config's special attributes in their order, then its
/// `additional_special_tokens`, each id once; with no config, the added tokens flagged special.
fn special_ids(inner: &tokenizers::Tokenizer, config: &Value) -> Vec<u32> {
    let mut all_special_ids = Vec::new();
    let mut seen = HashSet::new();
    let mut push = |id: Option<u32>, ids: &mut Vec<u32>| {
        if let Some(id) = id {
            if seen.insert(id) {
                ids.push(id);
            }
        }
    };
    if config.is_object() {
        for attr in SPECIAL_ATTRIBUTES {
            push(attr_id(inner, config, attr), &mut all_special_ids);
        }
        if let Some(extra) = config
            .get("additional_special_tokens")
            .and_then(Value::as_array)
        {
            for t in extra {
                let id = token_string(t).and_then(|name| inner.token_to_id(name));
                push(id, &mut all_special_ids);
            }
        }
    } else {
        // No config: the tokenizer's own added tokens flagged special.
        let mut specials: Vec<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        specials.sort_unstable();
        for id in specials {
            push(Some(id), &mut all_special_ids);
        }
    }
    all_special_ids
}

/// The config's `chat_template`: a string, or the one named `default` in a list of named ones.
fn chat_template(config: &Value) -> Option<String> {
    match config.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

/// The decoder is ByteLevel (so ids decode through a [`ByteTable`]).
fn is_byte_level(tok: &tokenizers::Tokenizer) -> bool {
    let decoder = serde_json::to_value(tok.get_decoder()).unwrap_or_default();
    decoder["type"] == "ByteLevel"
}

fn read(path: &Path) -> Result<Vec<u8>, SynthError> {
    std::fs::read(path).map_err(|source| SynthError::TokenizerIo {
        path: path.to_path_buf(),
        source,
    })
}

impl Tokenizer {
    /// The shipped Qwen3 tokenizer, embedded in the binary.
    pub fn default_qwen3() -> Result<Self, SynthError> {
        Self::from_bytes(QWEN3_TOKENIZER_JSON, Some(QWEN3_TOKENIZER_CONFIG))
    }

    /// Loads `tokenizer.json` from a file, or `tokenizer.json` (+ `tokenizer_config.json` and
    /// `chat_template.jinja` when present) from a folder.
    pub fn from_path(path: &Path) -> Result<Self, SynthError> {
        if path.is_dir() {
            let json = path.join("tokenizer.json");
            if !json.is_file() {
                return Err(SynthError::TokenizerMissing {
                    path: path.to_path_buf(),
                });
            }
            let config = path.join("tokenizer_config.json");
            let config = if config.is_file() {
                Some(read(&config)?)
            } else {
                None
            };
            let mut tokenizer = Self::from_bytes(&read(&json)?, config.as_deref())?;
            // transformers 5 reads a folder's `chat_template.jinja` before the config's
            // template (a model's folder may carry only the file).
            let jinja = path.join("chat_template.jinja");
            if jinja.is_file() {
                let text =
                    String::from_utf8(read(&jinja)?).map_err(|e| SynthError::TokenizerParse {
                        what: "chat_template.jinja".into(),
                        message: e.to_string(),
                    })?;
                tokenizer.chat_template = Some(text);
            }
            Ok(tokenizer)
        } else {
            let config = path
                .parent()
                .map(|p| p.join("tokenizer_config.json"))
                .filter(|p| p.is_file());
            let config = match config {
                Some(p) => Some(read(&p)?),
                None => None,
            };
            Self::from_bytes(&read(path)?, config.as_deref())
        }
    }

    /// Builds from the bytes of `tokenizer.json` and, optionally, `tokenizer_config.json`.
    pub fn from_bytes(
        tokenizer_json: &[u8],
        config_json: Option<&[u8]>,
    ) -> Result<Self, SynthError> {
        let (inner, model_tokens) = match fast_load::load(tokenizer_json) {
            Some((inner, tokens)) => (inner, Some(tokens)),
            None => (
                tokenizers::Tokenizer::from_bytes(tokenizer_json).map_err(|e| {
                    SynthError::TokenizerParse {
                        what: "tokenizer.json".into(),
                        message: e.to_string(),
                    }
                })?,
                None,
            ),
        };
        // With the fast load's token texts at hand, the byte table costs a copy of them (and
        // not one `id_to_token` allocation per id later).
        let byte_table = OnceLock::new();
        if let Some(tokens) = &model_tokens {
            let table = is_byte_level(&inner).then(|| ByteTable::build_with(&inner, tokens));
            // Freshly made, so it is empty.
            let _ = byte_table.set(table);
        }
        drop(model_tokens);
        let config: Value = match config_json {
            Some(bytes) => {
                serde_json::from_slice(bytes).map_err(|e| SynthError::TokenizerParse {
                    what: "tokenizer_config.json".into(),
                    message: e.to_string(),
                })?
            }
            None => Value::Null,
        };
        let fingerprint = hex::encode(Sha256::digest(tokenizer_json));

        let all_special_ids = special_ids(&inner, &config);
        let chat_template = chat_template(&config);
        let num_special_tokens_to_add = inner
            .get_post_processor()
            .map(|p| tokenizers::PostProcessor::added_tokens(p, false))
            .unwrap_or(0);
        Ok(Tokenizer {
            vocab_size: inner.get_vocab_size(false),
            bos_token_id: attr_id(&inner, &config, "bos_token"),
            eos_token_id: attr_id(&inner, &config, "eos_token"),
            all_special_ids,
            chat_template,
            num_special_tokens_to_add,
            fingerprint,
            fast_reencode: true,
            boundary_flags: OnceLock::new(),
            byte_table,
            letter_cuts: OnceLock::new(),
            piece_memo: Default::default(),
            inner,
        })
    }

    /// `encode(text, add_special_tokens=False)`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, SynthError> {
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| SynthError::Tokenize {
                op: "encode",
                message: e.to_string(),
            })
    }

    /// Encodes many texts in parallel (same ids as `encode` on each).
    pub fn encode_batch(&self, texts: Vec<String>) -> Result<Vec<Vec<u32>>, SynthError> {
        self.inner
            .encode_batch_fast(texts, false)
            .map(|v| v.into_iter().map(|e| e.get_ids().to_vec()).collect())
            .map_err(|e| SynthError::Tokenize {
                op: "encode",
                message: e.to_string(),
            })
    }

    /// `decode(ids, skip_special_tokens=False)` (no clean-up, as transformers 5 does for BPE).
    /// Byte-level tokenizers decode through a per-id byte table (same result, no per-token
    /// allocation).
    pub fn decode(&self, ids: &[u32]) -> Result<String, SynthError> {
        if let Some(table) = self.byte_table() {
            return Ok(table.decode(ids));
        }
        self.decode_reference(ids)
    }

    fn byte_table(&self) -> Option<&ByteTable> {
        self.byte_table
            .get_or_init(|| is_byte_level(&self.inner).then(|| ByteTable::build(&self.inner)))
            .as_ref()
    }

    /// `decode` through the `tokenizers` crate itself (the reference the byte table must match).
    pub fn decode_reference(&self, ids: &[u32]) -> Result<String, SynthError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| SynthError::Tokenize {
                op: "decode",
                message: e.to_string(),
            })
    }

    /// Base vocabulary size, without added tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Ids of the declared special tokens (bos, eos, unk, sep, pad, cls, mask, additional).
    pub fn all_special_ids(&self) -> &[u32] {
        &self.all_special_ids
    }

    /// Special tokens the post-processor adds to a single sequence (Llama: 1 BOS; Qwen: 0).
    pub fn num_special_tokens_to_add(&self) -> usize {
        self.num_special_tokens_to_add
    }

    /// The BOS token id, when the config declares one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// The EOS token id, when the config declares one.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// The chat template string from `tokenizer_config.json`, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Lowercase hex sha256 of the `tokenizer.json` bytes (a cache key).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Turns the exact local re-encode shortcut ([`crate::synth::tokenizer::reencode`]) on or off
    /// (on by default; it only ever applies to tokenizers it is proven for).
    pub fn with_fast_reencode(mut self, on: bool) -> Self {
        self.fast_reencode = on;
        self
    }

    /// Per-id boundary flags for the local re-encode shortcut, or `None` when this tokenizer
    /// is not eligible (or the shortcut is off).
    pub fn boundary_flags(&self) -> Option<&[u8]> {
        if !self.fast_reencode {
            return None;
        }
        self.boundary_flags
            .get_or_init(|| {
                // Only pipelines the shortcut is proven for get flags.
                split_pattern(&self.inner)?;
                let table = self.byte_table()?;
                let base = self.vocab_size;
                let dense = self.letter_cuts().is_some();
                Some(
                    (0..table.present.len() as u32)
                        .map(|id| {
                            let Some(b) = table.token(id).filter(|_| (id as usize) < base) else {
                                return 0;
                            };
                            let mut f = 0;
                            if b.first() == Some(&b' ') {
                                f |= STARTS_WITH_SPACE;
                            }
                            if b.last().is_some_and(u8::is_ascii_alphabetic) {
                                f |= ENDS_WITH_LETTER;
                            }
                            if dense && b.len() >= 3 {
                                if is_dense_letter(&b[..3]) {
                                    f |= STARTS_WITH_DENSE;
                                }
                                if is_dense_letter(&b[b.len() - 3..]) {
                                    f |= ENDS_WITH_DENSE;
                                }
                            }
                            f
                        })
                        .collect(),
                )
            })
            .as_deref()
    }

    /// The merge-safety table for cuts between dense letters, for pipelines where such a cut is
    /// a clean split of the encode (see [`crate::synth::tokenizer::reencode`]): those of
    /// [`split_pattern`], with a BPE that does not short-cut whole words found in the vocabulary
    /// (`ignore_merges`: a sub-word that is a token would then encode differently alone) and no
    /// added token holding a dense letter (the added-token split runs before pre-tokenizing).
    fn letter_cuts(&self) -> Option<&LetterCuts> {
        self.letter_cuts
            .get_or_init(|| {
                split_pattern(&self.inner)?;
                let merges_only = matches!(self.inner.get_model(),
                    tokenizers::ModelWrapper::BPE(bpe) if !bpe.ignore_merges);
                let added_ok = self.inner.get_added_tokens_decoder().values().all(|t| {
                    !t.content
                        .chars()
                        .any(|c| is_dense_letter(c.encode_utf8(&mut [0; 4]).as_bytes()))
                });
                if !(merges_only && added_ok) {
                    return None;
                }
                Some(LetterCuts::build(self.byte_table()?))
            })
            .as_ref()
    }

    /// Whether the boundary between `left` and `right` (ids flagged [`ENDS_WITH_DENSE`] and
    /// [`STARTS_WITH_DENSE`]) is a position where `encode` of any text splits: no token can lie
    /// across the two dense letters that meet there.
    pub fn letter_cut(&self, left: u32, right: u32) -> bool {
        let (Some(cuts), Some(table)) = (self.letter_cuts(), self.byte_table()) else {
            return false;
        };
        match (table.token(left), table.token(right)) {
            (Some(l), Some(r)) if l.len() >= 3 && r.len() >= 3 => {
                cuts.safe(&l[l.len() - 3..], &r[..3])
            }
            _ => false,
        }
    }

    /// Re-encodes of pieces between safe positions, shared by everything using this tokenizer.
    pub fn piece_memo(&self) -> &PieceMemo {
        &self.piece_memo
    }

    /// The number of bytes `id` decodes to (0 for unknown ids, or without a byte table).
    pub fn token_len(&self, id: u32) -> usize {
        self.byte_table()
            .and_then(|t| t.token(id))
            .map_or(0, <[u8]>::len)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// A faster `tokenizers::Tokenizer::from_bytes` for BPE `tokenizer.json` files: the same
/// builder calls the crate's own deserializer makes, from one typed, streaming parse. The
/// crate buffers the whole model three times over (an untagged enum's `Content`, then a
/// `serde_json::Value` for the tagged remainder, then the typed BPE), about two thirds of
/// Qwen3's 0.3 s load. Anything this parse does not take exactly as the crate does (another
/// model type, a model without `type`, mixed merge forms, duplicate top-level keys, a bad
/// `version`) is an error here, and the caller falls back to the crate's own load, so a
/// success is always the crate's result, but for an empty subword prefix or suffix dropped (see
/// `BpeVisitor`; checked against the crate's load by this file's tests).
mod fast_load {
    use serde::de::{Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde::Deserialize;
    use tokenizers::models::bpe::{BpeBuilder, Merges, Vocab, BPE};
    use tokenizers::{
        AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PaddingParams,
        PostProcessorWrapper, PreTokenizerWrapper, TokenizerBuilder, TruncationParams,
    };

    /// The top level of `tokenizer.json`, as the crate's `TokenizerVisitor` reads it.
    #[derive(Deserialize)]
    struct Document {
        #[serde(default)]
        version: Version,
        truncation: Option<TruncationParams>,
        padding: Option<PaddingParams>,
        #[serde(default)]
        added_tokens: Vec<AddedTokenWithId>,
        normalizer: Option<NormalizerWrapper>,
        pre_tokenizer: Option<PreTokenizerWrapper>,
        post_processor: Option<PostProcessorWrapper>,
        decoder: Option<DecoderWrapper>,
        model: Bpe,
    }

    /// `version`: absent, or a string that must be "1.0" (the crate refuses `null` too).
    #[derive(Default)]
    struct Version(Option<String>);

    impl<'de> Deserialize<'de> for Version {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            String::deserialize(d).map(|v| Version(Some(v)))
        }
    }

    /// The crate's `AddedTokenWithId` (private there): the id is only ever used for a warning.
    #[derive(Deserialize)]
    struct AddedTokenWithId {
        #[allow(dead_code)]
        id: u32,
        #[serde(flatten)]
        token: AddedToken,
    }

    /// The model, built as the crate's `BPEVisitor` builds it, from typed fields.
    struct Bpe(BPE, ModelTokens);

    #[derive(Deserialize)]
    #[serde(field_identifier, rename_all = "snake_case")]
    enum Field {
        Type,
        Dropout,
        UnkToken,
        ContinuingSubwordPrefix,
        EndOfWordSuffix,
        FuseUnk,
        ByteFallback,
        IgnoreMerges,
        Vocab,
        Merges,
        #[serde(other)]
        Other,
    }

    impl<'de> Deserialize<'de> for Bpe {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_map(BpeVisitor)
        }
    }

    struct BpeVisitor;

    impl<'de> Visitor<'de> for BpeVisitor {
        type Value = Bpe;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a BPE model with \"type\": \"BPE\"")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Bpe, A::Error> {
            let mut builder = BpeBuilder::new();
            let (mut typed, mut vocab, mut merges) = (false, None, None);
            let (mut prefix, mut suffix) = (None, None);
            while let Some(key) = map.next_key::<Field>()? {
                match key {
                    Field::Type => {
                        // The crate takes a model without `type` through its untagged
                        // fallback; only the tagged form is taken here.
                        let t: String = map.next_value()?;
                        if t != "BPE" {
                            return Err(A::Error::custom("not a BPE model"));
                        }
                        typed = true;
                    }
                    Field::Dropout => {
                        if let Some(p) = map.next_value::<Option<f32>>()? {
                            builder = builder.dropout(p);
                        }
                    }
                    Field::UnkToken => {
                        if let Some(s) = map.next_value::<Option<String>>()? {
                            builder = builder.unk_token(s);
                        }
                    }
                    Field::ContinuingSubwordPrefix => {
                        if let Some(s) = map.next_value::<Option<String>>()? {
                            prefix = Some(s.clone());
                            builder = builder.continuing_subword_prefix(s);
                        }
                    }
                    Field::EndOfWordSuffix => {
                        if let Some(s) = map.next_value::<Option<String>>()? {
                            suffix = Some(s.clone());
                            builder = builder.end_of_word_suffix(s);
                        }
                    }
                    Field::FuseUnk => {
                        if let Some(b) = map.next_value::<Option<bool>>()? {
                            builder = builder.fuse_unk(b);
                        }
                    }
                    Field::ByteFallback => {
                        if let Some(b) = map.next_value::<Option<bool>>()? {
                            builder = builder.byte_fallback(b);
                        }
                    }
                    Field::IgnoreMerges => {
                        if let Some(b) = map.next_value::<Option<bool>>()? {
                            builder = builder.ignore_merges(b);
                        }
                    }
                    Field::Vocab => vocab = Some(map.next_value::<VocabMap>()?),
                    Field::Merges => merges = Some(map.next_value::<MergeList>()?.0),
                    Field::Other => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            let (true, Some(VocabMap(vocab, tokens)), Some(merges)) = (typed, vocab, merges) else {
                return Err(A::Error::custom("missing type/vocab/merges"));
            };
            let mut bpe = builder
                .vocab_and_merges(vocab, merges)
                .build()
                .map_err(A::Error::custom)?;
            // An empty prefix or suffix (Qwen2/Qwen3 declare both) is the same as none: the
            // builder cut a prefix of length 0 from merge results, and `merge_word` only ever
            // formats it onto each character, allocating a copy of every character of every
            // word (a third of BPE time). No other BPE code reads them.
            if prefix.as_deref() == Some("") {
                bpe.continuing_subword_prefix = None;
            }
            if suffix.as_deref() == Some("") {
                bpe.end_of_word_suffix = None;
            }
            Ok(Bpe(bpe, tokens))
        }
    }

    /// `vocab`, inserted as it streams, and every token's text by id for the byte table. A
    /// repeated token or id is declined: the crate's reverse map would then depend on hash order.
    struct VocabMap(Vocab, ModelTokens);

    /// The model's tokens by id, in one buffer (`spans[id]` into `text`; `u32::MAX`: no token).
    #[derive(Default)]
    pub(super) struct ModelTokens {
        text: String,
        spans: Vec<(u32, u32)>,
    }

    impl ModelTokens {
        /// Ids above this are declined (the table is indexed by id).
        const MAX_ID: u32 = 1 << 24;

        /// What the crate's `BPE::id_to_token(id)` returns, borrowed.
        pub(super) fn get(&self, id: u32) -> Option<&str> {
            let &(a, b) = self.spans.get(id as usize)?;
            self.text.get(a as usize..b as usize)
        }
    }

    impl<'de> Deserialize<'de> for VocabMap {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = VocabMap;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a map of token to id")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<VocabMap, A::Error> {
                    let mut vocab = Vocab::with_capacity(map.size_hint().unwrap_or(1 << 16));
                    let mut tokens = ModelTokens::default();
                    while let Some((k, v)) = map.next_entry::<String, u32>()? {
                        if v >= ModelTokens::MAX_ID {
                            return Err(A::Error::custom("a token id beyond the table"));
                        }
                        let i = v as usize;
                        if tokens.spans.len() <= i {
                            tokens.spans.resize(i + 1, (u32::MAX, u32::MAX));
                        }
                        if tokens.spans[i].0 != u32::MAX {
                            return Err(A::Error::custom("a repeated id"));
                        }
                        let start = tokens.text.len();
                        tokens.text.push_str(&k);
                        let end = u32::try_from(tokens.text.len())
                            .map_err(|_| A::Error::custom("a vocabulary over 4 GB"))?;
                        tokens.spans[i] = (start as u32, end);
                        if vocab.insert(k, v).is_some() {
                            return Err(A::Error::custom("a repeated token"));
                        }
                    }
                    Ok(VocabMap(vocab, tokens))
                }
            }
            d.deserialize_map(V)
        }
    }

    /// `merges`: all `["a", "b"]` pairs, or all legacy `"a b"` strings (`#version` lines
    /// skipped, exactly one space), as the crate's untagged `MergeType` takes them.
    struct MergeList(Merges);

    impl<'de> Deserialize<'de> for MergeList {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_seq(MergesVisitor)
        }
    }

    /// One merge in either form.
    enum Merge {
        Pair(String, String),
        Legacy(String),
    }

    impl<'de> Deserialize<'de> for Merge {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Merge;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a merge")
                }
                fn visit_str<E: Error>(self, s: &str) -> Result<Merge, E> {
                    Ok(Merge::Legacy(s.to_owned()))
                }
                fn visit_string<E: Error>(self, s: String) -> Result<Merge, E> {
                    Ok(Merge::Legacy(s))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Merge, A::Error> {
                    let (Some(a), Some(b)) =
                        (seq.next_element::<String>()?, seq.next_element::<String>()?)
                    else {
                        return Err(A::Error::custom("a merge pair needs two strings"));
                    };
                    if seq.next_element::<IgnoredAny>()?.is_some() {
                        return Err(A::Error::custom("a merge pair has two strings"));
                    }
                    Ok(Merge::Pair(a, b))
                }
            }
            d.deserialize_any(V)
        }
    }

    struct MergesVisitor;

    impl<'de> Visitor<'de> for MergesVisitor {
        type Value = MergeList;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of merges")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MergeList, A::Error> {
            let mut merges = Merges::with_capacity(seq.size_hint().unwrap_or(1 << 16));
            let mut legacy = None;
            while let Some(m) = seq.next_element::<Merge>()? {
                let is_legacy = matches!(m, Merge::Legacy(_));
                if *legacy.get_or_insert(is_legacy) != is_legacy {
                    return Err(A::Error::custom("mixed merge forms"));
                }
                match m {
                    Merge::Pair(a, b) => merges.push((a, b)),
                    Merge::Legacy(line) if line.starts_with("#version") => {}
                    Merge::Legacy(line) => {
                        let mut parts = line.split(' ');
                        let (Some(a), Some(b), None) = (parts.next(), parts.next(), parts.next())
                        else {
                            return Err(A::Error::custom("a legacy merge needs one space"));
                        };
                        merges.push((a.to_owned(), b.to_owned()));
                    }
                }
            }
            Ok(MergeList(merges))
        }
    }

    /// The tokenizer and its model's tokens by id, or `None` when this parse does not take the
    /// file (the caller then uses the crate's own load, which gives its result or its error).
    pub(super) fn load(json: &[u8]) -> Option<(tokenizers::Tokenizer, ModelTokens)> {
        let doc: Document = serde_json::from_slice(json).ok()?;
        if doc.version.0.as_deref().is_some_and(|v| v != "1.0") {
            return None;
        }
        let mut inner = TokenizerBuilder::<
            ModelWrapper,
            NormalizerWrapper,
            PreTokenizerWrapper,
            PostProcessorWrapper,
            DecoderWrapper,
        >::new()
        .with_model(ModelWrapper::BPE(doc.model.0))
        .with_normalizer(doc.normalizer)
        .with_pre_tokenizer(doc.pre_tokenizer)
        .with_post_processor(doc.post_processor)
        .with_decoder(doc.decoder)
        .with_truncation(doc.truncation)
        .with_padding(doc.padding)
        .build()
        .ok()?;
        let added: Vec<AddedToken> = doc.added_tokens.into_iter().map(|t| t.token).collect();
        inner.add_tokens(&added);
        Some((inner.into(), doc.model.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_facts() {
        let t = Tokenizer::default_qwen3().expect("embedded tokenizer loads");
        assert_eq!(t.vocab_size(), 151_643);
        let mut ids = t.all_special_ids().to_vec();
        ids.sort_unstable();
        assert_eq!(ids, (151_643..=151_656).collect::<Vec<u32>>());
        assert_eq!(t.num_special_tokens_to_add(), 0);
        assert_eq!(t.bos_token_id(), None);
        assert_eq!(t.eos_token_id(), Some(151_645));
        assert!(t.chat_template().is_some());
        let ids = t.encode("Hello there").unwrap();
        assert_eq!(t.decode(&ids).unwrap(), "Hello there");
    }

    const VECTORS: [&str; 9] = [
        "Hello there, it's   a test.\n\n\tTabs, 12345 numbers and don't/won't",
        "<|im_start|>user\nHi<|im_end|><|endoftext|> <|begin_of_text|>x<|eot_id|>",
        "日本語のテキストと한국어 문장, 中文句子。カタカナ",
        "emoji 🙂🚀 and combining e\u{301} Å \u{2028} \r\n end",
        "    indented code:\n\tfn main() { println!(\"{}\", 1_000); }\n",
        "ĠĠ Ġ Ċ literal byte-level chars",
        "",
        " ",
        "a",
    ];

    /// The fast load gives the crate's own tokenizer: the same BPE (vocab, reverse vocab,
    /// merge ranks and results, options, an empty prefix or suffix aside), the same serialized
    /// pipeline and added vocabulary, the same encodings and decodes, and the same byte table.
    fn assert_same_load(json: &[u8]) {
        let (fast, model_tokens) = fast_load::load(json).expect("the fast load takes this file");
        let reference = tokenizers::Tokenizer::from_bytes(json).expect("the crate loads it");
        // The one difference: an empty prefix or suffix becomes none.
        let mut fast_value = serde_json::to_value(&fast).unwrap();
        let reference_value = serde_json::to_value(&reference).unwrap();
        match (fast.get_model(), reference.get_model()) {
            (tokenizers::ModelWrapper::BPE(a), tokenizers::ModelWrapper::BPE(b)) => {
                let mut a = a.clone();
                for (mine, theirs, key) in [
                    (
                        &mut a.continuing_subword_prefix,
                        &b.continuing_subword_prefix,
                        "continuing_subword_prefix",
                    ),
                    (
                        &mut a.end_of_word_suffix,
                        &b.end_of_word_suffix,
                        "end_of_word_suffix",
                    ),
                ] {
                    if mine.is_none() && theirs.as_deref() == Some("") {
                        *mine = Some(String::new());
                        fast_value["model"][key] = "".into();
                    }
                }
                assert!(a == *b, "BPE models differ");
            }
            _ => panic!("both are BPE"),
        }
        assert!(
            fast_value == reference_value,
            "serialized tokenizers differ"
        );
        // The table's length is the crate's count, without its vocabulary copy.
        assert_eq!(ByteTable::total(&fast), reference.get_vocab_size(true));
        assert_eq!(ByteTable::total(&reference), reference.get_vocab_size(true));
        if is_byte_level(&reference) {
            assert_eq!(
                ByteTable::build_with(&fast, &model_tokens),
                ByteTable::build(&reference)
            );
        }
        assert_eq!(
            fast.get_vocab_size(true),
            reference.get_vocab_size(true),
            "added vocabulary"
        );
        for text in VECTORS {
            for special in [false, true] {
                let a = fast.encode(text, special).unwrap();
                let b = reference.encode(text, special).unwrap();
                assert_eq!(a.get_ids(), b.get_ids(), "{text:?}");
                assert_eq!(a.get_offsets(), b.get_offsets(), "{text:?}");
            }
        }
        // Every id (added ones included) decodes alike, in runs of 97 consecutive ids.
        let total = reference.get_vocab_size(true) as u32;
        let ids: Vec<u32> = (0..total).collect();
        for run in ids.chunks(97) {
            for skip in [false, true] {
                assert_eq!(
                    fast.decode(run, skip).unwrap(),
                    reference.decode(run, skip).unwrap()
                );
            }
        }
        let text = reference
            .decode(&ids[..ids.len().min(20_000)], false)
            .unwrap();
        assert_eq!(
            fast.encode_fast(text.as_str(), false).unwrap().get_ids(),
            reference
                .encode_fast(text.as_str(), false)
                .unwrap()
                .get_ids()
        );
    }

    #[test]
    fn fast_load_equals_the_crates_load_qwen3() {
        assert_same_load(QWEN3_TOKENIZER_JSON);
    }

    #[test]
    fn fast_load_equals_the_crates_load_llama_legacy_merges() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/synth/tokenizers/llama-3.2/tokenizer.json"
        );
        assert_same_load(&std::fs::read(path).expect("the Llama-3.2 fixture"));
    }

    /// A small BPE with every option set, merges in both forms.
    fn small(model_extra: &str, merges: &str) -> String {
        format!(
            r###"{{"version":"1.0","truncation":null,"padding":null,
            "added_tokens":[{{"id":5,"content":"<s>","single_word":false,"lstrip":false,
            "rstrip":false,"normalized":false,"special":true}}],
            "normalizer":null,"pre_tokenizer":{{"type":"Whitespace"}},"post_processor":null,
            "decoder":null,"model":{{"type":"BPE","dropout":null,"unk_token":"<unk>",
            "continuing_subword_prefix":"##","end_of_word_suffix":null,"fuse_unk":true,
            "byte_fallback":false,"ignore_merges":true{model_extra},
            "vocab":{{"<unk>":0,"a":1,"##b":2,"ab":3,"c":4}},"merges":{merges}}}}}"###
        )
    }

    #[test]
    fn fast_load_small_models_equal_the_crates() {
        assert_same_load(small("", r###"[["a","##b"]]"###).as_bytes());
        assert_same_load(small("", r###"["#version: 0.2","a ##b"]"###).as_bytes());
        assert_same_load(small(r#","unknown_key":[1,{}]"#, "[]").as_bytes());
    }

    /// What the fast load does not take exactly as the crate does, it leaves to the crate.
    #[test]
    fn fast_load_declines_what_it_does_not_mirror() {
        let declined = [
            // Mixed merge forms (the crate refuses them).
            small("", r###"[["a","##b"],"a ##b"]"###),
            // A legacy merge with two spaces (the crate refuses it).
            small("", r###"["a ##b c"]"###),
            // A pair of three (the crate refuses it).
            small("", r###"[["a","##b","c"]]"###),
            // Another version (the crate refuses it).
            small("", "[]").replacen(r#""version":"1.0""#, r#""version":"2.0""#, 1),
            // A model without `type` (the crate takes it through its untagged fallback).
            small("", "[]").replacen(r#""type":"BPE","#, "", 1),
            // Another model type.
            small("", "[]").replacen(r#""type":"BPE""#, r#""type":"WordPiece""#, 1),
            // Duplicate top-level keys.
            small("", "[]").replacen(r#""padding":null,"#, r#""padding":null,"padding":null,"#, 1),
        ];
        for json in declined {
            assert!(fast_load::load(json.as_bytes()).is_none(), "{json}");
        }
        // Whatever the crate makes of the typeless model, `from_bytes` gives it.
        let typeless = small("", "[]").replacen(r#""type":"BPE","#, "", 1);
        let t = Tokenizer::from_bytes(typeless.as_bytes(), None).expect("the crate takes it");
        assert_eq!(t.inner().get_vocab_size(true), 6);
    }
}
