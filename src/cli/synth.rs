//! `kvbust synth`: AIPerf's synthesis flags (plus `--bench-compat` for vLLM/SGLang parity),
//! writing JSONL conversations or ready OpenAI chat request bodies.
//! Owns flag parsing, file output and the progress bar; the content comes from the library.
//!
//! ```text
//! # AIPerf's dataset for these flags (same conversations, byte for byte):
//! kvbust synth --isl 1024 --osl 128 --random-seed 42 --num-dataset-entries 200 -o data.jsonl
//! kvbust synth --prompt-corpus random --random-range-ratio 0.5 --isl 512 --osl 64 \
//!     --random-seed 7 --tokenizer ./llama --format openai-chat --model llama -o bodies.jsonl
//! # vLLM's `--dataset-name random` prompts (prompt, prompt_len, expected_output_len):
//! kvbust synth --bench-compat vllm --random-input-len 1024 --random-output-len 128 \
//!     --random-range-ratio 0.5 --num-prompts 1000 --seed 0
//! ```

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;

use crate::synth::bench::{bench_requests, BenchParams, BenchRequest, BenchTool};
use crate::synth::corpus::sonnet::SHAKESPEARE;
use crate::synth::corpus::PromptCorpus;
use crate::synth::corpus::RandomCorpusStyle;
use crate::synth::corpus::TokenCorpus;
use crate::synth::dataset::agentic_code::{self, DistributionConfig};
use crate::synth::dataset::composer::build_dataset_with;
use crate::synth::dataset::export::{self, Answers, ChatOptions};
use crate::synth::dataset::marker::CacheBustTarget;
use crate::synth::dataset::params::{RangeRatio, SynthParams};
use crate::synth::dataset::trace::agentic::{self, schema};
use crate::synth::dataset::trace::burst;
use crate::synth::dataset::trace::input::TraceReader;
use crate::synth::dataset::trace::{self, analyze, record};
use crate::synth::dataset::trace_kind::{BlockTerminator, TraceKind};
use crate::synth::dataset::{Conversation, Dataset, Out, Turn, DEFAULT_MAX_ROW_BYTES};
use crate::synth::error::SynthError;
use crate::synth::tokenizer::Tokenizer;
use crate::units::ByteSize;

/// What the output file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// One conversation per line: `session_id`, `system_message`, `user_context_message`,
    /// `turns[{text, max_tokens, timestamp?, delay?}]` (with `--bench-compat`: `request_id`,
    /// `prompt`, `prompt_len`, `expected_output_len`).
    #[default]
    Conversations,
    /// One OpenAI `/v1/chat/completions` body per turn; a later turn's body holds the earlier
    /// turns, each followed by an assistant answer of that turn's output length (sonnet text).
    OpenaiChat,
    /// `{"prompt", "output_tokens"}` per turn for `vllm bench serve --dataset-name custom`.
    VllmCustom,
    /// A JSON array of `{"id", "conversations": [human, gpt, …]}` for the ShareGPT loaders of
    /// vLLM and SGLang; each `gpt` value is exactly the turn's output length in tokens.
    Sharegpt,
    /// AIPerf `mooncake_trace` lines (`text_input`, `output_length`, `session_id`,
    /// `timestamp`/`delay`): `aiperf --custom-dataset-type mooncake_trace` replays them as is.
    Mooncake,
}

