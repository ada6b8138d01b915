//! The serde mirror of the TOML file: strings as written (after interpolation), every table
//! `deny_unknown_fields`. [`super::Config::from_raw`] turns it into typed values.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub identity: Option<RawIdentity>,
    pub admin: Option<RawAdmin>,
    pub dns: Option<RawDns>,
    pub limits: Option<RawLimits>,
    /// `[tls]`, typed by `crate::crypto::policy::from_toml`.
    pub tls: Option<toml::Value>,
    #[serde(default)]
    pub listeners: Vec<RawListener>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIdentity {
    pub trust: Option<String>,
    pub issuer_cert: Option<String>,
    pub issuer_key: Option<String>,
    pub dns_names: Option<Vec<String>>,
    pub ip_addresses: Option<Vec<String>>,
    pub validity: Option<String>,
    pub renew_before: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    pub export_dir: Option<String>,
    pub export_mode: Option<String>,
    pub export_group: Option<u32>,
    pub watch_interval: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    /// An address or a list of them; typed in `super::admin`.
    pub listen: toml::Value,
    pub bearer_token_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDns {
    pub servers: Option<Vec<String>>,
    pub refresh: Option<String>,
    pub hold_on_empty: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    /// An integer, or a string of digits: a profile sets it from an environment variable.
    #[serde(default, deserialize_with = "u32_or_digits")]
    pub max_connections: Option<u32>,
    pub header_bytes: Option<u32>,
    pub request_head_timeout: Option<String>,
    pub body_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub upstream_timeout: Option<String>,
    pub max_body_bytes: Option<u64>,
    pub drain_timeout: Option<String>,
    pub idle_trim: Option<String>,
    pub upstream_connections: Option<u32>,
    pub handover: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListener {
    pub name: Option<String>,
    pub listen: String,
    pub tls: Option<String>,
    pub http2: Option<bool>,
    pub jsonrpc: Option<bool>,
    pub allow: Option<Vec<String>>,
    /// A string (`local` shorthand) or a table; typed in `from_raw`. Required unless the
    /// listener is an egress proxy, which has none.
    pub upstream: Option<toml::Value>,
    /// `[listeners.auth]`, typed by `crate::auth::from_toml`.
    pub auth: Option<toml::Value>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    /// `[listeners.egress]`: a forward proxy towards peers (see `super::egress`).
    pub egress: Option<RawEgress>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEgress {
    pub credentials: String,
    pub targets: Vec<String>,
    /// Integers, or strings of digits (so a profile can take them from a variable).
    pub ports: Vec<toml::Value>,
    /// Ports relayed in plain HTTP (the image server on a peer's IP), as `ports`.
    #[serde(default)]
    pub plain_ports: Vec<toml::Value>,
    /// `relay` or `refuse`: what becomes of any other host and port.
    pub others: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    pub local: Option<String>,
    pub dns: Option<String>,
    pub fallback: Option<Vec<String>>,
    pub tls: Option<bool>,
    pub balance: Option<String>,
    pub health: Option<RawHealth>,
    pub retries: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    pub path: Option<String>,
    pub interval: Option<String>,
    pub timeout: Option<String>,
    pub unhealthy_after: Option<u32>,
    pub healthy_after: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub paths: Vec<String>,
    pub methods: Option<Vec<String>>,
    pub plaintext: Option<bool>,
    /// A string (`local` shorthand) or a table; `find` and `find_timeout` are taken out before
    /// the rest is read like a listener's upstream.
    pub upstream: toml::Value,
}

/// An optional `u32` written as a TOML integer or, after `${VAR}` interpolation, as a string of
/// ASCII digits (`"1024"`); anything else (signs, spaces, `0x`, out of range) is an error that
/// names the value.
fn u32_or_digits<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum IntOrText {
        Int(i64),
        Text(String),
    }
    let parsed = match IntOrText::deserialize(d)? {
        IntOrText::Int(n) => u32::try_from(n).ok(),
        IntOrText::Text(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()
        }
        IntOrText::Text(s) => {
            return Err(serde::de::Error::custom(format!(
                "invalid value {s:?}: expected an integer from 0 to {}",
                u32::MAX
            )))
        }
    };
    parsed.map(Some).ok_or_else(|| {
        serde::de::Error::custom(format!("expected an integer from 0 to {}", u32::MAX))
    })
}
