//! Glue between the request path and the pure cache-bust engine: reads the `x-kvbust-*` headers
//! into a decision, resolves the session's digest inputs, and asks the engine to mark the body.
//! Never touches the network and never re-serialises bytes the engine left alone.

use bytes::Bytes;
use http::HeaderMap;

use crate::api::Shape;
use crate::budget::Reservation;
use crate::cachebust::inject::{parse_laid_out, Edit, Parsed};
use crate::cachebust::{
    digest, marker::marker_for_digest, salt, DigestInputs, ListParts, Method, Phase, Plan,
    RewriteError, Target,
};
use crate::config::{edit_distance, HeaderNames, ListPartsMode, OnUnparseable, SessionSource};
use crate::error::{excerpt, ProxyError};
use crate::json::Layout;
use crate::runtime::SharedState;

/// What a request asks for, decided from its headers before its body is read.
#[derive(Debug, Clone)]
pub struct Decision {
    pub phase: Phase,
    pub target: Target,
    pub explicit: Option<DigestInputs>,
    pub user_context_messages: usize,
    /// How the request is isolated; [`Decision::for_shape`] makes it one the route can carry.
    pub method: Method,
    /// The cache-hit dial (`cache_bust.hit_ratio`, `x-kvbust-hit-ratio`), 0..=1.
    pub hit_ratio: Option<f64>,
}

impl Decision {
    /// True when a marker will be injected, so the body must be collected and parsed.
    pub fn needs_body(&self) -> bool {
        match self.target {
            Target::None => false,
            t if t.is_warmup_isolation() => self.phase == Phase::Warmup,
            _ => true,
        }
    }

    /// The decision for a request on a route of `shape`: `salt` on a route whose API has no
    /// salt (Anthropic Messages) falls back to the marker, counted in
    /// `kvbust_salt_fallback_total` and said once in the log.
    pub fn for_shape(mut self, shape: Shape, rt: &SharedState) -> Self {
        if self.method == Method::Salt && shape == Shape::Messages {
            self.method = Method::Marker;
            if self.needs_body() {
                rt.metrics.salt_fallback.inc();
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::warn!(
                        "cache_bust.method = salt: Anthropic Messages (/v1/messages) has no \
                         cache_salt, so its requests are isolated with the marker instead \
                         (counted in kvbust_salt_fallback_total; said once)"
                    );
                });
            }
        }
        self
    }

    /// The benchmark id this request's digest and warm-up salt use: its explicit header's,
    /// else the configured one.
    fn benchmark_id<'a>(&'a self, rt: &'a SharedState) -> &'a str {
        self.explicit
            .as_ref()
            .map_or(rt.benchmark_id.as_str(), |e| e.benchmark_id.as_str())
    }
}

/// A control or session header's value as text: any visible bytes that form UTF-8 (so a
/// `séssion-1` is itself, not a fallback), at most `limit` bytes. Anything else is a 400 that
/// says which; never a silent fallback to another identity source.
pub(super) fn header<'a>(
    headers: &'a HeaderMap,
    name: &str,
    limit: usize,
) -> Result<Option<&'a str>, ProxyError> {
    let Some(v) = headers.get(name) else {
        return Ok(None);
    };
    if v.len() > limit {
        return Err(ProxyError::bad_request(
            "header_too_long",
            format!(
                "header {name} is {} bytes, over limits.max_control_header ({limit} bytes); send a shorter value or raise the limit",
                v.len()
            ),
        ));
    }
    std::str::from_utf8(v.as_bytes())
        .map(|s| Some(s.trim()))
        .map_err(|_| {
            ProxyError::bad_request(
                "invalid_header",
                format!("header {name} must be UTF-8 text"),
            )
        })
}

/// Whether the request carries any kvbust control header. Most requests carry none; one pass
/// over the names then spares the header-by-header look-ups.
pub fn has_control_headers(headers: &HeaderMap, names: &HeaderNames) -> bool {
    headers.keys().any(|k| {
        let k = k.as_str();
        k.starts_with("x-kvbust-") || names.control().contains(&k)
    })
}