/// Flags of `kvbust synth` (names follow AIPerf's; the `--random-input-len` group and
/// `--num-prompts`/`--seed` follow `vllm bench serve` / SGLang for `--bench-compat`).
#[derive(Debug, Clone, clap::Args)]
pub struct SynthArgs {
    /// Tokenizer: a tokenizer.json file or a folder with tokenizer.json (+ tokenizer_config.json).
    /// Default: the shipped Qwen3 tokenizer. [config: synth.tokenizer]
    #[arg(long, value_name = "PATH", env = "KVBUST_SYNTH__TOKENIZER")]
    pub tokenizer: Option<PathBuf>,
    /// Prompt corpus: sonnet, random, coding (AIPerf's coding corpus) or coding-exact (kvbust's
    /// own token-exact agentic-coding corpus). Default: sonnet; coding for weka_trace and tracelab
    /// input.
    #[arg(long, value_name = "CORPUS")]
    pub prompt_corpus: Option<PromptCorpus>,
    /// Mean input sequence length in tokens (AIPerf default 550).
    #[arg(long, value_name = "N", visible_alias = "synthetic-input-tokens-mean")]
    pub isl: Option<u64>,
    /// Standard deviation of the input length.
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        visible_alias = "synthetic-input-tokens-stddev"
    )]
    pub isl_stddev: f64,
    /// Mean output length (max_tokens); none → no max_tokens.
    #[arg(long, value_name = "N", visible_alias = "output-tokens-mean")]
    pub osl: Option<u64>,
    /// Standard deviation of the output length.
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        visible_alias = "output-tokens-stddev"
    )]
    pub osl_stddev: f64,
    /// Root seed; without it the dataset is not reproducible and session ids are uuids.
    #[arg(long, value_name = "N")]
    pub random_seed: Option<u64>,
    /// Range ratio for ISL/OSL: a number, or (vllm style) {"input": a, "output": b}.
    #[arg(long, value_name = "R")]
    pub random_range_ratio: Option<RangeRatio>,
    /// Random corpus style / range-ratio semantics: vllm or sglang.
    #[arg(long, value_name = "STYLE", default_value = "vllm")]
    pub random_corpus_style: RandomCorpusStyle,
    /// Number of conversations (default 100). With an agentic trace: keep the first N traces
    /// that fit --max-context-length (all of them when not given), as AIPerf does.
    #[arg(long, value_name = "N", visible_alias = "num-conversations")]
    pub num_dataset_entries: Option<usize>,
    /// Size of the prefix pool (0: off).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub num_prefix_prompts: usize,
    /// Token length of each prefix-pool prompt.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub prefix_prompt_length: usize,
    /// Token length of the shared system prompt (the same for every conversation).
    #[arg(long, value_name = "N")]
    pub shared_system_prompt_length: Option<usize>,
    /// Token length of the per-conversation user-context prompt.
    #[arg(long, value_name = "N")]
    pub user_context_prompt_length: Option<usize>,
    /// A verbatim system prompt for every conversation.
    #[arg(long, value_name = "TEXT")]
    pub system_prompt: Option<String>,
    /// Mean number of turns per conversation.
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub session_turns_mean: f64,
    /// Standard deviation of the number of turns.
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    pub session_turns_stddev: f64,
    /// Cache-bust target the dataset will be sent with (shrinks prompts by the marker's cost).
    #[arg(long, value_name = "TARGET", default_value = "none")]
    pub cache_bust: CacheBustTarget,
    /// Compensate input lengths for the tokenizer's chat template.
    #[arg(long)]
    pub apply_chat_template: bool,
    /// Output file (default: standard output).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Conversations)]
    pub format: OutputFormat,
    /// The model on every turn, as AIPerf's composer sets it: each turn of `conversations`
    /// lines, each openai-chat body (default there "model"). For weka_trace input,
    /// AIPerf's `--model`: the trace's models map onto these comma-separated names, its main
    /// model onto the first (without it, the trace's own model names are kept).
    #[arg(long, value_name = "NAME[,NAME…]")]
    pub model: Option<String>,
    /// openai-chat: streaming bodies (`"stream": true` and `stream_options.include_usage`).
    #[arg(long)]
    pub stream: bool,
    /// Replay a hash-id trace (JSONL) instead of synthesizing conversations, as
    /// `aiperf profile --input-file FILE` does.
    #[arg(long, value_name = "FILE")]
    pub input_file: Option<PathBuf>,
    /// The trace's format: mooncake_trace, bailian_trace, weka_trace (a Weka JSON trace, a
    /// directory of them, or a cc-traces JSON-lines export), burst_gpt_trace (a BurstGPT CSV)
    /// or tracelab (uw-syfi TraceLab rounds, JSON lines, plain or gzipped). Default: detected
    /// from the input.
    #[arg(long, value_name = "TYPE")]
    pub custom_dataset_type: Option<TraceKind>,
    /// Tokens per hash-id block (default 512 for mooncake_trace, 16 for bailian_trace, 64 for
    /// weka_trace whatever the trace declares, as `aiperf profile` does; tracelab: the size its
    /// block ids are synthesized at, default 64). A kvbust capture's own block size is read
    /// from its `.meta.json` when this is not given.
    #[arg(long, value_name = "N")]
    pub isl_block_size: Option<usize>,
    /// Trace requests with more input tokens are skipped (weka: top-level requests;
    /// burst_gpt_trace: rows).
    #[arg(long, value_name = "N")]
    pub synthesis_max_isl: Option<u64>,
    /// Caps trace requests' max_tokens (weka: top-level requests, not subagents', as AIPerf).
    #[arg(long, value_name = "N")]
    pub synthesis_max_osl: Option<u64>,
    /// mooncake_trace, bailian_trace: divide timestamps by this (2 replays twice as fast).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 1.0,
        allow_hyphen_values = true
    )]
    pub synthesis_speedup_ratio: f64,
    /// mooncake_trace, bailian_trace: stretch (or cut) the shared hash-id prefixes by this.
    #[arg(
        long,
        value_name = "X",
        default_value_t = 1.0,
        allow_hyphen_values = true
    )]
    pub synthesis_prefix_len_multiplier: f64,
    /// mooncake_trace, bailian_trace: spread the requests over this many independent prefix
    /// trees (seeded draws, as AIPerf).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        allow_hyphen_values = true
    )]
    pub synthesis_prefix_root_multiplier: i64,
    /// mooncake_trace, bailian_trace: scale the unique (non-shared) prompt lengths by this.
    #[arg(
        long,
        value_name = "X",
        default_value_t = 1.0,
        allow_hyphen_values = true
    )]
    pub synthesis_prompt_len_multiplier: f64,
    /// mooncake_trace, bailian_trace: scale output lengths by this.
    #[arg(
        long,
        value_name = "X",
        default_value_t = 1.0,
        allow_hyphen_values = true
    )]
    pub synthesis_output_len_multiplier: f64,
    /// weka_trace, tracelab: drop traces whose peak input + max_tokens exceeds the model's context.
    #[arg(long, value_name = "N")]
    pub max_context_length: Option<u64>,
    /// weka_trace, tracelab: clamp inter-turn delays to at most this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub inter_turn_delay_cap_seconds: Option<f64>,
    /// weka_trace, tracelab: compress idle gaps between request starts longer than this many seconds,
    /// per trace (wins over --inter-turn-delay-cap-seconds).
    #[arg(long, value_name = "SECONDS")]
    pub trace_idle_gap_cap_seconds: Option<f64>,
    /// weka_trace, tracelab: a turn's delay is its recorded think_time (when it has one).
    #[arg(long)]
    pub use_think_time_only: bool,
    /// weka_trace, tracelab: send tool results as `role: tool` messages answering a synthetic
    /// `tool_calls` entry on the assistant turn before (AIPerf's WEKA_TOOL_SHAPED_MESSAGES).
    #[arg(long)]
    pub tool_shaped_messages: bool,
    /// Trace input: a row AIPerf's loader drops (a BurstGPT row whose numbers do not parse, a
    /// TraceLab row with no session_id) is an error (exit 2) instead of a warning.
    #[arg(long)]
    pub strict: bool,
    /// What starts each trace block. `aiperf` (default, byte-exact): the tokenizer's BOS, else
    /// its EOS (`<|im_end|>` for Qwen3). `none` (kvbust extension): corpus tokens only — use it
    /// when the server parses special-token text in user content, which would otherwise see an
    /// end-of-message token at every block start.
    #[arg(long, value_enum, value_name = "WHICH", default_value_t = BlockTerminator::Aiperf)]
    pub trace_block_terminator: BlockTerminator,
    /// Trace input: the most prompt text one conversation may hold (e.g. 256MiB, 1GiB). A
    /// replay is built and written one conversation at a time, so this bounds its memory (about
    /// three times this); a conversation over it stops the run (exit 2) naming it.
    #[arg(long, value_name = "SIZE", default_value_t = ByteSize(DEFAULT_MAX_ROW_BYTES))]
    pub max_row_bytes: ByteSize,
    /// tracelab: the hash-id blocks the file's rows may ask for in all (at --isl-block-size).
    /// TraceLab rows hold token counts, not ids, so a file of kilobytes can ask for billions of
    /// ids; over this the run stops (exit 2) naming the row.
    #[arg(long, value_name = "N", default_value_t = agentic::tracelab::DEFAULT_MAX_BLOCKS)]
    pub max_blocks: u64,
    /// Folder for cached corpus token ids (default: $KVBUST_CACHE_DIR, $XDG_CACHE_HOME/kvbust or
    /// ~/.cache/kvbust).
    #[arg(long, value_name = "DIR")]
    pub corpus_cache_dir: Option<PathBuf>,
    /// Always tokenize the corpus afresh; neither read nor write the cache.
    #[arg(long)]
    pub no_corpus_cache: bool,
    /// Reproduce another tool's random dataset instead of AIPerf's: vllm (`vllm bench serve
    /// --dataset-name random`, 0.17–0.33) or sglang (`random-ids`, 0.5.14–0.5.23).
    #[arg(long, value_name = "TOOL")]
    pub bench_compat: Option<BenchTool>,
    /// --bench-compat: input length (vLLM and SGLang default 1024).
    #[arg(long, value_name = "N")]
    pub random_input_len: Option<u64>,
    /// --bench-compat: output length (vLLM default 128, SGLang 1024).
    #[arg(long, value_name = "N")]
    pub random_output_len: Option<u64>,
    /// --bench-compat vllm: shared prefix length.
    #[arg(long, value_name = "N")]
    pub random_prefix_len: Option<usize>,
    /// --bench-compat: number of prompts (default 1000).
    #[arg(long, value_name = "N")]
    pub num_prompts: Option<usize>,
    /// --bench-compat: the tool's --seed (vLLM default 0, SGLang 42); falls back to --random-seed.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
}

