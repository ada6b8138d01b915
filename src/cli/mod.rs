//! The command-line subcommands whose work is more than a call into one module: the `ca` and
//! `cert` commands ([`pki`]), which write what [`crate::pki`] mints to files, `kit secrets`
//! ([`kit`]), `kit check` ([`kit_check`]), and what `--version` says ([`version`]). The
//! argument parsing of the other commands stays in `main.rs`.

pub mod ca_dir;
pub mod kit;
pub mod kit_check;
pub mod pki;
pub mod version;
