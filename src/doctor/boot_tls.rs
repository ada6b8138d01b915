//! What iPXE can speak against a boot-TLS listener (docs/boot-tls.md): TLS 1.2 only, ECDHE with
//! AES-GCM (ECDSA or RSA certificates), groups X25519, P-256 or P-384 (iPXE v2.0.0,
//! `src/config/crypto.h` and `src/crypto/mishmash/*.c`). A `[tls]` policy that leaves none of
//! that makes every iPXE fail the handshake (`Operation not permitted`, ipxe.org/410de13c)
//! while curl and openssl still connect, so `check` and `doctor` say so before a node fails to
//! boot. A warning, not an error: a listener may be meant for other clients.

use rustls::crypto::aws_lc_rs::kx_group;
use rustls::CipherSuite;

use crate::config::{Config, ListenerConfig};
use crate::crypto::policy::{MinVersion, TlsPolicy};
use crate::tls::TlsMode;

/// The TLS 1.2 suites iPXE 2.0 offers that rustls also implements.
const IPXE_SUITES: [CipherSuite; 4] = [
    CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
];

/// A listener that serves iPXE boot files over TLS: named as the profiles and the kit name
/// them (`ipxe-tls`, `boot-tls`), or with a route for `/boot.ipxe`, and speaking TLS without
/// asking for a client certificate (iPXE has none).
pub(crate) fn is_boot_tls(l: &ListenerConfig) -> bool {
    matches!(l.tls, TlsMode::Server | TlsMode::Optional)
        && (matches!(l.name.as_str(), "ipxe-tls" | "boot-tls")
            || l.routes
                .iter()
                .any(|r| r.paths.iter().any(|p| p.matches("/boot.ipxe"))))
}

/// Why `policy` leaves iPXE nothing to negotiate, or `None` when it can.
pub(crate) fn ipxe_gap(policy: &TlsPolicy) -> Option<String> {
    if policy.min_version == MinVersion::Tls13 {
        return Some("[tls] min_version is 1.3 and iPXE speaks TLS 1.2 at most".into());
    }
    if let Some(suites) = &policy.cipher_suites {
        if !suites.iter().any(|s| IPXE_SUITES.contains(&s.suite())) {
            return Some(
                "[tls] cipher_suites has no ECDHE-ECDSA or ECDHE-RSA AES-GCM suite for TLS 1.2, \
                 the only ones iPXE and this proxy share"
                    .into(),
            );
        }
    }
    if let Some(groups) = &policy.groups {
        let ipxe = [kx_group::X25519, kx_group::SECP256R1, kx_group::SECP384R1];
        if !groups
            .iter()
            .any(|g| ipxe.iter().any(|i| i.name() == g.name()))
        {
            return Some("[tls] groups has none of X25519, P-256, P-384, iPXE's groups".into());
        }
    }
    None
}

/// One line per boot-TLS listener that iPXE cannot use: `listener NAME (ADDR): why`.
pub fn warnings(config: &Config) -> Vec<String> {
    let Some(gap) = ipxe_gap(&config.tls) else {
        return Vec::new();
    };
    config
        .listeners
        .iter()
        .filter(|l| is_boot_tls(l))
        .map(|l| {
            format!(
                "boot-TLS listener {} ({}) cannot serve iPXE: {gap}",
                l.name, l.listen
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::ipxe_gap;
    use crate::crypto::policy::{MinVersion, TlsPolicy};
    use rustls::crypto::aws_lc_rs::{cipher_suite, kx_group};

    #[test]
    fn default_policy_serves_ipxe() {
        assert_eq!(ipxe_gap(&TlsPolicy::default()), None);
    }

    #[test]
    fn tls13_only_suites_without_gcm_or_groups_without_ipxe_s_are_named() {
        let only13 = TlsPolicy {
            min_version: MinVersion::Tls13,
            ..TlsPolicy::default()
        };
        assert!(ipxe_gap(&only13).is_some_and(|w| w.contains("1.3")));
        let chacha = TlsPolicy {
            cipher_suites: Some(vec![
                cipher_suite::TLS13_AES_128_GCM_SHA256,
                cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            ]),
            ..TlsPolicy::default()
        };
        assert!(ipxe_gap(&chacha).is_some_and(|w| w.contains("AES-GCM")));
        let rsa_gcm = TlsPolicy {
            cipher_suites: Some(vec![cipher_suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]),
            ..TlsPolicy::default()
        };
        assert_eq!(ipxe_gap(&rsa_gcm), None);
        let mlkem = TlsPolicy {
            groups: Some(vec![kx_group::X25519MLKEM768]),
            ..TlsPolicy::default()
        };
        assert!(ipxe_gap(&mlkem).is_some_and(|w| w.contains("X25519")));
    }
}