/// With `headers.reject_unknown`, a 400 for the first `x-kvbust-*` header that is none of the
/// configured request headers (a typo would otherwise be stripped and silently ignored, and the
/// request run with the defaults), naming the nearest valid header.
pub fn reject_unknown(headers: &HeaderMap, names: &HeaderNames) -> Result<(), ProxyError> {
    if !names.reject_unknown {
        return Ok(());
    }
    let control = names.control();
    let Some(unknown) = headers
        .keys()
        .map(http::HeaderName::as_str)
        .find(|k| k.starts_with("x-kvbust-") && !control.contains(k))
    else {
        return Ok(());
    };
    let nearest = control
        .iter()
        .min_by_key(|c| edit_distance(unknown, c))
        .copied()
        .unwrap_or_default();
    Err(ProxyError::bad_request(
        "unknown_header",
        format!(
            "unknown kvbust header {}: did you mean {nearest}? The request headers are {}; \
             set headers.reject_unknown = false to ignore unknown x-kvbust-* headers",
            excerpt(unknown.as_bytes()),
            control.join(", ")
        ),
    ))
}

/// The run a request names in `x-kvbust-run`, checked (`[A-Za-z0-9._-]{1,64}`).
pub fn run_name<'a>(
    headers: &'a HeaderMap,
    control: bool,
    rt: &SharedState,
) -> Result<Option<&'a str>, ProxyError> {
    if !control {
        return Ok(None);
    }
    let name = &rt.config.headers.run;
    match header(headers, name, rt.config.limits.control_header_len())? {
        Some(v) if crate::cache_model::runs::valid_name(v) => Ok(Some(v)),
        Some(v) => Err(ProxyError::bad_request(
            "invalid_run",
            format!(
                "{name}: `{}` is not a run name: 1 to 64 of A-Z a-z 0-9 . _ -",
                excerpt(v.as_bytes())
            ),
        )),
        None => Ok(None),
    }
}

/// Reads the request's phase, target and digest headers (`control`: from
/// [`has_control_headers`]; without any, everything comes from the configuration).
pub fn decide(
    headers: &HeaderMap,
    control: bool,
    rt: &SharedState,
    run: &crate::cache_model::RunCell,
) -> Result<Decision, ProxyError> {
    let cfg = &rt.config.cache_bust;
    if !control {
        return Ok(Decision {
            phase: run.unphased_phase(rt.default_phase()),
            target: cfg.target,
            explicit: None,
            user_context_messages: cfg.user_context_messages,
            method: cfg.method,
            hit_ratio: cfg.hit_ratio,
        });
    }
    let names = &rt.config.headers;
    let limit = rt.config.limits.control_header_len();
    let (h_phase, h_target, h_ctx) = (&names.phase, &names.target, &names.user_context_messages);
    let phase = match header(headers, h_phase, limit)? {
        Some(v) => v.parse::<Phase>().map_err(|mut e| {
            e.value = excerpt(e.value.as_bytes());
            ProxyError::bad_request("invalid_phase", format!("{h_phase}: {e}"))
        })?,
        None => run.unphased_phase(rt.default_phase()),
    };
    let target = match header(headers, h_target, limit)? {
        Some(v) if cfg.allow_target_header => v.parse::<Target>().map_err(|mut e| {
            e.value = excerpt(e.value.as_bytes());
            ProxyError::bad_request("invalid_target", format!("{h_target}: {e}"))
        })?,
        Some(_) => {
            return Err(ProxyError::bad_request(
                "target_header_disabled",
                format!(
                    "{h_target} is disabled on this proxy (cache_bust.allow_target_header = false)"
                ),
            ))
        }
        None => cfg.target,
    };
    let user_context_messages = match header(headers, h_ctx, limit)? {
        Some(v) => v.parse::<usize>().map_err(|_| {
            ProxyError::bad_request(
                "invalid_header",
                format!(
                    "{h_ctx} must be a non-negative integer, got `{}`",
                    excerpt(v.as_bytes())
                ),
            )
        })?,
        None => cfg.user_context_messages,
    };
    let explicit = explicit_inputs(headers, names, &rt.benchmark_id, limit)?;
    let (method, hit_ratio) = isolation(headers, names, limit, cfg)?;
    Ok(Decision {
        phase,
        target,
        explicit,
        user_context_messages,
        method,
        hit_ratio,
    })
}

