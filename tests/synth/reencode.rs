//! The local re-encode shortcut must equal the full decode → encode on every sequence shape
//! the fix-up loop produces: corpus windows (chunk joins, wrap-around, cut edges), a canonical
//! prefix joined to a window, a truncated re-encode, a re-encode with a window appended; and
//! whole datasets must be identical with the shortcut on and off.

use std::path::PathBuf;
use std::sync::OnceLock;

use kvbust::synth::corpus::sonnet::SHAKESPEARE;
use kvbust::synth::corpus::{random, RandomCorpusStyle, RandomPools};
use kvbust::synth::rng::PyRandom;
use kvbust::synth::tokenizer::reencode::{reencode, Pieces};
use kvbust::synth::tokenizer::{
    ENDS_WITH_DENSE, ENDS_WITH_LETTER, STARTS_WITH_DENSE, STARTS_WITH_SPACE,
};
use kvbust::synth::{compose, PromptCorpus, RangeRatio, SynthParams, TokenCorpus, Tokenizer};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/synth")
        .join(name)
}

struct Loaded {
    tokenizer: Tokenizer,
    sonnet: TokenCorpus,
}

fn load(name: &str) -> &'static Loaded {
    static QWEN: OnceLock<Loaded> = OnceLock::new();
    static LLAMA: OnceLock<Loaded> = OnceLock::new();
    let (cell, make): (&OnceLock<Loaded>, fn() -> Tokenizer) = match name {
        "qwen3" => (&QWEN, || Tokenizer::default_qwen3().unwrap()),
        _ => (&LLAMA, || {
            Tokenizer::from_path(&fixture("tokenizers/llama-3.2")).unwrap()
        }),
    };
    cell.get_or_init(|| {
        let tokenizer = make();
        let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("synth-corpus-cache");
        let sonnet = TokenCorpus::build_cached(SHAKESPEARE, &tokenizer, Some(&cache)).unwrap();
        Loaded { tokenizer, sonnet }
    })
}

fn full(t: &Tokenizer, tokens: &[u32]) -> Vec<u32> {
    t.encode(&t.decode(tokens).unwrap()).unwrap()
}

fn check(t: &Tokenizer, p: &Pieces, what: &str) {
    assert_eq!(reencode(t, p).unwrap(), full(t, &p.tokens), "{what}");
}

fn windows_agree(name: &str) {
    let l = load(name);
    let t = &l.tokenizer;
    assert!(t.boundary_flags().is_some(), "{name} should be eligible");
    let size = l.sonnet.len();
    let mut rng = PyRandom::new(20261130);
    let lengths = [1usize, 2, 3, 5, 8, 16, 33, 64, 129, 300, 1024, 1500];
    let mut n = 0;
    for round in 0..36 {
        for &k in &lengths {
            // Every third window starts just before a chunk join; one in 60 wraps around.
            let start = match round % 3 {
                0 => {
                    let joins = l.sonnet.joins();
                    let j = joins[rng.randrange(joins.len() as u64) as usize];
                    j.saturating_sub(rng.randrange(k as u64 + 1) as usize)
                }
                _ if round == 1 => size - k / 2 - 1,
                _ => rng.randrange(size as u64) as usize,
            };
            let w = l.sonnet.window(start, k);
            check(t, &w, &format!("{name} window {start}+{k}"));

            // Canonical prefix joined to a window (the prefix-pool shape).
            let pre_k = 1 + rng.randrange(12) as usize;
            let pre_start = rng.randrange(size as u64) as usize;
            let prefix = full(t, &l.sonnet.window(pre_start, pre_k).tokens);
            let mut joined = Pieces::canonical(prefix);
            joined.append(w.clone());
            check(t, &joined, &format!("{name} prefix+window {start}+{k}"));

            // Round-two shapes: a truncated re-encode, and a re-encode with a top-up window.
            let y = full(t, &w.tokens);
            let mut cut = Pieces::canonical(y.clone());
            cut.truncate(y.len().saturating_sub(1 + rng.randrange(3) as usize).max(1));
            check(t, &cut, &format!("{name} truncated {start}+{k}"));
            let mut topped = Pieces::canonical(y);
            topped.append(
                l.sonnet
                    .window(rng.randrange(size as u64) as usize, 1 + k % 7),
            );
            check(t, &topped, &format!("{name} topped-up {start}+{k}"));

            // Random-corpus shapes: consecutive ids (opaque), then a re-encode with an opaque
            // top-up, and a truncated re-encode of opaque ids.
            let base = rng.randrange(t.vocab_size() as u64) as u32;
            let ids: Vec<u32> = (0..k as u32)
                .map(|j| (base + j) % t.vocab_size() as u32)
                .collect();
            check(
                t,
                &Pieces::opaque(ids.clone()),
                &format!("{name} opaque {base}+{k}"),
            );
            let y = full(t, &ids);
            let mut mixed = Pieces::canonical(y.clone());
            let extra: Vec<u32> = (0..1 + k % 9)
                .map(|_| rng.randrange(t.vocab_size() as u64) as u32)
                .collect();
            mixed.append(Pieces::opaque(extra));
            check(t, &mixed, &format!("{name} canonical+opaque {base}+{k}"));
            let mut cut = Pieces::canonical(y.clone());
            cut.truncate(y.len().saturating_sub(1 + rng.randrange(3) as usize).max(1));
            check(t, &cut, &format!("{name} opaque truncated {base}+{k}"));
            n += 7;
        }
    }
    assert!(n >= 3000);
}

