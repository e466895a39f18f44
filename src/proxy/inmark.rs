//! Marking a chat body as it flows (`cache_bust.mark_in_flight`): decides from the headers
//! whether a request's marker can be placed before its body has ended, then, as chunks come,
//! when enough of `messages` has been read for the marker's place to be final: the first user
//! turn the rule (and, with `first_user_turn`, the session) depends on. It then asks the
//! cache-bust engine to mark those first messages, read as a body of their own, and hands
//! `inflow` the edits in the body's own offsets. Never sends, never reads a message past the
//! one it needs, and never guesses: whatever it cannot settle it leaves to the steps at the
//! body's end, which mark the whole body as a collected one is marked.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use crate::api::Shape;
use crate::cachebust::inject::is_user_message;
use crate::error::ProxyError;
use crate::json::stream::TopFacts;
use crate::json::Json;
use crate::runtime::SharedState;

use super::rewrite::{self, Decision, SessionReach};

/// An edit of the body as received: the range replaced and what replaces it.
pub(super) type Edit = (Range<usize>, Bytes);

/// What the marking knows so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stage {
    /// Reading `messages` up to the turn the marker's place depends on; nothing from the
    /// array's first element on may go.
    Reading,
    /// The marker's edits are made (possibly none: already marked, or nowhere to mark); the
    /// rest of the body flows.
    Placed,
    /// Not settled as the body flowed: the steps at the end mark the whole body; nothing from
    /// the array's first element on went.
    Collect,
}

/// The marking of one flowing request.
pub(super) struct InMark {
    decision: Decision,
    headers: HeaderMap,
    rt: Arc<SharedState>,
    /// User turns to pass before the one the rule marks (`user_context_messages`).
    skip: usize,
    /// With no user turn at all, the session would come from the body's `user`: collect.
    then_user: bool,
    /// The body came whole: its last top-level `user` member goes with the first messages.
    whole: bool,
    /// Elements of `messages` whose role was read, and the user turns among them.
    read: usize,
    users: usize,
    stage: Stage,
    /// The RID the marker carries, once placed.
    pub rid: Option<String>,
    /// Under `method = salt`, once placed: the salt's head, which goes into the body's
    /// `cache_salt` at its end (the prompt is not touched).
    pub salt: Option<String>,
}

impl InMark {
    /// The marking for a request whose body is about to flow, when its marker can be placed
    /// before the body ends: a chat body (`shape`), uncompressed, whose session key (when the
    /// marker carries one) comes from a header, explicit digest headers, or the first user
    /// turn; or, for a body that came `whole`, any session source (its `user` member, wherever
    /// it is, is then read from the scan). `None`: the body is collected and marked whole, as
    /// without this.
    pub(super) fn for_request(
        decision: &Decision,
        shape: Shape,
        headers: &HeaderMap,
        rt: &Arc<SharedState>,
        whole: bool,
    ) -> Option<InMark> {
        let cfg = &rt.config;
        if !cfg.cache_bust.mark_in_flight || shape != Shape::Chat || !decision.needs_body() {
            return None;
        }
        if let Some(enc) = headers.get(http::header::CONTENT_ENCODING) {
            // A compressed body is the marking step's to refuse or pass, on the whole body.
            if !enc.as_bytes().eq_ignore_ascii_case(b"identity") {
                return None;
            }
        }
        let reach = if decision.target.is_warmup_isolation() || decision.explicit.is_some() {
            SessionReach::Headers
        } else {
            rewrite::session_reach(
                &cfg.cache_bust.session_sources,
                headers,
                &cfg.headers,
                cfg.limits.control_header_len(),
            )?
        };
        let then_user = match reach {
            SessionReach::Headers => false,
            _ if whole => false,
            SessionReach::FirstUserTurn { then_user } => then_user,
            SessionReach::WholeBody => return None,
        };
        Some(InMark {
            decision: decision.clone(),
            headers: headers.clone(),
            rt: rt.clone(),
            skip: decision.user_context_messages,
            then_user,
            whole,
            read: 0,
            users: 0,
            stage: Stage::Reading,
            rid: None,
            salt: None,
        })
    }

