//! The wire types the observer reads a response through: the API whose response it is, `usage`
//! in each API's spelling and its mapping to [`Tokens`], and the few fields of an SSE event or a
//! JSON body that carry content or usage, borrowed raw. Owns those shapes only; never holds
//! state and never sees a frame (the observer, `super`, hands it bytes).

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::api::{Route, Shape};
use crate::usage::Tokens;

/// Token counts in one API's `usage` spelling, every field as the upstream sent it. Streams may
/// send it in pieces (Anthropic: `message_start`, then `message_delta`); a later value of a field
/// replaces an earlier one (they are running totals).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct UsageWire {
    // Chat and completions.
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_tokens_details: Option<CachedDetails>,
    // Responses and Anthropic.
    #[serde(default)]
    pub input_tokens: Option<u64>,
    #[serde(default)]
    pub output_tokens: Option<u64>,
    // Responses.
    #[serde(default)]
    pub input_tokens_details: Option<CachedDetails>,
    // Anthropic.
    #[serde(default)]
    pub cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u64>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct CachedDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

impl UsageWire {
    pub(super) fn merge(&mut self, later: UsageWire) {
        macro_rules! take_later {
            ($($f:ident),*) => { $( self.$f = later.$f.or(self.$f); )* };
        }
        take_later!(
            prompt_tokens,
            completion_tokens,
            input_tokens,
            output_tokens,
            cache_read_input_tokens,
            cache_creation_input_tokens
        );
        let cached = |d: Option<CachedDetails>| d.and_then(|d| d.cached_tokens);
        if let Some(c) = cached(later.prompt_tokens_details) {
            self.prompt_tokens_details = Some(CachedDetails {
                cached_tokens: Some(c),
            });
        }
        if let Some(c) = cached(later.input_tokens_details) {
            self.input_tokens_details = Some(CachedDetails {
                cached_tokens: Some(c),
            });
        }
    }

    pub(super) fn tokens(&self, route: Route) -> Tokens {
        match route {
            Route::Api(Shape::Chat | Shape::Completions) => Tokens {
                prompt: self.prompt_tokens,
                cached: self.prompt_tokens_details.and_then(|d| d.cached_tokens),
                completion: self.completion_tokens,
            },
            Route::Api(Shape::Responses) => Tokens {
                prompt: self.input_tokens,
                cached: self.input_tokens_details.and_then(|d| d.cached_tokens),
                completion: self.output_tokens,
            },
            Route::Api(Shape::Messages) => Tokens {
                prompt: self.input_tokens.map(|i| {
                    i + self.cache_read_input_tokens.unwrap_or(0)
                        + self.cache_creation_input_tokens.unwrap_or(0)
                }),
                cached: self.cache_read_input_tokens,
                completion: self.output_tokens,
            },
            Route::Other => Tokens::default(),
        }
    }
}

/// The few fields of an SSE event or a JSON response the observer reads, for every API at once;
/// strings stay borrowed raw JSON, so an event costs no allocation beyond its `choices`.
#[derive(Deserialize)]
pub(super) struct Event<'a> {
    /// Chat and completions.
    #[serde(default, borrow)]
    choices: Option<Vec<ChunkChoice<'a>>>,
    /// Chat, completions, Anthropic `message_delta`, and non-streamed Responses / Anthropic.
    #[serde(default)]
    usage: Option<UsageWire>,
    /// Responses and Anthropic event type.
    #[serde(default, borrow, rename = "type")]
    kind: Option<&'a RawValue>,
    /// Responses: a string; Anthropic `content_block_delta`: an object.
    #[serde(default, borrow)]
    delta: Option<&'a RawValue>,
    /// Responses `response.completed` (and the other lifecycle events).
    #[serde(default)]
    response: Option<Nested>,
    /// Anthropic `message_start`.
    #[serde(default)]
    message: Option<Nested>,
}

/// A whole JSON response body, as [`super::Observer::finish`] reads it: only the members that can carry
/// `usage`. Every other member is still parsed (as `IgnoredAny`), so a body that is not valid
/// JSON counts no tokens, as before; what is skipped is building `choices` and the raw values
/// an SSE event needs, which a JSON body's usage never does.
#[derive(Deserialize)]
pub(super) struct JsonBody {
    #[serde(default)]
    usage: Option<UsageWire>,
    #[serde(default)]
    response: Option<Nested>,
    #[serde(default)]
    message: Option<Nested>,
}

impl JsonBody {
    /// The usage that applies: the same precedence as [`Event::usages`]' last.
    pub(super) fn usage(self) -> Option<UsageWire> {
        let nested = |n: Option<Nested>| n.and_then(|n| n.usage);
        self.usage
            .or_else(|| nested(self.response))
            .or_else(|| nested(self.message))
    }
}

#[derive(Deserialize)]
struct Nested {
    #[serde(default)]
    usage: Option<UsageWire>,
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    text: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
    #[serde(default, borrow)]
    reasoning_content: Option<&'a RawValue>,
}

/// Anthropic's `content_block_delta.delta`: text, thinking or tool-input JSON.
#[derive(Deserialize)]
struct BlockDelta<'a> {
    #[serde(default, borrow)]
    text: Option<&'a RawValue>,
    #[serde(default, borrow)]
    thinking: Option<&'a RawValue>,
    #[serde(default, borrow)]
    partial_json: Option<&'a RawValue>,
}

/// A JSON string with at least one character (a raw value: quotes included).
fn nonempty_str(v: Option<&RawValue>) -> bool {
    v.is_some_and(|v| {
        let s = v.get();
        s.len() > 2 && s.starts_with('"')
    })
}

impl Event<'_> {
    /// Whether the event carries generated output: TTFT ends and inter-token gaps are taken here.
    pub(super) fn has_content(&self, route: Route) -> bool {
        match route {
            Route::Api(Shape::Chat | Shape::Completions) => {
                self.choices.iter().flatten().any(|c| {
                    nonempty_str(c.text)
                        || c.delta.as_ref().is_some_and(|d| {
                            nonempty_str(d.content) || nonempty_str(d.reasoning_content)
                        })
                })
            }
            // `response.output_text.delta`, and the other output deltas (reasoning text, refusal,
            // function-call arguments): all are generated tokens.
            Route::Api(Shape::Responses) => {
                self.kind.is_some_and(|k| {
                    let k = k.get();
                    k.starts_with("\"response.") && k.ends_with(".delta\"")
                }) && nonempty_str(self.delta)
            }
            Route::Api(Shape::Messages) => {
                self.kind
                    .is_some_and(|k| k.get() == "\"content_block_delta\"")
                    && self.delta.is_some_and(|d| {
                        serde_json::from_str::<BlockDelta>(d.get()).is_ok_and(|d| {
                            nonempty_str(d.text)
                                || nonempty_str(d.thinking)
                                || nonempty_str(d.partial_json)
                        })
                    })
            }
            Route::Other => false,
        }
    }

    /// Every `usage` the event carries, in the order they apply.
    pub(super) fn usages(&self) -> impl Iterator<Item = UsageWire> + '_ {
        let nested = |n: &Option<Nested>| n.as_ref().and_then(|n| n.usage);
        nested(&self.message)
            .into_iter()
            .chain(nested(&self.response))
            .chain(self.usage)
    }
}
