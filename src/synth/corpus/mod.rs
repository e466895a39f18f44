//! The prompt corpora and the choice among them (`--prompt-corpus`): token arrays (the sonnet
//! corpus's, and the coding corpora's in the same shape), the random-corpus token pools, AIPerf's
//! coding corpus (`aiperf_coding`, a port) and kvbust's own (`kvbust_coding`), their token cache,
//! and AIPerf's hash-id blocks cut from a corpus (`hash_blocks`).
//! Owns corpus construction and content; draws only from the seeds and streams passed in, and
//! must never choose prompt lengths or shape a dataset (`prompt` and `dataset` do).

pub mod aiperf_coding;
pub mod cache;
pub mod hash_blocks;
pub mod kvbust_coding;
pub mod random;
pub mod sonnet;
pub mod tokens;

pub use random::{RandomCorpusStyle, RandomPools};
pub use tokens::TokenCorpus;

/// `--prompt-corpus`. Its names live in [`PromptCorpus::as_str`] only: serde, `FromStr` and
/// `Display` all go through it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(into = "&'static str", try_from = "String")]
pub enum PromptCorpus {
    #[default]
    Sonnet,
    Random,
    /// AIPerf's coding corpus ([`crate::synth::corpus::aiperf_coding`]): byte-equal to AIPerf, windows decoded
    /// without the fix-up loop (not token-exact).
    Coding,
    /// kvbust's own agentic-coding corpus ([`crate::synth::corpus::kvbust_coding`]), sampled like sonnet
    /// (token-exact).
    CodingExact,
}

impl PromptCorpus {
    /// Every corpus, in the order help texts list them.
    pub const ALL: [PromptCorpus; 4] = [
        PromptCorpus::Sonnet,
        PromptCorpus::Random,
        PromptCorpus::Coding,
        PromptCorpus::CodingExact,
    ];

    /// The name used in flags, configuration files and `{{kvbust:prompt:N:name}}`.
    pub fn as_str(self) -> &'static str {
        match self {
            PromptCorpus::Sonnet => "sonnet",
            PromptCorpus::Random => "random",
            PromptCorpus::Coding => "coding",
            PromptCorpus::CodingExact => "coding-exact",
        }
    }
}

impl std::fmt::Display for PromptCorpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PromptCorpus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase().replace('_', "-");
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == lower)
            .ok_or_else(|| {
                format!("unknown prompt corpus {s:?}; use sonnet, random, coding or coding-exact")
            })
    }
}

impl From<PromptCorpus> for &'static str {
    fn from(c: PromptCorpus) -> Self {
        c.as_str()
    }
}

impl TryFrom<String> for PromptCorpus {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}
