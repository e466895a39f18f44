//! The pure half of `kvbust probe`: the prompts it sends, what it reads out of each answer, the
//! block size it infers, the verdict and the text it prints. Never does I/O.

use std::fmt::Write as _;

use crate::synth::corpus::sonnet::SHAKESPEARE;

/// Characters of corpus text in the first prompt: ~2k tokens on English BPE tokenizers (the
/// first 8,000 characters are 1,977 tokens for SmolLM2's tokenizer, ~2k for Qwen3's).
const PROMPT_CHARS: usize = 8000;
/// Where the third prompt's own second half starts in the corpus: far from the first prompt's
/// text, so the two prompts part at the first token after the shared half.
const OTHER_TEXT_AT: usize = 1_000_000;

/// The probe's prompts: the first (sent twice) and the third, which shares only its first half.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompts {
    pub first: String,
    pub third: String,
    /// Bytes the two have in common (the nonce line and the first half of the text).
    pub shared: usize,
}

/// The prompts for one probe run. `nonce` opens both (16 digits, so its token count does not
/// vary between runs on one tokenizer): what an earlier run left in the cache matches the first
/// request in no more than the chat template's opening tokens.
pub fn prompts(nonce: u64) -> Prompts {
    let head = format!(
        "kvbust probe {:016}. Answer with one word.\n",
        nonce % 10_000_000_000_000_000
    );
    let half = PROMPT_CHARS / 2;
    let shared_text = whole_lines(SHAKESPEARE, 0, half);
    let rest = whole_lines(SHAKESPEARE, shared_text.len(), half);
    let other = whole_lines(SHAKESPEARE, OTHER_TEXT_AT, half);
    let shared = head.len() + shared_text.len();
    Prompts {
        first: format!("{head}{shared_text}{rest}"),
        third: format!("{head}{shared_text}{other}"),
        shared,
    }
}

/// Whole lines of `text` from the first line start at or after `from`, at least `chars` bytes
/// (ending after a newline): a cut between lines keeps BPE tokenizers from merging tokens across
/// the point where two prompts part.
fn whole_lines(text: &str, from: usize, chars: usize) -> &str {
    let start = if from == 0 || text.as_bytes().get(from - 1) == Some(&b'\n') {
        from.min(text.len())
    } else {
        text[from.min(text.len())..]
            .find('\n')
            .map_or(text.len(), |i| from + i + 1)
    };
    let want = (start + chars).min(text.len());
    let end = text[want..].find('\n').map_or(text.len(), |i| want + i + 1);
    &text[start..end]
}

/// What one chat completion said about its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`, when the server sent it.
    pub cached: Option<u64>,
    /// llama.cpp's `timings.cache_n` (its own count of prompt tokens reused), when sent.
    pub cache_n: Option<u64>,
}

impl Observation {
    /// Reads a non-streaming chat completion; the error says what is missing.
    pub fn from_response(body: &[u8]) -> Result<Self, String> {
        let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
            format!(
                "the answer is not JSON ({e}): {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )
        })?;
        let prompt_tokens = v
            .pointer("/usage/prompt_tokens")
            .and_then(serde_json::Value::as_u64)
            .ok_or("the answer has no usage.prompt_tokens, so it says nothing about its prompt")?;
        Ok(Observation {
            prompt_tokens,
            cached: v
                .pointer("/usage/prompt_tokens_details/cached_tokens")
                .and_then(serde_json::Value::as_u64),
            cache_n: v
                .pointer("/timings/cache_n")
                .and_then(serde_json::Value::as_u64),
        })
    }
}

/// The prefix cache's block size as far as three answers tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockSize {
    /// Only this power of two fits.
    Exact(u64),
    /// Each of these fits (ascending).
    OneOf(Vec<u64>),
    /// Nothing cached on the repeat, or counts that fit no power-of-two block.
    Unknown,
}

