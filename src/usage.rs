//! Token counts as a response's `usage` reports them, in one meaning for every API: what the
//! observer reads, the access log writes and the cache model compares its prediction with.
//! A leaf: plain data, no parsing (the observer's `wire` reads each API's spelling into it).

/// Prompt, cached and generated tokens, the same meaning for every API.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    /// Every prompt token the server processed or reused. Anthropic reports the uncached part
    /// (`input_tokens`) apart from the cache hits and writes, so there it is
    /// `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`.
    pub prompt: Option<u64>,
    /// Prompt tokens served from the prefix cache (Anthropic: `cache_read_input_tokens`).
    pub cached: Option<u64>,
    pub completion: Option<u64>,
}
