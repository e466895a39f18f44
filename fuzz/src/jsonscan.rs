//! An independent oracle for where JSON strings are: a small recursive-descent reader of
//! already-valid JSON that lists every string literal's byte range, whether it is an object key,
//! its path from the root, and whether a later member with the same key shadows it. Never trusts
//! kvbust's own scanner.

use std::ops::Range;

/// One step of a path: a member (decoded key) or an array element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

pub struct Str {
    /// The literal, quotes included.
    pub range: Range<usize>,
    pub is_key: bool,
    /// Where the value is (for a key: the object holding it).
    pub path: Vec<Seg>,
    /// A later member with the same key, in this or an enclosing object, replaces it (a JSON
    /// parser that keeps the last duplicate never sees it).
    pub shadowed: bool,
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
    path: Vec<Seg>,
    out: Vec<Str>,
}

/// The strings of a valid JSON text; `None` if it is not valid after all.
pub fn strings(b: &[u8]) -> Option<Vec<Str>> {
    let mut r = Reader {
        b,
        i: 0,
        path: Vec::new(),
        out: Vec::new(),
    };
    r.ws();
    r.value()?;
    Some(r.out)
}

impl Reader<'_> {
    fn ws(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn string(&mut self, is_key: bool) -> Option<Range<usize>> {
        let start = self.i;
        if self.b.get(self.i) != Some(&b'"') {
            return None;
        }
        self.i += 1;
        loop {
            match self.b.get(self.i)? {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    break;
                }
                _ => self.i += 1,
            }
        }
        self.out.push(Str {
            range: start..self.i,
            is_key,
            path: self.path.clone(),
            shadowed: false,
        });
        Some(start..self.i)
    }

    fn value(&mut self) -> Option<()> {
        match self.b.get(self.i)? {
            b'"' => {
                self.string(false)?;
            }
            b'{' => {
                self.i += 1;
                self.ws();
                if self.b.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Some(());
                }
                // (key, the strings its value produced)
                let mut members: Vec<(String, Range<usize>)> = Vec::new();
                loop {
                    self.ws();
                    let k = self.string(true)?;
                    // Lone surrogates are valid JSON syntax but not text: compare them raw.
                    let key = serde_json::from_slice::<String>(&self.b[k.clone()])
                        .unwrap_or_else(|_| String::from_utf8_lossy(&self.b[k]).into_owned());
                    self.ws();
                    (self.b.get(self.i)? == &b':').then_some(())?;
                    self.i += 1;
                    self.ws();
                    let first = self.out.len();
                    self.path.push(Seg::Key(key.clone()));
                    self.value()?;
                    self.path.pop();
                    members.push((key, first..self.out.len()));
                    self.ws();
                    match self.b.get(self.i)? {
                        b',' => self.i += 1,
                        b'}' => {
                            self.i += 1;
                            break;
                        }
                        _ => return None,
                    }
                }
                for (n, (key, strings)) in members.iter().enumerate() {
                    if members[n + 1..].iter().any(|(k, _)| k == key) {
                        for s in &mut self.out[strings.clone()] {
                            s.shadowed = true;
                        }
                    }
                }
            }
            b'[' => {
                self.i += 1;
                self.ws();
                if self.b.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Some(());
                }
                let mut n = 0;
                loop {
                    self.ws();
                    self.path.push(Seg::Index(n));
                    self.value()?;
                    self.path.pop();
                    n += 1;
                    self.ws();
                    match self.b.get(self.i)? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            break;
                        }
                        _ => return None,
                    }
                }
            }
            _ => {
                // A number or literal: up to the next delimiter.
                while !matches!(
                    self.b.get(self.i),
                    None | Some(b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.i += 1;
                }
            }
        }
        Some(())
    }
}
