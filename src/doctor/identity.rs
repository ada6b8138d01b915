//! The doctor's identity checks: the live certificate (as a TLS listener serves it), its SANs,
//! expiry and chain, every trusted CA, and the exported files.

use super::net;
use super::Report;
use crate::config::{Config, IdentityConfig, IdentitySource, ListenAddr, TlsMode};
use crate::dns_name::{DnsName, WildcardName};
use crate::identity::expiry::pem_certs;
use crate::identity::Material;
use rustls::pki_types::CertificateDer;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};
use x509_parser::prelude::GeneralName;

/// What the checks need of a certificate.
#[derive(Debug)]
pub(super) struct CertInfo {
    pub subject: String,
    pub serial: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl CertInfo {
    pub(super) fn parse(der: &[u8]) -> Option<Self> {
        let (_, c) = x509_parser::parse_x509_certificate(der).ok()?;
        let at = |t: x509_parser::time::ASN1Time| {
            let secs = u64::try_from(t.timestamp()).unwrap_or(0);
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
        };
        let mut info = Self {
            subject: c.subject().to_string(),
            serial: c.raw_serial_as_string().replace(':', ""),
            not_before: at(c.validity().not_before),
            not_after: at(c.validity().not_after),
            dns: Vec::new(),
            ips: Vec::new(),
        };
        if let Ok(Some(san)) = c.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(n) => info.dns.push((*n).to_ascii_lowercase()),
                    GeneralName::IPAddress(b) => {
                        if let Ok(v4) = <[u8; 4]>::try_from(*b) {
                            info.ips.push(IpAddr::from(v4));
                        } else if let Ok(v6) = <[u8; 16]>::try_from(*b) {
                            info.ips.push(IpAddr::from(v6));
                        }
                    }
                    _ => {}
                }
            }
        }
        Some(info)
    }

    /// `DNS:a, IP:b`, for messages.
    pub(super) fn sans(&self) -> String {
        let names: Vec<String> = self
            .dns
            .iter()
            .map(|d| format!("DNS:{d}"))
            .chain(self.ips.iter().map(|i| format!("IP:{i}")))
            .collect();
        if names.is_empty() {
            "no SANs".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// Whether the certificate covers `name` (an IP, or a DNS name matched as RFC 6125 does:
    /// exact, or one `*` as the whole leftmost label).
    pub(super) fn covers(&self, name: &str) -> bool {
        if let Ok(ip) = name.parse::<IpAddr>() {
            return self.ips.contains(&ip);
        }
        // Each SAN as a name or a wildcard (a SAN that is neither covers nothing), matched as
        // the allow rules match: ASCII case-insensitive, one trailing dot ignored.
        self.dns.iter().any(|san| {
            if san.starts_with('*') {
                WildcardName::parse(san).is_ok_and(|w| w.matches(name))
            } else {
                DnsName::parse(san).is_ok_and(|d| d.matches(name))
            }
        })
    }

    /// `valid until T (in 5h 3m)`, or why it is not valid now.
    pub(super) fn validity(&self, now: SystemTime) -> Result<String, String> {
        if now < self.not_before {
            return Err(format!("not valid before {}", stamp(self.not_before)));
        }
        match self.not_after.duration_since(now) {
            Err(_) => Err(format!("expired at {}", stamp(self.not_after))),
            Ok(left) => Ok(format!(
                "valid until {} (in {})",
                stamp(self.not_after),
                coarse(left)
            )),
        }
    }
}

/// `412d`, `5h 3m`: enough to judge an expiry at a glance.
fn coarse(d: Duration) -> String {
    let mins = d.as_secs() / 60;
    if mins >= 2 * 24 * 60 {
        format!("{}d", mins / (24 * 60))
    } else {
        format!("{}h {}m", mins / 60, mins % 60)
    }
}

pub(super) fn stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Our identity for the probes: the static files, or (self-issued) a fresh leaf from the same
/// issuer with the same names, which peers must accept exactly as they accept the live one.
fn ours(cfg: &IdentityConfig) -> Result<Material, String> {
    match &cfg.source {
        IdentitySource::Files { cert, key } => {
            crate::identity::load_files(cfg, cert, key).map_err(|e| crate::error::chain(&e))
        }
        IdentitySource::Issuer(ic) => {
            crate::identity::rotate::issue(cfg, ic).map_err(|e| crate::error::chain(&e))
        }
    }
}

/// Runs the identity checks; returns our identity for the upstream checks.
pub(super) async fn check(config: &Config, report: &mut Report) -> Option<Material> {
    let Some(cfg) = &config.identity else {
        report.pass("identity", "no [identity] configured");
        return None;
    };
    let material = match ours(cfg) {
        Ok(m) => m,
        Err(e) => {
            report.fail("identity", e);
            return None;
        }
    };
    let live = live_leaf(config, &material, report).await;
    let Some(info) = CertInfo::parse(&live) else {
        report.fail("identity.live", "the live certificate does not parse");
        return Some(material);
    };
    let now = SystemTime::now();
    match &cfg.source {
        IdentitySource::Issuer(ic) => {
            let missing: Vec<String> = ic
                .dns_names
                .iter()
                .filter(|d| !info.covers(d))
                .map(|d| format!("DNS:{d}"))
                .chain(
                    ic.ip_addresses
                        .iter()
                        .filter(|ip| !info.ips.contains(ip))
                        .map(|ip| format!("IP:{ip}")),
                )
                .collect();
            if missing.is_empty() {
                report.pass(
                    "identity.sans",
                    format!("covers every configured name: {}", info.sans()),
                );
            } else {
                report.fail(
                    "identity.sans",
                    format!("lacks {} (it names {})", missing.join(", "), info.sans()),
                );
            }
        }
        IdentitySource::Files { .. } => {
            report.pass(
                "identity.sans",
                format!("static certificate names {}", info.sans()),
            );
        }
    }
    match info.validity(now) {
        Ok(v) => report.pass("identity.expiry", v),
        Err(e) => report.fail("identity.expiry", e),
    }
    check_chain(&live, &material, &info, report);
    check_trust(&material, now, report);
    if let Some(export) = &cfg.export {
        check_export(&export.dir, &live, &info, &material, report);
    }
    Some(material)
}

/// The leaf a TLS listener serves right now; the configured one when none can be asked.
async fn live_leaf(
    config: &Config,
    material: &Material,
    report: &mut Report,
) -> CertificateDer<'static> {
    let configured = || material.certified_key.cert[0].clone();
    let listener = config
        .listeners
        .iter()
        .find_map(|l| match (&l.listen, l.tls) {
            (ListenAddr::Tcp(addr), TlsMode::Server | TlsMode::Mutual | TlsMode::Optional) => {
                Some((l, *addr))
            }
            _ => None,
        });
    let Some((l, listen)) = listener else {
        report.pass(
            "identity.live",
            "no TLS listener: checking the configured certificate",
        );
        return configured();
    };
    let addr = net::dial_addr(listen);
    let name = "identity.live";
    let served = async {
        let (tcp, _) = net::connect(addr).await?;
        let (_, presented) = net::handshake(
            tcp,
            &addr.ip().to_string(),
            Some(material),
            material.roots.clone(),
        )
        .await?;
        Ok::<_, String>(presented.chain[0].clone())
    };
    match served.await {
        Ok(leaf) => {
            let serial = CertInfo::parse(&leaf).map(|i| i.serial).unwrap_or_default();
            report.pass(
                name,
                format!("listener {} ({addr}) serves serial {serial}", l.name),
            );
            leaf
        }
        Err(e) => {
            report.fail(name, format!("listener {} ({addr}): {e}", l.name));
            configured()
        }
    }
}