/// The request's isolation method and cache-hit dial: its headers', else the configuration's.
fn isolation(
    headers: &HeaderMap,
    names: &HeaderNames,
    limit: usize,
    cfg: &crate::config::CacheBustConfig,
) -> Result<(Method, Option<f64>), ProxyError> {
    let method = match header(headers, &names.method, limit)? {
        Some(v) => v.parse::<Method>().map_err(|mut e| {
            e.value = excerpt(e.value.as_bytes());
            ProxyError::bad_request("invalid_method", format!("{}: {e}", names.method))
        })?,
        None => cfg.method,
    };
    let h_ratio = &names.hit_ratio;
    let hit_ratio = match header(headers, h_ratio, limit)? {
        Some(v) => Some(
            v.parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| {
                    ProxyError::bad_request(
                        "invalid_hit_ratio",
                        format!(
                            "{h_ratio} must be a number from 0 to 1 (the share of the prompt that may come from the cache), got `{}`",
                            excerpt(v.as_bytes())
                        ),
                    )
                })?,
        ),
        None => cfg.hit_ratio,
    };
    Ok((method, hit_ratio))
}

/// Digest inputs given as headers. A trace id is required for the others to mean anything.
fn explicit_inputs(
    headers: &HeaderMap,
    names: &HeaderNames,
    benchmark_id: &str,
    limit: usize,
) -> Result<Option<DigestInputs>, ProxyError> {
    let number = |name: &str| -> Result<Option<i64>, ProxyError> {
        header(headers, name, limit)?
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    ProxyError::bad_request(
                        "invalid_digest_header",
                        format!("{name} must be an integer, got `{}`", excerpt(v.as_bytes())),
                    )
                })
            })
            .transpose()
    };
    let recycle_pass = number(&names.recycle_pass)?;
    let trajectory_index = number(&names.trajectory_index)?;
    let bid = header(headers, &names.benchmark_id, limit)?;
    let Some(trace_id) = header(headers, &names.trace_id, limit)? else {
        if recycle_pass.is_some() || trajectory_index.is_some() || bid.is_some() {
            return Err(ProxyError::bad_request(
                "invalid_digest_header",
                format!(
                    "{}/{}/{} need {} as well",
                    names.benchmark_id, names.recycle_pass, names.trajectory_index, names.trace_id
                ),
            ));
        }
        return Ok(None);
    };
    if trace_id.is_empty() {
        return Err(ProxyError::bad_request(
            "invalid_digest_header",
            format!("{} must not be empty", names.trace_id),
        ));
    }
    Ok(Some(DigestInputs {
        benchmark_id: bid.unwrap_or(benchmark_id).to_string(),
        recycle_pass: recycle_pass.unwrap_or(0),
        trajectory_index: trajectory_index.unwrap_or(0),
        trace_id: trace_id.to_string(),
    }))
}

pub struct Rewritten {
    /// The new body, or `None` to forward the original bytes.
    pub body: Option<Bytes>,
    /// The 12-hex digest when a RID marker applies.
    pub rid: Option<String>,
}

/// Marks a collected body according to `d`. Only called when `d.needs_body()`.
/// `session`: the session key when the caller already knows it (synthetic requests).
pub fn apply(
    d: &Decision,
    shape: Shape,
    body: &Bytes,
    headers: &HeaderMap,
    rt: &SharedState,
    session: Option<&str>,
) -> Result<Rewritten, ProxyError> {
    apply_laid_out(d, shape, body, (headers, rt, session), &mut None, None)
}

