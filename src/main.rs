//! The `kvbust` binary: parse the command line and hand over to the library. Nothing else.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

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
