//! Cache-bust engine: targets, markers, session identity and the pure body rewrite. Never does I/O.
//!
//! Reproduces AIPerf 0.13.0's cache-bust targets (`shared/spec/aiperf-semantics.md` §1) for
//! request bodies written by any client. Layout:
//! * [`target`]: the seven targets and the two phases (parsing, wire names);
//! * [`marker`]: the RID digest and the exact marker strings;
//! * [`salt`]: isolation by `cache_salt` (`cache_bust.method = "salt"`): the salt and its edit;
//! * [`identity`]: the bounded session ledger (AIPerf's per-session counter);
//! * [`inject`]: parse a body once and splice the marker into its raw bytes (with
//!   [`crate::json`], the span toolkit the other request steps share).
//!
//! The proxy's flow: resolve target and phase → if `build_marker` gives `None`, forward
//! untouched → else `parse` the body, resolve the session (`Parsed::user_field`,
//! `Parsed::first_user_turn_hash`, headers) in the [`Ledger`] → `build_marker` → `apply`.

pub mod identity;
pub mod inject;
pub mod marker;
pub mod salt;
pub mod target;

pub use identity::{KeyDigest, Ledger, Resolution};
pub use inject::{parse, ListParts, Location, Outcome, Parsed, Plan, RewriteError};
pub use marker::{
    base_trace_id, build_marker, digest, random_benchmark_id, DigestInputs, WARMUP_ISOLATION_MARKER,
};
pub use salt::{Method, ParseMethodError};
pub use target::{ParsePhaseError, ParseTargetError, Phase, Target};
