//! The agentic replay's wire: which dataset conversation and turn a synthetic request gets (a
//! new session: the next ROOT conversation, round-robin; a named conversation: that one) and the
//! response header values that let a client follow the dataset's topology (conversation and
//! turn served, the branches that turn spawns, what the next turn waits for and when).
//! Pure functions over the dataset model: owns no state, takes no lock, never reads a body or
//! touches the network.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::synth::Conversation;

/// Where a session stands: (conversation index, index of the turn it gets next).
pub type Cursor = (usize, usize);

/// The turn a request gets, from the session's cursor (`bound`), the conversation the request
/// names (`named`, an index) and each conversation's turn count. `None`: start the next root
/// conversation. A named conversation continues where the session stands in it, or starts over
/// at its first turn (a session bound elsewhere, or one that finished it); without a name a
/// session continues its conversation until the last turn, then gets a new one.
pub fn choose(
    bound: Option<Cursor>,
    named: Option<usize>,
    turns: impl Fn(usize) -> usize,
) -> Option<Cursor> {
    match (bound, named) {
        (Some((ci, k)), Some(n)) if ci == n && k < turns(ci) => Some((ci, k)),
        (_, Some(n)) => Some((n, 0)),
        (Some((ci, k)), None) if k < turns(ci) => Some((ci, k)),
        (_, None) => None,
    }
}

/// The next root conversation in round-robin order (`next` counts the roots handed out);
/// `None` when there is none.
pub fn next_root(roots: &[usize], next: &mut usize) -> Option<usize> {
    if roots.is_empty() {
        return None;
    }
    let ci = roots[*next % roots.len()];
    *next = next.wrapping_add(1);
    Some(ci)
}

/// Whether a new session may start `conv`: a conversation outside any agent tree, or the root of
/// one (a child is only ever served to a client that names it).
pub fn is_root(conv: &Conversation) -> bool {
    conv.agentic.as_ref().is_none_or(|t| t.is_root)
}

/// Bytes an id is percent-encoded for in a header value: `%` itself, the separators the
/// headers use (`,` `;` `=` and space), `"`, and what is not visible ASCII.
fn must_escape(b: u8) -> bool {
    !(0x21..=0x7e).contains(&b) || matches!(b, b'%' | b',' | b';' | b'=' | b'"')
}

/// `id` as the response headers spell it: percent-encoded ([`must_escape`]), so it is a valid
/// header value and never contains a separator. Most ids come back unchanged.
pub fn encode_id(id: &str) -> Cow<'_, str> {
    if !id.bytes().any(must_escape) {
        return Cow::Borrowed(id);
    }
    let mut out = String::with_capacity(id.len() + 8);
    for b in id.bytes() {
        if must_escape(b) {
            let _ = write!(out, "%{b:02X}");
        } else {
            out.push(char::from(b));
        }
    }
    Cow::Owned(out)
}

