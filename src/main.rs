//! The `kvbust` binary: parse the command line and hand over to the library. Nothing else.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

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
