//! `replay TARGET PATH...`: runs one target's check on files and on every file in folders
//! (a corpus, a crash), outside AFL, and says how many passed. Never writes anything.
#![forbid(unsafe_code)]

use std::path::PathBuf;

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_default();
    let Some((_, check)) = kvbust_fuzz::TARGETS.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = kvbust_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
        eprintln!(
            "usage: replay TARGET PATH...  (TARGET: {})",
            names.join(", ")
        );
        std::process::exit(2);
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for a in args {
        let p = PathBuf::from(a);
        match std::fs::read_dir(&p) {
            Ok(dir) => files.extend(dir.flatten().map(|e| e.path()).filter(|p| p.is_file())),
            Err(_) => files.push(p),
        }
    }
    files.sort();
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        eprintln!("{}", f.display());
        check(&data);
    }
    println!("{name}: {} inputs passed", files.len());
}
