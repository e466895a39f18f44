//! A body's top level read as it streams in, chunk by chunk: where the members
//! `observe.request_usage` and the salt may edit are (`stream`, `stream_options`, `cache_salt`,
//! the closing brace), where
//! the first `{{kvbust:` placeholder opens, and so how far the body can be forwarded before its
//! end is known. Never edits and never validates: what it cannot read for certain it calls
//! [`TopFacts::doubtful`], and the caller then reads the whole body the usual way.

use std::ops::Range;

use super::Layout;

/// What opens a placeholder (`synth.placeholders`); matched in the raw bytes, as the scan does.
const PLACEHOLDER_OPEN: &[u8] = b"{{kvbust:";

/// Bytes of one chunk kept for the next: all but the last byte of the opening.
const TAIL: usize = PLACEHOLDER_OPEN.len() - 1;

/// The longest literal a `stream` value is compared as (`true`); longer ones are not it.
const LITERAL_MAX: usize = 8;

/// The top-level keys the scan looks for; any other key is skipped.
const KEY_MAX: usize = b"stream_options".len();

/// What the scan knows of a body so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TopFacts {
    /// Where the last top-level `stream` value is, and whether it is the literal `true`.
    pub stream: Option<(Range<usize>, bool)>,
    /// Where the last top-level `stream_options` value is.
    pub options: Option<Range<usize>>,
    /// Offset of the top-level object's closing `}`.
    pub close: Option<usize>,
    /// How many top-level members were read.
    pub members: usize,
    /// Where the first `{{kvbust:` is, anywhere in the body.
    pub placeholder: Option<usize>,
    /// The body is not an object the scan could follow (not one at all, an escaped top-level
    /// key, text after the object): its edits are for a whole-body read to find.
    pub doubtful: bool,
    /// The first top-level `messages` member, as far as read (marking as the body flows reads
    /// the conversation's first messages from it).
    pub messages: Option<Items>,
    /// How many top-level `messages` members were read: past one, the last is the one that
    /// counts, and a marker placed in the first is in the wrong place.
    pub messages_members: usize,
    /// Where the last top-level `user` value is (a session source).
    pub user: Option<Range<usize>>,
    /// Where the last top-level `cache_salt` value is (`cache_bust.method = "salt"` keeps it as
    /// the tail of its own); nothing from its key on goes before the end.
    pub salt: Option<Range<usize>>,
}

/// The elements of a top-level array value, as far as the scan has read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Items {
    /// Offset of the value's first byte (`[` when it is an array).
    pub open: usize,
    /// The elements read whole, in order (only while every element is an object).
    pub items: Vec<Range<usize>>,
    /// Offset of the closing `]`, once read.
    pub close: Option<usize>,
    /// The value is not an array of objects: the elements are for a whole-body read.
    pub odd: bool,
}

impl TopFacts {
    /// Whether a step at the body's end may edit it: (with `placeholders`) a placeholder, a
    /// body the scan could not follow, or (with `usage`, `observe.request_usage`) a streamed
    /// one, whose `stream_options` may need `include_usage`. Otherwise the body goes as it came.
    pub(crate) fn may_edit(&self, usage: bool, placeholders: bool) -> bool {
        (placeholders && self.placeholder.is_some())
            || self.doubtful
            || (usage && self.stream.as_ref().is_some_and(|s| s.1))
    }