impl SynthArgs {
    /// The library parameters for AIPerf-style synthesis.
    pub fn to_params(&self) -> SynthParams {
        SynthParams {
            prompt_corpus: self.prompt_corpus,
            isl: self.isl,
            isl_stddev: self.isl_stddev,
            osl: self.osl,
            osl_stddev: self.osl_stddev,
            random_seed: self.random_seed,
            range_ratio: self.random_range_ratio,
            random_corpus_style: self.random_corpus_style,
            num_dataset_entries: self.num_dataset_entries,
            num_prefix_prompts: self.num_prefix_prompts,
            prefix_prompt_length: self.prefix_prompt_length,
            shared_system_prompt_length: self.shared_system_prompt_length,
            user_context_prompt_length: self.user_context_prompt_length,
            system_prompt: self.system_prompt.clone(),
            session_turns_mean: self.session_turns_mean,
            session_turns_stddev: self.session_turns_stddev,
            cache_bust: self.cache_bust,
            apply_chat_template: self.apply_chat_template,
            input_file: self.input_file.clone(),
            custom_dataset_type: self.custom_dataset_type,
            isl_block_size: self.isl_block_size,
            trace_block_terminator: self.trace_block_terminator,
            synthesis_max_isl: self.synthesis_max_isl,
            synthesis_max_osl: self.synthesis_max_osl,
            synthesis_speedup_ratio: self.synthesis_speedup_ratio,
            synthesis_prefix_len_multiplier: self.synthesis_prefix_len_multiplier,
            synthesis_prefix_root_multiplier: self.synthesis_prefix_root_multiplier,
            synthesis_prompt_len_multiplier: self.synthesis_prompt_len_multiplier,
            synthesis_output_len_multiplier: self.synthesis_output_len_multiplier,
            max_context_length: self.max_context_length,
            inter_turn_delay_cap_seconds: self.inter_turn_delay_cap_seconds,
            trace_idle_gap_cap_seconds: self.trace_idle_gap_cap_seconds,
            use_think_time_only: self.use_think_time_only,
            tool_shaped_messages: self.tool_shaped_messages,
            model: self.model.clone(),
            strict: self.strict,
        }
    }

    /// The tool parameters for `--bench-compat`, or an error naming flags that do not apply.
    pub fn to_bench_params(&self, tool: BenchTool) -> Result<BenchParams, SynthError> {
        let aiperf_only = [
            (self.isl.is_some(), "--isl"),
            (self.osl.is_some(), "--osl"),
            (
                self.shared_system_prompt_length.is_some(),
                "--shared-system-prompt-length",
            ),
            (
                self.user_context_prompt_length.is_some(),
                "--user-context-prompt-length",
            ),
            (self.system_prompt.is_some(), "--system-prompt"),
            (self.num_prefix_prompts > 0, "--num-prefix-prompts"),
            (self.cache_bust != CacheBustTarget::None, "--cache-bust"),
            (self.apply_chat_template, "--apply-chat-template"),
            (
                self.prompt_corpus
                    .is_some_and(|c| c != PromptCorpus::Sonnet),
                "--prompt-corpus",
            ),
        ];
        if let Some((_, flag)) = aiperf_only.iter().find(|(set, _)| *set) {
            return Err(SynthError::InvalidParams(format!(
                "{flag} is an AIPerf flag and does not apply with --bench-compat; use \
                 --random-input-len, --random-output-len, --random-range-ratio, \
                 --random-prefix-len, --num-prompts and --seed"
            )));
        }
        let (seed, output_len) = match tool {
            BenchTool::Vllm => (0, 128),
            BenchTool::Sglang => (42, 1024),
        };
        Ok(BenchParams {
            tool,
            seed: self.seed.or(self.random_seed).unwrap_or(seed),
            num_prompts: self.num_prompts.unwrap_or(1000),
            input_len: self.random_input_len.unwrap_or(1024),
            output_len: self.random_output_len.unwrap_or(output_len),
            range_ratio: self.random_range_ratio.unwrap_or(RangeRatio {
                input: 0.0,
                output: 0.0,
                per_direction: false,
            }),
            prefix_len: self.random_prefix_len.unwrap_or(0),
        })
    }

    fn check_no_bench_flags(&self) -> Result<(), SynthError> {
        let bench_only = [
            (
                self.random_input_len.is_some(),
                "--random-input-len",
                "--isl",
            ),
            (
                self.random_output_len.is_some(),
                "--random-output-len",
                "--osl",
            ),
            (
                self.random_prefix_len.is_some(),
                "--random-prefix-len",
                "--num-prefix-prompts",
            ),
            (
                self.num_prompts.is_some(),
                "--num-prompts",
                "--num-dataset-entries",
            ),
            (self.seed.is_some(), "--seed", "--random-seed"),
        ];
        if let Some((_, flag, instead)) = bench_only.iter().find(|(set, _, _)| *set) {
            return Err(SynthError::InvalidParams(format!(
                "{flag} is a vLLM/SGLang flag: add --bench-compat vllm|sglang, or use {instead} \
                 for AIPerf-style synthesis"
            )));
        }
        Ok(())
    }
}

/// Loads `--tokenizer`, or the shipped Qwen3 tokenizer.
pub fn load_tokenizer(path: Option<&Path>) -> anyhow::Result<Tokenizer> {
    match path {
        None => Ok(Tokenizer::default_qwen3()?),
        Some(p) if !p.exists() => anyhow::bail!(
            "tokenizer {} is not a local file or folder; kvbust never downloads tokenizers, so \
             pass a tokenizer.json file or a folder holding one",
            p.display()
        ),
        Some(p) => {
            Tokenizer::from_path(p).with_context(|| format!("loading tokenizer {}", p.display()))
        }
    }
}