/// [`apply`] reading the body through `layout`, the view of `body` an earlier step left (it
/// then parses nothing), or else parsing it once; `layout` is left as the view of the body
/// handed on (`None` when it could not be read). A marked body past `limits.max_body` is a
/// 413; before it is built, it is charged to `buffered` next to `body` (both are held while the
/// splice runs).
pub(crate) fn apply_laid_out(
    d: &Decision,
    shape: Shape,
    body: &Bytes,
    (headers, rt, session): (&HeaderMap, &SharedState, Option<&str>),
    layout: &mut Option<Layout>,
    buffered: Option<&mut Reservation<'_>>,
) -> Result<Rewritten, ProxyError> {
    let cfg = &rt.config.cache_bust;
    if let Some(enc) = headers.get(http::header::CONTENT_ENCODING) {
        let enc = enc.to_str().unwrap_or("?").trim();
        if !enc.eq_ignore_ascii_case("identity") {
            // kvbust does not decompress: a compressed body cannot be marked.
            return unparseable_because(
                format!("the body is compressed (content-encoding: {enc}); send it uncompressed"),
                rt,
            );
        }
    }
    let known = layout
        .as_ref()
        .and_then(|l| Parsed::from_layout(shape, body, l));
    let parsed = match known {
        Some(p) => p,
        None => match parse_laid_out(shape, body) {
            Ok((p, l)) => {
                *layout = l;
                p
            }
            Err(e) => return unparseable(e, rt),
        },
    };
    if d.method == Method::Salt {
        let head = salt_of(d, (headers, rt, session), &parsed)?;
        drop(parsed);
        return salted(body, head, layout, rt.config.limits.max_body.as_u64());
    }
    let Some((rid, marker)) = marker_of(d, (headers, rt, session), &parsed)? else {
        return Ok(Rewritten {
            body: None,
            rid: None,
        });
    };
    let plan = plan(d, cfg, &marker);
    let max_body = rt.config.limits.max_body.as_u64();
    let admit = |len: usize| {
        if len as u64 > max_body {
            return Err(ProxyError::BodyTooLarge { limit: max_body });
        }
        match buffered {
            Some(r) => super::exchange::reserve(r, (body.len() as u64).saturating_add(len as u64)),
            None => Ok(()),
        }
    };
    let outcome = match parsed.apply_admitting(&plan, layout.as_mut(), admit) {
        Ok(Ok(o)) => o,
        Ok(Err(refused)) => return Err(refused),
        // A list too long to mark is refused whatever `on_unparseable` says: forwarding it
        // unmarked would fake a cache-bust, and the body is not unparseable.
        Err(RewriteError::TooManyPrompts { limit }) => {
            return Err(ProxyError::bad_request(
                "too_many_prompts",
                RewriteError::TooManyPrompts { limit }.to_string(),
            ))
        }
        Err(e) => return unparseable(e, rt),
    };
    count_marker(d, outcome.location, rt);
    Ok(Rewritten {
        body: outcome.body.map(Bytes::from),
        rid,
    })
}

/// A marker's edits of a chat body, planned but not made, and its RID.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    pub edits: Vec<Edit>,
    pub rid: Option<String>,
    /// Under `method = salt`: the salt's head (`kvbust-…`), for the body's end; `edits` is then
    /// empty (the prompt is not touched).
    pub salt: Option<String>,
}

/// The edits [`apply_laid_out`] would splice into `body` (for marking as a body flows: the
/// first messages read so far, as a body of their own), with the same session, errors and
/// metrics; none when the body is to go as it came (already marked, nowhere to mark, or
/// unparseable under `on_unparseable = "passthrough"`).
pub(crate) fn plan_marks(
    d: &Decision,
    shape: Shape,
    body: &[u8],
    headers: &HeaderMap,
    rt: &SharedState,
) -> Result<Marks, ProxyError> {
    let passthrough = |r: Result<Rewritten, ProxyError>| r.map(|_| Marks::default());
    let parsed = match parse_laid_out(shape, body) {
        Ok((p, _)) => p,
        Err(e) => return passthrough(unparseable(e, rt)),
    };
    if d.method == Method::Salt {
        let (rid, salt) = salt_of(d, (headers, rt, None), &parsed)?.unzip();
        return Ok(Marks {
            edits: Vec::new(),
            rid: rid.flatten(),
            salt,
        });
    }
    let Some((rid, marker)) = marker_of(d, (headers, rt, None), &parsed)? else {
        return Ok(Marks::default());
    };
    let (edits, location) = match parsed.plan_edits(&plan(d, &rt.config.cache_bust, &marker)) {
        Ok(planned) => planned,
        Err(RewriteError::TooManyPrompts { limit }) => {
            return Err(ProxyError::bad_request(
                "too_many_prompts",
                RewriteError::TooManyPrompts { limit }.to_string(),
            ))
        }
        Err(e) => return passthrough(unparseable(e, rt)),
    };
    count_marker(d, location, rt);
    Ok(Marks {
        edits,
        rid,
        salt: None,
    })
}