/// Infers the block size from the repeat (`second`) and the half-shared prompt (`third`).
///
/// A block cache (vLLM, SGLang with `--page-size`, TensorRT-LLM) reuses whole blocks of B
/// tokens only, so B divides both cached counts, and B divides their gcd. On the repeat it
/// keeps at least the last prompt token to compute, so its uncached tail `prompt - cached` is
/// between 1 and B: B is at least that tail. Engines use powers of two (llama.cpp and SGLang's
/// default radix cache match to the token: B = 1). The answer is the one power of two that
/// fits, or the few that do: three requests cannot always tell B from B/2 (a tail of at most
/// B/2) or from 2B (both counts an even number of blocks).
pub fn infer_block_size(second: &Observation, third: &Observation) -> BlockSize {
    let Some(c2) = second.cached.filter(|&c| c > 0) else {
        return BlockSize::Unknown;
    };
    let tail = second.prompt_tokens.saturating_sub(c2).max(1);
    // No hit on the third prompt tells nothing of B's divisors (its shared half may be shorter
    // than one block, or evicted): the repeat's count alone then bounds it.
    let g = match third.cached {
        Some(c3) if c3 > 0 => gcd(c2, c3),
        _ => c2,
    };
    let fits: Vec<u64> = (0..u64::BITS)
        .map(|k| 1u64 << k)
        .take_while(|&p| p <= g)
        .filter(|&p| g % p == 0 && p >= tail)
        .collect();
    match fits.as_slice() {
        [] => BlockSize::Unknown,
        [one] => BlockSize::Exact(*one),
        _ => BlockSize::OneOf(fits),
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Whether the upstream's prefix cache is on and reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The repeat reported cached tokens: kvbust can count what the cache reused.
    Reported,
    /// The server sends the count but reused nothing of a repeated prompt: caching is off.
    NotCaching,
    /// No answer carried the count (`cache_n`: llama.cpp's own count, when it sent one).
    Silent { cache_n: Option<u64> },
}

impl Verdict {
    /// From the three observations, in the order sent.
    pub fn of(obs: &[Observation; 3]) -> Self {
        if obs[1].cached.is_some_and(|c| c > 0) {
            Verdict::Reported
        } else if obs.iter().any(|o| o.cached.is_some()) {
            Verdict::NotCaching
        } else {
            Verdict::Silent {
                cache_n: obs[1].cache_n.filter(|&n| n > 0),
            }
        }
    }

    pub fn is_success(self) -> bool {
        self == Verdict::Reported
    }

    /// One line for the verdict, then what to do about it.
    pub fn explain(self) -> String {
        match self {
            Verdict::Reported => "prefix caching is on and reported: kvbust counts cached tokens \
                 (kvbust_upstream_cached_tokens_total)"
                .to_owned(),
            Verdict::NotCaching => {
                "the server reports cached tokens but reused none of a repeated prompt: its \
                 prefix cache looks off.\n  vLLM: add --enable-prefix-caching (on by default \
                 in V1); SGLang: drop --disable-radix-cache; llama.cpp: do not send \
                 cache_prompt=false"
                    .to_owned()
            }
            Verdict::Silent { cache_n } => {
                let mut s = "no answer carried usage.prompt_tokens_details.cached_tokens, so \
                             kvbust cannot count cached tokens.\n  vLLM: add \
                             --enable-prompt-tokens-details (and keep prefix caching on: vLLM \
                             leaves the field out when nothing was cached)\n  SGLang: add \
                             --enable-cache-report"
                    .to_owned();
                if let Some(n) = cache_n {
                    let _ = write!(
                        s,
                        "\n  llama.cpp: it reported timings.cache_n = {n} on the repeat, so its \
                         cache is on, but this build does not fill cached_tokens; use a newer \
                         llama.cpp server"
                    );
                }
                s
            }
        }
    }
}

/// Whether the upstream honours `cache_salt`, from one fresh prompt sent under two salts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaltSupport {
    /// The prompt under the second salt was not served from the first's blocks: salts isolate
    /// (`cache_bust.method = "salt"` works).
    Honoured {
        first: Observation,
        second: Observation,
    },
    /// The second salt was served from the first's blocks: the salt is ignored.
    Ignored {
        first: Observation,
        second: Observation,
    },
    /// The server refused a request that carried a `cache_salt`.
    Refused { status: u16, message: String },
    /// The cache reports nothing (or reuses nothing), so salts cannot be told apart.
    Unknown,
}

