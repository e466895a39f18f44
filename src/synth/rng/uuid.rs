//! Unseeded uuid4 strings: AIPerf's session ids when no seed is given.
//! Owns that format; the one place in `rng` that draws OS entropy, on purpose (AIPerf's
//! unseeded ids are random too), and must never be used where a seed decides the output.

/// A random uuid4 string (AIPerf's session ids without a seed).
pub fn uuid4() -> String {
    let b: [u8; 16] = rand::random();
    let mut b = b;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}