    pub(super) fn stage(&self) -> &Stage {
        &self.stage
    }

    /// How far the body may go while the marker's place is not settled: up to the first
    /// element of `messages` (its `[` is never edited). `None`: no limit of the marking's.
    pub(super) fn hold(&self, facts: &TopFacts) -> Option<usize> {
        match self.stage {
            Stage::Placed => None,
            Stage::Reading | Stage::Collect => facts.messages.as_ref().map(|m| m.open + 1),
        }
    }

    /// After each chunk: reads the roles of the elements of `messages` read whole since the
    /// last call and, once the turn the rule needs is among them (or the array has closed),
    /// plans the marker. `Some`: the edits to make, in the body's offsets, sorted.
    pub(super) fn after_chunk(
        &mut self,
        facts: &TopFacts,
        chunks: &[Bytes],
    ) -> Result<Option<Vec<Edit>>, ProxyError> {
        if self.stage != Stage::Reading {
            return Ok(None);
        }
        if facts.doubtful {
            self.stage = Stage::Collect;
            return Ok(None);
        }
        let Some(m) = facts.messages.as_ref() else {
            return Ok(None);
        };
        if m.odd || facts.messages_members > 1 {
            self.stage = Stage::Collect;
            return Ok(None);
        }
        let mut upto = None;
        while self.read < m.items.len() {
            let item = m.items[self.read].clone();
            let bytes = gather(chunks, item);
            let read = Json::at(&bytes, 0..bytes.len()).map(|raw| is_user_message(self.read, raw));
            self.read += 1;
            match read {
                Some(Ok(false)) => continue,
                Some(Ok(true)) => self.users += 1,
                // An element the rule's read fails on ends the read: the engine words the
                // error, on these messages, as it would on the whole body.
                Some(Err(_)) | None => {
                    upto = Some(self.read);
                    break;
                }
            }
            if self.users > self.skip {
                upto = Some(self.read);
                break;
            }
        }
        if upto.is_none() && m.close.is_some() {
            if self.then_user && self.users <= self.skip {
                // No user turn: the session comes from the body's `user`, wherever it is.
                self.stage = Stage::Collect;
                return Ok(None);
            }
            upto = Some(m.items.len());
        }
        let Some(upto) = upto else {
            return Ok(None);
        };
        self.place(facts, chunks, &m.items[..upto]).map(Some)
    }

    /// The body ended: a marking still reading is left to the steps at the end.
    pub(super) fn at_end(&mut self) {
        if self.stage == Stage::Reading {
            self.stage = Stage::Collect;
        }
    }

    /// Marks the messages `items` (the first ones of the array, not empty unless the array is)
    /// as a body of their own, and moves the edits onto the body's offsets.
    fn place(
        &mut self,
        facts: &TopFacts,
        chunks: &[Bytes],
        items: &[Range<usize>],
    ) -> Result<Vec<Edit>, ProxyError> {
        let Some(m) = facts.messages.as_ref() else {
            return Ok(Vec::new());
        };
        // The array's content from its first element to the last one read, as it came.
        let (from, to) = match (items.first(), items.last()) {
            (Some(f), Some(l)) => (f.start, l.end),
            _ => (m.open + 1, m.open + 1),
        };
        if facts.placeholder.is_some_and(|p| p < to) {
            // A placeholder is expanded before a body is marked: the end's steps do both.
            self.stage = Stage::Collect;
            return Ok(Vec::new());
        }
        const HEAD: &[u8] = b"{\"messages\":[";
        let inner_len = to - from;
        // A whole body's session may be its `user`: that member goes too, as it came.
        let user = facts.user.clone().filter(|_| self.whole);
        let user = user.map(|r| gather(chunks, r));
        let tail = user.as_ref().map_or(0, |u| u.len() + 10);
        let mut own = Vec::with_capacity(HEAD.len() + inner_len + tail + 2);
        own.extend_from_slice(HEAD);
        // Straight from the chunks: an agent's first turn is hundreds of KB, and gathering it
        // first was a second copy of it on every request.
        gather_into(&mut own, chunks, from..to);
        own.push(b']');
        if let Some(u) = &user {
            own.extend_from_slice(b",\"user\":");
            own.extend_from_slice(u);
        }
        own.push(b'}');
        let marks =
            rewrite::plan_marks(&self.decision, Shape::Chat, &own, &self.headers, &self.rt)?;
        let mut edits = Vec::with_capacity(marks.edits.len());
        for (range, bytes) in marks.edits {
            let inside = HEAD.len()..HEAD.len() + inner_len;
            if range.start < inside.start || range.end > inside.end {
                return Err(ProxyError::Internal(
                    "a marker planned outside the messages it was planned on".into(),
                ));
            }
            let at = range.start - HEAD.len() + from..range.end - HEAD.len() + from;
            edits.push((at, Bytes::from(bytes)));
        }
        edits.sort_by_key(|e| e.0.start);
        self.rid = marks.rid;
        self.salt = marks.salt;
        self.stage = Stage::Placed;
        Ok(edits)
    }