impl SaltSupport {
    /// From the two salted answers: honoured when the second reused under half of its prompt
    /// (at most the chat template's opening can match, and not even that under vLLM, whose salt
    /// is in the first block); ignored when it reused more.
    pub fn of(first: &Observation, second: &Observation) -> Self {
        let (first, second) = (*first, *second);
        match second.cached {
            Some(c) if c * 2 >= second.prompt_tokens && c > 0 => {
                SaltSupport::Ignored { first, second }
            }
            Some(_) => SaltSupport::Honoured { first, second },
            None => SaltSupport::Unknown,
        }
    }

    /// A 4xx answer to a salted request: its status and the error's message (OpenAI-shaped
    /// `error.message`, else the start of the body).
    pub fn refused(status: u16, body: &[u8]) -> Self {
        let v: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        let message = v
            .as_ref()
            .and_then(|v| v["error"]["message"].as_str().or(v["message"].as_str()))
            .map(str::to_owned)
            .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned());
        SaltSupport::Refused { status, message }
    }

    /// One word, then what it means for `cache_bust.method = "salt"`.
    pub fn explain(&self) -> String {
        match self {
            SaltSupport::Honoured { .. } => "honoured: the same prompt under another salt was \
                 not cached, so cache_bust.method = \"salt\" isolates requests without changing \
                 a token"
                .to_owned(),
            SaltSupport::Ignored { .. } => "ignored: the same prompt under another salt was \
                 served from cache, so the salt isolates nothing here; use cache_bust.method = \
                 \"marker\" (vLLM and SGLang honour cache_salt)"
                .to_owned(),
            SaltSupport::Refused { status, message } => format!(
                "refused: a request with a cache_salt was answered {status} ({message}); use \
                 cache_bust.method = \"marker\""
            ),
            SaltSupport::Unknown => "unknown: the cache reports no reuse, so salts cannot be \
                 told apart"
                .to_owned(),
        }
    }
}

/// Everything a probe run found, for [`render`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Findings {
    pub upstream: String,
    /// What `/v1/models` lists.
    pub models: Vec<String>,
    pub model: String,
    pub observations: [Observation; 3],
    /// Whether `cache_salt` isolates.
    pub salt: SaltSupport,
}

