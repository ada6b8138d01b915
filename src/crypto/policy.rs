//! `[tls]`: the process-wide TLS policy (minimum protocol version, cipher suites, key-exchange
//! groups), applied to every TLS listener and to TLS towards peers.
//!
//! Names are accepted as IANA spells them (`TLS_AES_128_GCM_SHA256`,
//! `TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256`) and as OpenSSL does (`ECDHE-ECDSA-AES128-GCM-SHA256`,
//! the form OpenShift's TLS security profiles use), groups as IANA (`secp256r1`) or NIST
//! (`P-256`) names. What rustls with aws-lc-rs does not implement (finite-field DHE, CBC, RSA
//! key exchange) is a config error naming the key, never silently dropped.
//!
//! The policy is fixed for the life of the process: [`install`] stores it once at start-up,
//! before any TLS configuration is built, and [`crate::crypto::provider`] and the protocol
//! versions read it from there.

use rustls::crypto::aws_lc_rs::{kx_group, ALL_CIPHER_SUITES};
use rustls::crypto::SupportedKxGroup;
use rustls::{CipherSuite, SupportedCipherSuite, SupportedProtocolVersion};
use serde::Deserialize;
use std::fmt::Write as _;
use std::sync::OnceLock;

type FieldSource = Box<dyn std::error::Error + Send + Sync>;

use crate::error::Message as Msg;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MinVersion {
    Tls12,
    Tls13,
}

/// The effective policy. `None` lists mean rustls' defaults for this provider.
#[derive(Clone, Debug)]
pub struct TlsPolicy {
    pub min_version: MinVersion,
    pub cipher_suites: Option<Vec<SupportedCipherSuite>>,
    pub groups: Option<Vec<&'static dyn SupportedKxGroup>>,
}

impl Default for TlsPolicy {
    fn default() -> Self {
        Self {
            min_version: MinVersion::Tls12,
            cipher_suites: None,
            groups: None,
        }
    }
}

/// Every suite rustls offers with aws-lc-rs: (IANA name, OpenSSL name, suite).
const SUITES: &[(&str, &str, CipherSuite)] = &[
    (
        "TLS_AES_128_GCM_SHA256",
        "TLS_AES_128_GCM_SHA256",
        CipherSuite::TLS13_AES_128_GCM_SHA256,
    ),
    (
        "TLS_AES_256_GCM_SHA384",
        "TLS_AES_256_GCM_SHA384",
        CipherSuite::TLS13_AES_256_GCM_SHA384,
    ),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        "TLS_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-RSA-CHACHA20-POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// Groups by the names operators use; the first name of each is the one printed.
fn group(name: &str) -> Option<&'static dyn SupportedKxGroup> {
    Some(match name {
        "X25519" | "x25519" => kx_group::X25519,
        "secp256r1" | "P-256" | "prime256v1" => kx_group::SECP256R1,
        "secp384r1" | "P-384" => kx_group::SECP384R1,
        "X25519MLKEM768" => kx_group::X25519MLKEM768,
        "SecP256r1MLKEM768" => kx_group::SECP256R1MLKEM768,
        "MLKEM768" => kx_group::MLKEM768,
        "MLKEM1024" => kx_group::MLKEM1024,
        _ => return None,
    })
}

fn group_name(g: &dyn SupportedKxGroup) -> String {
    format!("{:?}", g.name())
}

fn suite_name(s: SupportedCipherSuite) -> &'static str {
    SUITES
        .iter()
        .find(|(_, _, c)| *c == s.suite())
        .map_or("?", |(iana, _, _)| iana)
}

fn is_tls13(s: SupportedCipherSuite) -> bool {
    matches!(s, SupportedCipherSuite::Tls13(_))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    min_version: Option<String>,
    cipher_suites: Option<Vec<String>>,
    groups: Option<Vec<String>>,
}

