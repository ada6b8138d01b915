//! The security parts of a profile, assembled from variables: `[listeners.auth]` on the API
//! listener and the global `[tls]` policy (see the module documentation of `profile`).
//!
//! The policy comes from our `IRONIC_PROXY_TLS_*`; each one unset falls back to what OpenShift's
//! cluster-baremetal-operator gives Ironic's containers from the cluster TLS profile
//! (provisioning/tls_profile.go): `IRONIC_SSL_PROTOCOL` (Apache `SSLProtocol`, e.g.
//! `-ALL +TLSv1.2 +TLSv1.3`), `IRONIC_TLS_12_CIPHERS` (OpenSSL names, `:`-separated),
//! `IRONIC_TLS_13_CIPHERS` (`TLS_*` names, `:`-separated), `IRONIC_TLS_CURVES` (OpenShift group
//! names, `:`-separated). What this build cannot offer from those is dropped with one warning:
//! CBO's renderings are valid for Apache and must never stop the proxy.

use super::{Env, Origins, ProfileError};
use crate::crypto::policy::{offers_group, offers_suite, Offer};

const HTPASSWD: &str = "IRONIC_PROXY_HTPASSWD";
const REALM: &str = "IRONIC_PROXY_AUTH_REALM";
const MIN_VERSION: &str = "IRONIC_PROXY_TLS_MIN_VERSION";
const CIPHER_SUITES: &str = "IRONIC_PROXY_TLS_CIPHER_SUITES";
const GROUPS: &str = "IRONIC_PROXY_TLS_GROUPS";
const OS_PROTOCOL: &str = "IRONIC_SSL_PROTOCOL";
const OS_TLS12: &str = "IRONIC_TLS_12_CIPHERS";
const OS_TLS13: &str = "IRONIC_TLS_13_CIPHERS";
const OS_CURVES: &str = "IRONIC_TLS_CURVES";
/// rustls' TLS 1.3 suites (all three offered by default, and by every build).
const TLS13_DEFAULT: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];
/// rustls' TLS 1.2 suites, in OpenSSL's spelling (CBO's `IRONIC_TLS_12_CIPHERS` uses it).
const TLS12_DEFAULT: &[&str] = &[
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-RSA-CHACHA20-POLY1305",
];

