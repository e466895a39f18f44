//! The `kvbust` binary: parse the command line and hand over to the library. Nothing else.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

// Per-request buffers and header maps are small, short-lived allocations on every worker thread;
// mimalloc's thread-local free lists serve them faster than glibc's arenas (see benches/README.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = kvbust::cli::Cli::parse();
    match kvbust::app::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvbust: {e}");
            e.exit_code()
        }
    }
}