/// The session's RID (none for warm-up isolation) and the salt's head it gives
/// ([`salt::salt_for`]); `None` when the request is not isolated.
fn salt_of(
    d: &Decision,
    (headers, rt, session): (&HeaderMap, &SharedState, Option<&str>),
    parsed: &Parsed<'_>,
) -> Result<Option<(Option<String>, String)>, ProxyError> {
    let inputs = digest_inputs(d, headers, rt, session, parsed)?;
    let rid = inputs.as_ref().map(digest);
    let head = salt::salt_for(d.target, d.phase, rid.as_deref(), d.benchmark_id(rt));
    Ok(head.map(|h| (rid, h)))
}

/// A collected body with the salt `head` (from [`salt_of`]) as its `cache_salt`, read through
/// `layout` (moved over the edit); a body past `max_body` is a 413, a salt past vLLM's limits
/// a 400 naming the limit.
fn salted(
    body: &Bytes,
    head: Option<(Option<String>, String)>,
    layout: &mut Option<Layout>,
    max_body: u64,
) -> Result<Rewritten, ProxyError> {
    let Some((rid, head)) = head else {
        return Ok(Rewritten {
            body: None,
            rid: None,
        });
    };
    if layout.is_none() {
        *layout = crate::json::top_object(body)
            .ok()
            .and_then(|top| Layout::of(body, &top));
    }
    let Some(l) = layout.as_mut() else {
        return Err(ProxyError::Internal(
            "a parsed body has no layout for its cache_salt".into(),
        ));
    };
    let (range, bytes, _) =
        salt::edit(body, l.get("cache_salt"), l.close(), l.members(), &head).map_err(salt_error)?;
    let edits = [(range, bytes)];
    if (body.len() + edits[0].1.len()) as u64 > max_body {
        return Err(ProxyError::BodyTooLarge { limit: max_body });
    }
    let out = crate::json::splice(body, &mut edits.clone())
        .ok_or_else(|| ProxyError::Internal("the cache_salt edit does not fit the body".into()))?;
    if edits[0].0.is_empty() {
        l.member_added();
    }
    l.shift(&edits);
    Ok(Rewritten {
        body: Some(Bytes::from(out)),
        rid,
    })
}

/// A salt the body cannot carry: the client's 400.
pub(crate) fn salt_error(e: salt::SaltError) -> ProxyError {
    ProxyError::bad_request(e.code(), e.to_string())
}

/// The session's RID (none for warm-up isolation) and the marker it gives; `None` when no
/// marker applies.
fn marker_of(
    d: &Decision,
    (headers, rt, session): (&HeaderMap, &SharedState, Option<&str>),
    parsed: &Parsed<'_>,
) -> Result<Option<(Option<String>, String)>, ProxyError> {
    let inputs = digest_inputs(d, headers, rt, session, parsed)?;
    // The digest once: it is both the RID reported and the one in the marker. Warm-up
    // isolation markers carry none (`inputs` is `None` for them).
    let rid = inputs.as_ref().map(digest);
    Ok(marker_for_digest(d.target, d.phase, rid.as_deref()).map(|m| (rid, m)))
}