/// Adds `[listeners.auth]` to the listener named `api` and `[tls]` to `tree`, recording in
/// `origins` which key came from which variable.
pub(super) fn assemble(
    tree: &mut toml::Value,
    env: &dyn Env,
    origins: &mut Origins,
) -> Result<(), ProfileError> {
    let var = |name: &'static str| env.var(name).filter(|v| !v.is_empty());
    // Values are inserted before interpolation: a `$` in them must stay literal.
    let literal = |v: &str| toml::Value::String(v.replace('$', "$$"));

    let htpasswd = var(HTPASSWD);
    let realm = var(REALM);
    let api = tree
        .get_mut("listeners")
        .and_then(toml::Value::as_array_mut)
        .and_then(|ls| {
            ls.iter_mut()
                .enumerate()
                .find(|(_, l)| l.get("name").and_then(toml::Value::as_str) == Some("api"))
        })
        .and_then(|(i, l)| Some((i, l.as_table_mut()?)));
    match (htpasswd.as_deref(), api) {
        (Some("none"), _) => {
            if let Some(realm) = realm {
                return Err(ProfileError::Variable {
                    var: REALM,
                    value: realm,
                    reason: "has no effect with IRONIC_PROXY_HTPASSWD=none",
                });
            }
        }
        (None, Some(_)) => return Err(ProfileError::Unprotected),
        (None, None) => {
            if let Some(realm) = realm {
                return Err(ProfileError::Variable {
                    var: REALM,
                    value: realm,
                    reason: "needs IRONIC_PROXY_HTPASSWD (the htpasswd file)",
                });
            }
        }
        (Some(path), Some((i, listener))) => {
            let mut auth = toml::Table::new();
            auth.insert("htpasswd".into(), literal(path));
            origins
                .keys
                .push((format!("listeners[{i}].auth.htpasswd"), HTPASSWD));
            if let Some(realm) = realm {
                auth.insert("realm".into(), literal(&realm));
                origins
                    .keys
                    .push((format!("listeners[{i}].auth.realm"), REALM));
            }
            listener.insert("auth".into(), toml::Value::Table(auth));
        }
        (Some(path), None) => {
            return Err(ProfileError::Variable {
                var: HTPASSWD,
                value: path.to_owned(),
                reason: "this profile has no API listener to protect",
            })
        }
    }

    let mut policy = toml::Table::new();
    if let Some(v) = var(MIN_VERSION) {
        policy.insert("min_version".into(), literal(v.trim()));
        origins.keys.push(("tls.min_version".into(), MIN_VERSION));
    } else if let Some(v) = var(OS_PROTOCOL) {
        let min = apache_min_version(&v).ok_or(ProfileError::Variable {
            var: OS_PROTOCOL,
            value: v.clone(),
            reason: "enables neither TLSv1.2 nor TLSv1.3 (Apache SSLProtocol syntax)",
        })?;
        policy.insert("min_version".into(), min.into());
        origins.keys.push(("tls.min_version".into(), OS_PROTOCOL));
    }
    let ours = |v: &str| -> toml::Value {
        let items = v
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(literal)
            .collect();
        toml::Value::Array(items)
    };
    if let Some(v) = var(CIPHER_SUITES) {
        policy.insert("cipher_suites".into(), ours(&v));
        origins
            .keys
            .push(("tls.cipher_suites".into(), CIPHER_SUITES));
    } else if let Some(suites) = openshift_suites(&var(OS_TLS12), &var(OS_TLS13))? {
        policy.insert("cipher_suites".into(), suites);
        let from = if var(OS_TLS12).is_some() {
            OS_TLS12
        } else {
            OS_TLS13
        };
        origins.keys.push(("tls.cipher_suites".into(), from));
    }
    if let Some(v) = var(GROUPS) {
        policy.insert("groups".into(), ours(&v));
        origins.keys.push(("tls.groups".into(), GROUPS));
    } else if let Some(v) = var(OS_CURVES) {
        let (kept, dropped) = offered(&v, offers_group);
        warn_dropped(OS_CURVES, &dropped);
        if kept.is_empty() {
            return Err(ProfileError::Variable {
                var: OS_CURVES,
                value: v,
                reason: "lists no group this build can offer",
            });
        }
        policy.insert("groups".into(), strings(&kept));
        origins.keys.push(("tls.groups".into(), OS_CURVES));
    }
    if !policy.is_empty() {
        if let Some(root) = tree.as_table_mut() {
            root.insert("tls".into(), toml::Value::Table(policy));
        }
    }
    Ok(())
}

