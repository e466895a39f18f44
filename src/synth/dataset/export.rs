//! Export formats: a dataset as the files vLLM, SGLang and AIPerf read (`vllm-custom`,
//! `sharegpt`, `mooncake`) and as fixed OpenAI chat bodies (one per turn, earlier answers
//! filled in). Owns those shapes and the answer texts; must never change a prompt.

use std::io::Write;

use serde::de::{MapAccess, Visitor};
use serde::Deserializer as _;
use serde_json::value::RawValue;

use crate::synth::corpus::TokenCorpus;
use crate::synth::dataset::{Conversation, Dataset, Turn};
use crate::synth::error::SynthError;
use crate::synth::prompt::generator::{CorpusSource, PromptGenerator};
use crate::synth::rng::derive_seed;
use crate::synth::rng::GeneratorRngs;
use crate::synth::tokenizer::Tokenizer;

/// The stream answer texts are drawn from (kvbust's own; AIPerf never draws it).
const ANSWERS_STREAM: &str = "kvbust.export.answers";

/// Assistant answers: sonnet texts of exactly a turn's output length, deterministic per seed.
pub struct Answers<'t> {
    gen: PromptGenerator<&'t Tokenizer>,
}

impl<'t> Answers<'t> {
    /// Answers under `root_seed` (the dataset's `--random-seed`, 0 without one).
    pub fn new(tokenizer: &'t Tokenizer, sonnet: TokenCorpus, root_seed: u64) -> Self {
        let rngs = GeneratorRngs::derive(derive_seed(root_seed, ANSWERS_STREAM));
        Answers {
            gen: PromptGenerator::new(tokenizer, CorpusSource::Sonnet(sonnet), rngs),
        }
    }

    /// The answers to turns `0..n` of `conv`, each `max_tokens` tokens long.
    fn for_turns(
        &mut self,
        conv: &Conversation,
        n: usize,
        format: &str,
    ) -> Result<Vec<String>, SynthError> {
        conv.turns[..n]
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let len = t.max_tokens.ok_or_else(|| {
                    SynthError::InvalidParams(format!(
                        "{format} needs each answered turn's output length, but turn {i} of \
                         {} has none; pass --osl (or give output_length in the trace)",
                        conv.session_id
                    ))
                })?;
                self.gen.generate_prompt(len.max(1) as usize, None)
            })
            .collect()
    }
}

/// A JSON string literal.
#[allow(clippy::expect_used)] // the invariant is named at the expect
fn js(s: &str) -> String {
    // Serialising a string cannot fail.
    serde_json::to_string(s).expect("string serialises")
}

/// A JSON object's members in their written order, values raw.
fn ordered_members(json: &str) -> Result<Vec<(String, Box<RawValue>)>, serde_json::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<(String, Box<RawValue>)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(kv) = map.next_entry::<String, Box<RawValue>>()? {
                out.push(kv);
            }
            Ok(out)
        }
    }
    serde_json::Deserializer::from_str(json).deserialize_map(V)
}

/// An object built member by member; a later `set` of a key replaces its value in place
/// (Python's `dict.update`).
#[derive(Default)]
struct Obj(Vec<(String, String)>);

impl Obj {
    fn set(&mut self, k: &str, raw: String) {
        match self.0.iter_mut().find(|(key, _)| key == k) {
            Some(slot) => slot.1 = raw,
            None => self.0.push((k.to_owned(), raw)),
        }
    }
    fn has(&self, k: &str) -> bool {
        self.0.iter().any(|(key, _)| key == k)
    }
    fn render(&self) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{}:{v}", js(k)))
            .collect();
        format!("{{{}}}", parts.join(","))
    }
}

fn msg(role: &str, content: &str) -> String {
    format!("{{\"role\":{},\"content\":{}}}", js(role), js(content))
}

/// Options of the `openai-chat` format.
#[derive(Debug, Clone, Copy)]
pub struct ChatOptions<'a> {
    pub model: &'a str,
    /// `"stream": true` plus `stream_options.include_usage`, as AIPerf sends streaming bodies.
    pub stream: bool,
}

