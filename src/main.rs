//! The `kvbust` binary: parse the command line and hand over to the library. Nothing else.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

// jemalloc, its background threads purging freed pages after its 10 s decay: after a burst of
// 30 large chats glibc's malloc still held 443 MB a minute later, jemalloc 88 MB, at no cost in
// throughput (benches/README.md, "The allocator").
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = kvbust::cli::Cli::parse();
    match kvbust::app::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The whole cause chain: typed errors keep the detail in their sources.
            eprintln!("kvbust: {}", kvbust::error::error_chain(&e));
            e.exit_code()
        }
    }
}