    /// At the body's end, for a placed marker: the marked `messages` must be the one the
    /// upstream reads, the last member of that name, its key compared decoded (an engine reads
    /// `messag\u0065s` as `messages`). A second one is refused (400), since bytes marked in the
    /// first have gone; an escaped key the scan could not name is looked up in a parse of the
    /// whole body (`whole`), and a body that parse refuses is refused too: which `messages` the
    /// upstream would read is then not known, and the marker is already in.
    pub(super) fn check_end(
        &self,
        facts: &TopFacts,
        whole: impl FnOnce() -> Bytes,
    ) -> Result<(), ProxyError> {
        if self.stage != Stage::Placed {
            return Ok(());
        }
        let mut overridden = facts.messages_members > 1;
        if !overridden && facts.doubtful {
            let whole = whole();
            let first = facts.messages.as_ref().map(|m| m.open);
            let top = crate::json::top_object(&whole).map_err(|e| {
                ProxyError::bad_request(
                    "invalid_body",
                    format!(
                        "the body is not valid JSON past the messages kvbust marked as it \
                         flowed ({e}); send valid JSON (or set cache_bust.mark_in_flight = \
                         false to have bodies read whole first)"
                    ),
                )
            })?;
            // Keys come decoded from the parse.
            let last = top
                .object
                .members()
                .filter(|(k, _)| *k == "messages")
                .last();
            overridden = last
                .and_then(|(_, v)| crate::json::span(&whole, v))
                .is_some_and(|r| Some(r.start) != first);
        }
        if overridden {
            return Err(ProxyError::bad_request(
                "duplicate_messages",
                "the body has a second top-level `messages` member: kvbust marked the first as \
                 it flowed and the upstream would read the last; send one `messages` (or set \
                 cache_bust.mark_in_flight = false to have such bodies read whole first)",
            ));
        }
        Ok(())
    }
}

/// The bytes `range` of the body received as `chunks`: borrowed when one chunk holds them.
/// Appends the bytes `range` of the body received as `chunks` to `out`.
fn gather_into(out: &mut Vec<u8>, chunks: &[Bytes], range: Range<usize>) {
    let mut start = 0;
    for chunk in chunks {
        let end = start + chunk.len();
        if end > range.start && start < range.end {
            let from = range.start.max(start) - start;
            let to = range.end.min(end) - start;
            out.extend_from_slice(&chunk[from..to]);
        }
        start = end;
        if start >= range.end {
            break;
        }
    }
}

