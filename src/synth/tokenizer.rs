//! A HuggingFace tokenizer as AIPerf sees it through transformers 5: encode without special
//! tokens, decode keeping them, base vocab size, declared special ids, BOS and chat template.
//! Owns tokenizer loading and these facts; must never fetch anything over the network.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::SynthError;

const QWEN3_TOKENIZER_JSON: &[u8] = include_bytes!("../../assets/tokenizers/qwen3/tokenizer.json");
const QWEN3_TOKENIZER_CONFIG: &[u8] =
    include_bytes!("../../assets/tokenizers/qwen3/tokenizer_config.json");

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

    /// Loads `tokenizer.json` from a file, or `tokenizer.json` (+ `tokenizer_config.json` when
    /// present) from a folder.
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
            Self::from_bytes(&read(&json)?, config.as_deref())
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
        let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json).map_err(|e| {
            SynthError::TokenizerParse {
                what: "tokenizer.json".into(),
                message: e.to_string(),
            }
        })?;
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

        let id_of = |name: &str| inner.token_to_id(name);
        let mut all_special_ids = Vec::new();
        let mut seen = HashSet::new();
        let mut push = |id: Option<u32>, ids: &mut Vec<u32>| {
            if let Some(id) = id {
                if seen.insert(id) {
                    ids.push(id);
                }
            }
        };
        let attr_id = |attr: &str| config.get(attr).and_then(token_string).and_then(id_of);
        if config.is_object() {
            for attr in SPECIAL_ATTRIBUTES {
                push(attr_id(attr), &mut all_special_ids);
            }
            if let Some(extra) = config
                .get("additional_special_tokens")
                .and_then(Value::as_array)
            {
                for t in extra {
                    push(token_string(t).and_then(id_of), &mut all_special_ids);
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
        let chat_template = match config.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            _ => None,
        };
        let num_special_tokens_to_add = inner
            .get_post_processor()
            .map(|p| tokenizers::PostProcessor::added_tokens(p, false))
            .unwrap_or(0);
        Ok(Tokenizer {
            vocab_size: inner.get_vocab_size(false),
            bos_token_id: attr_id("bos_token"),
            eos_token_id: attr_id("eos_token"),
            all_special_ids,
            chat_template,
            num_special_tokens_to_add,
            fingerprint,
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
    pub fn decode(&self, ids: &[u32]) -> Result<String, SynthError> {
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

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
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
}