/// The lowest version an Apache `SSLProtocol` value enables that rustls offers: `1.2` or `1.3`.
/// Apache's syntax: a bare name replaces the set, `+name` adds, `-name` removes; `all` is
/// TLSv1 to TLSv1.3 (mod_ssl). TLSv1 and TLSv1.1 (OpenShift's Old profile) are not offered by
/// rustls: TLS 1.2 is then the minimum, with a warning. `None` when neither 1.2 nor 1.3 is on.
fn apache_min_version(v: &str) -> Option<&'static str> {
    const ALL: [&str; 4] = ["tlsv1", "tlsv1.1", "tlsv1.2", "tlsv1.3"];
    let mut on: Vec<&str> = Vec::new();
    for word in v.split_whitespace() {
        let lower = word.to_ascii_lowercase();
        let (op, name) = match lower.as_bytes().first() {
            Some(b'+') => ('+', &lower[1..]),
            Some(b'-') => ('-', &lower[1..]),
            _ => ('=', lower.as_str()),
        };
        let names: Vec<&str> = match name {
            "all" => ALL.to_vec(),
            n => ALL.iter().copied().filter(|a| *a == n).collect(),
        };
        match op {
            '=' => on = names,
            '+' => on.extend(names),
            _ => on.retain(|n| !names.contains(n)),
        }
    }
    let old: Vec<&str> = on
        .iter()
        .copied()
        .filter(|n| *n == "tlsv1" || *n == "tlsv1.1")
        .collect();
    if !old.is_empty() {
        tracing::warn!(
            "{OS_PROTOCOL}={v:?}: this build cannot offer TLS 1.0 and 1.1; TLS 1.2 is the minimum"
        );
    }
    if on.contains(&"tlsv1.2") && !on.contains(&"tlsv1.3") {
        tracing::warn!(
            "{OS_PROTOCOL}={v:?}: TLS 1.3 is offered as well (the policy has no maximum version)"
        );
    }
    if on.contains(&"tlsv1.2") || !old.is_empty() && on.contains(&"tlsv1.3") {
        Some("1.2")
    } else if on.contains(&"tlsv1.3") {
        Some("1.3")
    } else {
        None
    }
}

/// `cipher_suites` from CBO's two lists; a list that is not set keeps its version's defaults
/// (CBO sets no TLS 1.2 list for Modern). `None` when neither is set.
fn openshift_suites(
    tls12: &Option<String>,
    tls13: &Option<String>,
) -> Result<Option<toml::Value>, ProfileError> {
    if tls12.is_none() && tls13.is_none() {
        return Ok(None);
    }
    let defaults = |names: &[&str]| names.join(":");
    let (mut kept, mut dropped) = offered(
        tls13.as_deref().unwrap_or(&defaults(TLS13_DEFAULT)),
        offers_suite,
    );
    let (k, d) = offered(
        tls12.as_deref().unwrap_or(&defaults(TLS12_DEFAULT)),
        offers_suite,
    );
    kept.extend(k);
    dropped.extend(d);
    // Defaults a FIPS build does not offer (CHACHA20) are not worth a warning.
    dropped
        .retain(|n| !TLS13_DEFAULT.contains(&n.as_str()) && !TLS12_DEFAULT.contains(&n.as_str()));
    warn_dropped("IRONIC_TLS_12_CIPHERS and IRONIC_TLS_13_CIPHERS", &dropped);
    if kept.is_empty() {
        let (var, value) = match (tls12, tls13) {
            (Some(v), _) => (OS_TLS12, v.clone()),
            (None, v) => (OS_TLS13, v.clone().unwrap_or_default()),
        };
        return Err(ProfileError::Variable {
            var,
            value,
            reason:
                "IRONIC_TLS_12_CIPHERS and IRONIC_TLS_13_CIPHERS list no suite this build offers",
        });
    }
    Ok(Some(strings(&kept)))
}

/// The names of an OpenSSL-style list (`:`, `,` or space separated) this build offers, and
/// those it drops: known but not offered, or unknown (OpenSSL ignores those too).
fn offered(list: &str, offers: fn(&str) -> Offer) -> (Vec<String>, Vec<String>) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for name in list
        .split([':', ',', ' '])
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        match offers(name) {
            Offer::Yes if !kept.iter().any(|k: &String| k.eq_ignore_ascii_case(name)) => {
                kept.push(name.to_owned());
            }
            Offer::Yes => {}
            Offer::Dropped | Offer::Unknown => dropped.push(name.to_owned()),
        }
    }
    (kept, dropped)
}

fn strings(names: &[String]) -> toml::Value {
    toml::Value::Array(
        names
            .iter()
            .map(|n| toml::Value::String(n.replace('$', "$$")))
            .collect(),
    )
}

/// One warning naming every dropped name of `what`.
fn warn_dropped(what: &str, dropped: &[String]) {
    if !dropped.is_empty() {
        tracing::warn!(
            "{what}: this build cannot offer {}; dropped (the rest is applied)",
            dropped.join(", ")
        );
    }
}
