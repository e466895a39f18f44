//! Identity of the byte-level encoder with `tokenizers`, id for id, on Qwen3 and Llama 3.2:
//! the shipped corpora and asset texts, vLLM's rendered chat templates, and generated unicode
//! and whitespace edge cases.

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};

use super::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[allow(clippy::expect_used)] // test fixtures
fn qwen() -> Tokenizer {
    Tokenizer::default_qwen3().expect("shipped tokenizer")
}

#[allow(clippy::expect_used)] // test fixtures
fn llama() -> Tokenizer {
    Tokenizer::from_path(&root().join("tests/fixtures/synth/tokenizers/llama-3.2"))
        .expect("llama fixture")
}

#[allow(clippy::expect_used)] // test fixtures
fn both() -> Vec<(&'static str, Tokenizer, ByteLevelBpe)> {
    [("qwen3", qwen()), ("llama-3.2", llama())]
        .into_iter()
        .map(|(name, tok)| {
            let bpe = ByteLevelBpe::new(&tok).expect("byte-level tokenizer accepted");
            (name, tok, bpe)
        })
        .collect()
}

#[allow(clippy::expect_used)] // test fixtures
fn hf(tok: &Tokenizer, text: &str, special: bool) -> Vec<u32> {
    tok.inner()
        .encode_fast(text, special)
        .expect("tokenizers encodes")
        .get_ids()
        .to_vec()
}

/// Both ways, with and without the special-token frame; names the first differing token.
fn assert_same(name: &str, tok: &Tokenizer, bpe: &ByteLevelBpe, what: &str, text: &str) {
    assert_same_in(name, tok, bpe, what, text, &[false, true]);
}

fn assert_same_in(
    name: &str,
    tok: &Tokenizer,
    bpe: &ByteLevelBpe,
    what: &str,
    text: &str,
    frames: &[bool],
) {
    for &special in frames {
        let want = hf(tok, text, special);
        let got = if special {
            bpe.encode_special(text)
        } else {
            bpe.encode(text)
        };
        if got != want {
            let at = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            let lo = at.saturating_sub(3);
            panic!(
                "{name} {what} (special {special}): differ at token {at} of {}/{}: got {:?} want {:?} near {:?}",
                got.len(),
                want.len(),
                &got[lo..(at + 4).min(got.len())],
                &want[lo..(at + 4).min(want.len())],
                tok.decode(&want[lo..(at + 4).min(want.len())]).unwrap_or_default(),
            );
        }
    }
}

#[allow(clippy::expect_used)] // test fixtures
fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every string in a JSON document, one per line.
fn json_strings(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| json_strings(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| json_strings(x, out)),
        _ => {}
    }
}