pub(super) fn gather(chunks: &[Bytes], range: Range<usize>) -> Cow<'_, [u8]> {
    // Within one chunk (a small body's usual case): borrowed, not copied.
    let mut start = 0;
    for chunk in chunks {
        let end = start + chunk.len();
        if start <= range.start && range.end <= end {
            return Cow::Borrowed(&chunk[range.start - start..range.end - start]);
        }
        if end > range.start {
            break;
        }
        start = end;
    }
    let mut out = Vec::with_capacity(range.len());
    gather_into(&mut out, chunks, range);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cachebust::{Phase, Target};
    use crate::json::stream::TopScan;
    use crate::metrics::Metrics;

    /// A range of the body, gathered (borrowed or copied) or appended, is those bytes of the
    /// body, however the body came in chunks.
    #[test]
    fn gathered_ranges_are_the_bodys_bytes() {
        let body: Vec<u8> = (0..40u8).collect();
        let cuts: [&[usize]; 4] = [&[], &[1], &[7, 8, 20], &[1, 2, 3, 39]];
        for cut in cuts {
            let mut chunks = Vec::new();
            let mut at = 0;
            for &c in cut.iter().chain([&body.len()]) {
                chunks.push(Bytes::copy_from_slice(&body[at..c]));
                at = c;
            }
            for a in 0..=body.len() {
                for b in a..=body.len() {
                    assert_eq!(&*gather(&chunks, a..b), &body[a..b], "{cut:?} {a}..{b}");
                    let mut out = b"head".to_vec();
                    gather_into(&mut out, &chunks, a..b);
                    assert_eq!(&out[4..], &body[a..b], "{cut:?} {a}..{b}");
                }
            }
        }
    }

    fn rt() -> Arc<SharedState> {
        let mut c = crate::config::Config::default();
        c.cache_bust.benchmark_id = Some("0123456789ab".into());
        SharedState::new(Arc::new(c), Metrics::new())
    }

    fn decision() -> Decision {
        Decision {
            phase: Phase::Profiling,
            target: Target::FirstTurnPrefix,
            explicit: None,
            user_context_messages: 0,
            method: crate::cachebust::Method::Marker,
            hit_ratio: None,
        }
    }

    /// What a body that came whole gets, as `Proxy::mark_whole` reads it: the stage, the
    /// edits and the RID.
    fn whole(rt: &Arc<SharedState>, body: &str) -> (Stage, Vec<Edit>, Option<String>) {
        let mut m = InMark::for_request(&decision(), Shape::Chat, &HeaderMap::new(), rt, true)
            .expect("a whole chat body is read apart");
        let mut scan = TopScan::reading_messages();
        scan.feed(body.as_bytes());
        let facts = scan.finish().clone();
        let data = Bytes::from(body.to_string());
        let edits = m
            .after_chunk(&facts, std::slice::from_ref(&data))
            .expect("no error")
            .unwrap_or_default();
        m.at_end();
        (m.stage().clone(), edits, m.rid.clone())
    }

    #[test]
    fn a_whole_body_is_read_to_its_first_user_turn_and_its_user_member_and_no_further() {
        // A bad literal after `messages` and `user`: never read.
        let bad = r#"{"messages":[{"role":"user","content":"task"},{"role":"assistant","content":"x"}],"user":"dave","temperature":tru}"#;
        let (stage, edits, rid) = whole(&rt(), bad);
        assert_eq!(stage, Stage::Placed);
        // A whole-body parse of the valid body, on a ledger as fresh, finds the same session
        // (`user` "dave", after `messages`) and the same edit.
        let good = bad.replace("tru}", "true}");
        let none = HeaderMap::new();
        let want = rewrite::plan_marks(&decision(), Shape::Chat, good.as_bytes(), &none, &rt())
            .expect("marks");
        assert_eq!(rid, want.rid);
        let got: Vec<_> = edits.iter().map(|(r, b)| (r.clone(), b.to_vec())).collect();
        assert_eq!(got, want.edits);
        // Without the `user` member the session is the first user turn's: another RID, so the
        // member was read.
        let anon = good.replace(r#","user":"dave""#, "");
        let other = rewrite::plan_marks(&decision(), Shape::Chat, anon.as_bytes(), &none, &rt())
            .expect("marks");
        assert_ne!(rid, other.rid);
        // Still arriving, the `user` member could come after the marker has gone: collected.
        assert!(InMark::for_request(&decision(), Shape::Chat, &none, &rt(), false).is_none());
    }
}
