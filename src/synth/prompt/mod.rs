//! Prompts of a target length: AIPerf's prompt generator over a corpus, the long-lived prompt
//! streams the proxy draws from, and the `{{kvbust:prompt:N}}` placeholders that ask for them.
//! Owns prompt sampling; must never shape a dataset (turns, sessions, timing: `dataset`).

pub mod generator;
pub mod placeholders;
pub mod stream;