/// The id a request header names: surrounding whitespace trimmed, `%XX` decoded (ids as the
/// response headers spell them; raw ones without `%` are themselves). `None` when a `%` is not
/// followed by two hex digits or the result is not UTF-8.
pub fn decode_id(value: &[u8]) -> Option<String> {
    let value = value.trim_ascii();
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        if value[i] == b'%' {
            let hex = value.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(value[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A millisecond value as the headers write it: whole numbers without a fraction (`3363`),
/// others in Rust's shortest round-tripping form (`16242.999999999998`).
pub fn millis(ms: f64) -> String {
    if ms.is_finite() && ms.fract() == 0.0 && ms.abs() < 1e15 {
        format!("{}", ms as i64)
    } else {
        format!("{ms}")
    }
}

/// What a synthesized response tells the client about the turn it served (header values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The conversation id, percent-encoded.
    pub conversation: String,
    pub turn: usize,
    /// The branches the turn starts after it completes (`branch=child,… start_ms=T
    /// offsets_ms=o,… [background]`, `; `-separated; child i starts `o_i` ms after the turn
    /// completes); `None` when it starts none.
    pub spawn: Option<String>,
    /// The conversation's next turn; `None` after the last.
    pub next: Option<Next>,
}

/// What the conversation's next turn needs before it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    pub turn: usize,
    /// Milliseconds to wait after the served turn's response completes (the trace's end-to-start
    /// `delay`; `0` when it has none, and for a turn that joins branches, which goes out when
    /// they complete).
    pub delay_ms: String,
    /// Branch ids (percent-encoded, comma-separated) whose children must all complete first;
    /// `None` when it waits for none.
    pub after: Option<String>,
}

impl Served {
    /// The next-turn header value: the index, or `none`.
    pub fn next_turn(&self) -> String {
        self.next
            .as_ref()
            .map_or_else(|| "none".to_owned(), |n| n.turn.to_string())
    }
}

/// A child's dispatch offset (AIPerf's `_child_dispatch_offset_ms`): its first turn's timestamp
/// minus the branch start, never negative; 0 when the child has no timestamp.
fn dispatch_offset(branch_start_ms: f64, child_first_ms: Option<f64>) -> f64 {
    child_first_ms.map_or(0.0, |t| (t - branch_start_ms).max(0.0))
}

/// The header values for turn `k` of `conv` (any conversation: outside an agent tree there are
/// no branches and no prerequisites). `first_ms` gives a child conversation's first-turn
/// timestamp (ms) by id, for the children's dispatch offsets.
pub fn served(conv: &Conversation, k: usize, first_ms: &dyn Fn(&str) -> Option<f64>) -> Served {
    let branches = conv
        .agentic
        .as_ref()
        .map(|t| &t.branches[..])
        .unwrap_or(&[]);
    let turn = conv.turns.get(k);
    let spawn: Vec<String> = turn
        .and_then(|t| t.agentic.as_ref())
        .map(|i| &i.branch_ids[..])
        .unwrap_or(&[])
        .iter()
        .map(|id| {
            let branch = branches.iter().find(|b| &b.branch_id == id);
            let children: Vec<Cow<'_, str>> = branch
                .map(|b| {
                    b.child_conversation_ids
                        .iter()
                        .map(|c| encode_id(c))
                        .collect()
                })
                .unwrap_or_default();
            let mut entry = format!("{}={}", encode_id(id), children.join(","));
            if let Some(b) = branch {
                let _ = write!(entry, " start_ms={}", millis(b.start_timestamp_ms));
                let offsets: Vec<String> = b
                    .child_conversation_ids
                    .iter()
                    .map(|c| millis(dispatch_offset(b.start_timestamp_ms, first_ms(c))))
                    .collect();
                if !offsets.is_empty() {
                    let _ = write!(entry, " offsets_ms={}", offsets.join(","));
                }
                if b.is_background {
                    entry.push_str(" background");
                }
            }
            entry
        })
        .collect();
    let next = conv.turns.get(k + 1).map(|t| {
        let after: Vec<Cow<'_, str>> = t
            .agentic
            .as_ref()
            .map(|i| i.prerequisites.iter().map(|b| encode_id(b)).collect())
            .unwrap_or_default();
        // A joining turn goes out as soon as its branches complete: AIPerf fires such joins
        // without their recorded delay (`_resolve_think_ms`).
        let delay = match after.is_empty() {
            true => t.delay.as_ref().and_then(|d| d.as_f64()).unwrap_or(0.0),
            false => 0.0,
        };
        Next {
            turn: k + 1,
            delay_ms: millis(delay),
            after: (!after.is_empty()).then(|| after.join(",")),
        }
    });
    Served {
        conversation: encode_id(&conv.session_id).into_owned(),
        turn: k,
        spawn: (!spawn.is_empty()).then(|| spawn.join("; ")),
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::dataset::trace::agentic::{Branch, Topology, TurnInfo};
    use crate::synth::Turn;

    fn info(branch_ids: &[&str], prerequisites: &[&str]) -> Option<Box<TurnInfo>> {
        Some(Box::new(TurnInfo {
            messages: Vec::new(),
            reset_context: false,
            model: None,
            input_kind: None,
            branch_ids: branch_ids.iter().map(|s| s.to_string()).collect(),
            prerequisites: prerequisites.iter().map(|s| s.to_string()).collect(),
        }))
    }

    fn turn(delay: Option<f64>, agentic: Option<Box<TurnInfo>>) -> Turn {
        Turn {
            delay: delay.and_then(serde_json::Number::from_f64),
            agentic,
            ..Turn::default()
        }
    }

    fn root() -> Conversation {
        let branch = |id: &str, children: &[&str], bg: bool, at: f64| Branch {
            branch_id: id.into(),
            child_conversation_ids: children.iter().map(|s| s.to_string()).collect(),
            is_background: bg,
            start_timestamp_ms: at,
        };
        Conversation {
            session_id: "t:root".into(),
            system_message: None,
            user_context_message: None,
            turns: vec![
                turn(None, info(&["t:b0", "t;b1"], &[])),
                turn(Some(12243.0), info(&[], &["t:b0"])),
                turn(Some(6110.000000000002), info(&[], &[])),
            ],
            agentic: Some(Box::new(Topology {
                branches: vec![
                    branch("t:b0", &["t::fa:000", "t::fa 1"], false, 3363.0),
                    branch("t;b1", &["t::aux:002"], true, 16242.999999999998),
                ],
                ..Topology::root()
            })),
        }
    }

    #[test]
    fn a_turn_tells_its_branches_and_what_the_next_turn_waits_for() {
        let c = root();
        // t::fa:000 starts 2,510 ms into its branch; t::fa 1 before it (clamped to 0); the
        // background child has no timestamp.
        let first = |id: &str| match id {
            "t::fa:000" => Some(5873.0),
            "t::fa 1" => Some(3000.0),
            _ => None,
        };
        assert_eq!(
            served(&c, 0, &first),
            Served {
                conversation: "t:root".into(),
                turn: 0,
                spawn: Some(
                    "t:b0=t::fa:000,t::fa%201 start_ms=3363 offsets_ms=2510,0; \
                     t%3Bb1=t::aux:002 start_ms=16242.999999999998 offsets_ms=0 background"
                        .into()
                ),
                // The join ignores its recorded delay (12243 ms).
                next: Some(Next {
                    turn: 1,
                    delay_ms: "0".into(),
                    after: Some("t:b0".into()),
                }),
            }
        );
        let s = served(&c, 1, &first);
        assert_eq!((s.spawn.clone(), s.next_turn()), (None, "2".to_owned()));
        assert_eq!(
            s.next,
            Some(Next {
                turn: 2,
                delay_ms: "6110.000000000002".into(),
                after: None
            })
        );
        let s = served(&c, 2, &first);
        assert_eq!((s.next.clone(), s.next_turn()), (None, "none".to_owned()));
        // A plain multi-turn conversation: no topology, delay 0 when the turn has none.
        let plain = Conversation {
            session_id: "session_000001".into(),
            system_message: None,
            user_context_message: None,
            turns: vec![turn(None, None), turn(None, None)],
            agentic: None,
        };
        let s = served(&plain, 0, &first);
        assert_eq!(s.spawn, None);
        assert_eq!(s.next.unwrap().delay_ms, "0");
    }

    #[test]
    fn ids_round_trip_through_the_percent_encoding() {
        for id in ["trace-d::fa:000", "a b,c;d=e%f\"g", "é\u{1}", ""] {
            let enc = encode_id(id);
            assert!(enc.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{enc}");
            assert!(!enc.contains([',', ';', '=', ' ']), "{enc}");
            assert_eq!(decode_id(enc.as_bytes()).as_deref(), Some(id), "{enc}");
        }
        assert!(matches!(encode_id("trace-d::fa:000"), Cow::Borrowed(_)));
        assert_eq!(decode_id(b"  x%3ay \t").as_deref(), Some("x:y"));
        assert_eq!(decode_id(b"x%2"), None);
        assert_eq!(decode_id(b"x%zz"), None);
        assert_eq!(decode_id(b"%C3"), None, "not UTF-8");
    }

    #[test]
    fn sessions_get_roots_round_robin_and_named_conversations_on_request() {
        let turns = |ci: usize| [2, 1, 3][ci];
        // New session: the next root. Bound: its next turn, until the last.
        assert_eq!(choose(None, None, turns), None);
        assert_eq!(choose(Some((0, 1)), None, turns), Some((0, 1)));
        assert_eq!(choose(Some((0, 2)), None, turns), None);
        // Named: where the session stands in it, else from the start.
        assert_eq!(choose(None, Some(2), turns), Some((2, 0)));
        assert_eq!(choose(Some((2, 1)), Some(2), turns), Some((2, 1)));
        assert_eq!(choose(Some((0, 1)), Some(2), turns), Some((2, 0)));
        assert_eq!(choose(Some((2, 3)), Some(2), turns), Some((2, 0)));

        let roots = [0, 3, 4];
        let mut next = 0;
        let got: Vec<_> = (0..5)
            .filter_map(|_| next_root(&roots, &mut next))
            .collect();
        assert_eq!(got, [0, 3, 4, 0, 3]);
        assert_eq!(next_root(&[], &mut next), None);
        let mut c = root();
        assert!(is_root(&c));
        c.agentic = Some(Box::new(Topology::child("t:root")));
        assert!(!is_root(&c));
        c.agentic = None;
        assert!(is_root(&c));
    }

    #[test]
    fn millis_are_written_as_json_would_without_a_needless_fraction() {
        assert_eq!(millis(3363.0), "3363");
        assert_eq!(millis(0.5), "0.5");
        assert_eq!(millis(-0.0), "0");
        assert_eq!(millis(f64::NAN), "NaN");
    }
}
