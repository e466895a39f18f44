//! The scan against serde: whatever the scan accepts, serde accepts with the same members.

use rand::{Rng, SeedableRng};

use super::super::{serde_object_with_array, Top};
use super::top;

/// The members, the split array, its span and count, as comparable values.
type Seen<'a> = (
    Vec<(String, &'a str)>,
    Option<Vec<&'a str>>,
    Option<std::ops::Range<usize>>,
    usize,
);

fn seen<'a>(t: &Top<'a>) -> Seen<'a> {
    (
        t.object
            .members()
            .map(|(k, v)| (k.to_owned(), v.get()))
            .collect(),
        t.array
            .as_ref()
            .map(|a| a.iter().map(|j| j.get()).collect()),
        t.array_span.clone(),
        t.array_members,
    )
}

/// What the scan says of `body`, checked against serde: `Some(true)` read by the scan (and
/// serde reads the same), `Some(false)` left to serde, which reads it; `None` both refuse.
fn judge(body: &[u8]) -> Option<bool> {
    judge_split(body, "messages")
}

fn judge_split(body: &[u8], field: &'static str) -> Option<bool> {
    let by_serde = serde_object_with_array(body, field);
    match top(body, field) {
        Some(scanned) => {
            let text = String::from_utf8_lossy(body);
            let by_serde = by_serde.unwrap_or_else(|e| panic!("scan accepted, serde: {e}: {text}"));
            assert_eq!(seen(&scanned), seen(&by_serde), "{text}");
            Some(true)
        }
        None => by_serde.ok().map(|_| false),
    }
}

#[test]
fn the_scan_reads_what_serde_reads() {
    let read: &[&str] = &[
        "{}",
        " \t\r\n{ \n}\r\n ",
        r#"{"model":"m","messages":[{"role":"system","content":"You are"},{"role":"user","content":"Hi"}],"max_tokens":64,"stream":false}"#,
        "{ \"messages\" :\n[ {\"role\":\"user\" , \"content\" : \"a\\\"b\\\\\" } ] ,\t\"n\":-0.5e-7 }",
        r#"{"messages":[],"messages":[1,"x",null,true,false,{},[]],"a":{"b":[{"c":"]}"}]}}"#,
        r#"{"a":1,"a":2,"messages":[{"r\u006fle":"user"}]}"#,
        r#"{"s":"\u00e9\ud800\uDFFF\/\b\f\n\r\t é 😀","n":[0,-0,1.0,1e5,1E+5,1e-05,-12.34e10,123456789012345678901234567890]}"#,
        r#"{"messages":[ ]}"#,
        r#"{"x":"{\"messages\":[]}","messages":[[[[]]]]}"#,
        r#"{"f":1e400}"#,
    ];
    for body in read {
        assert_eq!(judge(body.as_bytes()), Some(true), "{body}");
    }
    let deep = format!(r#"{{"messages":[{}]}}"#, "[".repeat(100) + &"]".repeat(100));
    let left: &[&str] = &[
        // escaped top-level keys: serde decodes them
        r#"{"m\u0065ssages":[1]}"#,
        r#"{"\\":1}"#,
        &deep,
    ];
    for body in left {
        assert_eq!(judge(body.as_bytes()), Some(false), "{body}");
    }
    let refused: &[&[u8]] = &[
        b"",
        b" ",
        b"[]",
        b"\"x\"",
        b"{",
        b"{} x",
        b"{}{}",
        b"{,}",
        br#"{"a":1,}"#,
        br#"{"a":1 "b":2}"#,
        br#"{"a" 1}"#,
        br#"{"a":}"#,
        br#"{a:1}"#,
        br#"{"a":01}"#,
        br#"{"a":-}"#,
        br#"{"a":1.}"#,
        br#"{"a":.5}"#,
        br#"{"a":1e}"#,
        br#"{"a":1e+}"#,
        br#"{"a":+1}"#,
        br#"{"a":tru}"#,
        br#"{"a":truex}"#,
        br#"{"a":nul}"#,
        br#"{"a":NaN}"#,
        br#"{"a":"\x"}"#,
        br#"{"a":"\u12"}"#,
        br#"{"a":"\u12g4"}"#,
        b"{\"a\":\"tab\there\"}",
        b"{\"a\":\"nl\nhere\"}",
        b"{\"a\":\"\xff\"}",
        b"{\"a\xff\":1}",
        br#"{"a":"unterminated}"#,
        br#"{"a":[1,2}"#,
        br#"{"a":{"b":1]}"#,
        br#"{"a":[1,]}"#,
        br#"{"a":{"b"}}"#,
        br#"{"messages":"x"}"#,
        br#"{"messages":[1],"messages":{}}"#,
        br#"{"messages":[1 2]}"#,
    ];
    for body in refused {
        assert_eq!(judge(body), None, "{}", String::from_utf8_lossy(body));
    }
}

/// Random edits of chat bodies, most of them invalid: the scan never accepts one serde
/// refuses, never reads one differently, and reads most of the valid ones itself.
#[test]
fn random_edits_never_make_the_scan_and_serde_disagree() {
    let seeds = [
        r#"{"model":"bench","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Shall I compare thee \"to\" a summer's day?\n\u00e9"}],"max_tokens":64,"stream":false}"#,
        r#" { "messages" : [ {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]} ] , "n" : -1.5E+3 , "t":true,"f":false,"z":null } "#,
    ];
    // Bytes that matter to JSON's syntax, and some that do not.
    let alphabet = b"{}[]\",:\\/ \t\n0123456789-+.eEtrufalsn\x01\x1f\x7f\xc3\xa9\xffax";
    let mut rng = rand_pcg::Pcg64::seed_from_u64(21);
    let (mut by_scan, mut valid) = (0, 0);
    for round in 0..30_000 {
        let mut body = seeds[round % seeds.len()].as_bytes().to_vec();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..=body.len());
            let byte = alphabet[rng.random_range(0..alphabet.len())];
            match rng.random_range(0..3) {
                0 => body.insert(at, byte),
                1 if at < body.len() => {
                    body.remove(at);
                }
                _ if at < body.len() => body[at] = byte,
                _ => body.push(byte),
            }
        }
        match judge(&body) {
            Some(true) => (by_scan, valid) = (by_scan + 1, valid + 1),
            Some(false) => valid += 1,
            None => {}
        }
    }
    // Both kinds of outcome were exercised, and the scan read almost every valid body.
    assert!(valid > 1_000 && valid < 30_000, "{valid}");
    assert!(by_scan * 100 >= valid * 95, "{by_scan} of {valid}");
}