/// The report `kvbust probe` prints.
pub fn render(f: &Findings) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "upstream    {}", f.upstream);
    let _ = writeln!(out, "models      {}", f.models.join(", "));
    let _ = writeln!(out, "model       {}", f.model);
    let labels = ["1 (new prompt)  ", "2 (same prompt) ", "3 (first half)  "];
    for (label, o) in labels.iter().zip(&f.observations) {
        let cached = o
            .cached
            .map_or_else(|| "not reported".to_owned(), |c| c.to_string());
        let _ = write!(
            out,
            "request {label}prompt_tokens {:>6}  cached_tokens {cached:>6}",
            o.prompt_tokens
        );
        if let Some(n) = o.cache_n {
            let _ = write!(out, "  timings.cache_n {n}");
        }
        out.push('\n');
    }
    if let SaltSupport::Honoured { first, second } | SaltSupport::Ignored { first, second } =
        &f.salt
    {
        for (label, o) in [("4 (salt a)      ", first), ("5 (salt b)      ", second)] {
            let cached = o
                .cached
                .map_or_else(|| "not reported".to_owned(), |c| c.to_string());
            let _ = writeln!(
                out,
                "request {label}prompt_tokens {:>6}  cached_tokens {cached:>6}",
                o.prompt_tokens
            );
        }
    }
    let [_, second, third] = &f.observations;
    let block = match infer_block_size(second, third) {
        BlockSize::Exact(1) => "1 token (the cache matches prefixes of any length)".to_owned(),
        BlockSize::Exact(b) => format!("{b} tokens"),
        BlockSize::OneOf(fits) => {
            let list: Vec<String> = fits.iter().map(u64::to_string).collect();
            format!("unknown ({} tokens fit these counts)", list.join(", "))
        }
        BlockSize::Unknown => "unknown".to_owned(),
    };
    let _ = writeln!(out, "block size  {block}");
    let _ = writeln!(out, "cache_salt  {}", f.salt.explain());
    let _ = writeln!(
        out,
        "verdict     {}",
        Verdict::of(&f.observations).explain()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(prompt_tokens: u64, cached: Option<u64>) -> Observation {
        Observation {
            prompt_tokens,
            cached,
            cache_n: None,
        }
    }

    #[test]
    fn prompts_share_exactly_the_first_half_and_part_right_after_it() {
        let p = prompts(42);
        assert!(p.first.starts_with("kvbust probe 0000000000000042. "));
        let common = p
            .first
            .bytes()
            .zip(p.third.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        assert_eq!(common, p.shared, "they part where the shared half ends");
        assert!(p.first[..p.shared].ends_with('\n'));
        assert!((8000..8300).contains(&p.first.len()), "{}", p.first.len());
        let half = p.shared as f64 / p.first.len() as f64;
        assert!((0.45..0.55).contains(&half), "{half}");
        assert_eq!(prompts(42), p, "deterministic");
        assert_ne!(prompts(43).first, p.first);
        assert_eq!(
            prompts(7).first.len(),
            p.first.len(),
            "the nonce has one length"
        );
    }

    #[test]
    fn whole_lines_start_and_end_at_line_breaks() {
        let t = "ab\ncd\nef\ngh";
        assert_eq!(whole_lines(t, 0, 1), "ab\n");
        assert_eq!(whole_lines(t, 1, 1), "cd\n");
        assert_eq!(
            whole_lines(t, 3, 4),
            "cd\nef\n",
            "from a line start: that line"
        );
        assert_eq!(
            whole_lines(t, 4, 1),
            "ef\n",
            "from inside a line: the next one"
        );
        assert_eq!(whole_lines(t, 7, 10), "gh");
        assert_eq!(whole_lines(t, 50, 10), "");
    }

    #[test]
    fn observations_read_usage_and_llamacpp_timings() {
        let o = Observation::from_response(
            br#"{"usage":{"prompt_tokens":26,"prompt_tokens_details":{"cached_tokens":25}},"timings":{"cache_n":25}}"#,
        )
        .unwrap();
        assert_eq!(
            o,
            Observation {
                prompt_tokens: 26,
                cached: Some(25),
                cache_n: Some(25)
            }
        );
        let silent = Observation::from_response(
            br#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":null}}"#,
        )
        .unwrap();
        assert_eq!(silent, obs(9, None));
        let e = Observation::from_response(br#"{"choices":[]}"#).unwrap_err();
        assert!(e.contains("usage.prompt_tokens"), "{e}");
        assert!(Observation::from_response(b"<html>")
            .unwrap_err()
            .contains("not JSON"));
    }

    #[test]
    fn a_block_cache_gives_its_block_size() {
        // vLLM, B = 16: 2,041 tokens twice -> 2,032 cached (tail 9 > 8); the half shares 1,020
        // tokens -> 1,008 cached. gcd 16.
        let b = infer_block_size(&obs(2041, Some(2032)), &obs(2050, Some(1008)));
        assert_eq!(b, BlockSize::Exact(16));
        // Tail 3 (B/2 and B/4 fit too) and both counts 16 x an even number (32 fits too).
        let b = infer_block_size(&obs(2019, Some(2016)), &obs(2050, Some(1024)));
        assert_eq!(b, BlockSize::OneOf(vec![4, 8, 16, 32]));
    }

    #[test]
    fn a_token_granular_cache_gives_one_when_the_counts_say_so() {
        // llama.cpp: all but the last token on the repeat, the exact shared length on the half.
        assert_eq!(
            infer_block_size(&obs(2041, Some(2040)), &obs(2050, Some(1011))),
            BlockSize::Exact(1)
        );
        assert_eq!(
            infer_block_size(&obs(2041, Some(2040)), &obs(2050, Some(1010))),
            BlockSize::OneOf(vec![1, 2])
        );
    }

    #[test]
    fn no_hit_or_no_report_leaves_the_block_size_unknown() {
        assert_eq!(
            infer_block_size(&obs(2041, None), &obs(2050, None)),
            BlockSize::Unknown
        );
        assert_eq!(
            infer_block_size(&obs(2041, Some(0)), &obs(2050, Some(0))),
            BlockSize::Unknown
        );
        // A tail longer than any block that divides the count: no power of two fits.
        assert_eq!(
            infer_block_size(&obs(2041, Some(1000)), &obs(2050, Some(500))),
            BlockSize::Unknown
        );
        // No hit on the half: the repeat alone (1,984 = 64 x 31; tail 57) bounds it.
        assert_eq!(
            infer_block_size(&obs(2041, Some(1984)), &obs(2050, Some(0))),
            BlockSize::Exact(64)
        );
    }

    #[test]
    fn verdicts() {
        let on = [
            obs(2041, Some(0)),
            obs(2041, Some(2032)),
            obs(2050, Some(1008)),
        ];
        assert_eq!(Verdict::of(&on), Verdict::Reported);
        assert!(Verdict::of(&on).is_success());
        // vLLM with the flag leaves the field out when nothing was cached: still reported.
        let vllm_cold = [
            obs(2041, None),
            obs(2041, Some(2032)),
            obs(2050, Some(1008)),
        ];
        assert_eq!(Verdict::of(&vllm_cold), Verdict::Reported);
        let off = [obs(2041, Some(0)), obs(2041, Some(0)), obs(2050, Some(0))];
        assert_eq!(Verdict::of(&off), Verdict::NotCaching);
        assert!(Verdict::of(&off)
            .explain()
            .contains("--enable-prefix-caching"));
        let silent = [obs(2041, None), obs(2041, None), obs(2050, None)];
        let v = Verdict::of(&silent);
        assert_eq!(v, Verdict::Silent { cache_n: None });
        assert!(!v.is_success());
        let text = v.explain();
        assert!(text.contains("--enable-prompt-tokens-details"), "{text}");
        assert!(text.contains("--enable-cache-report"), "{text}");
        assert!(!text.contains("llama.cpp"), "{text}");
        let mut old_llamacpp = silent;
        old_llamacpp[1].cache_n = Some(2040);
        let text = Verdict::of(&old_llamacpp).explain();
        assert!(text.contains("timings.cache_n = 2040"), "{text}");
    }

    #[test]
    fn salts_are_honoured_ignored_or_refused() {
        let cold = obs(2041, Some(0));
        assert!(matches!(
            SaltSupport::of(&cold, &obs(2041, Some(16))),
            SaltSupport::Honoured { .. }
        ));
        assert!(matches!(
            SaltSupport::of(&cold, &obs(2041, Some(2032))),
            SaltSupport::Ignored { .. }
        ));
        assert_eq!(
            SaltSupport::of(&cold, &obs(2041, None)),
            SaltSupport::Unknown
        );
        let body = br#"{"error":{"message":"Parameter 'cache_salt' must be a non-empty string if provided.","type":"BadRequestError","code":400}}"#;
        let r = SaltSupport::refused(400, body);
        let text = r.explain();
        assert!(
            text.starts_with(
                "refused: a request with a cache_salt was answered 400 (Parameter 'cache_salt'"
            ),
            "{text}"
        );
        let r = SaltSupport::refused(422, b"no salts here");
        assert!(r.explain().contains("422 (no salts here)"));
        for s in [r, SaltSupport::of(&cold, &obs(2041, Some(2032)))] {
            assert!(s.explain().contains("cache_bust.method = \"marker\""));
        }
    }

    #[test]
    fn the_report_lists_each_request_the_block_size_and_the_verdict() {
        let f = Findings {
            upstream: "http://127.0.0.1:8000".into(),
            models: vec!["a".into(), "b".into()],
            model: "b".into(),
            observations: [
                obs(2041, None),
                obs(2041, Some(2032)),
                obs(2050, Some(1008)),
            ],
            salt: SaltSupport::of(&obs(2041, Some(0)), &obs(2041, Some(0))),
        };
        let text = render(&f);
        assert!(
            text.contains("request 5 (salt b)      prompt_tokens   2041  cached_tokens      0\n"),
            "{text}"
        );
        assert!(text.contains("cache_salt  honoured: "), "{text}");
        assert!(text.contains("models      a, b\n"), "{text}");
        assert!(
            text.contains(
                "request 1 (new prompt)  prompt_tokens   2041  cached_tokens not reported\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("request 2 (same prompt) prompt_tokens   2041  cached_tokens   2032\n"),
            "{text}"
        );
        assert!(text.contains("block size  16 tokens\n"), "{text}");
        assert!(
            text.contains("verdict     prefix caching is on and reported"),
            "{text}"
        );
    }
}
