//! Names the source revision for `kvbust_build_info{revision}`: `VCS_REF` when set (a Docker
//! build, whose context has no .git: `docker build --build-arg VCS_REF=$(git rev-parse HEAD)`),
//! else the git commit of the checkout, else "unknown". Not `KVBUST_`-prefixed: kvbust reads
//! every `KVBUST_*` variable as configuration.
// A build script's inputs are environment variables: this is its edge.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=VCS_REF");
    let from_env = std::env::var("VCS_REF")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let revision = from_env.or_else(|| {
        // Rebuild when HEAD moves: HEAD itself, and the branch it points to (in the common git
        // dir, which a worktree shares). Only files that exist, or cargo would rerun every time.
        for (dir_arg, file) in [("--git-dir", "HEAD"), ("--git-common-dir", "packed-refs")] {
            if let Some(dir) = git(&["rev-parse", dir_arg]) {
                let p = Path::new(&dir).join(file);
                if p.exists() {
                    println!("cargo:rerun-if-changed={}", p.display());
                }
            }
        }
        if let (Some(common), Some(name)) = (
            git(&["rev-parse", "--git-common-dir"]),
            git(&["symbolic-ref", "-q", "HEAD"]),
        ) {
            let p = Path::new(&common).join(name);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
        git(&["rev-parse", "--short=12", "HEAD"])
    });
    println!(
        "cargo:rustc-env=BUILD_REVISION={}",
        revision.as_deref().unwrap_or("unknown")
    );
}
