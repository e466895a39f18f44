//! Attribution and the isolation guard, pure: given the owners of a request's hit blocks and
//! the request's own identity and isolation point, split the hit by source (same session,
//! another session, warmup) and decide which breaches it is; and per session, whether a request
//! extends that session's previous one. Owns those rules only; never reads a body, never logs.

use crate::cachebust::{Phase, Target};
use crate::report::{Breaches, Reuse};

use super::index::Owner;

/// A breach kind (the `kind` label of `kvbust_isolation_breaches_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Breach {
    /// A hit past the isolation point on blocks another session put there.
    CrossSession,
    /// Under `warmup_isolation_*`: a profiling request's hit past the isolation point on
    /// blocks warmup requests put there.
    WarmupReuse,
    /// A session's request that does not extend the session's previous one: two conversations
    /// under one session key (one RID, one cache path).
    SessionCollision,
}

impl Breach {
    pub const ALL: [Breach; 3] = [
        Breach::CrossSession,
        Breach::WarmupReuse,
        Breach::SessionCollision,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Breach::CrossSession => "cross_session",
            Breach::WarmupReuse => "warmup_reuse",
            Breach::SessionCollision => "session_collision",
        }
    }
}

/// Adds one breach of `kind` to `b`.
pub fn count(b: &mut Breaches, kind: Breach) {
    match kind {
        Breach::CrossSession => b.cross_session += 1,
        Breach::WarmupReuse => b.warmup_reuse += 1,
        Breach::SessionCollision => b.session_collision += 1,
    }
}

/// The request being attributed.
#[derive(Debug, Clone, Copy)]
pub struct Requester {
    pub session: u64,
    pub phase: Phase,
    pub target: Target,
    /// The first block that holds the isolation point or follows it; `None`: no point.
    pub iso_block: Option<usize>,
}

/// The hit split by source, in tokens, and the breaches of the hit itself (not collisions).
pub fn attribute(owners: &[Owner], block_size: usize, me: &Requester) -> (Reuse, Vec<Breach>) {
    let mut reuse = Reuse::default();
    let mut cross = false;
    let mut warm = false;
    let bs = block_size as u64;
    for (i, o) in owners.iter().enumerate() {
        if o.phase == Phase::Warmup && me.phase == Phase::Profiling {
            reuse.warmup += bs;
        } else if o.session == me.session {
            reuse.same_session += bs;
        } else {
            reuse.other_session += bs;
        }
        // Private to a session: past this request's point, or past its inserter's.
        let private = me.iso_block.is_some_and(|b| i >= b) || o.past_iso;
        if !private {
            continue;
        }
        cross |= o.session != me.session;
        warm |= o.phase == Phase::Warmup;
    }
    let mut breaches = Vec::new();
    match me.target {
        Target::None => {}
        t if t.is_warmup_isolation() => {
            if warm && me.phase == Phase::Profiling {
                breaches.push(Breach::WarmupReuse);
            }
        }
        _ => {
            if cross {
                breaches.push(Breach::CrossSession);
            }
        }
    }
    (reuse, breaches)
}

/// The one block of a session's last prompt that a request of the session must share to extend
/// it: the last full block that ends at least two tokens before that prompt's end (the tokens
/// at the very end of a prompt may tokenize differently once more text follows them), as its
/// index and chain hash. Chain hashes cover the whole prefix, so one block stands for all.
pub fn continuation_check(
    hashes: &[u64],
    n_tokens: usize,
    block_size: usize,
) -> Option<(usize, u64)> {
    let full = n_tokens.saturating_sub(2) / block_size.max(1);
    let i = full.checked_sub(1)?;
    hashes.get(i).map(|h| (i, *h))
}

/// Whether a request whose blocks hash to `hashes` extends the previous request that left
/// `check` ([`continuation_check`]).
pub fn extends(hashes: &[u64], check: Option<(usize, u64)>) -> bool {
    match check {
        None => true,
        Some((i, h)) => hashes.get(i) == Some(&h),
    }
}

