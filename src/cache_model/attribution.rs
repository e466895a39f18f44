//! Attribution and the isolation guard, pure: given the owners of a request's hit blocks and
//! the request's own identity and isolation point, split the hit by source (same session,
//! another session, warmup) and decide which breaches it is; and per session, whether a request
//! extends that session's previous one. Owns those rules only; never reads a body, never logs.

use crate::cachebust::{Phase, Target};
use crate::report::verdict::BreachTokens;
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

/// Tokens of a hit past the isolation point that the request's target promised to keep out:
/// other sessions' blocks under a RID target, warmup's blocks for a profiling request under a
/// warmup-isolation target (the verdict's token counts; [`attribute`] decides the breaches).
pub fn breach_tokens(owners: &[Owner], block_size: usize, me: &Requester) -> BreachTokens {
    let mut t = BreachTokens::default();
    let bs = block_size as u64;
    for (i, o) in owners.iter().enumerate() {
        let private = me.iso_block.is_some_and(|b| i >= b) || o.past_iso;
        if !private {
            continue;
        }
        match me.target {
            Target::None => {}
            x if x.is_warmup_isolation() => {
                if o.phase == Phase::Warmup && me.phase == Phase::Profiling {
                    t.warmup_reuse += bs;
                }
            }
            _ => {
                if o.session != me.session {
                    t.cross_session += bs;
                }
            }
        }
    }
    t
}

/// What a request must share with its session's last prompt to extend it: that prompt's tokens
/// up to two before its end (the tokens at the very end of a prompt may tokenize differently
/// once more text follows them), held as the chain hash of the last full block within them
/// (chain hashes cover the whole prefix, so one block stands for all before it) and a hash of
/// the tokens after that block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Continuation {
    /// Tokens that must be shared.
    len: usize,
    /// Full blocks within them, and the last one's chain hash.
    blocks: usize,
    block_hash: Option<u64>,
    /// The hash of the tokens past those blocks, up to `len`.
    tail: u64,
}

fn tail_hash(ids: &[u32]) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    ids.hash(&mut h);
    h.finish()
}

/// The continuation a prompt of `ids` (whose full blocks hash to `hashes`) leaves for the next
/// request of its session; `None` for a prompt of two tokens or fewer.
pub fn continuation(ids: &[u32], hashes: &[u64], block_size: usize) -> Option<Continuation> {
    let len = ids.len().checked_sub(2).filter(|&l| l > 0)?;
    let bs = block_size.max(1);
    let blocks = (len / bs).min(hashes.len());
    Some(Continuation {
        len,
        blocks,
        block_hash: blocks.checked_sub(1).map(|i| hashes[i]),
        tail: tail_hash(&ids[blocks * bs..len]),
    })
}

/// Whether a request of `ids` (full blocks hashing to `hashes`) extends the previous request
/// that left `prev`.
pub fn extends(ids: &[u32], hashes: &[u64], block_size: usize, prev: Option<Continuation>) -> bool {
    let Some(c) = prev else {
        return true;
    };
    if ids.len() < c.len {
        return false;
    }
    let head = match c.block_hash {
        Some(h) => hashes.get(c.blocks - 1) == Some(&h),
        None => true,
    };
    head && tail_hash(&ids[c.blocks * block_size.max(1)..c.len]) == c.tail
}

/// How many branches of one session are remembered: the one it follows now and the last ones it
/// left. Bounds a session's memory; a branch older than these is forgotten, and a request that
/// goes back to it opens a branch again (still a collision when the branch it leaves never grew).
pub const BRANCHES: usize = 4;

/// One branch of a session's context: what its next request must share, and whether a request
/// has extended it since it opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Branch {
    check: Option<Continuation>,
    grown: bool,
}

impl Branch {
    /// Tokens a request must share to extend it (a branch of a short prompt takes any).
    fn shared(&self) -> usize {
        self.check.map_or(0, |c| c.len)
    }
}

/// What a session's request did to the session's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// It extends the branch the session follows (or opens the session).
    Extends,
    /// It extends none of the session's branches, after the one it leaves grew: the context
    /// was cut back to an earlier point and goes on from there (agentic compaction). Counted,
    /// not a breach.
    Compaction,
    /// Two live branches under one key (`session_collision`): it extends a branch older than
    /// the one the session follows, or opens a new one while the branch it leaves never grew
    /// (two conversations taking turns).
    Collision,
}