/// The shipped corpora and asset texts (the sonnet corpus, the coding templates, the coding
/// word lists, the agentic-code config) and this crate's own Rust source.
fn corpora() -> Vec<(String, String)> {
    let assets = root().join("assets");
    let mut texts = vec![(
        "shakespeare.txt".to_string(),
        read(&assets.join("shakespeare.txt")),
    )];
    let templates = read(&assets.join("aiperf-coding/templates.json"));
    let mut strings = String::new();
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&templates) {
        json_strings(&v, &mut strings);
    }
    texts.push(("aiperf-coding strings".into(), strings));
    texts.push(("aiperf-coding/templates.json".into(), templates));
    texts.push((
        "agentic-code/default.json".into(),
        read(&assets.join("agentic-code/default.json")),
    ));
    let mut words = String::new();
    let mut lists: Vec<_> = std::fs::read_dir(assets.join("coding-exact"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    lists.sort();
    for p in lists {
        words.push_str(&read(&p));
    }
    texts.push(("coding-exact/*.txt".into(), words));
    let mut code = String::new();
    for dir in ["src/cache_model", "src/synth/tokenizer", "src/proxy"] {
        let mut files: Vec<_> = std::fs::read_dir(root().join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        files.sort();
        for p in files {
            code.push_str(&read(&p));
        }
    }
    texts.push(("Rust source".into(), code));
    texts
}

#[test]
fn corpora_and_assets_encode_as_tokenizers_does() {
    let texts = corpora();
    for (name, tok, bpe) in both() {
        for (what, text) in &texts {
            assert!(!text.is_empty(), "{what} is empty");
            // Megabytes: without the frame (every other test checks it).
            assert_same_in(name, &tok, &bpe, what, text, &[false]);
        }
    }
}

/// vLLM 0.33's rendered chat templates (`shared/vectors/chat_template.json`): the prompt text
/// encodes to the engine's own ids, special tokens included, and to `tokenizers`' ids.
#[test]
#[allow(clippy::expect_used)] // test fixtures
fn chat_template_vectors_give_the_engines_ids() {
    let path = root().join("tests/fixtures/tokenizer/chat_template.json");
    let doc: serde_json::Value = serde_json::from_str(&read(&path)).expect("vectors parse");
    let cases = doc["cases"].as_array().expect("cases");
    let tokenizers = both();
    let mut checked = 0;
    for case in cases {
        let Some(ids) = case["prompt_token_ids"].as_array() else {
            continue;
        };
        let want: Vec<u32> = ids.iter().map(|v| v.as_u64().expect("id") as u32).collect();
        let text = case["prompt_text"].as_str().expect("prompt_text");
        let (name, tok, bpe) = tokenizers
            .iter()
            .find(|(n, _, _)| case["tokenizer"] == *n)
            .expect("a known tokenizer");
        // vLLM tokenizes with `add_special_tokens = body.add_special_tokens` (default false).
        let got = if case["body"]["add_special_tokens"] == true {
            bpe.encode_special(text)
        } else {
            bpe.encode(text)
        };
        assert_eq!(got, want, "{name} {}", case["name"]);
        assert_same(name, tok, bpe, "chat template vector", text);
        checked += 1;
    }
    assert_eq!(checked, 45, "every vector with ids is checked");
}

/// Whitespace, line ends, normalization, joiners, digits, contractions and added tokens: each
/// alone, between words and at the ends.
#[allow(clippy::too_many_lines)] // a table of cases
fn edge_cases(added: &[String]) -> Vec<String> {
    let mut cases: Vec<String> = Vec::new();
    for n in [1, 2, 3, 4, 7, 8, 16, 33, 100] {
        let s = " ".repeat(n);
        let t = "\t".repeat(n);
        let nl = "\n".repeat(n);
        let crlf = "\r\n".repeat(n);
        for run in [
            &s,
            &t,
            &nl,
            &crlf,
            &format!("{s}\n"),
            &format!("\n{s}"),
            &format!("{s}\r\n{t}"),
        ] {
            cases.push(format!("a{run}b"));
            cases.push(format!("a{run}"));
            cases.push(format!("{run}b"));
            cases.push(format!("x.{run}(y){run}"));
            cases.push(run.clone());
        }
    }
    let fragments = [
        "\r",
        "\r\r\n",
        "\n\r",
        " \n ",
        "\u{a0}",
        "\u{3000}",
        "\u{2028}",
        "\u{2029}",
        "\u{85}",
        "\u{1680}",
        "\u{180e}",
        "\u{200b}",
        "\u{feff}",
        "\u{1c}\u{1d}\u{1e}\u{1f}",
        "\u{b}\u{c}",
        "é",
        "e\u{301}",
        "Å",
        "A\u{30a}",
        "한",
        "\u{1112}\u{1161}\u{11ab}",
        "ﬁ",
        "a\u{323}\u{302}",
        "a\u{302}\u{323}",
        ">\u{338}",
        "<\u{338}",
        "\u{915}\u{93c}",
        "Việt Nam",
        "\u{301}start",
        "👨\u{200d}👩\u{200d}👧\u{200d}👦",
        "🇫🇷🇩🇪",
        "👍🏽",
        "1\u{fe0f}\u{20e3}",
        "🏳\u{fe0f}\u{200d}🌈",
        "\u{fffd}",
        "\u{fffd}\u{fffd}abc",
        "'s",
        "'S",
        "'ſ",
        "'LL",
        "'ll",
        "'Re",
        "don't",
        "I'M",
        "'",
        "''",
        "1",
        "12",
        "123",
        "1234",
        "1234567890",
        "١٢٣",
        "½",
        "²³",
        "Ⅻ",
        "3.14",
        "-5",
        "東京タワー",
        "こんにちは世界",
        "русский",
        "Ελληνικά",
        "عربى",
        "עברית",
        "ไทย",
        "🦀",
        "\u{10ffff}",
        "\u{e000}",
        "\u{0}",
        "\u{7f}",
        "()",
        "{}",
        "=>",
        "...",
        "!!!",
        "?\n",
        "#!/",
    ];
    for f in fragments {
        cases.push(f.to_string());
        cases.push(format!("word{f}word"));
        cases.push(format!(" {f} "));
        cases.push(format!("x {f}\n"));
    }
    for t in added {
        cases.push(t.clone());
        cases.push(format!("a{t}b"));
        cases.push(format!(" {t} "));
        cases.push(format!("{t}{t}\n{t}"));
        cases.push(format!("{t}\u{338}x"));
        cases.push(t[..t.len() - 1].to_string());
    }
    // Invalid UTF-8, decoded lossily as a client would.
    for bytes in [
        &b"\xff\xfeabc"[..],
        b"caf\xc3",
        b"\xe6\x9d\xb1\xe4",
        b"a\x80\x80 b",
        b"\xf0\x9f\xa6",
    ] {
        cases.push(String::from_utf8_lossy(bytes).into_owned());
    }
    // Long pieces: the heap merge, and long single pre-tokens.
    for (unit, n) in [
        ("a", 300),
        ("ab", 200),
        (" ", 300),
        ("=", 150),
        ("東", 400),
        ("0", 50),
    ] {
        cases.push(unit.repeat(n));
        cases.push(format!("x {} y", unit.repeat(n)));
    }
    cases
}

fn added_contents(tok: &Tokenizer) -> Vec<String> {
    let mut added: Vec<String> = tok
        .inner()
        .get_added_tokens_decoder()
        .into_values()
        .map(|t| t.content)
        .collect();
    added.sort();
    added.truncate(40);
    added
}

#[test]
fn unicode_and_whitespace_edge_cases_encode_as_tokenizers_does() {
    for (name, tok, bpe) in both() {
        for text in edge_cases(&added_contents(&tok)) {
            assert_same(name, &tok, &bpe, &format!("{text:?}"), &text);
        }
    }
}

/// Random strings of tricky fragments (a fixed seed, so a failure reproduces).
#[test]
fn random_mixtures_encode_as_tokenizers_does() {
    let pool = [
        " ",
        "  ",
        "\n",
        "\r\n",
        "\t",
        "\u{a0}",
        "a",
        "The",
        " word",
        "ſ",
        "'s",
        "'",
        "1",
        "2024",
        ".",
        ",",
        "!?",
        "(",
        "))",
        "é",
        "e\u{301}",
        "\u{301}",
        "東京",
        "👍",
        "\u{200d}",
        "🏽",
        "\u{fffd}",
        "ä",
        "a\u{308}",
        "\u{338}",
        ">",
        "<",
        "_",
        "-->",
        "::",
        "Ⅻ",
        "١",
        "<|im_start|>",
        "<think>",
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|im",
        "|>",
    ];
    let mut rng = rand_pcg::Pcg64::seed_from_u64(44);
    for (name, tok, bpe) in both() {
        for _ in 0..1500 {
            let n = rng.random_range(1..24);
            let text: String = (0..n)
                .map(|_| pool[rng.random_range(0..pool.len())])
                .collect();
            assert_same(name, &tok, &bpe, &format!("{text:?}"), &text);
        }
    }
}

/// The isolation point: tokens that end at or before a byte, as `tokenizers`' offsets count them.
#[test]
#[allow(clippy::expect_used)] // test fixtures
fn points_count_as_tokenizers_offsets() {
    let marker = "[rid:4f2a9c]";
    let texts = [
        format!("<|im_start|>system\nYou are kind. {marker}\nBe brief.<|im_end|>\n"),
        format!("{marker}Hello"),
        format!("Hello {marker}"),
        format!("naïve東京{marker}  \n\n x"),
        format!("👨\u{200d}👩 {marker}{marker}"),
    ];
    for (name, tok, bpe) in both() {
        for text in &texts {
            let at = text.find(marker).expect("marker") + marker.len();
            let enc = tok.inner().encode(text.as_str(), false).expect("encodes");
            let want = enc.get_offsets().iter().take_while(|o| o.1 <= at).count();
            let (before, ids) = bpe.encode_point(text, at).expect("NFC text: exact offsets");
            assert_eq!(
                (before, ids.as_slice()),
                (want, enc.get_ids()),
                "{name} {text:?}"
            );
            let enc = tok.inner().encode(text.as_str(), true).expect("encodes");
            let want = enc
                .get_offsets()
                .iter()
                .zip(enc.get_special_tokens_mask())
                .take_while(|(o, s)| **s == 1 || o.1 <= at)
                .count();
            let (before, ids) = bpe.encode_special_point(text, at).expect("exact");
            assert_eq!(
                (before, ids.as_slice()),
                (want, enc.get_ids()),
                "{name} special {text:?}"
            );
        }
    }
    // Text that NFC changes has no byte offsets of its own: the caller asks `tokenizers`.
    let tok = qwen();
    let bpe = ByteLevelBpe::new(&tok).expect("accepted");
    assert!(bpe.encode_point("cafe\u{301} [rid:1]", 7).is_none());
    let llama_bpe = ByteLevelBpe::new(&llama()).expect("accepted");
    assert!(llama_bpe.encode_point("cafe\u{301} [rid:1]", 7).is_some());
}

/// The stack merge and the heap merge agree on every piece of a corpus.
#[test]
#[allow(clippy::expect_used)] // test fixtures
fn short_and_long_merges_agree() {
    let text = read(&root().join("assets/aiperf-coding/templates.json"));
    let (_, _, bpe) = both().into_iter().next().expect("qwen");
    let mut pieces = 0;
    for line in text.lines().take(3000) {
        for start in (0..line.len()).step_by(7) {
            let end = (start + 1 + (start * 31 % SHORT_PIECE)).min(line.len());
            let Some(piece) = line.get(start..end) else {
                continue;
            };
            if piece.len() < 2 {
                continue;
            }
            let (mut a, mut b) = (Vec::new(), Vec::new());
            bpe.merge_short(piece.as_bytes(), &mut a);
            bpe.merge_long(piece.as_bytes(), &mut b);
            assert_eq!(a, b, "{piece:?}");
            pieces += 1;
        }
    }
    assert!(pieces > 1000, "{pieces} pieces");
}

/// Anything but a byte-level BPE pipeline with a known split regex is left to `tokenizers`.
#[test]
#[allow(clippy::expect_used)] // test fixtures
fn other_pipelines_are_declined() {
    let word_level = br#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{"[UNK]":0,"a":1},"unk_token":"[UNK]"}}"#;
    let tok = Tokenizer::from_bytes(word_level, None).expect("loads");
    assert!(ByteLevelBpe::new(&tok).is_err());
    // Qwen3 with another normalizer: the same vocabulary, not the same ids.
    let json = std::fs::read(root().join("assets/tokenizers/qwen3/tokenizer.json")).expect("read");
    let mut doc: serde_json::Value = serde_json::from_slice(&json).expect("parses");
    assert_eq!(doc["normalizer"]["type"], "NFC");
    doc["normalizer"] = serde_json::json!({"type": "NFKC"});
    let nfkc = serde_json::to_string(&doc).expect("serializes");
    let tok = Tokenizer::from_bytes(nfkc.as_bytes(), None).expect("loads");
    let err = ByteLevelBpe::new(&tok).expect_err("NFKC declined");
    assert!(err.0.contains("byte-level"), "{err}");
}

/// The load check catches an encoder that differs: one merge removed.
#[test]
#[allow(clippy::expect_used)] // test fixtures
fn the_load_check_catches_a_difference() {
    let tok = qwen();
    let mut bpe = ByteLevelBpe::new(&tok).expect("accepted");
    assert!(bpe.check(tok.inner()).is_ok());
    let first = *bpe
        .merges
        .iter()
        .find(|(_, v)| *v >> 32 == 0)
        .expect("rank 0")
        .0;
    bpe.merges.remove(&first);
    // This thread's piece cache holds what the full merges gave: a new key, a new cache.
    bpe.id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    assert!(bpe.check(tok.inner()).is_err());
}

/// The ASCII split and the regex cut every text at the same places: random strings of the
/// fragments each alternative turns on (contractions in every case, runs of digits, spaces and
/// breaks of each kind, ASCII controls and the wide characters next to which the ASCII split
/// must give way), for both patterns. And it does the work: most pieces of ASCII text are its.
#[test]
fn the_ascii_split_cuts_where_the_regex_cuts() {
    let pool = [
        " ", "  ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x7f", "\0", "a",
        "Z", "word", " word", "'", "'s", "'S", "'t", "'re", "'RE", "'rE", "'ve", "'m", "'ll",
        "'Ll", "'d", "'x", "'r", "'l", "1", "12", "123", "1234", ".", ",", "!?", "((", "-->", "_",
        "{", "\\", "\"", "é", "ſ", "²", "١", "\u{a0}", "\u{85}", "\u{3000}", "\u{2028}", "«", "😀",
        "東", "K", "e\u{301}",
    ];
    let mut rng = rand_pcg::Pcg64::seed_from_u64(4404);
    for (name, _, bpe) in both() {
        let (mut fast, mut all) = (0usize, 0usize);
        for round in 0..20_000 {
            let n = rng.random_range(1..16);
            let text: String = (0..n)
                .map(|_| pool[rng.random_range(0..pool.len())])
                .collect();
            let mut pos = 0;
            while pos < text.len() {
                let want = bpe.regex_piece(&text, pos);
                if let Some(got) = ascii_piece(text.as_bytes(), pos, bpe.digits) {
                    assert_eq!(got, want, "{name}: {text:?} at {pos} (round {round})");
                    fast += 1;
                }
                all += 1;
                pos = want;
            }
        }
        assert!(
            fast * 2 > all,
            "{name}: the ASCII split took {fast} of {all} pieces"
        );
    }
}
