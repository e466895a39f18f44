//! AFL target `headers`: runs [`kvbust_fuzz::check_headers`] on each input. Owns nothing else.
#![forbid(unsafe_code)]

fn main() {
    afl::fuzz!(|data: &[u8]| {
        kvbust_fuzz::check_headers(data);
    });
}