/// Converts the `[tls]` table; each bad field goes to `error` with its key path.
pub(crate) fn from_toml(v: toml::Value, error: &mut dyn FnMut(String, FieldSource)) -> TlsPolicy {
    let raw: RawTls = match crate::error::toml_table(v, "tls") {
        Ok(r) => r,
        Err((at, message)) => {
            error(at, Box::new(message));
            return TlsPolicy::default();
        }
    };
    let mut p = TlsPolicy::default();
    match raw.min_version.as_deref() {
        None | Some("1.2") => {}
        Some("1.3") => p.min_version = MinVersion::Tls13,
        Some(other) => error(
            "tls.min_version".into(),
            Box::new(Msg(format!("{other:?} is not \"1.2\" or \"1.3\""))),
        ),
    }
    if let Some(names) = raw.cipher_suites {
        let mut suites = Vec::new();
        for (i, n) in names.iter().enumerate() {
            let found = SUITES
                .iter()
                .find(|(iana, openssl, _)| n == iana || n == openssl)
                .and_then(|(_, _, c)| ALL_CIPHER_SUITES.iter().find(|s| s.suite() == *c));
            match found {
                Some(s) if cfg!(feature = "fips") && !s.fips() => error(
                    format!("tls.cipher_suites[{i}]"),
                    Box::new(Msg(format!(
                        "{n:?} is not FIPS-approved (this is a FIPS build)"
                    ))),
                ),
                Some(s) if !suites.contains(s) => suites.push(*s),
                Some(_) => error(
                    format!("tls.cipher_suites[{i}]"),
                    Box::new(Msg(format!("{n:?} is listed twice"))),
                ),
                None => {
                    error(
                        format!("tls.cipher_suites[{i}]"),
                        Box::new(Msg(format!(
                        "unknown or unsupported cipher suite {n:?} (supported: {}; finite-field \
                         DHE, CBC and RSA key exchange are not implemented)",
                        SUITES.iter().map(|(i, _, _)| *i).collect::<Vec<_>>().join(", ")
                    ))),
                    )
                }
            }
        }
        if suites.is_empty() && !names.is_empty() {
            // Each bad name was reported above.
        } else if suites.is_empty() {
            error(
                "tls.cipher_suites".into(),
                Box::new(Msg("must not be empty".into())),
            );
        } else if p.min_version == MinVersion::Tls13 && !suites.iter().any(|s| is_tls13(*s)) {
            error(
                "tls.cipher_suites".into(),
                Box::new(Msg(
                    "min_version = \"1.3\" but no TLS 1.3 suite is listed (TLS_AES_128_GCM_SHA256, \
                     TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256)"
                        .into(),
                )),
            );
        }
        p.cipher_suites = Some(suites);
    }
    if let Some(names) = raw.groups {
        let mut groups: Vec<&'static dyn SupportedKxGroup> = Vec::new();
        for (i, n) in names.iter().enumerate() {
            match group(n) {
                Some(g) if cfg!(feature = "fips") && !g.fips() => error(
                    format!("tls.groups[{i}]"),
                    Box::new(Msg(format!(
                        "{n:?} is not FIPS-approved (this is a FIPS build)"
                    ))),
                ),
                Some(g) if !groups.iter().any(|h| h.name() == g.name()) => groups.push(g),
                Some(_) => error(
                    format!("tls.groups[{i}]"),
                    Box::new(Msg(format!("{n:?} is listed twice"))),
                ),
                None => error(
                    format!("tls.groups[{i}]"),
                    Box::new(Msg(format!(
                        "unknown or unsupported group {n:?} (supported: X25519, secp256r1 \
                         (P-256), secp384r1 (P-384), X25519MLKEM768, SecP256r1MLKEM768, MLKEM768, \
                         MLKEM1024)"
                    ))),
                ),
            }
        }
        if names.is_empty() {
            error(
                "tls.groups".into(),
                Box::new(Msg("must not be empty".into())),
            );
        }
        p.groups = Some(groups);
    }
    p
}

static INSTALLED: OnceLock<TlsPolicy> = OnceLock::new();

/// Fixes the process's policy; the first call wins (a process runs one configuration).
pub(crate) fn install(p: &TlsPolicy) {
    let _ = INSTALLED.set(p.clone());
}

/// The process's policy (the default until [`install`]).
pub(crate) fn current() -> &'static TlsPolicy {
    static DEFAULT: OnceLock<TlsPolicy> = OnceLock::new();
    INSTALLED
        .get()
        .unwrap_or_else(|| DEFAULT.get_or_init(TlsPolicy::default))
}

impl TlsPolicy {
    /// Restricts `p` to the policy's suites (in the configured order) and groups.
    pub fn apply(&self, p: &mut rustls::crypto::CryptoProvider) {
        let min13 = self.min_version == MinVersion::Tls13;
        if let Some(suites) = &self.cipher_suites {
            p.cipher_suites.clone_from(suites);
        }
        p.cipher_suites.retain(|s| !min13 || is_tls13(*s));
        if let Some(groups) = &self.groups {
            p.kx_groups.clone_from(groups);
        }
    }

    /// True when the operator fixed the suites' order.
    pub fn orders_suites(&self) -> bool {
        self.cipher_suites.is_some()
    }