fn progress_bar(total: u64) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} synthesizing {pos}/{len} conversations [{elapsed_precise}] {wide_bar} {eta}",
    ) {
        bar.set_style(style);
    }
    Some(bar)
}

/// A spinner on standard error while `what` runs (on a terminal only, like the bar).
fn spinner(what: &str) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let s = indicatif::ProgressBar::new_spinner();
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}]")
    {
        s.set_style(style);
    }
    s.set_message(what.to_owned());
    // Drawn now, so even a short step shows what it does; then every 100 ms.
    s.tick();
    s.enable_steady_tick(std::time::Duration::from_millis(100));
    Some(s)
}

/// The bench requests as single-turn conversations (session id = request id), for the
/// formats other than `conversations`.
fn bench_dataset(requests: &[BenchRequest]) -> Dataset {
    Dataset {
        conversations: requests
            .iter()
            .map(|r| Conversation {
                session_id: r.request_id.clone(),
                system_message: None,
                user_context_message: None,
                turns: vec![Turn {
                    text: r.prompt.clone(),
                    max_tokens: Some(r.expected_output_len),
                    ..Turn::default()
                }],
                agentic: None,
            })
            .collect(),
    }
}

/// `--model`'s names (comma-separated for the agentic traces; one name elsewhere).
fn model_names(model: Option<&str>) -> Vec<&str> {
    model.map_or_else(Vec::new, |m| m.split(',').map(str::trim).collect())
}

/// How `write_dataset` writes: the format and its options.
pub struct WriteOptions<'a> {
    pub format: OutputFormat,
    pub model: &'a str,
    pub stream: bool,
}

/// Writes a dataset in `opts.format`. `answers` supplies assistant texts (openai-chat
/// multi-turn, sharegpt); `None` is fine for the other formats.
pub fn write_dataset(
    out: &mut dyn Write,
    dataset: &Dataset,
    opts: &WriteOptions,
    answers: Option<&mut Answers>,
) -> Result<(), SynthError> {
    let need = || SynthError::invalid("this format needs answer texts (an Answers source)");
    match opts.format {
        OutputFormat::Conversations => {
            for conv in &dataset.conversations {
                writeln!(out, "{}", conv.to_json_line())?;
            }
            Ok(())
        }
        OutputFormat::OpenaiChat => export::write_openai_chat(
            out,
            dataset,
            answers.ok_or_else(need)?,
            ChatOptions {
                model: opts.model,
                stream: opts.stream,
            },
        ),
        OutputFormat::VllmCustom => export::write_vllm_custom(out, dataset),
        OutputFormat::Sharegpt => export::write_sharegpt(out, dataset, answers.ok_or_else(need)?),
        OutputFormat::Mooncake => export::write_mooncake(out, dataset),
    }
}

/// Writes to `path` through a temporary file renamed into place, so a failure never leaves a
/// partial file behind; `None` writes to standard output.
fn write_output(
    path: Option<&Path>,
    write: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    write_counted(path, write).map(|_| ())
}

/// What [`write_counted`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// All of it, this many bytes.
    Bytes(u64),
    /// Standard output's reader went away first (`| head`): not a failure, nothing to report.
    PipeClosed,
}

/// [`write_output`], counting the bytes; a closed standard output ends the write quietly.
fn write_counted(
    path: Option<&Path>,
    write: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>,
) -> anyhow::Result<Written> {
    let Some(path) = path else {
        let mut out = Counting::new(std::io::BufWriter::new(std::io::stdout().lock()));
        let result = write(&mut out).and_then(|()| Ok(out.flush()?));
        return match result {
            Err(e) if is_broken_pipe(&e) => Ok(Written::PipeClosed),
            r => r.map(|()| Written::Bytes(out.bytes)),
        };
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.kvbust-{}.tmp", std::process::id()));
    let _removed_on_signal = Temp::register(&tmp);
    let result = (|| -> anyhow::Result<Written> {
        let file =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", path.display()))?;
        let mut out = Counting::new(std::io::BufWriter::new(file));
        write(&mut out)?;
        out.flush()?;
        let bytes = out.bytes;
        drop(out);
        std::fs::rename(&tmp, path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Written::Bytes(bytes))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Temporary output files being written: SIGINT or SIGTERM removes them before the process
/// ends (with 130 or 143, as a shell reports those signals), so an interrupted synthesis
/// leaves no hidden file of gigabytes behind.
static TEMPS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// One registered temporary file: unregistered when dropped (renamed into place or removed).
struct Temp(PathBuf);

impl Temp {
    fn register(path: &Path) -> Temp {
        watch_signals();
        crate::sync::lock(&TEMPS).push(path.to_path_buf());
        Temp(path.to_path_buf())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        crate::sync::lock(&TEMPS).retain(|p| *p != self.0);
    }
}

/// Starts, once, the thread that waits for SIGINT and SIGTERM. The handlers are in place
/// before it returns (set up on this thread), so no temporary file is made unwatched.
fn watch_signals() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            else {
                return;
            };
            let signals = {
                let _in = rt.enter();
                (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                )
            };
            let (Ok(mut int), Ok(mut term)) = signals else {
                return;
            };
            let waiting = std::thread::Builder::new()
                .name("kvbust-signals".into())
                .spawn(move || {
                    let code = rt.block_on(async {
                        tokio::select! {
                            _ = int.recv() => 130,
                            _ = term.recv() => 143,
                        }
                    });
                    for p in crate::sync::lock(&TEMPS).drain(..) {
                        let _ = std::fs::remove_file(p);
                    }
                    std::process::exit(code);
                });
            if let Err(e) = waiting {
                tracing::warn!("cannot watch for SIGINT/SIGTERM: {e}; an interrupted write may leave its temporary file");
            }
        }
    });
}

