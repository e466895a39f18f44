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

/// The `usage` of a whole JSON response body, as [`JsonBody`] reads it. OpenAI-style servers
/// (chat, completions; Anthropic too) write `usage` as the last member of the top-level object,
/// so that member is found from the end and only its value is parsed; any other layout, or a
/// `null` or unreadable value there, takes the full read.
///
/// The member is taken when the body is `{ ... , "usage" : V }`: the quote opening `"usage"`
/// right after a `,` or the `{` (white space between), a `:`, then V, one whole JSON value, then
/// the body's last `}`. In a whole JSON object that is a top-level member: an unescaped quote
/// inside a string would end it and leave `usage"` bare, so the quote opens the key; the `}`
/// after its value closes the object it is in, and the body's last byte closes the top level.
/// The observer reads only a body that ended cleanly (a complete `content-length` or chunked
/// body), so a body cut short is not read. What comes before the member is not read, so not
/// validated: a body malformed there (or with a second top-level `usage`) but ending in a whole
/// `usage` member counts its tokens, where the full read would count none.
pub(super) fn json_usage(body: &[u8]) -> Option<UsageWire> {
    match usage_at_end(body) {
        Some(Some(u)) => Some(u),
        _ => serde_json::from_slice::<JsonBody>(body)
            .ok()
            .and_then(JsonBody::usage),
    }
}

/// The value of the top-level `usage` member when it is the body's last: `None` when the body
/// is not laid out so or the value does not read as usage (then the caller reads it all).
fn usage_at_end(body: &[u8]) -> Option<Option<UsageWire>> {
    const KEY: &[u8] = b"\"usage\"";
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let close = body.iter().rposition(|b| !ws(b))?;
    let open = body.iter().position(|b| !ws(b))?;
    if body[open] != b'{' || body[close] != b'}' {
        return None;
    }
    let key = memchr::memmem::rfind(&body[..close], KEY)?;
    let before = body[..key].iter().rposition(|b| !ws(b))?;
    if !matches!(body[before], b',' | b'{') {
        return None;
    }
    let after = key + KEY.len();
    let colon = after + body[after..close].iter().position(|b| !ws(b))?;
    if body[colon] != b':' {
        return None;
    }
    // The value must be all that is left before the last `}`: `from_slice` reads exactly one
    // value and allows only white space after it; the plain reading does the same.
    let value = &body[colon + 1..close];
    match plain::usage(value) {
        Some(u) => Some(u),
        None => serde_json::from_slice::<Option<UsageWire>>(value).ok(),
    }
}

/// A `usage` value read by hand when it is plain: an object of unsigned integers (or `null`),
/// the two `*_details` objects, and unknown members whose values are numbers, literals, strings
/// without escapes or objects of those. Anything else (escapes, fractions, signs, arrays, bytes
/// past ASCII, a repeated field) is left to serde, which reads every case, so the answer never
/// differs from serde's: `None` means "not sure", `Some(None)` is a `null` usage.
mod plain {
    use super::{CachedDetails, UsageWire};