/// The live leaf chains to the trust bundle (checked for its own first name, so only the chain
/// and validity count here).
fn check_chain(live: &CertificateDer<'static>, m: &Material, info: &CertInfo, report: &mut Report) {
    let name = info
        .ips
        .first()
        .map(ToString::to_string)
        .or_else(|| info.dns.first().cloned());
    let Some(name) = name.and_then(|n| rustls::pki_types::ServerName::try_from(n).ok()) else {
        report.fail(
            "identity.chain",
            "the live certificate has no SAN to verify",
        );
        return;
    };
    let provider = std::sync::Arc::new(crate::crypto::provider());
    let verifier = match rustls::client::WebPkiServerVerifier::builder_with_provider(
        m.roots.clone(),
        provider,
    )
    .build()
    {
        Ok(v) => v,
        Err(e) => return report.fail("identity.chain", format!("trust bundle unusable: {e}")),
    };
    let intermediates: Vec<CertificateDer<'static>> =
        m.certified_key.cert.iter().skip(1).cloned().collect();
    let now = rustls::pki_types::UnixTime::now();
    match rustls::client::danger::ServerCertVerifier::verify_server_cert(
        verifier.as_ref(),
        live,
        &intermediates,
        &name,
        &[],
        now,
    ) {
        Ok(_) => report.pass("identity.chain", "chains to identity.trust"),
        Err(e) => report.fail(
            "identity.chain",
            format!("does not verify against identity.trust: {e}"),
        ),
    }
}

