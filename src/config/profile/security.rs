//! The security parts of a profile, assembled from variables: `[listeners.auth]` on the API
//! listener and the global `[tls]` policy (see the module documentation of `profile`).

use super::{Env, Origins, ProfileError};

const HTPASSWD: &str = "IRONIC_PROXY_HTPASSWD";
const REALM: &str = "IRONIC_PROXY_AUTH_REALM";
const MIN_VERSION: &str = "IRONIC_PROXY_TLS_MIN_VERSION";
const CIPHER_SUITES: &str = "IRONIC_PROXY_TLS_CIPHER_SUITES";
const GROUPS: &str = "IRONIC_PROXY_TLS_GROUPS";

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
        (None, api) => {
            if let Some(realm) = realm {
                return Err(ProfileError::Variable {
                    var: REALM,
                    value: realm,
                    reason: "needs IRONIC_PROXY_HTPASSWD (the htpasswd file)",
                });
            }
            origins.unprotected_api = api.is_some();
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
    }
    for (key, name) in [("cipher_suites", CIPHER_SUITES), ("groups", GROUPS)] {
        if let Some(v) = var(name) {
            let items = v
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(literal)
                .collect();
            policy.insert(key.into(), toml::Value::Array(items));
            origins.keys.push((format!("tls.{key}"), name));
        }
    }
    if !policy.is_empty() {
        if let Some(root) = tree.as_table_mut() {
            root.insert("tls".into(), toml::Value::Table(policy));
        }
    }
    Ok(())
}
