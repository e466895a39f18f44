//! Which part of a request a trace row records. A request of a session whose messages extend
//! the session's previous request is a later turn: its row holds only the messages added since
//! (the server's answers left out, as a replay regenerates them) and a `delay`. Anything else
//! (a first request, a session whose history was rewritten, a request without a session) is a
//! whole prompt with a `timestamp`. Pure: messages in, a plan out; no tokens, no files.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::num::NonZeroUsize;

use lru::LruCache;

/// A message as the plan sees it: its role and a fingerprint of its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub assistant: bool,
    pub print: u64,
}

impl Seen {
    pub fn new(role: &str, content: &str) -> Self {
        let mut h = DefaultHasher::new();
        (role, content).hash(&mut h);
        Self {
            assistant: role == "assistant",
            print: h.finish(),
        }
    }
}

/// What one request's row records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The messages (by index) whose tokens the row counts.
    pub messages: Vec<usize>,
    /// The row's session (a session key's digest, split when its history was rewritten);
    /// `None`: a request of its own.
    pub session: Option<u64>,
    /// A later turn: written with `delay` after the session's previous row.
    pub follows: bool,
}

struct Session {
    messages: Vec<u64>,
    /// How many times this key's history was rewritten: each rewrite starts a new row session.
    segment: u64,
}

/// The sessions' last messages, bounded (a session pushed out starts afresh).
pub struct Turns {
    sessions: LruCache<u64, Session>,
}

impl Turns {
    pub fn new(capacity: NonZeroUsize) -> Self {
        Self {
            sessions: LruCache::new(capacity),
        }
    }

    /// The plan for a request of `session` (a key's digest) with `messages`.
    pub fn plan(&mut self, session: Option<u64>, messages: &[Seen]) -> Plan {
        let all = || (0..messages.len()).collect();
        let Some(key) = session else {
            return Plan {
                messages: all(),
                session: None,
                follows: false,
            };
        };
        let prints: Vec<u64> = messages.iter().map(|m| m.print).collect();
        let (follows, segment) = match self.sessions.get_mut(&key) {
            Some(s) if prints.len() > s.messages.len() && prints.starts_with(&s.messages) => {
                (Some(s.messages.len()), s.segment)
            }
            Some(s) => (None, s.segment + 1),
            None => (None, 0),
        };
        self.sessions.put(
            key,
            Session {
                messages: prints,
                segment,
            },
        );
        let row_session = {
            let mut h = DefaultHasher::new();
            (key, segment).hash(&mut h);
            h.finish()
        };
        match follows {
            Some(from) => Plan {
                messages: (from..messages.len())
                    .filter(|&i| !messages[i].assistant)
                    .collect(),
                session: Some(row_session),
                follows: true,
            },
            None => Plan {
                messages: all(),
                session: Some(row_session),
                follows: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(m: &[(&str, &str)]) -> Vec<Seen> {
        m.iter().map(|(r, c)| Seen::new(r, c)).collect()
    }

    #[test]
    fn later_turns_record_only_what_the_client_added() {
        let mut t = Turns::new(NonZeroUsize::new(8).unwrap());
        let one = seen(&[("system", "S"), ("user", "q1")]);
        let two = seen(&[
            ("system", "S"),
            ("user", "q1"),
            ("assistant", "a1"),
            ("user", "q2"),
        ]);
        let p1 = t.plan(Some(7), &one);
        assert_eq!((p1.messages.clone(), p1.follows), (vec![0, 1], false));
        let p2 = t.plan(Some(7), &two);
        assert_eq!((p2.messages.clone(), p2.follows), (vec![3], true));
        assert_eq!(p1.session, p2.session);
        // A rewritten history starts a new row session with the whole prompt.
        let rewritten = seen(&[("system", "S"), ("user", "other"), ("user", "q3")]);
        let p3 = t.plan(Some(7), &rewritten);
        assert_eq!((p3.messages, p3.follows), (vec![0, 1, 2], false));
        assert_ne!(p3.session, p2.session);
        // The same prompt again is not a later turn (nothing was added).
        let p4 = t.plan(Some(7), &rewritten);
        assert!(!p4.follows);
        // No session: the whole prompt, always.
        let p5 = t.plan(None, &two);
        assert_eq!(
            (p5.messages, p5.session, p5.follows),
            (vec![0, 1, 2, 3], None, false)
        );
    }
}
