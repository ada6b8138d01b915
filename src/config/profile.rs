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
//!
//! Where the listener's `[listeners.auth]` and the global `[tls]` policy will be added for a
//! profile (`IRONIC_PROXY_HTPASSWD`, ...): [`assemble`], once those keys exist.

use super::{Config, ConfigError, Env};

/// A profile: its name, its template and the defaults it gives variables the template reads.
struct Profile {
    name: &'static str,
    template: &'static str,
    defaults: &'static [(&'static str, &'static str)],
    /// What it is, for `--help` and errors.
    about: &'static str,
}

const SIDECAR: &str = include_str!("../../config/profiles/sidecar.toml");
const BALANCER: &str = include_str!("../../config/profiles/balancer.toml");

const PROFILES: &[Profile] = &[
    Profile {
        name: "sidecar",
        template: SIDECAR,
        defaults: &[],
        about: "sidecar of an Ironic pod as the Ironic standalone operator runs it \
                (API 6385, JSON-RPC 6189)",
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
    },
    Profile {
        name: "balancer",
        template: BALANCER,
        defaults: &[],
        about: "load balancer for the Ironic API (DaemonSet on the host network, 6385)",
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
    assemble(&mut tree, &env)?;
    Config::from_tree(tree, &env).map_err(|source| ProfileError::Config {
        name: profile.name,
        source,
    })
}

/// The Rust-side parts of a profile; see the module documentation.
fn assemble(tree: &mut toml::Value, env: &dyn Env) -> Result<(), ProfileError> {
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
    Ok(())
}

#[cfg(test)]
mod tests;