#[test]
fn qwen3_local_reencode_equals_full() {
    windows_agree("qwen3");
}

#[test]
fn llama_local_reencode_equals_full() {
    windows_agree("llama3.2");
}

#[test]
fn datasets_identical_with_shortcut_off() {
    let l = load("qwen3");
    let slow = Tokenizer::default_qwen3()
        .unwrap()
        .with_fast_reencode(false);
    assert!(slow.boundary_flags().is_none());
    for (seed, isl, prefix) in [(1u64, 1024u64, 0usize), (2, 37, 3), (3, 4000, 0), (4, 5, 2)] {
        let params = SynthParams {
            isl: Some(isl),
            osl: Some(16),
            random_seed: Some(seed),
            num_dataset_entries: Some(12),
            num_prefix_prompts: prefix,
            prefix_prompt_length: 9,
            session_turns_mean: 2.0,
            ..SynthParams::default()
        };
        let fast = compose(&params, &l.tokenizer, Some(&l.sonnet), &mut |_, _| {}).unwrap();
        let reference = compose(&params, &slow, Some(&l.sonnet), &mut |_, _| {}).unwrap();
        assert_eq!(fast, reference, "sonnet seed {seed} isl {isl}");
        let random = SynthParams {
            prompt_corpus: Some(PromptCorpus::Random),
            range_ratio: (seed % 2 == 0).then_some(RangeRatio {
                input: 0.5,
                output: 0.5,
                per_direction: false,
            }),
            ..params
        };
        let fast = compose(&random, &l.tokenizer, None, &mut |_, _| {}).unwrap();
        let reference = compose(&random, &slow, None, &mut |_, _| {}).unwrap();
        assert_eq!(fast, reference, "random seed {seed} isl {isl}");
    }
}

fn decode_agrees(name: &str) {
    let l = load(name);
    let t = &l.tokenizer;
    let total = t.inner().get_vocab_size(true) as u64;
    let mut rng = PyRandom::new(7);
    for i in 0..400u64 {
        let k = 1 + rng.randrange(300) as usize;
        let ids: Vec<u32> = if i % 2 == 0 {
            l.sonnet
                .window(rng.randrange(l.sonnet.len() as u64) as usize, k)
                .tokens
        } else {
            // Arbitrary ids, added tokens and ids past the vocabulary included.
            (0..k).map(|_| rng.randrange(total + 10) as u32).collect()
        };
        assert_eq!(
            t.decode(&ids).unwrap(),
            t.decode_reference(&ids).unwrap(),
            "{name} {ids:?}"
        );
    }
    // Every single id, so partial UTF-8 sequences are covered too.
    for id in 0..total as u32 {
        assert_eq!(
            t.decode(&[id]).unwrap(),
            t.decode_reference(&[id]).unwrap(),
            "{name} {id}"
        );
    }
}

#[test]
fn qwen3_byte_table_decode_equals_tokenizers() {
    decode_agrees("qwen3");
}

#[test]
fn llama_byte_table_decode_equals_tokenizers() {
    decode_agrees("llama3.2");
}

/// Random-corpus windows overlapping one another, so most of their pieces come from the piece
/// memo filled by earlier windows (and by other lengths, cut at other places).
fn overlapping_random_windows_agree(name: &str) {
    let t = &load(name).tokenizer;
    let v = t.vocab_size() as u32;
    let mut rng = PyRandom::new(11);
    for i in 0..240u32 {
        let base = (v - 3000 + rng.randrange(6000) as u32) % v;
        let k = 1 + rng.randrange(1500) as usize;
        let ids: Vec<u32> = (0..k as u32).map(|j| (base + j) % v).collect();
        let mut p = Pieces::opaque(ids);
        if i % 4 == 3 {
            // The fix-up's second round: a re-encode with random top-up ids appended.
            let mut next = Pieces::canonical(full(t, &p.tokens));
            let extra = (0..1 + i % 17).map(|_| rng.randrange(v as u64) as u32);
            next.append(Pieces::opaque(extra.collect()));
            p = next;
        }
        check(
            t,
            &p,
            &format!("{name} overlapping window {base}+{k} ({i})"),
        );
    }
    assert!(!t.piece_memo().is_empty());
}

#[test]
fn qwen3_memoized_random_windows_equal_full() {
    overlapping_random_windows_agree("qwen3");
}

#[test]
fn llama_memoized_random_windows_equal_full() {
    overlapping_random_windows_agree("llama3.2");
}