/// Every CA of the trust bundle is inside its validity.
fn check_trust(m: &Material, now: SystemTime, report: &mut Report) {
    for (i, der) in pem_certs(&m.trust_pem).iter().enumerate() {
        let name = format!("trust[{i}]");
        match CertInfo::parse(der) {
            None => report.fail(name, "does not parse"),
            Some(ca) => match ca.validity(now) {
                Ok(v) => report.pass(name, format!("{} {v}", ca.subject)),
                Err(e) => report.fail(name, format!("{} {e}", ca.subject)),
            },
        }
    }
}

/// The exported `tls.crt` is the live leaf and `ca.crt` the trust bundle in force.
fn check_export(
    dir: &std::path::Path,
    live: &CertificateDer<'static>,
    info: &CertInfo,
    m: &Material,
    report: &mut Report,
) {
    let name = "export";
    let crt = dir.join("tls.crt");
    let exported = match std::fs::read_to_string(&crt) {
        Ok(s) => s,
        Err(e) => return report.fail(name, format!("{}: {e}", crt.display())),
    };
    let Some(first) = pem_certs(&exported).into_iter().next() else {
        return report.fail(name, format!("{}: no certificate in it", crt.display()));
    };
    if first.as_ref() != live.as_ref() {
        let Some(old) = CertInfo::parse(&first) else {
            return report.fail(name, format!("{}: does not parse", crt.display()));
        };
        let how = if old.not_before < info.not_before {
            "is older than"
        } else {
            "differs from"
        };
        return report.fail(
            name,
            format!(
                "{} (serial {}, issued {}) {how} the live certificate (serial {}, issued {})",
                crt.display(),
                old.serial,
                stamp(old.not_before),
                info.serial,
                stamp(info.not_before)
            ),
        );
    }
    let ca = dir.join("ca.crt");
    match std::fs::read_to_string(&ca) {
        Ok(s) if pem_certs(&s) == pem_certs(&m.trust_pem) => report.pass(
            name,
            format!(
                "{} is the live certificate (serial {}); ca.crt is identity.trust",
                crt.display(),
                info.serial
            ),
        ),
        Ok(_) => report.fail(
            name,
            format!("{} differs from identity.trust", ca.display()),
        ),
        Err(e) => report.fail(name, format!("{}: {e}", ca.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::CertInfo;

    #[test]
    fn san_coverage() {
        let info = CertInfo {
            subject: String::new(),
            serial: String::new(),
            not_before: std::time::SystemTime::UNIX_EPOCH,
            not_after: std::time::SystemTime::UNIX_EPOCH,
            dns: vec!["*.ironic.svc".into(), "api.example".into()],
            ips: vec!["10.0.0.2".parse().unwrap()],
        };
        assert!(info.covers("10.0.0.2"));
        assert!(!info.covers("10.0.0.3"));
        assert!(info.covers("pod-1.ironic.svc"));
        assert!(info.covers("API.example."));
        assert!(!info.covers("ironic.svc"));
        assert!(!info.covers("a.b.ironic.svc"));
        assert_eq!(
            info.sans(),
            "DNS:*.ironic.svc, DNS:api.example, IP:10.0.0.2"
        );
        // SANs are matched case-insensitively too, and one that is not a name covers nothing.
        let info = CertInfo {
            dns: vec!["API.Example".into(), "*.Ironic.SVC".into(), "a..b".into()],
            ..info
        };
        assert!(info.covers("api.example"));
        assert!(info.covers("pod-1.ironic.svc."));
        assert!(!info.covers("a..b"));
    }
}
