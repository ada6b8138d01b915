//! Temporary entry point for the `ca` and `cert` commands while the proxy core is built on
//! `main`; the real `main.rs` replaces this file and calls the same library functions.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ironic_proxy::pki::{run_ca, run_cert, CaCommand, CertCommand};

#[derive(Parser, Debug)]
#[command(name = "ironic-proxy", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Certificate authority commands.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Leaf certificate commands.
    #[command(subcommand)]
    Cert(CertCommand),
}

fn main() -> ExitCode {
    // clap exits with 2 on a usage error and 0 for --help.
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ca(cmd) => run_ca(cmd),
        Command::Cert(cmd) => run_cert(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {:#}", anyhow::Error::new(err));
            ExitCode::from(1)
        }
    }
}
