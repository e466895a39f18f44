//! AFL target `rewrite`: runs [`kvbust_fuzz::check_rewrite`] on each input. Owns nothing else.
#![forbid(unsafe_code)]

fn main() {
    afl::fuzz!(|data: &[u8]| {
        kvbust_fuzz::check_rewrite(data);
    });
}