/// The fuzzing inputs kept in the repo (`fuzz/corpus`, `fuzz/seeds`: bodies after a few plan
/// bytes), each from every offset of its first bytes, split on `messages` and on `input`.
#[test]
fn the_fuzzing_corpus_never_makes_the_scan_and_serde_disagree() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = 0;
    let mut read = 0;
    for dir in [
        "corpus/rewrite",
        "corpus/placeholders",
        "seeds/rewrite",
        "seeds/placeholders",
        "seeds/headers",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            files += 1;
            for skip in 0..=8.min(data.len()) {
                for field in ["messages", "input"] {
                    read += usize::from(judge_split(&data[skip..], field) == Some(true));
                }
            }
        }
    }
    assert!(
        files > 900 && read > 500,
        "{files} files, {read} read by the scan"
    );
}

/// Every special byte at every position of strings of every length up to 40 bytes (one
/// `memchr` window and more), in a value and in a key.
#[test]
fn strings_of_every_length_and_every_special_position() {
    // (spelling inside the string, what the scan says of a value holding it, of a key holding it)
    let specials: &[(&str, Option<bool>, Option<bool>)] = &[
        ("x", Some(true), Some(true)),
        ("\\\"", Some(true), Some(false)),
        ("\\\\", Some(true), Some(false)),
        ("\\n", Some(true), Some(false)),
        ("\\u00e9", Some(true), Some(false)),
        ("é", Some(true), Some(true)),
        ("\u{1}", None, None),
        ("\n", None, None),
        ("\\x", None, None),
    ];
    for n in 0..40 {
        for p in 0..=n {
            for (special, as_value, as_key) in specials {
                let text = format!("{}{special}{}", "a".repeat(p), "b".repeat(n - p));
                let value = format!(r#"{{"k":"{text}","messages":["{text}"]}}"#);
                assert_eq!(judge(value.as_bytes()), *as_value, "{value}");
                let key = format!(r#"{{"{text}":1}}"#);
                assert_eq!(judge(key.as_bytes()), *as_key, "{key}");
            }
        }
    }
}

/// Long strings dense with escapes, as agentic text is (a backslash every few dozen bytes), half
/// of them broken at a random byte (a control character, a bad escape, a byte that is not UTF-8,
/// a stray quote or backslash): the scan and serde agree on every one, in a value and in the
/// split array, and the scan reads every valid one.
#[test]
fn long_escaped_strings_never_make_the_scan_and_serde_disagree() {
    let pieces: &[&[u8]] = &[
        b"a",
        b"plain text ",
        b"0123456789abcdef",
        br"\n",
        br#"\""#,
        br"\\",
        br"\/",
        br"\t",
        br"\u00e9",
        br"\ud83d\ude00",
        br"\ud800",
        "é".as_bytes(),
        "😀".as_bytes(),
    ];
    let broken: &[&[u8]] = &[
        b"\x00", b"\x01", b"\n", b"\x1f", br"\x", br"\u12", br"\u12g4", b"\xff", b"\xc3", b"\"",
        b"\\",
    ];
    let mut rng = rand_pcg::Pcg64::seed_from_u64(33);
    let (mut read, mut refused) = (0, 0);
    for round in 0..6_000 {
        let mut text = Vec::new();
        for _ in 0..rng.random_range(0..120) {
            text.extend_from_slice(pieces[rng.random_range(0..pieces.len())]);
        }
        if round % 2 == 1 {
            let at = rng.random_range(0..=text.len());
            let bad = broken[rng.random_range(0..broken.len())];
            text.splice(at..at, bad.iter().copied());
        }
        let mut body = br#"{"k":""#.to_vec();
        body.extend_from_slice(&text);
        body.extend_from_slice(br#"","messages":[""#);
        body.extend_from_slice(&text);
        body.extend_from_slice(br#""]}"#);
        match judge(&body) {
            Some(true) => read += 1,
            Some(false) => panic!("left to serde: {}", String::from_utf8_lossy(&body)),
            None => refused += 1,
        }
    }
    assert!(
        read > 3_000 && refused > 2_000,
        "{read} read, {refused} refused"
    );
}