/// Whether `e` is a write to a pipe whose reader has gone (`kvbust synth … | head`).
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// A writer that counts the bytes it passes on (for the summary line).
struct Counting<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Counting<W> {
    fn new(inner: W) -> Self {
        Counting { inner, bytes: 0 }
    }
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The line `kvbust synth` ends with on standard error: what it wrote, where, how long it took.
fn summary(
    dataset: &Dataset,
    written: u64,
    to: Option<&Path>,
    elapsed: std::time::Duration,
) -> String {
    let turns: usize = dataset.conversations.iter().map(|c| c.turns.len()).sum();
    let osl: u64 = dataset
        .conversations
        .iter()
        .flat_map(|c| &c.turns)
        .filter_map(|t| t.max_tokens)
        .sum();
    let rows = format!(
        "{} conversations, {turns} turns, {osl} output tokens requested",
        dataset.conversations.len()
    );
    summary_line("synth", &rows, written, to, elapsed)
}

/// `kvbust synth: <rows>; <bytes> bytes to <where> in <seconds>s`, the one summary line every
/// long command ends with on standard error (`command` is `synth`, `analyze-trace`, ...).
pub fn summary_line(
    command: &str,
    rows: &str,
    written: u64,
    to: Option<&Path>,
    elapsed: std::time::Duration,
) -> String {
    let to = to.map_or_else(|| "standard output".to_owned(), |p| p.display().to_string());
    format!(
        "kvbust {command}: {rows}; {written} bytes to {to} in {:.2}s",
        elapsed.as_secs_f64()
    )
}

/// Flags an output format cannot do without, refused before any work (exit 2, as a missing
/// flag is everywhere): vLLM's custom loader and the ShareGPT loaders read each prompt's
/// output length, which only `--osl` (or a trace's `output_length`) gives.
fn check_format_flags(args: &SynthArgs, params: &SynthParams) -> Result<(), SynthError> {
    let needs_osl = match args.format {
        OutputFormat::VllmCustom => Some(
            "--format vllm-custom needs each prompt's output length: pass --osl N (vllm bench \
             serve --custom-output-len -1 reads it from the file)",
        ),
        OutputFormat::Sharegpt => Some(
            "--format sharegpt needs each answer's output length: pass --osl N (the gpt turns \
             are that many tokens long)",
        ),
        _ => None,
    };
    match needs_osl {
        Some(m) if params.osl.is_none() && params.input_file.is_none() => {
            Err(SynthError::InvalidParams(m.into()))
        }
        _ => Ok(()),
    }
}

/// Runs `kvbust synth`. Usage problems (flag combinations, values, a tokenizer path that does
/// not exist) come back as a [`SynthError`] inside the `anyhow::Error` (`InvalidParams`,
/// `TokenizerNotFound`), so a caller can map them to the usage exit code.
pub fn run(args: &SynthArgs) -> anyhow::Result<()> {
    run_with(args, false)
}

/// [`run`] for a process that exits right after: the tokenizer and the dataset are left for
/// the exit to reclaim (freeing Qwen3's maps and a large dataset piece by piece costs about
/// 0.05 CPU s and buys nothing then).
pub fn run_then_exit(args: &SynthArgs) -> anyhow::Result<()> {
    run_with(args, true)
}

/// The loaders' warnings (dropped trace rows, say) on stderr: `kvbust synth` sets up no server
/// logging, and they would otherwise be lost. A subscriber already set (tests) stays.
fn init_warnings() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .without_time()
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Every flag checked before any expensive work or touching the output file; warns (once, on
/// stderr) of a body model that is only a placeholder.
fn checked_job(args: &SynthArgs) -> anyhow::Result<Job> {
    let job = match args.bench_compat {
        Some(tool) => Job::Bench(args.to_bench_params(tool)?),
        None => {
            args.check_no_bench_flags()?;
            let mut params = args.to_params();
            if params.isl_block_size.is_none() {
                params.isl_block_size =
                    capture_block_size(params.input_file.as_deref(), params.custom_dataset_type)
                        .map(|(size, meta)| {
                            eprintln!(
                                "{}",
                                block_size_note("synth", size, &meta, "--isl-block-size")
                            );
                            size
                        });
            }
            params.validate()?;
            check_format_flags(args, &params)?;
            Job::Aiperf(Box::new(params))
        }
    };
    if args.format == OutputFormat::OpenaiChat && args.model.is_none() {
        eprintln!(
            "kvbust synth: warning: no --model: each body's \"model\" is the placeholder \
             \"model\", which a real server refuses; pass --model with a name its /v1/models lists"
        );
    }
    Ok(job)
}

fn run_with(args: &SynthArgs, exiting: bool) -> anyhow::Result<()> {
    init_warnings();
    let started = Instant::now();
    let job = checked_job(args)?;
    let tokenizer = load_tokenizer(args.tokenizer.as_deref())?;
    let cache_dir = if args.no_corpus_cache {
        None
    } else {
        args.corpus_cache_dir.clone()
    };
    let opts = WriteOptions {
        format: args.format,
        model: args.model.as_deref().unwrap_or("model"),
        stream: args.stream,
    };
    // Assistant answers (sonnet texts) for the formats that carry them.
    let answers_for = |seed: Option<u64>| -> Result<Option<Answers>, SynthError> {
        Ok(match args.format {
            OutputFormat::OpenaiChat | OutputFormat::Sharegpt => Some(Answers::new(
                &tokenizer,
                TokenCorpus::build_cached(SHAKESPEARE, &tokenizer, cache_dir.as_deref())?,
                seed.unwrap_or(0),
            )),
            _ => None,
        })
    };
    match job {
        Job::Bench(params) => {
            let mut answers = answers_for(Some(params.seed))?;
            run_bench(args, &params, &tokenizer, &opts, answers.as_mut(), started)?;
        }
        Job::Aiperf(params) if params.input_file.is_some() => {
            let answers = answers_for(params.random_seed)?;
            let cache = cache_dir.as_deref();
            stream_trace(args, &params, &tokenizer, cache, &opts, answers, started)?;
        }
        Job::Aiperf(params) => {
            // A trace's length is known only once it is read: a spinner, not a bar.
            let bar = match params.input_file {
                None => progress_bar(params.entries() as u64),
                Some(_) => spinner("replaying the trace"),
            };
            let mut tick = |done: usize, _total: usize| {
                if let Some(b) = &bar {
                    b.set_position(done as u64);
                }
            };
            let mut dataset =
                build_dataset_with(&params, &tokenizer, cache_dir.as_deref(), &mut tick)?;
            dataset.assign_models(&model_names(args.model.as_deref()));
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            let mut answers = answers_for(params.random_seed)?;
            warn_sharegpt_lengths(args.format, &dataset, &tokenizer)?;
            let written = write_counted(args.output.as_deref(), |out| {
                Ok(write_dataset(out, &dataset, &opts, answers.as_mut())?)
            })?;
            if let Written::Bytes(n) = written {
                let to = args.output.as_deref();
                eprintln!("{}", summary(&dataset, n, to, started.elapsed()));
            }
            tracing::debug!(
                conversations = dataset.conversations.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "synthesized dataset"
            );
            if exiting {
                std::mem::forget(dataset);
            }
        }
    }
    if exiting {
        std::mem::forget(tokenizer);
    }
    Ok(())
}

/// What a streamed replay wrote, counted as it went (for the summary and the warning).
#[derive(Default)]
struct Rows {
    conversations: usize,
    turns: usize,
    osl: u64,
    sharegpt: export::SharegptLengths,
}

impl Rows {
    fn summary(&self, written: u64, to: Option<&Path>, elapsed: std::time::Duration) -> String {
        let rows = format!(
            "{} conversations, {} turns, {} output tokens requested",
            self.conversations, self.turns, self.osl
        );
        summary_line("synth", &rows, written, to, elapsed)
    }
}

/// Replays `params.input_file` straight into the output: each conversation is written in
/// `opts.format` as soon as the trace's builder hands it over, then dropped, so memory holds
/// the trace's own records and one conversation (at most `--max-row-bytes` of text), whatever
/// the output's size. Byte for byte what building the dataset first and writing it wrote: the
/// formats carry no state from one conversation to the next but the answer stream, the model
/// round robin and the sharegpt array's commas, each carried here in order.
fn stream_trace(
    args: &SynthArgs,
    params: &SynthParams,
    tokenizer: &Tokenizer,
    cache_dir: Option<&Path>,
    opts: &WriteOptions<'_>,
    mut answers: Option<Answers<'_>>,
    started: Instant,
) -> anyhow::Result<()> {
    let spinner = spinner("replaying the trace");
    let names = model_names(args.model.as_deref());
    let mut rows = Rows::default();
    let written = write_counted(args.output.as_deref(), |w| {
        let mut next_model = 0;
        let mut array = export::SharegptArray::default();
        let mut sink = |mut conv: Conversation, unscheduled: bool| -> Result<(), SynthError> {
            conv.assign_models(&names, &mut next_model);
            rows.conversations += 1;
            rows.turns += conv.turns.len();
            rows.osl += conv.turns.iter().filter_map(|t| t.max_tokens).sum::<u64>();
            if opts.format == OutputFormat::Sharegpt {
                rows.sharegpt.add(&conv, tokenizer)?;
                let need = || SynthError::invalid("sharegpt needs answer texts");
                return array.entry(w, &conv, answers.as_mut().ok_or_else(need)?);
            }
            let one = Dataset {
                conversations: vec![conv],
            };
            match opts.format {
                OutputFormat::Mooncake => export::write_mooncake_with(w, &one, unscheduled),
                _ => write_dataset(w, &one, opts, answers.as_mut()),
            }
        };
        let mut out = Out {
            sink: &mut sink,
            max_row_bytes: args.max_row_bytes.as_u64(),
            max_blocks: args.max_blocks,
            unscheduled: false,
        };
        trace::stream_from_params(params, tokenizer, cache_dir, &mut out)?;
        if opts.format == OutputFormat::Sharegpt {
            array.finish(w)?;
        }
        Ok(())
    })?;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    if let Some(w) = rows.sharegpt.warning() {
        eprintln!("kvbust synth: warning: {w}");
    }
    if let Written::Bytes(n) = written {
        let to = args.output.as_deref();
        eprintln!("{}", rows.summary(n, to, started.elapsed()));
    }
    Ok(())
}

/// A `--bench-compat` job: draws the requests (a spinner on a terminal meanwhile), writes them
/// and ends with the summary line.
fn run_bench(
    args: &SynthArgs,
    params: &BenchParams,
    tokenizer: &Tokenizer,
    opts: &WriteOptions<'_>,
    answers: Option<&mut Answers>,
    started: Instant,
) -> anyhow::Result<()> {
    let spinner = spinner("drawing prompts");
    let requests = bench_requests(params, tokenizer)?;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let written = write_bench(args, &requests, tokenizer, opts, answers)?;
    if let Written::Bytes(n) = written {
        let prompt: usize = requests.iter().map(|r| r.prompt_len).sum();
        let osl: u64 = requests.iter().map(|r| r.expected_output_len).sum();
        let rows = format!(
            "{} requests, {prompt} prompt tokens, {osl} output tokens requested",
            requests.len()
        );
        eprintln!(
            "{}",
            summary_line("synth", &rows, n, args.output.as_deref(), started.elapsed())
        );
    }
    Ok(())
}

/// Writes a `--bench-compat` job's requests: as they are for `--format conversations`,
/// otherwise as a dataset in the chosen format.
fn write_bench(
    args: &SynthArgs,
    requests: &[BenchRequest],
    tokenizer: &Tokenizer,
    opts: &WriteOptions<'_>,
    answers: Option<&mut Answers>,
) -> anyhow::Result<Written> {
    write_counted(args.output.as_deref(), |out| {
        if args.format == OutputFormat::Conversations {
            for r in requests {
                // Plain strings and integers always serialise.
                #[allow(clippy::expect_used)] // the invariant is named at the expect
                let line = serde_json::to_string(r).expect("request serialises");
                writeln!(out, "{line}")?;
            }
        } else {
            let mut dataset = bench_dataset(requests);
            dataset.assign_models(&model_names(args.model.as_deref()));
            warn_sharegpt_lengths(args.format, &dataset, tokenizer)?;
            write_dataset(out, &dataset, opts, answers)?;
        }
        Ok(())
    })
}

/// On stderr: the ShareGPT prompts vLLM's loader would drop (`--format sharegpt` only).
fn warn_sharegpt_lengths(
    format: OutputFormat,
    dataset: &Dataset,
    tokenizer: &Tokenizer,
) -> Result<(), SynthError> {
    if format == OutputFormat::Sharegpt {
        if let Some(w) = export::sharegpt_length_warning(dataset, tokenizer)? {
            eprintln!("kvbust synth: warning: {w}");
        }
    }
    Ok(())
}

/// The block size of a trace kvbust's capture wrote: its `NAME.meta.json` beside `NAME.jsonl`
/// says what `capture.block_size` the hash ids were cut at, which AIPerf's defaults (512 for
/// mooncake_trace) would otherwise contradict. `None` for a trace of another type, or without
/// such a file beside it. Returns the size and the meta file's path.
fn capture_block_size(input: Option<&Path>, kind: Option<TraceKind>) -> Option<(usize, PathBuf)> {
    use crate::capture::file::{meta_path, Meta, FORMAT};
    let input = input?;
    // Captures are mooncake_trace rows (bailian_trace reads the same fields).
    if !matches!(
        kind,
        None | Some(TraceKind::MooncakeTrace | TraceKind::BailianTrace)
    ) || input.is_dir()
    {
        return None;
    }
    let meta = meta_path(input);
    let text = std::fs::read_to_string(&meta).ok()?;
    let m: Meta = serde_json::from_str(&text).ok()?;
    (m.format == FORMAT && m.block_size > 0).then_some((m.block_size, meta))
}

/// The stderr line saying where the block size came from and how to override it.
fn block_size_note(command: &str, size: usize, meta: &Path, flag: &str) -> String {
    format!(
        "kvbust {command}: block size {size} from the capture's {} ({flag} overrides it)",
        meta.display()
    )
}

/// What `run` was asked to do, after the flags were checked.
enum Job {
    Bench(BenchParams),
    Aiperf(Box<SynthParams>),
}

/// Flags of `kvbust analyze-trace` (AIPerf's `aiperf analyze-trace`).
#[derive(Debug, Clone, clap::Args)]
pub struct AnalyzeArgs {
    /// The trace: a mooncake_trace or bailian_trace JSONL file (read exactly as AIPerf's
    /// analyzer reads it), or any other type kvbust replays (weka_trace, tracelab,
    /// burst_gpt_trace: their requests in file order).
    #[arg(value_name = "TRACE")]
    pub input_file: PathBuf,
    /// Tokens per hash-id block (AIPerf's default 512; for weka_trace the trace's declared
    /// block size, for tracelab 64; for a kvbust capture, its `.meta.json`'s).
    #[arg(long, value_name = "N")]
    pub block_size: Option<u64>,
    /// Also write the statistics as JSON (AIPerf's `--output-file` object) to this file; its
    /// folder must exist.
    #[arg(long, value_name = "FILE")]
    pub output_file: Option<PathBuf>,
    /// The trace's type (default: detected as `kvbust synth --input-file` detects it).
    #[arg(long, value_name = "TYPE")]
    pub custom_dataset_type: Option<TraceKind>,
    /// The hash-id blocks the analysis may count in all (every request's, summed). The
    /// analyzer's prefix tables take about 100 bytes a block, so this bounds its memory and
    /// time; over it the run stops (exit 2) naming the row that passed it.
    #[arg(long, value_name = "N", default_value_t = analyze::DEFAULT_MAX_BLOCKS)]
    pub max_blocks: u64,
}

/// The analyzer's rows for `path` and the block size they are counted at.
fn analysis_rows(args: &AnalyzeArgs) -> Result<(Vec<analyze::Row>, u64), SynthError> {
    let path = args.input_file.as_path();
    let kind = trace::detect_kind(path, args.custom_dataset_type)?;
    // The sources are taken apart, not copied: their hash ids become the rows'.
    let from_sources = |sources: Vec<crate::synth::dataset::trace::agentic::weka::Source>| {
        let declared = sources.first().map(|s| s.trace.block_size.max(1) as u64);
        let rows = sources
            .into_iter()
            .flat_map(|s| s.trace.requests)
            .flat_map(|e| match e {
                schema::Entry::Request(r) => vec![r],
                schema::Entry::Subagent(s) => s.requests,
            })
            .map(|r| analyze::Row {
                input_length: r.input_length,
                output_length: r.output_length,
                hash_ids: r.hash_ids,
            })
            .collect::<Vec<_>>();
        (rows, declared)
    };
    let (rows, default_block) = match kind {
        TraceKind::MooncakeTrace | TraceKind::BailianTrace => {
            let lines = trace::read_lines(TraceReader::open(path)?)?;
            let captured = match args.block_size {
                Some(_) => None,
                None => capture_block_size(Some(path), Some(kind)),
            };
            let block = match captured {
                Some((size, meta)) => {
                    eprintln!(
                        "{}",
                        block_size_note("analyze-trace", size, &meta, "--block-size")
                    );
                    size as u64
                }
                None => 512,
            };
            (analyze::rows_from_lines(path, &lines)?, block)
        }
        TraceKind::BurstGptTrace => {
            let rows = burst::entries(path, TraceReader::open(path)?, None, false)?
                .into_iter()
                .map(|e| analyze::Row {
                    input_length: match e.input {
                        record::Input::Length(n) => n,
                        _ => 0,
                    },
                    output_length: e.output_length.unwrap_or(0),
                    hash_ids: Vec::new(),
                })
                .collect();
            (rows, 512)
        }
        TraceKind::WekaTrace => {
            let (rows, declared) =
                from_sources(agentic::read_weka(path).map_err(SynthError::from)?);
            (rows, declared.unwrap_or(64))
        }
        TraceKind::Tracelab => {
            let block = args.block_size.unwrap_or(64).max(1) as usize;
            let sources = agentic::tracelab::read_capped(path, block, false, args.max_blocks)?;
            let (rows, _) = from_sources(sources);
            (rows, 64)
        }
    };
    analyze::check_blocks(path, &rows, args.max_blocks)?;
    Ok((rows, args.block_size.unwrap_or(default_block)))
}

/// Runs `kvbust analyze-trace`: the report on standard output, the JSON to `--output-file`.
pub fn run_analyze(args: &AnalyzeArgs) -> anyhow::Result<()> {
    init_warnings();
    if args.block_size == Some(0) {
        return Err(SynthError::invalid("--block-size must be at least 1").into());
    }
    if let Some(out) = &args.output_file {
        check_output_folder(out, "--output-file")?;
    }
    let started = Instant::now();
    let (rows, block_size) = analysis_rows(args)?;
    let stats = analyze::analyze(&rows, block_size);
    let report = analyze_report(&stats);
    print!("{report}");
    let mut written = report.len() as u64;
    if let Some(out) = &args.output_file {
        let json = stats.to_json_pretty();
        write_output(Some(out), |w| {
            w.write_all(json.as_bytes())?;
            Ok(())
        })?;
        println!("Analysis report saved to {}", out.display());
        written = json.len() as u64;
    }
    let input: i64 = rows.iter().map(|r| r.input_length).sum();
    let output: i64 = rows.iter().map(|r| r.output_length).sum();
    let counted = format!(
        "{} requests, {input} input tokens, {output} output tokens",
        rows.len()
    );
    let to = args.output_file.as_deref();
    eprintln!(
        "{}",
        summary_line("analyze-trace", &counted, written, to, started.elapsed())
    );
    Ok(())
}

/// Refuses an output path whose folder does not exist (nothing is created).
fn check_output_folder(path: &Path, flag: &str) -> Result<(), SynthError> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if parent.is_dir() {
        Ok(())
    } else {
        Err(SynthError::InvalidParams(format!(
            "{flag} {}: the folder {} does not exist; create it first or pick another path",
            path.display(),
            parent.display()
        )))
    }
}

/// Python's `f"{x:,.2f}"`.
fn thousands(x: f64) -> String {
    let s = format!("{:.2}", x.abs());
    let (int, frac) = s.split_once('.').unwrap_or((&s, "00"));
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if x < 0.0 && s.bytes().any(|b| (b'1'..=b'9').contains(&b)) {
        "-"
    } else {
        ""
    };
    format!("{sign}{grouped}.{frac}")
}

/// The terminal report AIPerf prints: the counts, then one row per distribution.
pub fn analyze_report(stats: &analyze::AnalysisStats) -> String {
    let mut out = format!(
        "\nTrace Analysis Report\nTotal requests:   {}\nUnique prefixes:  {}\nPrefix groups:    \
         {}\n\n",
        thousands(stats.total_requests as f64).trim_end_matches(".00"),
        thousands(stats.unique_prefixes as f64).trim_end_matches(".00"),
        thousands(stats.num_prefix_groups as f64).trim_end_matches(".00"),
    );
    let header = [
        "Metric", "Mean", "Std Dev", "Min", "P25", "Median", "P75", "Max",
    ];
    let metrics = [
        ("Input Length", stats.isl_stats),
        ("Context Length", stats.context_length_stats),
        ("Unique Prompt Length", stats.unique_prompt_length_stats),
        ("Output Length", stats.osl_stats),
        ("Theoretical Hit Rates", stats.hit_rate_stats),
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| (*s).to_owned()).collect()];
    for (name, m) in metrics {
        let mut row = vec![name.to_owned()];
        match m {
            Some(m) => {
                row.extend([m.mean, m.std_dev, m.min, m.p25, m.median, m.p75, m.max].map(thousands))
            }
            None => row.extend(std::iter::repeat_n("N/A".to_owned(), 7)),
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    out.push_str("Trace Statistics\n");
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:>w$}"))
            .collect();
        out.push_str(cells.join(" | ").trim_end());
        out.push('\n');
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out.push_str(&rule.join("-+-"));
            out.push('\n');
        }
    }
    out.push('\n');
    out
}

