//! `kvbust synth agentic-code`: AIPerf 0.13.0's `aiperf synthesize agentic-code`, byte for byte —
//! synthetic agentic-coding sessions from a distribution config, written as a mooncake trace
//! (`dataset.jsonl`) with AIPerf's `manifest.json` and `quality.json`. Owns the generation and
//! the three files' bytes; must never touch the file system (the command line writes them).

pub mod config;
pub mod sessions;
pub mod writer;

pub use config::DistributionConfig;

/// The three files of a run, as bytes.
#[derive(Debug, Clone)]
pub struct Generated {
    pub dataset_jsonl: Vec<u8>,
    pub manifest_json: String,
    pub quality_json: String,
    /// Sessions written (restart continuations included) and their rows.
    pub sessions: usize,
    pub rows: usize,
    /// The rows' `input_length` (a turn's new tokens, as dataset.jsonl writes it) and
    /// `output_length`, summed (for the command's summary line).
    pub input_tokens: i64,
    pub output_tokens: i64,
}

/// Synthesizes `num_sessions` sessions under `seed` (numpy's `default_rng(seed)`) and renders
/// AIPerf's files; `config_name` goes into the manifest ("default" without `--config`).
pub fn generate(
    cfg: &DistributionConfig,
    seed: u64,
    num_sessions: usize,
    config_name: &str,
) -> Result<Generated, String> {
    let mut synth = sessions::Synthesizer::new(cfg, seed)?;
    let sessions = synth.sessions(num_sessions)?;
    let rows = sessions.iter().map(|s| s.turns.len()).sum();
    let turns = || sessions.iter().flat_map(|s| &s.turns);
    let input_tokens = turns().map(|t| t.new_tokens).sum();
    let output_tokens = turns().map(|t| t.output_length).sum();
    Ok(Generated {
        dataset_jsonl: writer::dataset_jsonl(&sessions, cfg.block_size),
        manifest_json: writer::manifest_json(seed, sessions.len(), Some(config_name), cfg),
        quality_json: writer::quality_json(&sessions, cfg),
        sessions: sessions.len(),
        rows,
        input_tokens,
        output_tokens,
    })
}