/// A session's branches, the one it follows first: bounded to [`BRANCHES`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Branches {
    slots: [Option<Branch>; BRANCHES],
}

impl Branches {
    /// Judges a request of `ids` (full blocks hashing to `hashes`) against the session's
    /// branches and remembers it as the end of the branch it follows.
    ///
    /// Of the branches it extends, the one with the longest shared context is the one it
    /// continues (a cut back to the system prompt is extended by every request of every
    /// branch; the longer match says which). That is the newest branch: fine. An older one:
    /// both are live, a collision. None: a new branch, which is a compaction only when the
    /// branch it leaves grew; a branch that opened and never grew before another opened is two
    /// conversations starting, not a context cut back.
    pub fn follow(&mut self, ids: &[u32], hashes: &[u64], block_size: usize) -> Turn {
        let now = Branch {
            check: continuation(ids, hashes, block_size),
            grown: true,
        };
        let Some(current) = self.slots[0] else {
            self.slots[0] = Some(Branch {
                grown: false,
                ..now
            });
            return Turn::Extends;
        };
        let mut best: Option<(usize, usize)> = None;
        for (i, b) in self.slots.iter().enumerate() {
            let Some(b) = b else { continue };
            if extends(ids, hashes, block_size, b.check)
                && best.is_none_or(|(_, shared)| b.shared() > shared)
            {
                best = Some((i, b.shared()));
            }
        }
        let turn = match best {
            Some((0, _)) => Turn::Extends,
            Some((i, _)) => {
                // Back to an older branch: it becomes the one followed, the others stay.
                self.slots[..=i].rotate_right(1);
                Turn::Collision
            }
            None => {
                // A new branch; the oldest one falls out.
                self.slots.rotate_right(1);
                if current.grown {
                    Turn::Compaction
                } else {
                    Turn::Collision
                }
            }
        };
        self.slots[0] = Some(Branch {
            grown: best.is_some(),
            ..now
        });
        turn
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
        let bs = 4;
        let hashed = |ids: &[u32]| crate::mock::prefix_cache::chain(ids, bs);
        let prev: Vec<u32> = (0..18).collect();
        let c = continuation(&prev, &hashed(&prev), bs);
        let ok = |ids: &[u32]| extends(ids, &hashed(ids), bs, c);
        let longer: Vec<u32> = (0..30).collect();
        assert!(ok(&longer));
        assert!(ok(&prev), "the same prompt again");
        // The last two tokens may change (they may tokenize differently with more after them).
        let mut retok = prev.clone();
        retok[16] = 99;
        retok[17] = 98;
        assert!(ok(&retok));
        // A change anywhere before them is another conversation: in a full block ...
        let mut early = longer.clone();
        early[5] = 77;
        assert!(!ok(&early));
        // ... or in the partial block after the last full one (tokens 16..18 of 18 - 2 = 16: none
        // here; use a prompt whose check ends inside a block).
        let prev: Vec<u32> = (0..15).collect(); // checks 13 tokens: 3 blocks + 1 token
        let c = continuation(&prev, &hashed(&prev), bs);
        let mut late = prev.clone();
        late[12] = 55;
        assert!(
            !extends(&late, &hashed(&late), bs, c),
            "diverged after the last full block"
        );
        assert!(extends(&prev, &hashed(&prev), bs, c));
        let short: Vec<u32> = (0..10).collect();
        assert!(
            !extends(&short, &hashed(&short), bs, c),
            "shorter than the last prompt"
        );
        assert_eq!(continuation(&[1, 2], &[], bs), None, "nothing to check");
        assert!(extends(&[], &[], bs, None));
        assert!(guards_sessions(Target::FirstTurnPrefix));
        assert!(!guards_sessions(Target::None));
        assert!(!guards_sessions(Target::WarmupIsolationSystem));
    }
    /// Prompts of a few "messages" of 8 tokens each (4-token blocks): `conv(&[a, b, c])` is the
    /// messages `a`, `b`, `c` in order, message `m` being tokens `8m .. 8m + 8`. A prompt's
    /// next turn appends messages; a cut back keeps an earlier run of them.
    fn conv(messages: &[u32]) -> Vec<u32> {
        messages.iter().flat_map(|m| m * 8..m * 8 + 8).collect()
    }

