//! Built-in profiles: a whole role configured from environment variables alone, no file
//! (`run --profile NAME`, `check --profile NAME`, or `IRONIC_PROXY_PROFILE`).
//!
//! Each profile is an embedded TOML template (`config/profiles/*.toml`, the one source of truth
//! that the shipped manifests use) with `${VAR:-default}` in its strings, parsed by the normal
//! parser: an unset variable or a bad value is reported with its key path and the variable's
//! name. What a template cannot say is assembled here, on the tree before interpolation:
//!
//! - `IRONIC_PROXY_IDENTITY`: `issue` (default) signs our own leaf with the mounted CA;
//!   `files` uses a mounted certificate instead (`IRONIC_PROXY_CERT_DIR`, default
//!   `/certs/ironic`, the directory where the Ironic standalone operator mounts its TLS secret).
//! - `IRONIC_PROXY_PEERS`: `none` turns the sidecar's API peers off (only the local Ironic);
//!   `NAME:PORT` or `srv:NAME` replaces the discovery target built from the Service name.
//! - `IRONIC_PROXY_HTPASSWD`: the htpasswd file that protects the API listener with
//!   `[listeners.auth]` (the Ironic standalone operator mounts its API credentials Secret at
//!   `/auth/ironic/`, key `htpasswd`); `none` turns authentication off on purpose; unset is an
//!   error (exit 1, one line naming the variable): no profile serves the API without
//!   authentication unless told so. `IRONIC_PROXY_AUTH_REALM` sets the realm. The JSON-RPC
//!   listener never gets `[listeners.auth]`: its peers are authenticated by mTLS, and Ironic's
//!   own `http_basic` credentials pass through it untouched.
//! - `IRONIC_PROXY_EGRESS_CREDENTIALS`: keeps the `json-rpc-egress` listener (see [`egress`]).
//! - `IRONIC_PROXY_ADMIN_LISTEN`, `IRONIC_PROXY_METRICS_TOKEN_FILE`: `[admin]` (see [`admin`]).
//! - `IRONIC_PROXY_TLS_MIN_VERSION`, `IRONIC_PROXY_TLS_CIPHER_SUITES`, `IRONIC_PROXY_TLS_GROUPS`
//!   (lists comma-separated): the `[tls]` policy; each unset one keeps the default.
//!
//! A bad value of one of these variables is reported with its key path and the variable's name.

use super::{Config, ConfigError, Env};

/// A profile: its name, its template and the defaults it gives variables the template reads.
struct Profile {
    name: &'static str,
    template: &'static str,
    defaults: &'static [(&'static str, &'static str)],
    /// What it is, for `--help` and errors.
    about: &'static str,
    /// The sidecar of one Ironic instance: reads ironic-image's address variables and the
    /// optional listeners' (networking JSON-RPC, boot over TLS).
    sidecar: bool,
}

const SIDECAR: &str = include_str!("../../../config/profiles/sidecar.toml");
const BALANCER: &str = include_str!("../../../config/profiles/balancer.toml");

const PROFILES: &[Profile] = &[
    Profile {
        name: "sidecar",
        template: SIDECAR,
        defaults: &[],
        about: "sidecar of an Ironic pod as the Ironic standalone operator runs it \
                (API 6385, JSON-RPC 6189)",
        sidecar: true,
    },
    Profile {
        name: "sidecar-openshift",
        template: SIDECAR,
        // cluster-baremetal-operator provisioning/ironic_proxy.go: ironicPrivatePort = 6388.
        defaults: &[
            ("IRONIC_PROXY_API_PORT", "6388"),
            ("IRONIC_PROXY_PEER_API_PORT", "6388"),
        ],
        about: "sidecar of OpenShift's metal3 pod, API on 6388 behind the balancer",
        sidecar: true,
    },
    Profile {
        name: "balancer",
        template: BALANCER,
        defaults: &[],
        about: "load balancer for the Ironic API (DaemonSet on the host network, 6385)",
        sidecar: false,
    },
];

/// The profile names, for usage messages.
pub fn names() -> Vec<&'static str> {
    PROFILES.iter().map(|p| p.name).collect()
}

/// One line per profile: `name  what it is`.
pub fn describe() -> String {
    PROFILES
        .iter()
        .map(|p| format!("{:<18} {}\n", p.name, p.about))
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("unknown profile {name:?} (known: {known})")]
    Unknown { name: String, known: String },
    #[error("{var}={value:?}: {reason}")]
    Variable {
        var: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error(
        "IRONIC_PROXY_HTPASSWD is not set: this profile serves the Ironic API; set it to the \
         htpasswd file (e.g. /auth/ironic/htpasswd) or to none to serve it without \
         authentication on purpose"
    )]
    Unprotected,
    #[error("{var}={value:?}: {reason}")]
    Address {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("profile {name}")]
    Config {
        name: &'static str,
        #[source]
        source: ConfigError,
    },
}

/// The variables of the environment, then the profile's defaults.
struct WithDefaults<'a> {
    env: &'a dyn Env,
    defaults: &'static [(&'static str, &'static str)],
}

