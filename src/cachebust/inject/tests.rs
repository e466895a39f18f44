//! Unit tests for the body rewrite: every payload vector, transparency, bad input.
