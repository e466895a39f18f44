//! AFL target `sse`: runs [`kvbust_fuzz::check_sse`] on each input. Owns nothing else.
#![forbid(unsafe_code)]

fn main() {
    afl::fuzz!(|data: &[u8]| {
        kvbust_fuzz::check_sse(data);
    });
}