impl Env for WithDefaults<'_> {
    fn var(&self, name: &str) -> Option<String> {
        self.env.var(name).filter(|v| !v.is_empty()).or_else(|| {
            self.defaults
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }
}

/// Builds the configuration of profile `name` from `env`.
///
/// # Errors
///
/// An unknown name, a bad profile switch, or the configuration's own errors (which name the
/// key and the unset variable).
pub fn load(name: &str, env: &dyn Env) -> Result<Config, ProfileError> {
    let profile =
        PROFILES
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| ProfileError::Unknown {
                name: name.to_owned(),
                known: names().join(", "),
            })?;
    let env = WithDefaults {
        env,
        defaults: profile.defaults,
    };
    let mut tree: toml::Value = toml::from_str::<toml::Table>(profile.template)
        .map(toml::Value::Table)
        .expect("built-in profile templates parse (tested)");
    let origins = assemble(&mut tree, &env)?;
    if profile.sidecar {
        listeners::assemble(&mut tree, &env)?;
        add_ironic_ip(&mut tree, &env)?;
    }
    Config::from_tree(tree, &env).map_err(|source| ProfileError::Config {
        name: profile.name,
        source: origins.name_variables(source),
    })
}

/// Which keys [`assemble`] set from which variable, so errors can name it.
#[derive(Default)]
struct Origins {
    keys: Vec<(String, &'static str)>,
}

impl Origins {
    /// Appends `(from VAR)` to the path of each field error at a key set from a variable.
    fn name_variables(&self, e: ConfigError) -> ConfigError {
        let ConfigError::Fields(mut fields) = e else {
            return e;
        };
        for f in &mut fields {
            let var = self.keys.iter().find(|(key, _)| {
                f.path
                    .strip_prefix(key.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(['[', '.']))
            });
            if let Some((_, var)) = var {
                f.path = format!("{} (from {var})", f.path);
            }
        }
        ConfigError::Fields(fields)
    }
}

/// The Rust-side parts of a profile; see the module documentation.
fn assemble(tree: &mut toml::Value, env: &dyn Env) -> Result<Origins, ProfileError> {
    let mut origins = Origins::default();
    let var = |name: &'static str| env.var(name).filter(|v| !v.is_empty());
    // Values read here are inserted into the tree before interpolation: `$` must stay literal.
    let literal = |v: &str| toml::Value::String(v.replace('$', "$$"));
    if let Some(identity) = tree.get_mut("identity").and_then(toml::Value::as_table_mut) {
        match var("IRONIC_PROXY_IDENTITY").as_deref() {
            None | Some("issue") => {}
            Some("files") => {
                for key in [
                    "issuer_cert",
                    "issuer_key",
                    "dns_names",
                    "ip_addresses",
                    "validity",
                    "renew_before",
                ] {
                    identity.remove(key);
                }
                let dir = "${IRONIC_PROXY_CERT_DIR:-/certs/ironic}";
                identity.insert("cert".into(), format!("{dir}/tls.crt").into());
                identity.insert("key".into(), format!("{dir}/tls.key").into());
            }
            Some(other) => {
                return Err(ProfileError::Variable {
                    var: "IRONIC_PROXY_IDENTITY",
                    value: other.to_owned(),
                    reason: "expected issue or files",
                })
            }
        }
    }
    if let Some(peers) = var("IRONIC_PROXY_PEERS") {
        let upstream = tree
            .get_mut("listeners")
            .and_then(toml::Value::as_array_mut)
            .and_then(|ls| {
                ls.iter_mut()
                    .find(|l| l.get("name").and_then(toml::Value::as_str) == Some("api"))
            })
            .and_then(|l| l.get_mut("upstream"))
            .and_then(toml::Value::as_table_mut);
        let Some(upstream) = upstream else {
            return Err(ProfileError::Variable {
                var: "IRONIC_PROXY_PEERS",
                value: peers,
                reason: "this profile has no API upstream to change",
            });
        };
        if peers == "none" {
            if !upstream.contains_key("local") {
                return Err(ProfileError::Variable {
                    var: "IRONIC_PROXY_PEERS",
                    value: peers,
                    reason: "the balancer has no local Ironic: its peers cannot be turned off",
                });
            }
            for key in ["dns", "fallback", "tls"] {
                upstream.remove(key);
            }
        } else {
            upstream.insert("dns".into(), literal(&peers));
        }
    }
    admin::assemble(tree, env, &mut origins);
    security::assemble(tree, env, &mut origins)?;
    egress::assemble(tree, env, &mut origins);
    Ok(origins)
}

/// Adds ironic-image's `[DEFAULT]host` address (`address::ironic_ip`) to the issued
/// certificate's IP SANs, unless `POD_IPS` has it already.
fn add_ironic_ip(tree: &mut toml::Value, env: &dyn Env) -> Result<(), ProfileError> {
    let Some(ip) = address::ironic_ip(env)? else {
        return Ok(());
    };
    let pod_ips = env.var("POD_IPS").unwrap_or_default();
    if pod_ips
        .split(',')
        .any(|p| p.trim().parse::<std::net::IpAddr>().ok() == Some(ip))
    {
        return Ok(());
    }
    if let Some(ips) = tree
        .get_mut("identity")
        .and_then(|i| i.get_mut("ip_addresses"))
        .and_then(toml::Value::as_array_mut)
    {
        ips.push(ip.to_string().into());
    }
    Ok(())
}

mod address;
mod admin;
mod egress;
mod listeners;
mod netlink;
mod security;

#[cfg(test)]
mod tests;
