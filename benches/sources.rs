//! Files the tokenizer benches read, shared by `benches/tokenizer.rs` and
//! `benches/model_tokens.rs` (a module of each, not a bench of its own: `autobenches = false`).

use std::path::PathBuf;

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `.rs` files of `dirs` (under the root), each folder's in name order, one after another:
/// real code to tokenize.
pub fn rust_sources(dirs: &[&str]) -> String {
    let mut code = String::new();
    for dir in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
            .expect("source folder")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        files.sort();
        for p in files {
            code.push_str(&std::fs::read_to_string(&p).expect("source file"));
        }
    }
    code
}
