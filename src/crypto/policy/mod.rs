//! `[tls]`: the process-wide TLS policy (minimum protocol version, cipher suites, key-exchange
//! groups), applied to every TLS listener and to TLS towards peers.
//!
//! Names are accepted as IANA spells them (`TLS_AES_128_GCM_SHA256`,
//! `TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256`) and as OpenSSL does (`ECDHE-ECDSA-AES128-GCM-SHA256`,
//! the form OpenShift's TLS security profiles use), groups as IANA (`secp256r1`) or NIST
//! (`P-256`) names, case-insensitive. A name this build knows but cannot offer (the CBC, RSA
//! key exchange and 3DES suites of OpenShift's Old profile; `secp521r1` and `SecP384r1MLKEM1024`
//! among OpenShift's groups; in the FIPS build, what is not approved) is dropped with one
//! warning per list naming them all: an OpenShift TLS profile never stops the proxy. An unknown
//! name (a typo) and a list left empty are config errors naming the key.
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
    /// Names that were configured but that this build cannot offer (printed by `check`).
    pub dropped: Vec<String>,
}

impl Default for TlsPolicy {
    fn default() -> Self {
        Self {
            min_version: MinVersion::Tls12,
            cipher_suites: None,
            groups: None,
            dropped: Vec::new(),
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

/// Groups by the names operators use (case-insensitive); the first name of each is the one
/// printed. `Err(())`: a group this build knows by name but cannot offer (OpenShift's
/// `secp521r1` and `SecP384r1MLKEM1024`: rustls with aws-lc-rs implements neither).
fn group(name: &str) -> Option<Result<&'static dyn SupportedKxGroup, ()>> {
    Some(Ok(match name.to_ascii_lowercase().as_str() {
        "x25519" => kx_group::X25519,
        "secp256r1" | "p-256" | "prime256v1" => kx_group::SECP256R1,
        "secp384r1" | "p-384" => kx_group::SECP384R1,
        "x25519mlkem768" => kx_group::X25519MLKEM768,
        "secp256r1mlkem768" => kx_group::SECP256R1MLKEM768,
        "mlkem768" => kx_group::MLKEM768,
        "mlkem1024" => kx_group::MLKEM1024,
        "secp521r1" | "p-521" | "secp384r1mlkem1024" | "x448" | "ffdhe2048" | "ffdhe3072"
        | "ffdhe4096" | "ffdhe6144" | "ffdhe8192" => return Some(Err(())),
        _ => return None,
    }))
}

/// Cipher suites this build knows by name but cannot offer: the rest of Mozilla's Old list
/// (which OpenShift's Old profile copies: CBC, RSA key exchange, 3DES, finite-field DHE) and
/// OpenSSL's TLS 1.3 CCM suites. OpenSSL spellings, matched case-insensitively.
const UNOFFERED_SUITES: &[&str] = &[
    "ECDHE-ECDSA-AES128-SHA256",
    "ECDHE-RSA-AES128-SHA256",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA384",
    "ECDHE-RSA-AES256-SHA384",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "DHE-RSA-AES128-GCM-SHA256",
    "DHE-RSA-AES256-GCM-SHA384",
    "DHE-RSA-CHACHA20-POLY1305",
    "DHE-RSA-AES128-SHA256",
    "DHE-RSA-AES256-SHA256",
    "DHE-RSA-AES128-SHA",
    "DHE-RSA-AES256-SHA",
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA256",
    "AES256-SHA256",
    "AES128-SHA",
    "AES256-SHA",
    "DES-CBC3-SHA",
    "TLS_AES_128_CCM_SHA256",
    "TLS_AES_128_CCM_8_SHA256",
];

/// A suite by its IANA or OpenSSL name (case-insensitive); `Err(())` as for [`group`].
fn suite(name: &str) -> Option<Result<SupportedCipherSuite, ()>> {
    let known = SUITES
        .iter()
        .find(|(iana, openssl, _)| {
            name.eq_ignore_ascii_case(iana) || name.eq_ignore_ascii_case(openssl)
        })
        .and_then(|(_, _, c)| ALL_CIPHER_SUITES.iter().find(|s| s.suite() == *c));
    match known {
        Some(s) => Some(Ok(*s)),
        None if UNOFFERED_SUITES
            .iter()
            .any(|u| name.eq_ignore_ascii_case(u)) =>
        {
            Some(Err(()))
        }
        None => None,
    }
}

/// How a name fares in this build: offered, dropped (known, not offered) or unknown.
pub(crate) enum Offer {
    Yes,
    Dropped,
    Unknown,
}

/// Whether this build offers the suite `name` (for the profiles' OpenShift variables).
pub(crate) fn offers_suite(name: &str) -> Offer {
    match suite(name) {
        Some(Ok(s)) if !cfg!(feature = "fips") || s.fips() => Offer::Yes,
        Some(_) => Offer::Dropped,
        None => Offer::Unknown,
    }
}

/// Whether this build offers the group `name` (for the profiles' OpenShift variables).
pub(crate) fn offers_group(name: &str) -> Offer {
    match group(name) {
        Some(Ok(g)) if !cfg!(feature = "fips") || g.fips() => Offer::Yes,
        Some(_) => Offer::Dropped,
        None => Offer::Unknown,
    }
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
        let mut dropped = Vec::new();
        for (i, n) in names.iter().enumerate() {
            match (suite(n), offers_suite(n)) {
                (_, Offer::Dropped) => dropped.push(n.clone()),
                (Some(Ok(s)), _) if !suites.contains(&s) => suites.push(s),
                (Some(_), _) => error(
                    format!("tls.cipher_suites[{i}]"),
                    Box::new(Msg(format!("{n:?} is listed twice"))),
                ),
                (None, _) => error(
                    format!("tls.cipher_suites[{i}]"),
                    Box::new(Msg(format!(
                        "unknown cipher suite {n:?} (offered: {})",
                        SUITES
                            .iter()
                            .map(|(i, _, _)| *i)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))),
                ),
            }
        }
        warn_dropped("tls.cipher_suites", &dropped);
        if suites.is_empty() && names.len() > dropped.len() {
            // Each bad name was reported above.
        } else if suites.is_empty() {
            error(
                "tls.cipher_suites".into(),
                Box::new(Msg(format!(
                    "no suite this build can offer is listed{}",
                    dropped_note(&dropped)
                ))),
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
        p.dropped.extend(dropped);
    }
    if let Some(names) = raw.groups {
        let mut groups: Vec<&'static dyn SupportedKxGroup> = Vec::new();
        let mut dropped = Vec::new();
        for (i, n) in names.iter().enumerate() {
            match (group(n), offers_group(n)) {
                (_, Offer::Dropped) => dropped.push(n.clone()),
                (Some(Ok(g)), _) if !groups.iter().any(|h| h.name() == g.name()) => groups.push(g),
                (Some(_), _) => error(
                    format!("tls.groups[{i}]"),
                    Box::new(Msg(format!("{n:?} is listed twice"))),
                ),
                (None, _) => error(
                    format!("tls.groups[{i}]"),
                    Box::new(Msg(format!(
                        "unknown group {n:?} (offered: X25519, secp256r1 (P-256), secp384r1 \
                         (P-384), X25519MLKEM768, SecP256r1MLKEM768, MLKEM768, MLKEM1024; \
                         known, dropped: secp521r1, SecP384r1MLKEM1024)"
                    ))),
                ),
            }
        }
        warn_dropped("tls.groups", &dropped);
        if groups.is_empty() && names.len() == dropped.len() {
            error(
                "tls.groups".into(),
                Box::new(Msg(format!(
                    "no group this build can offer is listed{}",
                    dropped_note(&dropped)
                ))),
            );
        }
        p.groups = Some(groups);
        p.dropped.extend(dropped);
    }
    p
}

/// The one warning for the names of a list that this build cannot offer.
fn warn_dropped(key: &str, dropped: &[String]) {
    if !dropped.is_empty() {
        tracing::warn!(
            "{key}: this build cannot offer {}; dropped",
            dropped.join(", ")
        );
    }
}

fn dropped_note(dropped: &[String]) -> String {
    if dropped.is_empty() {
        String::new()
    } else {
        format!(
            " (dropped, not offered by this build: {})",
            dropped.join(", ")
        )
    }
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
        if !self.dropped.is_empty() {
            let _ = writeln!(
                o,
                "# dropped, not offered by this build: {}",
                self.dropped.join(", ")
            );
        }
        o
    }
}

#[cfg(test)]
mod tests;
