//! AFL target `rewrite_json`: runs [`kvbust_fuzz::check_rewrite_json`] on each input. Owns nothing else.
#![forbid(unsafe_code)]

fn main() {
    afl::fuzz!(|data: &[u8]| {
        kvbust_fuzz::check_rewrite_json(data);
    });
}