/// One OpenAI chat body for turn `i` of `conv` in AIPerf's key order (`messages`, `model`,
/// `stream`, `tools`, `max_completion_tokens`, the turn's `extra`, `stream_options`):
/// system message, user-context message, then the earlier turns each followed by its answer.
/// A trace's verbatim `payload` is the body itself.
fn chat_body(
    conv: &Conversation,
    i: usize,
    answers: &[String],
    opts: ChatOptions,
) -> Result<String, SynthError> {
    let turn = &conv.turns[i];
    if let Some(p) = &turn.raw_payload {
        return Ok(p.get().to_owned());
    }
    let agentic = turn.agentic.as_deref();
    let messages = match (&turn.raw_messages, agentic) {
        (Some(m), _) => m.get().to_owned(),
        (None, Some(_)) => agentic_messages(conv, i),
        (None, None) => {
            let mut parts = Vec::new();
            if let Some(s) = conv.system_message.as_deref().filter(|s| !s.is_empty()) {
                parts.push(msg("system", s));
            }
            if let Some(c) = conv
                .user_context_message
                .as_deref()
                .filter(|s| !s.is_empty())
            {
                parts.push(msg("user", c));
            }
            for (j, earlier) in conv.turns[..i].iter().enumerate() {
                parts.push(msg("user", &earlier.text));
                parts.push(msg("assistant", &answers[j]));
            }
            parts.push(msg("user", &turn.text));
            format!("[{}]", parts.join(","))
        }
    };
    let mut body = Obj::default();
    body.set("messages", messages);
    let model = agentic
        .and_then(|a| a.model.as_deref())
        .or(turn.model.as_deref())
        .unwrap_or(opts.model);
    body.set("model", js(model));
    body.set("stream", opts.stream.to_string());
    if let Some(t) = &turn.raw_tools {
        body.set("tools", t.get().to_owned());
    }
    if let Some(n) = turn.max_tokens {
        body.set("max_completion_tokens", n.to_string());
    }
    if let Some(extra) = &turn.extra_body {
        let members = ordered_members(extra.get())
            .map_err(|e| SynthError::invalid(format!("a turn's `extra` is not an object: {e}")))?;
        for (k, v) in members {
            body.set(&k, v.get().to_owned());
        }
    }
    if opts.stream && !body.has("stream_options") {
        body.set("stream_options", r#"{"include_usage":true}"#.to_owned());
    }
    Ok(body.render())
}

/// An agentic turn's whole context (the deltas since the last reset) as a JSON array.
#[allow(clippy::expect_used)] // the invariant is named at the expect
fn agentic_messages(conv: &Conversation, i: usize) -> String {
    // Messages are plain strings in a fixed shape; serialising them cannot fail.
    serde_json::to_string(&crate::synth::dataset::trace::agentic::context(conv, i))
        .expect("messages serialise")
}

fn refuse_agentic(conv: &Conversation, format: &str) -> Result<(), SynthError> {
    if conv.agentic.is_some() || conv.turns.iter().any(|t| t.agentic.is_some()) {
        return Err(SynthError::InvalidParams(format!(
            "{format} holds one prompt text per turn, but {} is an agentic conversation whose \
             turns are whole message lists (system, user, assistant replies); use --format \
             openai-chat (one request body per turn), mooncake (the messages per turn) or \
             conversations (with the spawn/join topology)",
            conv.session_id
        )));
    }
    Ok(())
}

fn refuse_context(conv: &Conversation, format: &str) -> Result<(), SynthError> {
    if conv.system_message.is_some() || conv.user_context_message.is_some() {
        return Err(SynthError::InvalidParams(format!(
            "{format} carries user turns only, but {} has a system or user-context message; \
             use --format openai-chat or conversations (AIPerf: give the system prompt with \
             its own --system-prompt)",
            conv.session_id
        )));
    }
    Ok(())
}

fn refuse_raw(conv: &Conversation, turn: &Turn, format: &str) -> Result<(), SynthError> {
    if turn.raw_messages.is_some() || turn.raw_payload.is_some() {
        return Err(SynthError::InvalidParams(format!(
            "{format} needs a prompt text, but {} holds verbatim messages/payload turns; use \
             --format mooncake, openai-chat or conversations",
            conv.session_id
        )));
    }
    Ok(())
}

/// `openai-chat`: one body per turn.
pub fn write_openai_chat(
    out: &mut dyn Write,
    dataset: &Dataset,
    answers: &mut Answers,
    opts: ChatOptions,
) -> Result<(), SynthError> {
    for conv in &dataset.conversations {
        let needs_answers = conv.turns.len() > 1
            && conv.turns.iter().any(|t| {
                t.raw_messages.is_none() && t.raw_payload.is_none() && t.agentic.is_none()
            });
        let given = if needs_answers {
            answers.for_turns(conv, conv.turns.len() - 1, "--format openai-chat")?
        } else {
            Vec::new()
        };
        for i in 0..conv.turns.len() {
            let body = chat_body(conv, i, &given, opts)?;
            writeln!(out, "{body}")?;
        }
    }
    Ok(())
}

/// `vllm-custom`: `{"prompt", "output_tokens"}` per turn for `vllm bench serve --dataset-name
/// custom` (`output_tokens` left out when unknown: then give `--custom-output-len`).
pub fn write_vllm_custom(out: &mut dyn Write, dataset: &Dataset) -> Result<(), SynthError> {
    for conv in &dataset.conversations {
        refuse_agentic(conv, "--format vllm-custom")?;
        refuse_context(conv, "--format vllm-custom")?;
        for turn in &conv.turns {
            refuse_raw(conv, turn, "--format vllm-custom")?;
            let mut o = Obj::default();
            o.set("prompt", js(&turn.text));
            if let Some(n) = turn.max_tokens {
                o.set("output_tokens", n.to_string());
            }
            writeln!(out, "{}", o.render())?;
        }
    }
    Ok(())
}

/// The longest prompt vLLM's ShareGPT loader keeps (tokens), when no output length is fixed.
pub const SHAREGPT_MAX_PROMPT: usize = 1024;

/// A warning when first turns are longer than [`SHAREGPT_MAX_PROMPT`] tokens: vLLM's ShareGPT
/// loader drops them silently (it reads the first human/gpt pair of each entry), naming what
/// keeps them. `None` when every first turn fits.
pub fn sharegpt_length_warning(
    dataset: &Dataset,
    tokenizer: &Tokenizer,
) -> Result<Option<String>, SynthError> {
    let mut lengths = SharegptLengths::default();
    for conv in &dataset.conversations {
        lengths.add(conv, tokenizer)?;
    }
    Ok(lengths.warning())
}

/// [`sharegpt_length_warning`] counted a conversation at a time.
#[derive(Default)]
pub struct SharegptLengths {
    entries: usize,
    long: usize,
    longest: usize,
}

impl SharegptLengths {
    /// Counts `conv`'s first prompt.
    pub fn add(&mut self, conv: &Conversation, tokenizer: &Tokenizer) -> Result<(), SynthError> {
        self.entries += 1;
        if let Some(first) = conv.turns.first() {
            let n = tokenizer.encode(&first.text)?.len();
            if n > SHAREGPT_MAX_PROMPT {
                self.long += 1;
                self.longest = self.longest.max(n);
            }
        }
        Ok(())
    }

    /// The warning, when a first prompt was too long.
    pub fn warning(&self) -> Option<String> {
        let (long, longest) = (self.long, self.longest);
        (long > 0).then(|| {
            format!(
                "{long} of {} sharegpt entries have a first prompt over {SHAREGPT_MAX_PROMPT} \
                 tokens (longest {longest}), which vLLM's ShareGPT loader drops: pass \
                 --sharegpt-output-len to `vllm bench serve` to keep them, or a shorter --isl",
                self.entries
            )
        })
    }
}

/// `sharegpt`: one JSON array of `{"id", "conversations": [human, gpt, …]}`; each `gpt` value is
/// a sonnet text of exactly the turn's output length (the loaders take the length from it).
pub fn write_sharegpt(
    out: &mut dyn Write,
    dataset: &Dataset,
    answers: &mut Answers,
) -> Result<(), SynthError> {
    let mut array = SharegptArray::default();
    for conv in &dataset.conversations {
        array.entry(out, conv, answers)?;
    }
    array.finish(out)
}

/// The `sharegpt` array written an entry at a time: `[`, then each entry on its line, a comma
/// ending every line but the last (put in front of the next entry, which is when it is known),
/// then `]`.
#[derive(Default)]
pub struct SharegptArray {
    entries: usize,
}

impl SharegptArray {
    /// Writes `conv` as the array's next entry.
    pub fn entry(
        &mut self,
        out: &mut dyn Write,
        conv: &Conversation,
        answers: &mut Answers,
    ) -> Result<(), SynthError> {
        refuse_agentic(conv, "--format sharegpt")?;
        refuse_context(conv, "--format sharegpt")?;
        for turn in &conv.turns {
            refuse_raw(conv, turn, "--format sharegpt")?;
        }
        let given = answers.for_turns(conv, conv.turns.len(), "--format sharegpt")?;
        let parts: Vec<String> = conv
            .turns
            .iter()
            .zip(&given)
            .map(|(t, a)| {
                format!(
                    "{{\"from\":\"human\",\"value\":{}}},{{\"from\":\"gpt\",\"value\":{}}}",
                    js(&t.text),
                    js(a)
                )
            })
            .collect();
        let before = if self.entries == 0 { "[\n" } else { ",\n" };
        write!(
            out,
            "{before}{{\"id\":{},\"conversations\":[{}]}}",
            js(&conv.session_id),
            parts.join(",")
        )?;
        self.entries += 1;
        Ok(())
    }

    /// Closes the array.
    pub fn finish(self, out: &mut dyn Write) -> Result<(), SynthError> {
        match self.entries {
            0 => writeln!(out, "[\n]")?,
            _ => writeln!(out, "\n]")?,
        }
        Ok(())
    }
}

/// `mooncake`: AIPerf `mooncake_trace` lines carrying the texts (`text_input`, or the verbatim
/// `messages`/`payload`), `output_length`, `session_id`, `timestamp` and `delay`, so that
/// `aiperf --custom-dataset-type mooncake_trace` replays this dataset as it is. A dataset with
/// no schedule at all (a synthetic one) gets the simplest: every session's first turn at
/// `timestamp` 0 and each later turn at `delay` 0 after the previous answer, since AIPerf's
/// `--fixed-schedule` refuses a trace without either.
pub fn write_mooncake(out: &mut dyn Write, dataset: &Dataset) -> Result<(), SynthError> {
    let unscheduled = dataset
        .conversations
        .iter()
        .flat_map(|c| &c.turns)
        .all(|t| t.timestamp.is_none() && t.delay.is_none());
    write_mooncake_with(out, dataset, unscheduled)
}

/// [`write_mooncake`] for part of a dataset, `unscheduled` said for the whole of it.
pub fn write_mooncake_with(
    out: &mut dyn Write,
    dataset: &Dataset,
    unscheduled: bool,
) -> Result<(), SynthError> {
    for conv in &dataset.conversations {
        refuse_context(conv, "--format mooncake")?;
        for (i, turn) in conv.turns.iter().enumerate() {
            let mut o = Obj::default();
            o.set("session_id", js(&conv.session_id));
            match (&turn.raw_messages, &turn.raw_payload) {
                (None, None) if turn.agentic.is_some() => {
                    o.set("messages", agentic_messages(conv, i))
                }
                (Some(m), _) => {
                    o.set("messages", m.get().to_owned());
                    if let Some(t) = &turn.raw_tools {
                        o.set("tools", t.get().to_owned());
                    }
                }
                (None, Some(p)) => o.set("payload", p.get().to_owned()),
                (None, None) => o.set("text_input", js(&turn.text)),
            }
            if let Some(n) = turn.max_tokens {
                o.set("output_length", n.to_string());
            }
            if let Some(t) = &turn.timestamp {
                o.set("timestamp", t.to_string());
            }
            if let Some(d) = &turn.delay {
                o.set("delay", d.to_string());
            }
            if unscheduled {
                o.set(if i == 0 { "timestamp" } else { "delay" }, "0".into());
            }
            if let Some(e) = &turn.extra_body {
                o.set("extra", e.get().to_owned());
            }
            writeln!(out, "{}", o.render())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::dataset::RawJson;

    fn conv(turns: &[(&str, Option<u64>)]) -> Conversation {
        Conversation {
            session_id: "s".into(),
            system_message: Some("S".into()),
            user_context_message: None,
            turns: turns
                .iter()
                .map(|(t, m)| Turn {
                    text: t.to_string(),
                    max_tokens: *m,
                    ..Turn::default()
                })
                .collect(),
            agentic: None,
        }
    }

    #[test]
    fn chat_bodies_alternate_and_keep_aiperf_key_order() {
        let mut c = conv(&[("t0", Some(3)), ("t1", Some(4))]);
        c.turns[1].extra_body = Some(RawJson(
            RawValue::from_string(r#"{"temperature":0,"model":"x"}"#.into()).unwrap(),
        ));
        let answers = vec!["a0".to_owned()];
        let opts = ChatOptions {
            model: "m",
            stream: true,
        };
        assert_eq!(
            chat_body(&c, 0, &answers, opts).unwrap(),
            r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"t0"}],"model":"m","stream":true,"max_completion_tokens":3,"stream_options":{"include_usage":true}}"#
        );
        assert_eq!(
            chat_body(&c, 1, &answers, opts).unwrap(),
            r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"t0"},{"role":"assistant","content":"a0"},{"role":"user","content":"t1"}],"model":"x","stream":true,"max_completion_tokens":4,"temperature":0,"stream_options":{"include_usage":true}}"#
        );
    }

    #[test]
    fn formats_refuse_what_they_cannot_carry() {
        let c = conv(&[("t0", Some(3))]);
        let d = Dataset {
            conversations: vec![c],
        };
        let e = write_vllm_custom(&mut Vec::new(), &d).unwrap_err();
        assert!(e.to_string().contains("system or user-context"), "{e}");
        assert!(write_mooncake(&mut Vec::new(), &d).is_err());
    }

    #[test]
    fn an_unscheduled_dataset_gets_timestamp_then_delay_in_mooncake() {
        let mut c = conv(&[("t0", Some(3)), ("t1", Some(4))]);
        c.system_message = None;
        let mut d = Dataset {
            conversations: vec![c],
        };
        let mut out = Vec::new();
        write_mooncake(&mut out, &d).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["timestamp"], 0);
        assert!(lines[0].get("delay").is_none());
        assert_eq!(lines[1]["delay"], 0);
        assert!(lines[1].get("timestamp").is_none());
        // A scheduled (trace) dataset keeps its own schedule, nothing added.
        d.conversations[0].turns[0].timestamp = Some(serde_json::Number::from(7));
        let mut out = Vec::new();
        write_mooncake(&mut out, &d).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().next().unwrap().contains("\"timestamp\":7"));
        assert!(!text.contains("\"delay\""), "{text}");
    }

    #[test]
    fn sharegpt_warns_about_first_prompts_vllm_drops() {
        let t = Tokenizer::default_qwen3().unwrap();
        let mut c = conv(&[("short prompt", Some(3))]);
        c.system_message = None;
        let mut d = Dataset {
            conversations: vec![c],
        };
        assert_eq!(sharegpt_length_warning(&d, &t).unwrap(), None);
        d.conversations[0].turns[0].text = "word ".repeat(1100);
        let w = sharegpt_length_warning(&d, &t).unwrap().unwrap();
        assert!(w.starts_with("1 of 1 sharegpt entries"), "{w}");
        assert!(
            w.contains("--sharegpt-output-len") && w.contains("--isl"),
            "{w}"
        );
    }
}
