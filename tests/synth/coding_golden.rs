//! Golden digests of the coding corpora's bytes for fixed seeds, so a refactor of the generators,
//! their word lists or the hash-id blocks cannot change a prompt silently. The digests were
//! computed from the code before the word lists moved to `assets/` and the generators were split
//! (issue 15); any change to them is a change of every `coding-exact` prompt (or every `coding`
//! prompt) and must be deliberate.

use std::sync::{Arc, OnceLock};

use kvbust::synth::corpus::aiperf_coding::{self, CodingPool, CodingPrompts};
use kvbust::synth::corpus::kvbust_coding::{self, Category};
use kvbust::synth::Tokenizer;
use sha2::{Digest, Sha256};

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::default_qwen3().expect("embedded tokenizer loads"))
}

/// `coding-exact`: the whole corpus text per seed, and per category the digest of its blocks'
/// texts joined in corpus order (so a failure names the generator that changed).
#[test]
fn coding_exact_blocks_are_pinned() {
    const WANT: &[(u64, &str, [&str; 8])] = &[
        (
            0,
            "09c3948f2601c0ea2d962be20556c8543713856449a84f781211a3227535f81c",
            [
                "d6080e6636136b2a948f50eebe486709c9c8444c20d11ae5b47ef4255fa44dd1",
                "87cdca64f09914ee54d8b94a0a07689e44ae1c098475799fda4aeed5771172c0",
                "e1ca53c2f131a4e2627ec297a33008fb3f1aff134c29393cc88d88d5b0d15cba",
                "bca74bb68df15258fade093ee9cda8b33f8402d90238e3f080d822fd774bcd66",
                "edc57a6b706c60d2af582beb746a27721169a18d7d7e06bb3a98ffbff8f22c62",
                "033b31fbe17b6d0ef3051ac0037531f727244a1bb5868580a05d2f7cae80a161",
                "5a2815c94dc9656274d8c5c0912dfbffd8d94fc6795a8f7d640acb103585e27b",
                "dbd0fa54fd0618bd51858ee0d7cfc271e22f9c29a60ec5827ff7c36989fb5a6f",
            ],
        ),
        (
            42,
            "d9361d53bc280ecb698cc27f8274924b46518bff4b6f84f54beb538382907754",
            [
                "bfa0a40683916bf366f430a95f817db0bcc2057e6d4b99d5144f4a9f3df5995a",
                "312e1dd6cf1b4d4004f56d1bf7a5ad5a605e19c037ccd2f470ad54b10021ee9d",
                "88ba06acd878d17b0abdd20c3b584f5f1dd8beda65384b3f1b94216b61a9fcd9",
                "3b69226d177f999a414ec191f8e2a75d045d6f050c7468efa9866164544ad35a",
                "2510fb9ce93ebcedde55bb3b4a5f2a7fd781e74a2b84112c0bdb770bdb646f48",
                "84c562c86c8e035f991926ad49ea97b5dc8111ee587b23acdb66e648eda68808",
                "7ccc24d11032659aa53652a49269d9a6fdbb154fd701720b9b2291096dcbcd1b",
                "b52e9d6de20ee7e0459a8fe61dffe471cd933dd796faf77857535c205e34254f",
            ],
        ),
        (
            7,
            "2273167edc7abd37ca70e7ad950216c43dd43580b6e5beba1d83a3ee47b5fddc",
            [
                "bfcb4a079d2061ee1d544dd417c587ad24105472acc26879c81c0addfa1d7d0c",
                "a32d8b495db92539a5467993c0ba2d15ca09f527b1a68b4a1ad4b399c20cf7d5",
                "a1cf53717f8229ca0952628b6494c96cf60a5809742c99607607a1bc0e2ba7e9",
                "68d21a0d3c282dba873ab0832fd93f4c3c137291bb2d3b2a9115b776440139df",
                "fe572eadd9ad8b560b6c0553c4c5b02bd3d666f334356f5393071862add28570",
                "0f669fff1f064e19f64990bf584ec42104ba1ca19faefec16fe579c4aaefbd02",
                "a42aa2ea07e8d445a8ce9d7df0a9c9a43a4d3559a19aebc7a49f1db92650415b",
                "d3753ca019a5691a65f61c25e68bcaf72c5269d5148ffe8dce88ee60a31f43a4",
            ],
        ),
    ];
    for (seed, whole, per_category) in WANT {
        let blocks = kvbust_coding::blocks(*seed);
        for (c, want) in Category::ALL.iter().zip(per_category) {
            let text: Vec<&str> = blocks
                .iter()
                .filter(|b| b.category == *c)
                .map(|b| b.text.as_str())
                .collect();
            assert_eq!(
                sha(text.join("\n\n").as_bytes()),
                *want,
                "seed {seed} category {c}"
            );
        }
        assert_eq!(
            sha(kvbust_coding::corpus_text(&blocks).as_bytes()),
            *whole,
            "seed {seed}"
        );
    }
}

/// AIPerf's `coding` corpus: the pool text (before tokenization) for three seeds.
#[test]
fn coding_pool_text_is_pinned() {
    const WANT: &[(u64, &str)] = &[
        (
            0,
            "ce6c1a1eadc7babc58ec6d971b1b30c9873cc546ba8619ee98b84b0bc56f36e1",
        ),
        (
            42,
            "e7a6daeed88b5ef43fc725c8e8b6f0b19679dd692c03a8d906a49661efa590ec",
        ),
        (
            7,
            "d6cef5daff6fcd1d9982a2549052ff772a2966938d81ec034b67192f44656e5f",
        ),
    ];
    for (seed, want) in WANT {
        let text = aiperf_coding::pool_blocks(*seed, 1.0)
            .unwrap()
            .join(aiperf_coding::SEPARATOR);
        assert_eq!(sha(text.as_bytes()), *want, "seed {seed}");
    }
}

/// AIPerf's `coding` corpus: prompts (plain windows and hash-id blocks with their cache, a
/// partial last block and a sampled tail) for one seed, with Qwen3.
#[test]
fn coding_prompts_are_pinned() {
    const WANT: &str = "cea36827adf3a9dfae2ba4e0210ec5db2f98304f9df938834377acb11c9f8953";
    let pool = Arc::new(CodingPool::build(5, tokenizer()).unwrap());
    let mut gen = CodingPrompts::new(pool, tokenizer());
    gen.set_trace_id("0123456789abcdef");
    let mut all = String::new();
    for n in [1usize, 17, 256, 1000] {
        all.push_str(&gen.prompt(tokenizer(), n, None).unwrap());
        all.push('\u{0}');
    }
    // Exact tile, reuse of cached ids with a partial last block, a tail past the ids.
    for (n, ids) in [
        (96usize, vec![1u64, 2, 3]),
        (80, vec![1, 2, 9]),
        (200, vec![3, 4]),
    ] {
        all.push_str(&gen.hash_id_prompt(tokenizer(), n, &ids, 32).unwrap());
        all.push('\u{0}');
    }
    assert_eq!(sha(all.as_bytes()), WANT);
}