    struct Scan<'a> {
        b: &'a [u8],
        i: usize,
    }

    const COUNTS: [&[u8]; 6] = [
        b"prompt_tokens",
        b"completion_tokens",
        b"input_tokens",
        b"output_tokens",
        b"cache_read_input_tokens",
        b"cache_creation_input_tokens",
    ];

    pub(super) fn usage(value: &[u8]) -> Option<Option<UsageWire>> {
        let mut s = Scan { b: value, i: 0 };
        let u = if s.literal(b"null") {
            None
        } else {
            Some(s.usage()?)
        };
        s.ws();
        (s.i == value.len()).then_some(u)
    }

    impl<'a> Scan<'a> {
        fn ws(&mut self) {
            while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.i += 1;
            }
        }

        fn eat(&mut self, c: u8) -> bool {
            self.ws();
            let hit = self.b.get(self.i) == Some(&c);
            self.i += usize::from(hit);
            hit
        }

        fn literal(&mut self, word: &[u8]) -> bool {
            self.ws();
            let hit = self.b[self.i..].starts_with(word);
            if hit {
                self.i += word.len();
            }
            hit
        }

        /// A string of printable ASCII without escapes; its bytes, quotes left out.
        fn string(&mut self) -> Option<&'a [u8]> {
            if !self.eat(b'"') {
                return None;
            }
            let start = self.i;
            loop {
                match *self.b.get(self.i)? {
                    b'"' => break,
                    b'\\' | 0..=0x1f | 0x80.. => return None,
                    _ => self.i += 1,
                }
            }
            self.i += 1;
            let b: &'a [u8] = self.b;
            Some(&b[start..self.i - 1])
        }

        /// An unsigned integer as JSON writes it (no leading zero, no fraction, no exponent), or
        /// `null`: what serde reads into an `Option<u64>`.
        fn count(&mut self) -> Option<Option<u64>> {
            if self.literal(b"null") {
                return Some(None);
            }
            let rest = &self.b[self.i..];
            let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
            let leading_zero = digits > 1 && rest[0] == b'0';
            // 19 digits always fit a u64; a longer number is left to serde.
            if digits == 0 || digits > 19 || leading_zero {
                return None;
            }
            if matches!(rest.get(digits), Some(b'.' | b'e' | b'E')) {
                return None;
            }
            let n = rest[..digits]
                .iter()
                .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            self.i += digits;
            Some(Some(n))
        }

        /// An object's members: `member` reads each value after its key.
        fn members(
            &mut self,
            mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>,
        ) -> Option<()> {
            if !self.eat(b'{') {
                return None;
            }
            if self.eat(b'}') {
                return Some(());
            }
            loop {
                let key = self.string()?;
                if !self.eat(b':') {
                    return None;
                }
                member(self, key)?;
                if self.eat(b'}') {
                    return Some(());
                }
                if !self.eat(b',') {
                    return None;
                }
            }
        }

        /// Skips an unknown member's value, one level of objects deep.
        fn skip(&mut self, nested: bool) -> Option<()> {
            self.ws();
            match self.b.get(self.i)? {
                b'"' => self.string().map(drop),
                b'{' if !nested => self.members(|s, _| s.skip(true)),
                b'0'..=b'9' | b'n' => self.count().map(drop),
                _ => (self.literal(b"true") || self.literal(b"false")).then_some(()),
            }
        }

        fn details(&mut self) -> Option<Option<CachedDetails>> {
            if self.literal(b"null") {
                return Some(None);
            }
            let mut d = CachedDetails::default();
            let mut seen = false;
            self.members(|s, key| {
                if key != b"cached_tokens" {
                    return s.skip(true);
                }
                // A repeated field is serde's error to make.
                if std::mem::replace(&mut seen, true) {
                    return None;
                }
                d.cached_tokens = s.count()?;
                Some(())
            })?;
            Some(Some(d))
        }

        fn usage(&mut self) -> Option<UsageWire> {
            let mut u = UsageWire::default();
            let mut seen = 0u8;
            self.members(|s, key| {
                let index = COUNTS.iter().position(|c| *c == key).or(match key {
                    b"prompt_tokens_details" => Some(6),
                    b"input_tokens_details" => Some(7),
                    _ => None,
                });
                let Some(index) = index else {
                    return s.skip(false);
                };
                if seen & (1 << index) != 0 {
                    return None;
                }
                seen |= 1 << index;
                match index {
                    0 => u.prompt_tokens = s.count()?,
                    1 => u.completion_tokens = s.count()?,
                    2 => u.input_tokens = s.count()?,
                    3 => u.output_tokens = s.count()?,
                    4 => u.cache_read_input_tokens = s.count()?,
                    5 => u.cache_creation_input_tokens = s.count()?,
                    6 => u.prompt_tokens_details = s.details()?,
                    _ => u.input_tokens_details = s.details()?,
                }
                Some(())
            })?;
            Some(u)
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The full read, as the observer did it before the read from the end.
    fn full(body: &[u8]) -> Option<UsageWire> {
        serde_json::from_slice::<JsonBody>(body)
            .ok()
            .and_then(JsonBody::usage)
    }

    fn usage(p: u64, c: u64, cached: Option<u64>) -> UsageWire {
        UsageWire {
            prompt_tokens: Some(p),
            completion_tokens: Some(c),
            prompt_tokens_details: cached.map(|c| CachedDetails {
                cached_tokens: Some(c),
            }),
            ..UsageWire::default()
        }
    }

    #[test]
    fn usage_read_from_the_end_matches_the_full_read_on_a_table() {
        let u = Some(usage(7, 2, Some(3)));
        let u_plain = Some(usage(7, 2, None));
        // (body, what both reads give, whether the end alone answers it)
        let cases: &[(&str, Option<UsageWire>, bool)] = &[
            (
                r#"{"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":3}}}"#,
                u,
                true,
            ),
            (
                " {\"id\":\"x\" ,\n \"usage\" :\t{\"prompt_tokens\":7,\"completion_tokens\":2} \n}\r\n",
                u_plain,
                true,
            ),
            (r#"{"usage":{"prompt_tokens":7,"completion_tokens":2}}"#, u_plain, true),
            // Not last: the full read.
            (
                r#"{"usage":{"prompt_tokens":7,"completion_tokens":2},"id":"x"}"#,
                u_plain,
                false,
            ),
            // Nested in the last member, not a top-level member.
            (
                r#"{"id":"x","data":{"usage":{"prompt_tokens":1}}}"#,
                None,
                false,
            ),
            (
                r#"{"usage":{"prompt_tokens":7,"completion_tokens":2},"data":{"usage":{"prompt_tokens":1}}}"#,
                u_plain,
                false,
            ),
            // `"usage"` inside a string, escaped: never taken for the key.
            (
                r#"{"usage":{"prompt_tokens":7,"completion_tokens":2},"note":"a,\"usage\":{\"prompt_tokens\":1}}"}"#,
                u_plain,
                false,
            ),
            (
                r#"{"note":"\\","usage":{"prompt_tokens":7,"completion_tokens":2}}"#,
                u_plain,
                true,
            ),
            // A `usage` key inside the usage object.
            (
                r#"{"usage":{"prompt_tokens":7,"completion_tokens":2,"x":{"usage":1}}}"#,
                u_plain,
                false,
            ),
            // Null at the top: the Responses / Anthropic nesting applies.
            (
                r#"{"response":{"usage":{"prompt_tokens":7,"completion_tokens":2}},"usage":null}"#,
                u_plain,
                false,
            ),
            (r#"{"usage":null}"#, None, false),
            // Unreadable usage: nothing, from either read.
            (r#"{"id":"x","usage":{"prompt_tokens":-1}}"#, None, false),
            (r#"{"id":"x","usage":"many"}"#, None, false),
            (r#"{"id":"x","usage":{"prompt_tokens":7}} x"#, None, false),
            // Serde reads a struct from an array too (its members in order): not the end's.
            (
                r#"[{"usage":{"prompt_tokens":7}}]"#,
                Some(UsageWire::default()),
                false,
            ),
            (r#"{"usage":{"prompt_tokens":7}}}"#, None, false),
            (r#""usage":{"prompt_tokens":7}}"#, None, false),
            ("", None, false),
            ("}", None, false),
        ];
        for (body, want, at_end) in cases {
            let b = body.as_bytes();
            assert_eq!(full(b), *want, "full read of {body}");
            assert_eq!(json_usage(b), *want, "{body}");
            assert_eq!(
                usage_at_end(b).flatten().is_some(),
                *at_end,
                "read from the end: {body}"
            );
        }
    }

    #[test]
    fn what_comes_before_a_last_usage_member_is_not_validated() {
        let body = br#"{"id":"x",,,"usage":{"prompt_tokens":7,"completion_tokens":2}}"#;
        assert_eq!(full(body), None);
        assert_eq!(json_usage(body), Some(usage(7, 2, None)));
        // A second top-level usage is serde's error; the end's member is taken.
        let body =
            br#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":7,"completion_tokens":2}}"#;
        assert_eq!(full(body), None);
        assert_eq!(json_usage(body), Some(usage(7, 2, None)));
    }

    #[test]
    fn the_plain_reading_of_a_usage_value_is_serdes_or_none() {
        let serde = |v: &str| serde_json::from_slice::<Option<UsageWire>>(v.as_bytes()).ok();
        // (value, whether the plain reading answers it itself)
        let cases: &[(&str, bool)] = &[
            ("null", true),
            (" {} ", true),
            (
                r#"{"prompt_tokens":0,"completion_tokens":18446744073709551}"#,
                true,
            ),
            (
                r#"{"prompt_tokens":null,"prompt_tokens_details":null}"#,
                true,
            ),
            (
                r#"{ "input_tokens" : 5 , "input_tokens_details" : { "cached_tokens" : 2 } }"#,
                true,
            ),
            (
                r#"{"total_tokens":9,"x":"y","t":true,"f":false,"n":null,"o":{"a":1,"b":"c"}}"#,
                true,
            ),
            (
                r#"{"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0}}"#,
                true,
            ),
            (
                r#"{"prompt_tokens_details":{"cached_tokens":1,"audio_tokens":0}}"#,
                true,
            ),
            // Left to serde: what it reads in ways worth not copying, or refuses.
            (r#"{"prompt_tokens":1,"prompt_tokens":2}"#, false),
            (
                r#"{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":1}}"#,
                false,
            ),
            (r#"{"prompt_tokens":1.0}"#, false),
            (r#"{"prompt_tokens":1e3}"#, false),
            (r#"{"prompt_tokens":-1}"#, false),
            (r#"{"prompt_tokens":01}"#, false),
            (r#"{"prompt_tokens":99999999999999999999}"#, false),
            (r#"{"prompt\u005ftokens":3}"#, false),
            (r#"{"x":"\"","prompt_tokens":3}"#, false),
            (r#"{"x":"é","prompt_tokens":3}"#, false),
            (r#"{"x":[1],"prompt_tokens":3}"#, false),
            (r#"{"x":{"y":{}},"prompt_tokens":3}"#, false),
            (r#"{"prompt_tokens":3,}"#, false),
            (r#"{"prompt_tokens":3} x"#, false),
            (r#"[1,2]"#, false),
            (r#"{"prompt_tokens":nul}"#, false),
            ("", false),
        ];
        for (v, plain) in cases {
            let got = plain::usage(v.as_bytes());
            assert_eq!(got.is_some(), *plain, "{v}");
            if let Some(u) = got {
                assert_eq!(Some(u), serde(v), "{v}");
            }
        }
    }

    /// SplitMix64: a deterministic generator, so a failing body can be rebuilt from its seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
            of[self.below(of.len() as u64) as usize]
        }
    }

    fn ws(r: &mut Rng, out: &mut String) {
        for _ in 0..r.below(3) {
            out.push_str(r.pick(&["", " ", "\n", "\t", "\r\n"]));
        }
    }

    /// A random JSON value, at most `depth` levels deep; strings hold quotes, backslashes and
    /// the text `"usage"` escaped.
    fn value(r: &mut Rng, depth: u32, out: &mut String) {
        let kinds = if depth == 0 { 4 } else { 6 };
        match r.below(kinds) {
            0 => out.push_str(r.pick(&["null", "true", "false"])),
            1 => out.push_str(&r.below(100_000).to_string()),
            2 => out.push_str(r.pick(&["-3", "1.5", "2e3", "0"])),
            3 => {
                let s = r.pick(&[
                    r#""""#,
                    r#""hi""#,
                    r#""\\""#,
                    r#""a,\"usage\":{\"prompt_tokens\":1}}""#,
                    r#""\"usage\"""#,
                    r#""usage""#,
                    r#""}""#,
                    r#""\u0022usage\u0022""#,
                ]);
                out.push_str(s);
            }
            4 => {
                out.push('[');
                for i in 0..r.below(3) {
                    if i > 0 {
                        out.push(',');
                    }
                    ws(r, out);
                    value(r, depth - 1, out);
                }
                out.push(']');
            }
            _ => object(r, depth - 1, &["a", "usage", "b", "text"], out),
        }
    }

    /// An object with distinct keys drawn from `keys`, random values.
    fn object(r: &mut Rng, depth: u32, keys: &[&str], out: &mut String) {
        out.push('{');
        let mut first = true;
        for k in keys {
            if r.below(2) == 0 {
                continue;
            }
            if !first {
                out.push(',');
            }
            first = false;
            ws(r, out);
            out.push_str(&format!("\"{k}\""));
            ws(r, out);
            out.push(':');
            ws(r, out);
            value(r, depth, out);
            ws(r, out);
        }
        out.push('}');
    }

    /// A usage object: mostly readable, now and then a field of the wrong type or unknown.
    fn usage_value(r: &mut Rng, out: &mut String, may_break: bool) {
        if may_break && r.below(8) == 0 {
            out.push_str(r.pick(&["null", "\"x\"", "[]", "{\"prompt_tokens\":-1}"]));
            return;
        }
        let fields = [
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
        ];
        out.push('{');
        let mut first = true;
        for f in fields {
            if r.below(2) == 0 {
                continue;
            }
            if !first {
                out.push(',');
            }
            first = false;
            ws(r, out);
            out.push_str(&format!("\"{f}\":{}", r.below(5000)));
        }
        if r.below(3) == 0 {
            if !first {
                out.push(',');
            }
            let d = r.pick(&["prompt_tokens_details", "input_tokens_details"]);
            out.push_str(&format!("\"{d}\":{{\"cached_tokens\":{}}}", r.below(5000)));
            if r.below(4) == 0 {
                out.push_str(r#","usage":{"x":1}"#);
            }
        }
        out.push('}');
    }

    /// A response-like body: random members in random order, `usage` among them (last in most).
    fn body(r: &mut Rng) -> String {
        let mut members: Vec<String> = Vec::new();
        let names = [
            "id", "object", "choices", "model", "response", "message", "data",
        ];
        for name in names {
            if r.below(2) == 0 {
                continue;
            }
            let mut m = format!("\"{name}\"");
            ws(r, &mut m);
            m.push(':');
            ws(r, &mut m);
            match name {
                // The Responses / Anthropic nesting, always readable (a broken one fails the
                // full read, which the read from the end does not look at).
                "response" | "message" => {
                    m.push_str("{\"usage\":");
                    usage_value(r, &mut m, false);
                    m.push('}');
                }
                _ => value(r, 3, &mut m),
            }
            members.push(m);
        }
        if r.below(6) != 0 {
            let mut m = String::from("\"usage\"");
            ws(r, &mut m);
            m.push(':');
            ws(r, &mut m);
            usage_value(r, &mut m, true);
            ws(r, &mut m);
            let at = if r.below(4) == 0 {
                r.below(members.len() as u64 + 1) as usize
            } else {
                members.len()
            };
            members.insert(at, m);
        }
        let mut out = String::new();
        ws(r, &mut out);
        out.push('{');
        for (i, m) in members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            ws(r, &mut out);
            out.push_str(m);
            ws(r, &mut out);
        }
        out.push('}');
        ws(r, &mut out);
        out
    }

    #[test]
    fn the_plain_reading_matches_serde_on_random_usage_values() {
        let mut r = Rng(0x0075_7361_6765);
        let mut plain_read = 0;
        for i in 0..20_000 {
            let mut v = String::new();
            if r.below(3) == 0 {
                // Any object: unknown members of every kind, known ones of any value.
                let keys = [
                    "prompt_tokens",
                    "input_tokens_details",
                    "a",
                    "prompt_tokens",
                ];
                object(&mut r, 2, &keys, &mut v);
            } else {
                usage_value(&mut r, &mut v, true);
            }
            let want = serde_json::from_slice::<Option<UsageWire>>(v.as_bytes()).ok();
            if let Some(u) = plain::usage(v.as_bytes()) {
                plain_read += 1;
                assert_eq!(Some(u), want, "value {i}: {v}");
            }
        }
        assert!(plain_read > 10_000, "{plain_read}");
    }

    #[test]
    fn usage_read_from_the_end_matches_the_full_read_on_random_bodies() {
        let mut r = Rng(0x6b76_6275_7374);
        let mut from_end = 0;
        for i in 0..20_000 {
            let b = body(&mut r);
            let b = b.as_bytes();
            let want = full(b);
            assert_eq!(
                json_usage(b),
                want,
                "body {i}: {}",
                String::from_utf8_lossy(b)
            );
            if let Some(Some(u)) = usage_at_end(b) {
                from_end += 1;
                assert_eq!(Some(u), want, "body {i} from the end");
            }
            // A cut body is never read by the observer (it reads only a body that ended
            // cleanly); reading one must still not fail.
            let cut = &b[..(r.below(b.len() as u64) as usize)];
            let _ = json_usage(cut);
        }
        // Most bodies end in their usage member: the read from the end is what answered them.
        assert!(from_end > 10_000, "{from_end}");
    }
}