/// `kvbust synth`: a dataset from the flags, or one of the synthesis tools.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SynthCommand {
    #[command(subcommand)]
    pub tool: Option<SynthTool>,
    #[command(flatten)]
    pub args: SynthArgs,
}

/// The subcommands of `kvbust synth`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SynthTool {
    /// Synthetic agentic-coding sessions as a mooncake trace, byte for byte what
    /// `aiperf synthesize agentic-code` writes (dataset.jsonl, plus manifest.json and
    /// quality.json beside it).
    AgenticCode(AgenticCodeArgs),
}

/// Flags of `kvbust synth agentic-code` (AIPerf's `aiperf synthesize agentic-code`).
#[derive(Debug, Clone, clap::Args)]
pub struct AgenticCodeArgs {
    /// Number of sessions to generate (restart continuations come on top).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1000,
        allow_hyphen_values = true
    )]
    pub num_sessions: i64,
    /// Random seed (numpy's default_rng).
    #[arg(long, value_name = "N", default_value_t = 42)]
    pub seed: u64,
    /// Context limit: overrides the config's max_prompt_tokens.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub max_isl: Option<i64>,
    /// Output bound: overrides the config's generation_length.max.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub max_osl: Option<i64>,
    /// Distribution config JSON, or a previous run's manifest.json; `default` is AIPerf's
    /// bundled configs/default.json. Without it: AIPerf's SessionDistributionConfig defaults.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The dataset.jsonl to write; manifest.json and quality.json go into its folder.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,
}