/// Every position of the random corpus's id cycle in its real context: the cycle cut into
/// chunks, twice (the second pass shifted by half a chunk, so each first-pass chunk edge lies
/// inside a chunk), each chunk re-encoded locally and in full. Covers every safe position the
/// shortcut finds in that cycle, dense-letter cuts included; the second pass is mostly served
/// from the memo the first one filled, from pieces cut in other contexts.
fn cycle_agrees(name: &str) -> (usize, usize, usize) {
    let t = &load(name).tokenizer;
    let ids = RandomPools::new(t, RandomCorpusStyle::Vllm).allowed;
    let n = ids.len();
    let chunk = 3000;
    for shift in [0, chunk / 2] {
        for start in (shift..n + shift).step_by(chunk) {
            let window: Vec<u32> = (start..start + chunk).map(|j| ids[j % n]).collect();
            check(
                t,
                &Pieces::opaque(window),
                &format!("{name} cycle {start}+{chunk}"),
            );
        }
    }
    // How much of the cycle the safe positions cut up: dense-letter cuts, and the longest
    // stretch without any safe position.
    let flags = t.boundary_flags().unwrap();
    let f = |id: u32| flags[id as usize];
    let (mut dense, mut longest, mut run) = (0, 0, 0);
    for i in 1..n {
        let (l, r) = (f(ids[i - 1]), f(ids[i]));
        let letter = l & ENDS_WITH_LETTER != 0 && r & STARTS_WITH_SPACE != 0;
        let cut = l & ENDS_WITH_DENSE != 0
            && r & STARTS_WITH_DENSE != 0
            && t.letter_cut(ids[i - 1], ids[i]);
        dense += usize::from(cut);
        run = if letter || cut { 0 } else { run + 1 };
        longest = longest.max(run);
    }
    (n, dense, longest)
}

#[test]
fn qwen3_whole_random_cycle_reencodes_exactly() {
    let (n, dense, longest) = cycle_agrees("qwen3");
    eprintln!("qwen3: {n} ids, {dense} dense-letter cuts, longest stretch {longest}");
    assert!(dense > 10_000, "{dense}");
}

#[test]
fn llama_whole_random_cycle_reencodes_exactly() {
    let (n, dense, longest) = cycle_agrees("llama3.2");
    eprintln!("llama3.2: {n} ids, {dense} dense-letter cuts, longest stretch {longest}");
}

#[test]
fn a_warmed_piece_memo_changes_no_prompt() {
    let warm = Tokenizer::default_qwen3().unwrap();
    RandomPools::new(&warm, RandomCorpusStyle::Vllm)
        .warm_piece_memo(&warm)
        .unwrap();
    assert!(
        warm.piece_memo().len() > 50_000,
        "{}",
        warm.piece_memo().len()
    );
    let slow = Tokenizer::default_qwen3()
        .unwrap()
        .with_fast_reencode(false);
    for (style, seed) in [
        (RandomCorpusStyle::Vllm, 3u64),
        (RandomCorpusStyle::Sglang, 4),
    ] {
        let params = SynthParams {
            prompt_corpus: Some(PromptCorpus::Random),
            random_corpus_style: style,
            isl: Some(1024),
            osl: Some(16),
            random_seed: Some(seed),
            num_dataset_entries: Some(16),
            range_ratio: Some(RangeRatio {
                input: 0.0,
                output: 0.0,
                per_direction: false,
            }),
            ..SynthParams::default()
        };
        let fast = compose(&params, &warm, None, &mut |_, _| {}).unwrap();
        let reference = compose(&params, &slow, None, &mut |_, _| {}).unwrap();
        assert_eq!(fast, reference, "{style:?}");
    }
}

#[test]
fn a_piece_memo_read_from_its_cache_file_changes_no_prompt() {
    let dir = crate::common::test_dir().join("piece-memo-cache");
    let _ = std::fs::remove_dir_all(&dir);
    let first = Tokenizer::default_qwen3().unwrap();
    assert!(!random::load_piece_memo(&first, &dir), "no file yet");
    RandomPools::new(&first, RandomCorpusStyle::Vllm)
        .warm_piece_memo(&first)
        .unwrap();
    random::save_piece_memo(&first, &dir);
    let second = Tokenizer::default_qwen3().unwrap();
    assert!(random::load_piece_memo(&second, &dir));
    assert_eq!(second.piece_memo().len(), first.piece_memo().len());
    let slow = Tokenizer::default_qwen3()
        .unwrap()
        .with_fast_reencode(false);
    let params = SynthParams {
        prompt_corpus: Some(PromptCorpus::Random),
        isl: Some(700),
        osl: Some(16),
        random_seed: Some(8),
        num_dataset_entries: Some(16),
        ..SynthParams::default()
    };
    let fast = compose(&params, &second, None, &mut |_, _| {}).unwrap();
    let reference = compose(&params, &slow, None, &mut |_, _| {}).unwrap();
    assert_eq!(fast, reference);

    // A damaged file adds nothing.
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    let third = Tokenizer::default_qwen3().unwrap();
    assert!(!random::load_piece_memo(&third, &dir));
    assert!(third.piece_memo().is_empty());
}