fn plan<'m>(d: &Decision, cfg: &crate::config::CacheBustConfig, marker: &'m str) -> Plan<'m> {
    Plan {
        target: d.target,
        marker,
        user_context_messages: d.user_context_messages,
        list_parts: match cfg.list_parts {
            ListPartsMode::OwnPart => ListParts::OwnPart,
            ListPartsMode::InlineText => ListParts::InlineText,
        },
        // Only kvbust's own synthesis knows where a merged system prompt ends.
        system_prompt_bytes: None,
        max_prompts: cfg.max_marked_prompts,
    }
}

fn count_marker(
    d: &Decision,
    location: Option<crate::cachebust::inject::Location>,
    rt: &SharedState,
) {
    if let Some(loc) = location {
        rt.metrics
            .markers
            .with_label_values(&[d.target.as_str(), d.phase.as_str(), loc.as_str()])
            .inc();
    }
}

/// What the session's RID digest is made of: the request's explicit digest headers, or its
/// session (known already for synthetic requests, else from `cache_bust.session_sources`, else
/// a random one) and that session's counter. `None` for warm-up isolation, which has no RID.
fn digest_inputs(
    d: &Decision,
    headers: &HeaderMap,
    rt: &SharedState,
    session: Option<&str>,
    parsed: &Parsed<'_>,
) -> Result<Option<DigestInputs>, ProxyError> {
    let cfg = &rt.config.cache_bust;
    Ok(if d.target.is_warmup_isolation() {
        None
    } else {
        Some(match &d.explicit {
            Some(i) => i.clone(),
            None => {
                let key = match session {
                    Some(s) => s.to_string(),
                    // No identity at all: a random key, so each such request gets its own marker.
                    None => session_key(
                        &cfg.session_sources,
                        headers,
                        &rt.config.headers,
                        rt.config.limits.control_header_len(),
                        parsed,
                        d.user_context_messages,
                    )?
                    .unwrap_or_else(|| {
                        format!("anonymous-{}", crate::cachebust::random_benchmark_id())
                    }),
                };
                let c = rt.resolve_session(&key) as i64;
                DigestInputs {
                    benchmark_id: rt.benchmark_id.clone(),
                    recycle_pass: c,
                    trajectory_index: c,
                    trace_id: key,
                }
            }
        })
    })
}

fn unparseable(e: RewriteError, rt: &SharedState) -> Result<Rewritten, ProxyError> {
    if !e.is_client_error() {
        return Err(ProxyError::Internal(format!("cache-bust engine: {e}")));
    }
    unparseable_because(e.to_string(), rt)
}

fn unparseable_because(e: String, rt: &SharedState) -> Result<Rewritten, ProxyError> {
    match rt.config.cache_bust.on_unparseable {
        OnUnparseable::Reject => Err(ProxyError::bad_request(
            "invalid_body",
            format!("cannot apply the cache-bust marker: {e} (set cache_bust.on_unparseable = \"passthrough\" to forward such bodies unchanged)"),
        )),
        OnUnparseable::Passthrough => {
            tracing::info!("forwarding an unparseable body unchanged: {e}");
            rt.metrics.unparseable_passthrough.inc();
            Ok(Rewritten { body: None, rid: None })
        }
    }
}

/// A header source's session key; `None` for body sources and absent or blank headers.
fn header_source(
    source: SessionSource,
    headers: &HeaderMap,
    names: &HeaderNames,
    limit: usize,
) -> Result<Option<String>, ProxyError> {
    let name = match source {
        SessionSource::XCorrelationId => &names.correlation_id,
        SessionSource::XSessionId => &names.session_id,
        SessionSource::BodyUser | SessionSource::FirstUserTurn => return Ok(None),
    };
    Ok(non_empty(header(headers, name, limit)?))
}

/// The session key from the header sources alone (for synthetic requests, whose body is not
/// the client's own).
pub fn header_session_key(
    sources: &[SessionSource],
    headers: &HeaderMap,
    names: &HeaderNames,
    limit: usize,
) -> Result<Option<String>, ProxyError> {
    for s in sources {
        if let Some(key) = header_source(*s, headers, names, limit)? {
            return Ok(Some(key));
        }
    }
    Ok(None)
}