/// AIPerf's bundled `configs/default.json` (`--config default`).
const BUNDLED_DEFAULT_CONFIG: &str = include_str!("../../assets/agentic-code/default.json");

/// The config `--config` names (and its manifest name), with the CLI overrides applied.
fn agentic_config(args: &AgenticCodeArgs) -> anyhow::Result<(DistributionConfig, String)> {
    let bad_config = |path: &Path, message: String| crate::config::ConfigError {
        key: "--config".into(),
        message: format!("{}: {message}", path.display()),
    };
    let (cfg, name) = match &args.config {
        None => (DistributionConfig::default(), "default".to_owned()),
        Some(p) if p.as_os_str() == "default" && !p.is_file() => (
            DistributionConfig::from_json(BUNDLED_DEFAULT_CONFIG).map_err(|m| bad_config(p, m))?,
            "default".to_owned(),
        ),
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                SynthError::InvalidParams(format!(
                    "--config {}: cannot read it ({e}); pass a config JSON, a manifest.json, \
                     or `default`",
                    p.display()
                ))
            })?;
            let cfg = DistributionConfig::from_json(&text).map_err(|m| bad_config(p, m))?;
            let stem = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            (cfg, stem)
        }
    };
    let cfg = cfg
        .with_overrides(args.max_isl, args.max_osl)
        .map_err(|m| SynthError::InvalidParams(format!("--max-isl/--max-osl: {m}")))?;
    Ok((cfg, name))
}

