//! Chat templates: [`ChatTemplate`] compiles a tokenizer's Jinja chat template once and renders it
//! as transformers' `apply_chat_template` does, and [`estimate_overheads`] measures its fixed and
//! per-message token cost on three fixed probes (AIPerf `_estimate_chat_template_overheads`).
//! Owns template rendering only; never tokenizes beyond the estimate and never reads request
//! bodies itself (the mock model hands it role/content pairs).

use std::collections::BTreeMap;

use minijinja::{Environment, Value};

use crate::synth::error::SynthError;
use crate::synth::rng::py_round;
use crate::synth::tokenizer::pyjinja::{self, TemplateDate};
use crate::synth::tokenizer::Tokenizer;

const PROBES: [&str; 3] = [
    "Hello, how are you today?",
    "Could you write a Python function to reverse a string?",
    "What's the difference between TCP and UDP in networking?",
];

/// Per-request fixed tokens and per-message wrap tokens of a chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChatTemplateOverheads {
    /// Tokens a request pays once (beyond one message's wrap and the special tokens).
    pub fixed: i64,
    /// Tokens each message's wrapping costs.
    pub wrap: i64,
}

fn map<const N: usize>(entries: [(&str, Value); N]) -> Value {
    let m: BTreeMap<String, Value> = entries
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    Value::from(m)
}

fn message(role: &str, content: &str) -> Value {
    map([
        ("role", Value::from(role)),
        ("content", Value::from(content)),
    ])
}

fn special_token(tokenizer: &Tokenizer, id: Option<u32>) -> Value {
    id.and_then(|id| tokenizer.inner().id_to_token(id))
        .map(Value::from)
        .unwrap_or(Value::from(()))
}

/// A chat template compiled once as transformers compiles it (Jinja with trim_blocks,
/// lstrip_blocks and loop controls; Python's string and dict methods through pycompat;
/// `raise_exception`; transformers' own `tojson`), with the tokenizer's BOS and EOS token
/// texts and its source (vLLM looks into it for a `developer` role).
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: Value,
    eos: Value,
    source: String,
    /// The day `strftime_now` reads.
    date: TemplateDate,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `template`; a syntax error is [`SynthError::ChatTemplate`].
    pub fn new(template: &str, bos: Value, eos: Value) -> Result<Self, SynthError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| SynthError::ChatTemplate(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_filter("tojson", pyjinja::tojson_filter);
        env.add_template_owned("chat", template.to_owned())
            .map_err(|e| SynthError::ChatTemplate(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos,
            eos,
            source: template.to_owned(),
            date: TemplateDate::Today,
        })
    }

    /// This template with `strftime_now` reading `date` (`chat_template_date`).
    pub fn with_date(mut self, date: TemplateDate) -> Self {
        self.date = date;
        self
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders with `vars` as the template's variables (after the tokenizer's `bos_token` and
    /// `eos_token`, which a variable of the same name replaces, as transformers merges them),
    /// and `strftime_now` reading the template's date. The error is minijinja's: its `detail()` is what a
    /// template's `raise_exception` said.
    pub fn render_with(&self, vars: Vec<(&str, Value)>) -> Result<String, minijinja::Error> {
        let tmpl = self.env.get_template("chat")?;
        let mut ctx = pyjinja::Dict::default();
        ctx.set("bos_token", self.bos.clone());
        ctx.set("eos_token", self.eos.clone());
        let now = self.date.now();
        ctx.set(
            "strftime_now",
            Value::from_function(move |format: String| pyjinja::strftime(&now, &format)),
        );
        for (k, v) in vars {
            ctx.set(k, v);
        }
        tmpl.render(ctx.into_value())
    }

    /// The tokenizer's own chat template, or `None` when it has none.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Option<Self>, SynthError> {
        let Some(template) = tokenizer.chat_template() else {
            return Ok(None);
        };
        let bos = special_token(tokenizer, tokenizer.bos_token_id());
        let eos = special_token(tokenizer, tokenizer.eos_token_id());
        Self::new(template, bos, eos).map(Some)
    }

    /// Renders `messages` (role, content) like transformers' `apply_chat_template(tokenize=False,
    /// add_generation_prompt=True)`.
    pub fn render(&self, messages: &[(&str, &str)]) -> Result<String, SynthError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| SynthError::ChatTemplate(e.to_string()))?;
        let msgs: Vec<Value> = messages.iter().map(|(r, c)| message(r, c)).collect();
        let ctx = map([
            ("messages", Value::from(msgs)),
            ("add_generation_prompt", Value::from(true)),
            ("tools", Value::from(())),
            ("bos_token", self.bos.clone()),
            ("eos_token", self.eos.clone()),
        ]);
        tmpl.render(ctx)
            .map_err(|e| SynthError::ChatTemplate(e.to_string()))
    }
}

/// AIPerf's estimate; `Ok(None)` when the tokenizer has no chat template or a per-probe value is
/// negative (AIPerf then uses 0 and 0).
pub fn estimate_overheads(
    tokenizer: &Tokenizer,
) -> Result<Option<ChatTemplateOverheads>, SynthError> {
    let Some(template) = ChatTemplate::for_tokenizer(tokenizer)? else {
        return Ok(None);
    };
    let special = tokenizer.num_special_tokens_to_add() as f64;
    let mut fixed_sum = 0.0;
    let mut wrap_sum = 0.0;
    for s in PROBES {
        let single = template.render(&[("user", s)])?;
        let triple = template.render(&[("user", s), ("assistant", s), ("user", s)])?;
        let n_single = tokenizer.encode(&single)?.len() as f64;
        let n_triple = tokenizer.encode(&triple)?.len() as f64;
        let n_s = tokenizer.encode(s)?.len() as f64;
        let wrap = (n_triple - n_single - 2.0 * n_s) / 2.0;
        let fixed = n_single - n_s - wrap - special;
        if wrap < 0.0 || fixed < 0.0 {
            return Ok(None);
        }
        fixed_sum += fixed;
        wrap_sum += wrap;
    }
    let n = PROBES.len() as f64;
    Ok(Some(ChatTemplateOverheads {
        fixed: py_round(fixed_sum / n),
        wrap: py_round(wrap_sum / n),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_overheads() {
        let t = Tokenizer::default_qwen3().unwrap();
        let o = estimate_overheads(&t).unwrap().unwrap();
        assert_eq!(o, ChatTemplateOverheads { fixed: 3, wrap: 5 });
    }
}