    pub fn versions(&self) -> &'static [&'static SupportedProtocolVersion] {
        static TLS13_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
        static BOTH: &[&SupportedProtocolVersion] =
            &[&rustls::version::TLS13, &rustls::version::TLS12];
        match self.min_version {
            MinVersion::Tls13 => TLS13_ONLY,
            MinVersion::Tls12 => BOTH,
        }
    }

    /// The effective policy as a `[tls]` table (what `check` prints): defaults filled in.
    pub fn render(&self) -> String {
        let mut p = super::base_provider();
        self.apply(&mut p);
        let suites: Vec<String> = p
            .cipher_suites
            .iter()
            .map(|s| format!("\"{}\"", suite_name(*s)))
            .collect();
        let groups: Vec<String> = p
            .kx_groups
            .iter()
            .map(|g| format!("\"{}\"", group_name(*g)))
            .collect();
        let mut o = format!(
            "[tls]\n# crypto: aws-lc-rs, FIPS module: {}\n",
            if p.fips() { "yes" } else { "no" }
        );
        let v = match self.min_version {
            MinVersion::Tls12 => "1.2",
            MinVersion::Tls13 => "1.3",
        };
        let _ = writeln!(o, "min_version = \"{v}\"");
        let _ = writeln!(o, "cipher_suites = [{}]", suites.join(", "));
        let _ = writeln!(o, "groups = [{}]", groups.join(", "));
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> (TlsPolicy, Vec<String>) {
        let v: toml::Value = toml::from_str(text).unwrap();
        let mut errs = Vec::new();
        let p = from_toml(v, &mut |path, e| errs.push(format!("{path}: {e}")));
        (p, errs)
    }

    #[test]
    #[cfg(feature = "fips")]
    fn a_fips_build_refuses_what_is_not_approved() {
        let (_, e) = parse(
            "cipher_suites = [\"TLS_AES_128_GCM_SHA256\", \"TLS_CHACHA20_POLY1305_SHA256\"]\n\
             groups = [\"secp256r1\", \"X25519\"]",
        );
        assert!(e[0].starts_with("tls.cipher_suites[1]: "), "{e:?}");
        assert!(e[1].starts_with("tls.groups[1]: "), "{e:?}");
        assert!(crate::crypto::fips());
    }

    #[test]
    #[cfg(not(feature = "fips"))]
    fn openshift_profiles_are_expressible() {
        // Modern: TLS 1.3 only, its three suites.
        let (p, e) = parse(
            "min_version = \"1.3\"\ncipher_suites = [\"TLS_AES_128_GCM_SHA256\", \
             \"TLS_AES_256_GCM_SHA384\", \"TLS_CHACHA20_POLY1305_SHA256\"]",
        );
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(p.versions().len(), 1);
        // Intermediate, OpenSSL spellings as the profile lists them (without DHE).
        let (p, e) = parse(
            "min_version = \"1.2\"\ncipher_suites = [\"TLS_AES_128_GCM_SHA256\", \
             \"TLS_AES_256_GCM_SHA384\", \"TLS_CHACHA20_POLY1305_SHA256\", \
             \"ECDHE-ECDSA-AES128-GCM-SHA256\", \"ECDHE-RSA-AES128-GCM-SHA256\", \
             \"ECDHE-ECDSA-AES256-GCM-SHA384\", \"ECDHE-RSA-AES256-GCM-SHA384\", \
             \"ECDHE-ECDSA-CHACHA20-POLY1305\", \"ECDHE-RSA-CHACHA20-POLY1305\"]\n\
             groups = [\"X25519\", \"P-256\", \"secp384r1\"]",
        );
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(p.cipher_suites.as_ref().unwrap().len(), 9);
        assert!(p
            .render()
            .contains("groups = [\"X25519\", \"secp256r1\", \"secp384r1\"]"));
    }

    #[test]
    fn bad_names_and_inconsistent_sets_name_the_key() {
        let (_, e) = parse(
            "cipher_suites = [\"TLS_AES_128_GCM_SHA256\", \"X\", \"DHE-RSA-AES128-GCM-SHA256\"]",
        );
        assert!(e[0].starts_with("tls.cipher_suites[1]: unknown"), "{e:?}");
        assert!(e[1].starts_with("tls.cipher_suites[2]: unknown"), "{e:?}");
        let (_, e) =
            parse("min_version = \"1.3\"\ncipher_suites = [\"ECDHE-ECDSA-AES128-GCM-SHA256\"]");
        assert!(e[0].starts_with("tls.cipher_suites: min_version"), "{e:?}");
        let (_, e) = parse("groups = [\"X25519\", \"ffdhe2048\"]\nmin_version = \"1.1\"");
        assert!(e.iter().any(|x| x.starts_with("tls.groups[1]")), "{e:?}");
        assert!(e.iter().any(|x| x.starts_with("tls.min_version")), "{e:?}");
        let (_, e) = parse("ciphers = []");
        assert!(e[0].starts_with("tls"), "{e:?}");
    }
}
