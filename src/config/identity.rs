//! `[identity]`: from its raw table to [`IdentityConfig`].

use super::{msg, Fields, IdentityConfig};
use crate::dns_name::DnsName;
use crate::identity::{ExportConfig, IdentitySource, IssuerConfig};
use std::net::IpAddr;
use std::time::Duration;

pub(super) fn identity_from_raw(
    id: super::raw::RawIdentity,
    f: &mut Fields,
) -> Option<IdentityConfig> {
    let Some(trust) = id.trust else {
        f.push(
            "identity.trust",
            msg("is required (PEM bundle of trusted CAs)"),
        );
        return None;
    };
    let issuer = id.issuer_cert.is_some() || id.issuer_key.is_some();
    let files = id.cert.is_some() || id.key.is_some();
    let source = match (issuer, files) {
        (true, true) => {
            f.push(
                "identity",
                msg("use either issuer_cert/issuer_key or cert/key, not both"),
            );
            return None;
        }
        (false, false) => {
            f.push(
                "identity",
                msg("needs issuer_cert + issuer_key, or cert + key"),
            );
            return None;
        }
        (false, true) => match (id.cert, id.key) {
            (Some(cert), Some(key)) => IdentitySource::Files {
                cert: cert.into(),
                key: key.into(),
            },
            (None, _) => {
                f.push("identity.cert", msg("is required with identity.key"));
                return None;
            }
            (_, None) => {
                f.push("identity.key", msg("is required with identity.cert"));
                return None;
            }
        },
        (true, false) => {
            let validity = f.dur(
                "identity.validity",
                id.validity.as_ref(),
                Duration::from_secs(86_400),
            );
            let renew_before = f.dur(
                "identity.renew_before",
                id.renew_before.as_ref(),
                validity / 3,
            );
            if renew_before >= validity {
                f.push(
                    "identity.renew_before",
                    msg("must be shorter than identity.validity"),
                );
            }
            let dns_names = id.dns_names.unwrap_or_default();
            let ip_addresses: Vec<IpAddr> = id
                .ip_addresses
                .unwrap_or_default()
                .iter()
                .enumerate()
                .filter_map(|(i, s)| f.parse::<IpAddr>(&format!("identity.ip_addresses[{i}]"), s))
                .collect();
            // The names of the leaf we issue, so the certificate rules: no wildcard, `_` or
            // trailing dot (`DnsName::parse_host`).
            for (i, n) in dns_names.iter().enumerate() {
                if let Err(reason) = DnsName::parse_host(n) {
                    f.push(
                        format!("identity.dns_names[{i}]"),
                        msg(format!("invalid DNS name {n:?}: {reason}")),
                    );
                }
            }
            if dns_names.is_empty() && ip_addresses.is_empty() {
                f.push(
                    "identity.dns_names",
                    msg("issuer mode needs at least one dns_names or ip_addresses entry"),
                );
            }
            match (id.issuer_cert, id.issuer_key) {
                (Some(c), Some(k)) => IdentitySource::Issuer(IssuerConfig {
                    issuer_cert: c.into(),
                    issuer_key: k.into(),
                    dns_names,
                    ip_addresses,
                    validity,
                    renew_before,
                }),
                (None, _) => {
                    f.push(
                        "identity.issuer_cert",
                        msg("is required with identity.issuer_key"),
                    );
                    return None;
                }
                (_, None) => {
                    f.push(
                        "identity.issuer_key",
                        msg("is required with identity.issuer_cert"),
                    );
                    return None;
                }
            }
        }
    };
    let mode = match id.export_mode.as_deref() {
        None => 0o640,
        Some(m) => match u32::from_str_radix(m.trim_start_matches("0o"), 8) {
            Ok(v) if v <= 0o777 => v,
            _ => {
                f.push(
                    "identity.export_mode",
                    msg(format!("invalid octal file mode {m:?}")),
                );
                0o640
            }
        },
    };
    let export = id.export_dir.map(|dir| ExportConfig {
        dir: dir.into(),
        mode,
        group: id.export_group,
    });
    let watch_interval = f.dur(
        "identity.watch_interval",
        id.watch_interval.as_ref(),
        Duration::from_secs(2),
    );
    Some(IdentityConfig {
        trust: trust.into(),
        source,
        export,
        watch_interval,
    })
}