    /// A layout knowing only `stream`, `stream_options` and the close: enough for the usage
    /// step, which reads nothing else. `None` when the scan did not see the object close.
    pub(crate) fn usage_layout(&self) -> Option<Layout> {
        let close = self.close?;
        let mut values: [Option<Range<usize>>; super::LAYOUT_KEYS.len()] = Default::default();
        values[1] = self.stream.as_ref().map(|(r, _)| r.clone());
        values[2] = self.options.clone();
        Some(Layout {
            values,
            close,
            members: self.members,
            items: None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the top-level value.
    Start,
    /// Inside the object, where a key (or, first, the close) comes.
    Key { first: bool },
    /// Inside a top-level key.
    InKey,
    /// After a key, before its colon.
    Colon,
    /// After the colon, before the value.
    Value,
    /// Inside a top-level string value.
    Str,
    /// Inside a top-level literal or number.
    Literal,
    /// Inside a nested object or array value (`depth` levels below the top).
    Nested,
    /// After a value, before the comma or the close.
    After,
    /// After the top-level object (only whitespace belongs here).
    End,
    /// Not following the structure any more (doubtful).
    Lost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    Stream,
    Options,
    /// The first `messages` (its elements are tracked).
    Messages,
    User,
    Salt,
    Other,
}

/// The streaming scan; feed it every chunk in order, then read [`TopScan::facts`].
#[derive(Debug, Clone)]
pub(crate) struct TopScan {
    state: State,
    /// Offset of the next byte fed.
    pos: usize,
    /// Nesting below the top level, in [`State::Nested`].
    depth: u32,
    /// Inside a string in [`State::Nested`], and after a backslash in any string.
    nested_string: bool,
    /// Read the first `messages` array's elements ([`TopScan::reading_messages`]).
    track_messages: bool,
    /// Where the element of the first `messages` being read began (depth 2 and below).
    item_start: usize,
    escaped: bool,
    /// The key being read: where it starts, its first bytes, whether it had an escape.
    key_start: usize,
    key: [u8; KEY_MAX],
    key_len: usize,
    key_escaped: bool,
    member: Member,
    value_start: usize,
    literal: [u8; LITERAL_MAX],
    literal_len: usize,
    /// How many bytes at the end of what was fed so far begin `{{kvbust:`, and those last
    /// bytes (a placeholder may straddle two chunks).
    open_tail: usize,
    tail: [u8; TAIL],
    tail_len: usize,
    /// The first place an edit could land that the facts do not name (a `stream_options` key,
    /// an escaped key, where the structure was lost).
    held_from: Option<usize>,
    facts: TopFacts,
}

impl Default for TopScan {
    fn default() -> Self {
        Self {
            state: State::Start,
            pos: 0,
            depth: 0,
            nested_string: false,
            track_messages: false,
            item_start: 0,
            escaped: false,
            key_start: 0,
            key: [0; KEY_MAX],
            key_len: 0,
            key_escaped: false,
            member: Member::Other,
            value_start: 0,
            literal: [0; LITERAL_MAX],
            literal_len: 0,
            open_tail: 0,
            tail: [0; TAIL],
            tail_len: 0,
            held_from: None,
            facts: TopFacts::default(),
        }
    }
}

impl TopScan {
    /// A scan that also reads the first top-level `messages` array's elements and counts the
    /// `messages` members ([`TopFacts::messages`]), for marking as a body flows; the plain
    /// scan leaves them out (a body with nothing to mark need not pay for them).
    pub(crate) fn reading_messages() -> Self {
        Self {
            track_messages: true,
            ..Self::default()
        }
    }

    pub(crate) fn facts(&self) -> &TopFacts {
        &self.facts
    }

    /// How many bytes from the start may go on now: none at or past the first place an edit
    /// could land (a `stream_options` key, the close, a placeholder, the point the scan lost
    /// the structure), nor the start of a key or a `{{kvbust:` not yet read to its end.
    pub(crate) fn safe_len(&self) -> usize {
        let mut limit = self.pos - self.open_tail;
        if self.state == State::InKey {
            limit = limit.min(self.key_start);
        }
        if let Some(p) = self.facts.placeholder {
            limit = limit.min(p);
        }
        if let Some(c) = self.facts.close {
            limit = limit.min(c);
        }
        if let Some(held) = self.held_from {
            limit = limit.min(held);
        }
        limit
    }

    /// Reads the next chunk of the body.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        self.find_placeholder(chunk);
        let base = self.pos;
        let mut i = 0;
        while i < chunk.len() {
            i = self.step(chunk, i, base);
        }
        self.pos = base + chunk.len();
    }

    /// The body ended: a value still open at the top level (a literal) ends here.
    pub(crate) fn finish(&mut self) -> &TopFacts {
        if self.state != State::End {
            self.lose(self.pos);
        }
        &self.facts
    }

    fn find_placeholder(&mut self, chunk: &[u8]) {
        if self.facts.placeholder.is_some() {
            return;
        }
        // One that straddles the boundary begins in the last bytes fed before this chunk.
        let mut joint = [0u8; 2 * TAIL];
        let (tail, head) = (self.tail_len, chunk.len().min(TAIL));
        joint[..tail].copy_from_slice(&self.tail[..tail]);
        joint[tail..tail + head].copy_from_slice(&chunk[..head]);
        let straddling = memchr::memmem::find(&joint[..tail + head], PLACEHOLDER_OPEN);
        let found = match straddling {
            Some(at) if at < tail => Some(self.pos - tail + at),
            _ => memchr::memmem::find(chunk, PLACEHOLDER_OPEN).map(|at| self.pos + at),
        };
        if found.is_some() {
            self.facts.placeholder = found;
            self.open_tail = 0;
            return;
        }
        // The last bytes fed, for the next chunk, and how many of them could begin one.
        let all = &joint[..tail + head];
        let last: &[u8] = if chunk.len() >= TAIL {
            &chunk[chunk.len() - TAIL..]
        } else {
            &all[all.len().saturating_sub(TAIL)..]
        };
        let mut kept = [0u8; TAIL];
        kept[..last.len()].copy_from_slice(last);
        self.tail = kept;
        self.tail_len = last.len();
        self.open_tail = (1..=last.len())
            .rev()
            .find(|&k| last.ends_with(&PLACEHOLDER_OPEN[..k]))
            .unwrap_or(0);
    }

    /// Reads from `chunk[i]`, returns where it stopped. `base` is the chunk's offset.
    fn step(&mut self, chunk: &[u8], i: usize, base: usize) -> usize {
        let b = chunk[i];
        let at = base + i;
        match self.state {
            State::Start => match b {
                b'{' => self.state = State::Key { first: true },
                _ if is_space(b) => {}
                _ => self.lose(at),
            },
            State::Key { first } => match b {
                b'"' => {
                    self.state = State::InKey;
                    self.key_start = at;
                    self.key_len = 0;
                    self.key_escaped = false;
                }
                b'}' if first => self.close(at),
                _ if is_space(b) => {}
                _ => self.lose(at),
            },
            State::InKey => return self.in_key(chunk, i),
            State::Colon => match b {
                b':' => self.state = State::Value,
                _ if is_space(b) => {}
                _ => self.lose(at),
            },
            State::Value => self.value_begins(b, at),
            State::Str => {
                let (next, closed) = skip_string(chunk, i, &mut self.escaped);
                if closed {
                    self.value_ends(base + next);
                }
                return next;
            }
            State::Literal => {
                if b == b',' || b == b'}' || is_space(b) {
                    self.value_ends(at);
                    // The delimiter is the `After` state's to read.
                    return i;
                }
                if self.literal_len < LITERAL_MAX {
                    self.literal[self.literal_len] = b;
                }
                self.literal_len += 1;
            }
            State::Nested => return self.nested(chunk, i, base),
            State::After => match b {
                b',' => self.state = State::Key { first: false },
                b'}' => self.close(at),
                _ if is_space(b) => {}
                _ => self.lose(at),
            },
            State::End => {
                if !is_space(b) {
                    self.lose(at);
                }
            }
            State::Lost => return chunk.len(),
        }
        i + 1
    }

    fn in_key(&mut self, chunk: &[u8], i: usize) -> usize {
        let mut j = i;
        while j < chunk.len() {
            let b = chunk[j];
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
                self.key_escaped = true;
            } else if b == b'"' {
                self.key_read();
                return j + 1;
            }
            if self.key_len < KEY_MAX {
                self.key[self.key_len] = b;
            }
            self.key_len += 1;
            j += 1;
        }
        j
    }

    fn key_read(&mut self) {
        self.state = State::Colon;
        self.facts.members += 1;
        let key = &self.key[..self.key_len.min(KEY_MAX)];
        self.member = if self.key_escaped {
            // Escapes could spell either name: a whole-body read decides.
            self.hold(self.key_start);
            self.facts.doubtful = true;
            Member::Other
        } else if self.key_len == KEY_MAX && key == b"stream_options" {
            // Its value may be edited: nothing from its key on goes before the end.
            self.hold(self.key_start);
            Member::Options
        } else if self.key_len == 6 && key == b"stream" {
            Member::Stream
        } else if self.key_len == 4 && key == b"user" {
            Member::User
        } else if self.key_len == 10 && key == b"cache_salt" {
            // The salt step may rewrite its value at the end.
            self.hold(self.key_start);
            Member::Salt
        } else if self.track_messages && self.key_len == 8 && key == b"messages" {
            self.facts.messages_members += 1;
            if self.facts.messages_members == 1 {
                Member::Messages
            } else {
                Member::Other
            }
        } else {
            Member::Other
        };
    }

    fn value_begins(&mut self, b: u8, at: usize) {
        if is_space(b) {
            return;
        }
        self.value_start = at;
        if self.member == Member::Messages {
            self.facts.messages = Some(Items {
                open: at,
                odd: b != b'[',
                ..Items::default()
            });
        }
        match b {
            b'"' => self.state = State::Str,
            b'{' | b'[' => {
                self.state = State::Nested;
                self.depth = 1;
                self.nested_string = false;
            }
            b',' | b'}' | b']' | b':' => self.lose(at),
            _ => {
                self.state = State::Literal;
                self.literal[0] = b;
                self.literal_len = 1;
            }
        }
    }

    /// A top-level value ended at `end` (exclusive).
    fn value_ends(&mut self, end: usize) {
        let range = self.value_start..end;
        match self.member {
            Member::Stream => {
                let literal = &self.literal[..self.literal_len.min(LITERAL_MAX)];
                let is_true = matches!(self.state, State::Literal)
                    && self.literal_len == 4
                    && literal == b"true";
                self.facts.stream = Some((range, is_true));
            }
            Member::Options => self.facts.options = Some(range),
            Member::User => self.facts.user = Some(range),
            Member::Salt => self.facts.salt = Some(range),
            Member::Messages | Member::Other => {}
        }
        self.state = State::After;
    }

    fn nested(&mut self, chunk: &[u8], i: usize, base: usize) -> usize {
        let items = self.member == Member::Messages;
        let mut j = i;
        while j < chunk.len() {
            if self.nested_string {
                let (next, closed) = skip_string(chunk, j, &mut self.escaped);
                j = next;
                if closed {
                    self.nested_string = false;
                }
                continue;
            }
            let b = chunk[j];
            if items && self.depth == 1 {
                self.between_items(b, base + j);
            }
            match b {
                b'"' => self.nested_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if items && self.depth == 1 {
                        self.item_read(base + j + 1);
                    }
                    if self.depth == 0 {
                        self.value_ends(base + j + 1);
                        return j + 1;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        j
    }

    /// A byte of the first `messages` array between its elements: an object opens one, the
    /// bracket closes the array; any other element makes it odd.
    fn between_items(&mut self, b: u8, at: usize) {
        let Some(m) = self.facts.messages.as_mut() else {
            return;
        };
        match b {
            b'{' => self.item_start = at,
            b']' => m.close = Some(at),
            b',' => {}
            _ if is_space(b) => {}
            _ => m.odd = true,
        }
    }

    /// An element of the first `messages` array ended at `end` (exclusive).
    fn item_read(&mut self, end: usize) {
        if let Some(m) = self.facts.messages.as_mut() {
            if !m.odd {
                m.items.push(self.item_start..end);
            }
        }
    }

    fn close(&mut self, at: usize) {
        self.facts.close = Some(at);
        self.state = State::End;
    }

    /// The structure is no longer certain from `at` on.
    fn lose(&mut self, at: usize) {
        self.facts.doubtful = true;
        self.hold(at);
        self.state = State::Lost;
    }

    fn hold(&mut self, at: usize) {
        self.held_from = Some(self.held_from.map_or(at, |h| h.min(at)));
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Skips string bytes from `chunk[i]` (just inside the string, or after its opening quote was
/// read): returns where it stopped and whether the closing quote was read. Only quotes are
/// searched for (an agent's context has a backslash every few dozen bytes, a quote far less
/// often): a quote after an odd run of backslashes is escaped. `escaped`: the last chunk ended
/// on an odd run, so this one's first byte is escaped.
fn skip_string(chunk: &[u8], i: usize, escaped: &mut bool) -> (usize, bool) {
    let mut j = i;
    if *escaped {
        if j >= chunk.len() {
            return (j, false);
        }
        *escaped = false;
        j += 1;
    }
    // Backslashes before `end` since `j`: a run never reaches back past `j`, which follows an
    // opening quote, an escaped byte or the end of an even run.
    let run = |end: usize, from: usize| {
        chunk[from..end]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count()
    };
    loop {
        match memchr::memchr(b'"', &chunk[j..]) {
            None => {
                *escaped = run(chunk.len(), j) % 2 == 1;
                return (chunk.len(), false);
            }
            Some(k) => {
                let quote = j + k;
                let odd = run(quote, j) % 2 == 1;
                if !odd {
                    return (quote + 1, true);
                }
                j = quote + 1;
            }
        }
    }
}

#[cfg(test)]
mod tests;
