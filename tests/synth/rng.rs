//! The RNG ports against `rng_reference` in `tests/fixtures/synth/prompts.json` (AIPerf 0.13.0,
//! CPython 3.11.7, numpy 2.4.6).

use kvbust::synth::rng::{derive_seed, fold_seed_to_u32, NumpyGenerator, PyRandom, RandomState};
use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::Value;

fn reference() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/synth/prompts.json"
    ))
    .expect("fixture prompts.json");
    let v: Value = serde_json::from_str(&text).expect("valid JSON");
    v["rng_reference"].clone()
}

/// The gauss vectors of one seed, parsed exactly from the fixture text: serde_json's default
/// float parser can be one ulp off, so the raw number text goes through `str::parse`.
fn exact_gauss(seed: &str) -> Vec<f64> {
    type Obj<'a> = HashMap<String, &'a RawValue>;
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/synth/prompts.json"
    ))
    .expect("fixture prompts.json");
    let root: Obj = serde_json::from_str(&text).expect("object");
    let rr: Obj = serde_json::from_str(root["rng_reference"].get()).expect("object");
    let py: HashMap<String, Obj> = serde_json::from_str(rr["python_random"].get()).expect("object");
    let raw: Vec<&RawValue> =
        serde_json::from_str(py[seed]["gauss_128_20_x4"].get()).expect("array");
    raw.iter()
        .map(|r| r.get().parse::<f64>().expect("float"))
        .collect()
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("u64"))
        .collect()
}

#[test]
fn derived_seeds() {
    let r = reference();
    let mut n = 0;
    for (root, ids) in r["derived_seeds"].as_object().unwrap() {
        let root: u64 = root.parse().unwrap();
        for (ident, want) in ids.as_object().unwrap() {
            assert_eq!(
                derive_seed(root, ident),
                want.as_u64().unwrap(),
                "{root}:{ident}"
            );
            n += 1;
        }
    }
    assert!(n >= 30);
}

#[test]
fn cpython_random() {
    let r = reference();
    for (seed, case) in r["python_random"].as_object().unwrap() {
        let seed: u64 = seed.parse().unwrap();
        let mut g = PyRandom::new(seed);
        let got: Vec<u64> = (0..5).map(|_| g.getrandbits(32)).collect();
        assert_eq!(got, u64s(&case["getrandbits32_x5"]), "seed {seed}");
        let mut g = PyRandom::new(seed);
        let got: Vec<u64> = (0..5).map(|_| g.randrange(1_200_000)).collect();
        assert_eq!(got, u64s(&case["randrange_1200000_x5"]), "seed {seed}");
        let mut g = PyRandom::new(seed);
        let got: Vec<u64> = (0..8).map(|_| g.choice_index(2) as u64).collect();
        assert_eq!(got, u64s(&case["choice_range2_x8"]), "seed {seed}");
        let mut g = PyRandom::new(seed);
        let got: Vec<f64> = (0..4).map(|_| g.gauss(128.0, 20.0)).collect();
        assert_eq!(got, exact_gauss(&seed.to_string()), "seed {seed}");
    }
}

#[test]
fn numpy_default_rng() {
    let r = reference();
    for (seed, case) in r["numpy_default_rng_pcg64"].as_object().unwrap() {
        let seed: u128 = seed.parse().unwrap();
        let mut g = NumpyGenerator::new(seed);
        let got: Vec<u64> = (0..3).map(|_| g.next_u64()).collect();
        assert_eq!(got, u64s(&case["raw_uint64_x3"]), "seed {seed}");

        let mut g = NumpyGenerator::new(seed);
        let got: Vec<u64> = (0..5).map(|_| g.integers(0, 151_643) as u64).collect();
        assert_eq!(got, u64s(&case["integers_0_151643_x5"]), "seed {seed}");

        let seq = &case["isl_64_193_x3_then_osl_8_25_x3_then_offsets_x3"];
        let mut g = NumpyGenerator::new(seed);
        for (k, (lo, hi)) in [(64, 193), (8, 25), (0, 151_643)].into_iter().enumerate() {
            let got: Vec<u64> = g
                .integers_n(lo, hi, 3)
                .into_iter()
                .map(|x| x as u64)
                .collect();
            assert_eq!(got, u64s(&seq[k]), "seed {seed} group {k}");
        }

        let mut g = NumpyGenerator::new(seed);
        let mut items: Vec<u64> = (0..10).collect();
        g.shuffle(&mut items);
        assert_eq!(items, u64s(&case["shuffle_range10"]), "seed {seed}");
    }
}

#[test]
fn numpy_legacy_random_state() {
    let r = reference();
    for (seed, case) in r["numpy_randomstate_mt19937"].as_object().unwrap() {
        let seed: u32 = seed.parse().unwrap();
        let mut g = RandomState::new(seed);
        let got: Vec<u64> = (0..3).map(|_| u64::from(g.next_u32())).collect();
        assert_eq!(got, u64s(&case["tomaxint_raw_u32_x3"]), "seed {seed}");

        let seq = &case["randint_64_129_x3_then_8_17_x3_then_0_151643_x3"];
        let mut g = RandomState::new(seed);
        for (k, (lo, hi)) in [(64, 129), (8, 17), (0, 151_643)].into_iter().enumerate() {
            let got: Vec<u64> = g
                .randint_n(lo, hi, 3)
                .into_iter()
                .map(|x| x as u64)
                .collect();
            assert_eq!(got, u64s(&seq[k]), "seed {seed} group {k}");
        }
    }
}

#[test]
fn seed_folding() {
    let r = reference();
    for (seed, want) in r["fold_seed_to_uint32_examples"].as_object().unwrap() {
        let seed: u64 = seed.parse().unwrap();
        assert_eq!(u64::from(fold_seed_to_u32(seed)), want.as_u64().unwrap());
    }
}