/// Whether `target` promises session isolation that a collision breaks (the RID targets).
pub fn guards_sessions(target: Target) -> bool {
    !target.is_none() && !target.is_warmup_isolation()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(session: u64, phase: Phase, past_iso: bool) -> Owner {
        Owner {
            session,
            phase,
            past_iso,
        }
    }

    const W: Phase = Phase::Warmup;
    const P: Phase = Phase::Profiling;

    /// (owners, requester session, phase, target, iso block) → (same, other, warmup tokens, breaches)
    #[test]
    #[allow(clippy::too_many_lines)] // a table of cases, one per line before rustfmt
    fn hits_are_split_by_source_and_breaches_found() {
        type Case = (
            Vec<Owner>,
            u64,
            Phase,
            Target,
            Option<usize>,
            (u64, u64, u64),
            Vec<Breach>,
        );
        let cases: Vec<Case> = vec![
            // The shared system prompt before the marker, another session's: reuse, no breach.
            (
                vec![o(1, P, false), o(1, P, false)],
                2,
                P,
                Target::FirstTurnPrefix,
                Some(2),
                (0, 2, 0),
                vec![],
            ),
            // Past my point on another session's blocks: cross_session.
            (
                vec![o(1, P, false), o(1, P, false), o(1, P, true)],
                2,
                P,
                Target::FirstTurnPrefix,
                Some(2),
                (0, 3, 0),
                vec![Breach::CrossSession],
            ),
            // Past the inserter's point (mine unknown): cross_session too.
            (
                vec![o(1, P, true)],
                2,
                P,
                Target::SystemSuffix,
                None,
                (0, 1, 0),
                vec![Breach::CrossSession],
            ),
            // My own session past the point: fine.
            (
                vec![o(2, P, false), o(2, P, true), o(2, P, true)],
                2,
                P,
                Target::FirstTurnSuffix,
                Some(1),
                (3, 0, 0),
                vec![],
            ),
            // none never breaches.
            (
                vec![o(1, P, true), o(1, P, true)],
                2,
                P,
                Target::None,
                Some(0),
                (0, 2, 0),
                vec![],
            ),
            // Warmup isolation: profiling past the point on warmup blocks.
            (
                vec![o(1, W, false), o(1, W, false)],
                2,
                P,
                Target::WarmupIsolationFirstTurn,
                Some(1),
                (0, 0, 2),
                vec![Breach::WarmupReuse],
            ),
            // ... before the point only: reuse from warmup, no breach.
            (
                vec![o(1, W, false)],
                2,
                P,
                Target::WarmupIsolationSystem,
                Some(1),
                (0, 0, 1),
                vec![],
            ),
            // ... warmup requests sharing among themselves: no promise broken.
            (
                vec![o(1, W, true)],
                2,
                W,
                Target::WarmupIsolationFirstTurn,
                Some(0),
                (0, 1, 0),
                vec![],
            ),
            // RID targets: warmup blocks of another session past the point are cross_session.
            (
                vec![o(1, W, true)],
                2,
                P,
                Target::SystemPrefix,
                Some(0),
                (0, 0, 1),
                vec![Breach::CrossSession],
            ),
        ];
        for (i, (owners, session, phase, target, iso_block, (same, other, warm), breaches)) in
            cases.into_iter().enumerate()
        {
            let me = Requester {
                session,
                phase,
                target,
                iso_block,
            };
            let (reuse, got) = attribute(&owners, 1, &me);
            assert_eq!(
                (reuse.same_session, reuse.other_session, reuse.warmup),
                (same, other, warm),
                "case {i}"
            );
            assert_eq!(got, breaches, "case {i}");
        }
        let me = Requester {
            session: 1,
            phase: P,
            target: Target::None,
            iso_block: None,
        };
        let (reuse, _) = attribute(&[o(1, P, false)], 16, &me);
        assert_eq!(reuse.same_session, 16, "tokens, not blocks");
    }

    #[test]
    fn a_session_must_extend_its_previous_prompt() {
        let prev = [10, 11, 12, 13];
        // 4 full blocks of 4 and 2 tokens more: the check is the last block ending 2 before the end.
        let check = continuation_check(&prev, 18, 4);
        assert_eq!(check, Some((3, 13)));
        assert!(extends(&[10, 11, 12, 13, 14, 15], check));
        assert!(
            !extends(&[10, 11, 12, 99, 14], check),
            "diverged inside the last prompt"
        );
        assert!(!extends(&[10, 11], check), "shorter than the last prompt");
        // Exactly 4 blocks: the last block ends at the prompt's end, so block 2 is checked.
        assert_eq!(continuation_check(&prev, 16, 4), Some((2, 12)));
        assert_eq!(
            continuation_check(&prev, 5, 4),
            None,
            "under two blocks: nothing to check"
        );
        assert!(extends(&[], None));
        assert!(guards_sessions(Target::FirstTurnPrefix));
        assert!(!guards_sessions(Target::None));
        assert!(!guards_sessions(Target::WarmupIsolationSystem));
    }
}
