//! The four generation APIs kvbust reads, as one [`Shape`] with its path table, and the
//! [`Route`] a request is on. A leaf: every layer that treats the APIs differently (marking,
//! the observer, the cache model, the mock) matches on this one enum, exhaustively, so a new
//! API is a new variant the compiler walks through every such place. Never reads a body.

use std::fmt;

use http::Method;

/// The model list every OpenAI-compatible server serves (the health probe's fallback, the
/// served-models check, `kvbust probe`, the mock).
pub const MODELS_PATH: &str = "/v1/models";

/// The request body shapes kvbust rewrites, one per API route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `/v1/chat/completions`: `messages`, content a string or a list of parts.
    Chat,
    /// `/v1/responses`: `instructions`, `input` a string or a list of items.
    Responses,
    /// `/v1/messages` (Anthropic): top-level `system`, `messages`.
    Messages,
    /// `/v1/completions`: `prompt` a string or a list of strings.
    Completions,
}

impl Shape {
    /// Every shape. The one list the compiler does not check: a new variant goes here by hand
    /// (every `match` on a shape, from marking to the observer to the mock, is exhaustive).
    pub const ALL: [Shape; 4] = [
        Shape::Chat,
        Shape::Responses,
        Shape::Messages,
        Shape::Completions,
    ];

    /// The route this shape is read from.
    pub const fn path(self) -> &'static str {
        match self {
            Shape::Chat => "/v1/chat/completions",
            Shape::Responses => "/v1/responses",
            Shape::Messages => "/v1/messages",
            Shape::Completions => "/v1/completions",
        }
    }

    /// The shape of an exact route path (no query string, no trailing slash), if it is one.
    pub fn from_path(path: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|s| s.path() == path)
    }

    /// Short name: `chat`, `responses`, `messages`, `completions` (AIPerf's endpoint names).
    pub const fn as_str(self) -> &'static str {
        match self {
            Shape::Chat => "chat",
            Shape::Responses => "responses",
            Shape::Messages => "messages",
            Shape::Completions => "completions",
        }
    }

    /// The `type` of a text content part in this API: `input_text` for the Responses API (the
    /// only text part its input messages accept), `text` for chat and Anthropic.
    pub const fn text_part_type(self) -> &'static str {
        match self {
            Shape::Responses => "input_text",
            Shape::Chat | Shape::Messages | Shape::Completions => "text",
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `path` with its `%XX` escapes decoded as uvicorn decodes them (`urllib.parse.unquote`: an
/// escape that is not two hex digits stays as it is; bytes that are not UTF-8 become U+FFFD).
fn percent_decoded(path: &str) -> std::borrow::Cow<'_, str> {
    if !path.contains('%') {
        return std::borrow::Cow::Borrowed(path);
    }
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                // Two hex digits make one byte (at most 0xff).
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(u8::MAX));
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    std::borrow::Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// The route a request is on: one of the API paths (POST), named by the body shape read
/// there ([`Shape::path`] holds the paths), or `Other`, which passes through untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Api(Shape),
    Other,
}

impl Route {
    /// The route of `path` as the engine routes it: percent-decoded first (uvicorn hands
    /// Starlette the decoded path, so `/v1/chat%2Fcompletions` is served as chat and must be
    /// marked, counted and modelled as chat; the path goes upstream as it came).
    pub fn classify(method: &Method, path: &str) -> Route {
        if method != Method::POST {
            return Route::Other;
        }
        let decoded = percent_decoded(path);
        Shape::from_path(decoded.trim_end_matches('/')).map_or(Route::Other, Route::Api)
    }

    /// The metric and log label: the shape's name, or `other`.
    pub fn label(self) -> &'static str {
        match self {
            Route::Api(shape) => shape.as_str(),
            Route::Other => "other",
        }
    }

    pub fn shape(self) -> Option<Shape> {
        match self {
            Route::Api(shape) => Some(shape),
            Route::Other => None,
        }
    }
}