/// Runs `kvbust synth agentic-code`: all three files are written, or none.
pub fn run_agentic_code(args: &AgenticCodeArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    if args.num_sessions < 1 {
        return Err(SynthError::InvalidParams(format!(
            "--num-sessions is {}, and must be at least 1",
            args.num_sessions
        ))
        .into());
    }
    for (v, flag) in [(args.max_isl, "--max-isl"), (args.max_osl, "--max-osl")] {
        if v.is_some_and(|v| v < 1) {
            return Err(SynthError::InvalidParams(format!("{flag} must be at least 1")).into());
        }
    }
    check_output_folder(&args.output, "-o/--output")?;
    let (cfg, name) = agentic_config(args)?;
    let generated = agentic_code::generate(&cfg, args.seed, args.num_sessions as usize, &name)
        .map_err(|m| SynthError::InvalidParams(format!("agentic-code: {m}")))?;
    let folder = args
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let manifest = folder.join("manifest.json");
    let quality = folder.join("quality.json");
    write_output(Some(&args.output), |w| {
        Ok(w.write_all(&generated.dataset_jsonl)?)
    })?;
    let rest = write_output(Some(&manifest), |w| {
        Ok(w.write_all(generated.manifest_json.as_bytes())?)
    })
    .and_then(|()| {
        write_output(Some(&quality), |w| {
            Ok(w.write_all(generated.quality_json.as_bytes())?)
        })
    });
    if let Err(e) = rest {
        let _ = std::fs::remove_file(&args.output);
        let _ = std::fs::remove_file(&manifest);
        return Err(e);
    }
    let rows = format!(
        "{} sessions, {} rows, {} input tokens, {} output tokens",
        generated.sessions, generated.rows, generated.input_tokens, generated.output_tokens
    );
    let to = format!("{} (+ manifest.json, quality.json)", args.output.display());
    eprintln!(
        "{}",
        summary_line(
            "synth agentic-code",
            &rows,
            generated.dataset_jsonl.len() as u64,
            Some(Path::new(&to)),
            started.elapsed()
        )
    );
    Ok(())
}
