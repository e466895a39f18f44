//! An independent oracle for where JSON strings are: a small recursive-descent reader of
//! already-valid JSON that lists every string literal's byte range, whether it is an object key,
//! and under which top-level member it sits. Never trusts kvbust's own scanner.

use std::ops::Range;

pub struct Str {
    /// The literal, quotes included.
    pub range: Range<usize>,
    pub is_key: bool,
    /// The top-level member's key (decoded) this string is inside, if any.
    pub top_key: Option<String>,
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
    out: Vec<Str>,
}

/// The strings of a valid JSON text; `None` if it is not valid after all.
pub fn strings(b: &[u8]) -> Option<Vec<Str>> {
    let mut r = Reader {
        b,
        i: 0,
        out: Vec::new(),
    };
    r.ws();
    r.value(0, &None)?;
    Some(r.out)
}

impl Reader<'_> {
    fn ws(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn string(&mut self, is_key: bool, top: &Option<String>) -> Option<Range<usize>> {
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
            top_key: top.clone(),
        });
        Some(start..self.i)
    }

    fn value(&mut self, depth: usize, top: &Option<String>) -> Option<()> {
        match self.b.get(self.i)? {
            b'"' => {
                self.string(false, top)?;
            }
            b'{' => {
                self.i += 1;
                self.ws();
                if self.b.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    let k = self.string(true, top)?;
                    let inner = if depth == 0 {
                        serde_json::from_slice::<String>(&self.b[k]).ok()
                    } else {
                        top.clone()
                    };
                    self.ws();
                    (self.b.get(self.i)? == &b':').then_some(())?;
                    self.i += 1;
                    self.ws();
                    self.value(depth + 1, &inner)?;
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
            }
            b'[' => {
                self.i += 1;
                self.ws();
                if self.b.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    self.value(depth + 1, top)?;
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