/// How far into a body its session key lies, by the first configured source that could yield
/// it (for marking as a body flows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionReach {
    /// Nowhere in the body: a header names the session, or no source can (a random key).
    Headers,
    /// The first user turn; `then_user`: when there is none, the body's `user` is next.
    FirstUserTurn { then_user: bool },
    /// The top-level `user` member, which may come anywhere up to the body's end.
    WholeBody,
}

/// Where `sources` find the request's session key, reading the headers; `None` when a header
/// is not a usable value (the marking step words that 400).
pub(crate) fn session_reach(
    sources: &[SessionSource],
    headers: &HeaderMap,
    names: &HeaderNames,
    limit: usize,
) -> Option<SessionReach> {
    for (i, s) in sources.iter().enumerate() {
        match s {
            SessionSource::BodyUser => return Some(SessionReach::WholeBody),
            SessionSource::FirstUserTurn => {
                let then_user = sources[i..].contains(&SessionSource::BodyUser);
                return Some(SessionReach::FirstUserTurn { then_user });
            }
            header => {
                if header_source(*header, headers, names, limit)
                    .ok()?
                    .is_some()
                {
                    return Some(SessionReach::Headers);
                }
            }
        }
    }
    Some(SessionReach::Headers)
}

/// Each configured session source with its header's digest (body sources: `None`), for the
/// cache model, which reads the body sources itself off the request path. A header that is not
/// a usable value counts as absent here: the marking step already refused it when it mattered.
pub fn session_hint(
    sources: &[SessionSource],
    headers: &HeaderMap,
    names: &HeaderNames,
    limit: usize,
) -> Vec<(SessionSource, Option<u64>)> {
    sources
        .iter()
        .map(|s| {
            let key = header_source(*s, headers, names, limit).ok().flatten();
            (*s, key.as_deref().map(crate::cache_model::session_digest))
        })
        .collect()
}

/// The first configured source that yields a session key.
fn session_key(
    sources: &[SessionSource],
    headers: &HeaderMap,
    names: &HeaderNames,
    limit: usize,
    parsed: &crate::cachebust::Parsed<'_>,
    user_context: usize,
) -> Result<Option<String>, ProxyError> {
    for s in sources {
        let key = match s {
            SessionSource::BodyUser => non_empty(parsed.user_field()),
            SessionSource::FirstUserTurn => parsed.first_user_turn_hash(user_context),
            header => header_source(*header, headers, names, limit)?,
        };
        if key.is_some() {
            return Ok(key);
        }
    }
    Ok(None)
}

fn non_empty(v: Option<&str>) -> Option<String> {
    v.map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn edit_distance_counts_single_byte_edits() {
        assert_eq!(edit_distance("x-kvbust-phas", "x-kvbust-phase"), 1);
        assert_eq!(edit_distance("x-kvbust-trgt", "x-kvbust-target"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn an_unknown_kvbust_header_names_the_nearest_valid_one() {
        let names = HeaderNames::default();
        let err = reject_unknown(&headers(&[("x-kvbust-phas", "warmup")]), &names).unwrap_err();
        assert_eq!(err.code(), "unknown_header");
        assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
        let msg = err.to_string();
        assert!(
            msg.contains("x-kvbust-phas: did you mean x-kvbust-phase?"),
            "{msg}"
        );
        assert!(msg.contains("headers.reject_unknown"), "{msg}");
        let err = reject_unknown(&headers(&[("x-kvbust-tracid", "a")]), &names).unwrap_err();
        assert!(err.to_string().contains("did you mean x-kvbust-trace-id?"));
        // Known headers, other headers and the switched-off check pass.
        let ok = headers(&[
            ("x-kvbust-phase", "warmup"),
            ("x-kvbust-synth", "1"),
            ("x-correlation-id", "s"),
        ]);
        assert!(reject_unknown(&ok, &names).is_ok());
        let off = HeaderNames {
            reject_unknown: false,
            ..HeaderNames::default()
        };
        assert!(reject_unknown(&headers(&[("x-kvbust-phas", "w")]), &off).is_ok());
    }
}
