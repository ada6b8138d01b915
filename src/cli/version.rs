//! `--version`: what a binary is, for a bug report or an audit: the version, the commit it was
//! built from, how it was built and which crypto module it carries.
//!
//! The commit and the build kind come from variables the build scripts set
//! (`IRONIC_PROXY_COMMIT`, `IRONIC_PROXY_BUILD_KIND`: the Dockerfile, scripts/build-image,
//! scripts/build-pgo, scripts/release), read at compile time with `option_env!`. A plain
//! `cargo build` has neither: it says `commit unknown` rather than guess from a work tree that
//! may differ from what was compiled, and its kind follows the profile (`debug` or `release`).

use std::sync::OnceLock;

/// The version from Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit this binary was built from, as the build scripts passed it; `unknown` otherwise.
pub const COMMIT: &str = match option_env!("IRONIC_PROXY_COMMIT") {
    Some(c) if !c.is_empty() => c,
    _ => "unknown",
};

/// `pgo` (scripts/build-pgo: profile-guided, BOLT-laid-out), `release` or `debug`.
pub const BUILD_KIND: &str = match option_env!("IRONIC_PROXY_BUILD_KIND") {
    Some(k) if !k.is_empty() => k,
    _ => {
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    }
};

/// The crypto module rustls and rcgen use (src/crypto), by build feature.
pub const CRYPTO: &str = if cfg!(feature = "fips") {
    "aws-lc-rs FIPS (the AWS-LC FIPS 140-3 module)"
} else {
    "aws-lc-rs (AWS-LC)"
};

/// The text `--version` prints after the program name: the version, then one line each for
/// commit, build and crypto.
pub fn long() -> &'static str {
    static LONG: OnceLock<String> = OnceLock::new();
    LONG.get_or_init(|| {
        format!("{VERSION}\ncommit: {COMMIT}\nbuild: {BUILD_KIND}\ncrypto: {CRYPTO}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_version_names_version_commit_build_and_crypto() {
        let lines: Vec<&str> = long().lines().collect();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(lines[0], env!("CARGO_PKG_VERSION"));
        assert!(lines[1].starts_with("commit: ") && lines[1].len() > "commit: ".len());
        assert!(["debug", "release", "pgo"].contains(&&lines[2]["build: ".len()..]));
        assert!(lines[3].starts_with("crypto: aws-lc-rs"), "{}", lines[3]);
        assert_eq!(lines[3].contains("FIPS 140-3"), cfg!(feature = "fips"));
    }
}