    /// (requests of one session, as message lists) → what each did.
    #[test]
    #[allow(clippy::too_many_lines)] // a table of cases, one per line before rustfmt
    fn compaction_is_one_cut_back_and_collision_is_two_live_branches() {
        use Turn::{Collision as X, Compaction as C, Extends as E};
        type Case = (&'static str, Vec<Vec<u32>>, Vec<Turn>);
        // Message 0 is the system prompt, 1 the first user turn; other numbers are new text.
        let cases: Vec<Case> =
            vec![
            (
                "one conversation growing",
                vec![vec![0, 1], vec![0, 1, 2, 3], vec![0, 1, 2, 3, 4, 5]],
                vec![E, E, E],
            ),
            (
                "the same prompt again",
                vec![vec![0, 1], vec![0, 1], vec![0, 1, 2, 3]],
                vec![E, E, E],
            ),
            (
                "cut back to system + first user turn, then grows from there",
                vec![
                    vec![0, 1],
                    vec![0, 1, 2, 3],
                    vec![0, 1, 2, 3, 4, 5],
                    vec![0, 1],
                    vec![0, 1, 6, 7],
                    vec![0, 1, 6, 7, 8, 9],
                ],
                vec![E, E, E, C, E, E],
            ),
            (
                "cut back to the system prompt with a summary (a Weka reset turn)",
                vec![vec![0, 1], vec![0, 1, 2, 3], vec![0, 10], vec![0, 10, 11, 12]],
                vec![E, E, C, E],
            ),
            (
                "cut back to a later prefix of its own history",
                vec![
                    vec![0, 1, 2, 3],
                    vec![0, 1, 2, 3, 4, 5, 6, 7],
                    vec![0, 1, 2, 3, 20],
                    vec![0, 1, 2, 3, 20, 21, 22],
                ],
                vec![E, E, C, E],
            ),
            (
                "two compactions, each after the context grew again",
                vec![
                    vec![0, 1],
                    vec![0, 1, 2, 3],
                    vec![0, 10],
                    vec![0, 10, 11, 12],
                    vec![0, 20],
                    vec![0, 20, 21, 22],
                ],
                vec![E, E, C, E, C, E],
            ),
            (
                "after a cut back, the old branch goes on: two live branches",
                vec![
                    vec![0, 1],
                    vec![0, 1, 2, 3],
                    vec![0, 1],
                    vec![0, 1, 2, 3, 4, 5],
                ],
                vec![E, E, C, X],
            ),
            (
                "after a cut back to the system prompt, the old branch goes on",
                vec![
                    vec![0, 1],
                    vec![0, 1, 2, 3],
                    vec![0, 10],
                    vec![0, 10, 11],
                    vec![0, 1, 2, 3, 4, 5],
                ],
                vec![E, E, C, E, X],
            ),
            (
                "two conversations with one first turn taking turns (first-user-turn key)",
                vec![
                    vec![0, 1],
                    vec![0, 1],
                    vec![0, 1, 2, 3],
                    vec![0, 1, 4, 5],
                    vec![0, 1, 2, 3, 6, 7],
                    vec![0, 1, 4, 5, 8, 9],
                    vec![0, 1, 2, 3, 6, 7, 10],
                ],
                vec![E, E, E, C, X, X, X],
            ),
            (
                "two conversations under one key, different first turns",
                vec![vec![0, 1], vec![0, 2], vec![0, 1, 3, 4], vec![0, 2, 5, 6]],
                vec![E, X, X, X],
            ),
            (
                "more conversations taking turns than branches are remembered",
                vec![
                    vec![0, 1],
                    vec![0, 2],
                    vec![0, 3],
                    vec![0, 4],
                    vec![0, 5],
                    vec![0, 6],
                    vec![0, 1, 11],
                    vec![0, 2, 12],
                ],
                vec![E, X, X, X, X, X, X, X],
            ),
            (
                "a cut back right after the session opened is not told from a second conversation",
                vec![vec![0, 1], vec![0, 10], vec![0, 10, 11]],
                vec![E, X, E],
            ),
        ];
        let bs = 4;
        for (name, requests, want) in cases {
            let mut b = Branches::default();
            let got: Vec<Turn> = requests
                .iter()
                .map(|m| {
                    let ids = conv(m);
                    b.follow(&ids, &crate::mock::prefix_cache::chain(&ids, bs), bs)
                })
                .collect();
            assert_eq!(got, want, "{name}");
            assert!(b.slots.iter().flatten().count() <= BRANCHES, "{name}");
        }
    }
}
