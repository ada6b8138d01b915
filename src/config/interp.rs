//! `${VAR}` and `${VAR:-default}` interpolation of every string in the configuration.
//!
//! Interpolation runs on the parsed TOML tree before typing, so every string value (including
//! array items and nested tables) is covered and errors carry the key path of the value. `$$`
//! writes a literal `$`. Environment reads go through [`Env`] so tests never touch the process
//! environment.
//!
//! List-valued keys ([`LIST_KEYS`]: `dns_names`, `ip_addresses`, `allow`, `fallback`, `servers`,
//! and an egress listener's `targets`, `ports` and `plain_ports`) take a
//! comma-separated value in one item, so one environment variable can carry a whole list (the
//! downward API's `status.podIPs` is `10.0.0.5,fd00::5`). After expansion such an item becomes
//! one item per comma-separated piece and empty pieces are dropped, so `"${EXTRA:-}"` adds
//! nothing when EXTRA is unset. In `allow`, the pieces of an `ip:` item are all CIDRs:
//! `"ip:10.0.0.0/8,fd00::/64"` is two rules. None of these values can contain a comma.

use std::collections::HashMap;

/// Where variables come from.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InterpError {
    #[error("environment variable {0} is not set (use ${{{0}:-default}} for a default)")]
    Unset(String),
    #[error("unterminated ${{ in {0:?}")]
    Unterminated(String),
    #[error("invalid variable name {0:?}")]
    BadName(String),
    #[error("every entry expanded to nothing (an empty allow list would accept any client)")]
    EmptyAllow,
}

/// Keys whose array items are split at commas after expansion (see the module docs).
pub(crate) const LIST_KEYS: &[&str] = &[
    "dns_names",
    "ip_addresses",
    "allow",
    "fallback",
    "servers",
    "targets",
    "ports",
    "plain_ports",
    // `[admin] listen` as a list (a listener's `listen` is a string, never split).
    "listen",
];

/// Expands every `${...}` in `input`.
pub fn expand(input: &str, env: &dyn Env) -> Result<String, InterpError> {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| InterpError::Unterminated(input.into()))?;
            let expr = &body[..end];
            let (name, default) = match expr.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (expr, None),
            };
            if name.is_empty()
                || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                || name.as_bytes()[0].is_ascii_digit()
            {
                return Err(InterpError::BadName(name.into()));
            }
            // As in the shell, `:-` also takes the default when the variable is set but empty.
            match (env.var(name), default) {
                (Some(v), Some(d)) if v.is_empty() => out.push_str(d),
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => return Err(InterpError::Unset(name.into())),
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Expands every string in a TOML tree in place; errors are `(key path, error)`.
pub(crate) fn expand_tree(
    value: &mut toml::Value,
    path: &str,
    env: &dyn Env,
    errors: &mut Vec<(String, InterpError)>,
) {
    match value {
        toml::Value::String(s) => match expand(s, env) {
            Ok(v) => *s = v,
            Err(e) => errors.push((path.to_owned(), e)),
        },
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                expand_tree(item, &format!("{path}[{i}]"), env, errors);
            }
            let key = path.rsplit('.').next().unwrap_or(path);
            if LIST_KEYS.contains(&key) {
                let had_items = !items.is_empty();
                split_items(items, key == "allow");
                if key == "allow" && had_items && items.is_empty() {
                    errors.push((path.to_owned(), InterpError::EmptyAllow));
                }
            }
        }
        toml::Value::Table(table) => {
            for (k, v) in table.iter_mut() {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                expand_tree(v, &p, env, errors);
            }
        }
        _ => {}
    }
}

/// Splits every string item at commas, drops empty pieces; with `ip_prefix`, the pieces of an
/// `ip:` item keep the prefix.
fn split_items(items: &mut Vec<toml::Value>, ip_prefix: bool) {
    let mut out = Vec::with_capacity(items.len());
    for item in items.drain(..) {
        let toml::Value::String(s) = item else {
            out.push(item);
            continue;
        };
        let prefix = if ip_prefix && s.trim_start().starts_with("ip:") {
            "ip:"
        } else {
            ""
        };
        for piece in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let piece = piece.strip_prefix(prefix).unwrap_or(piece);
            out.push(toml::Value::String(format!("{prefix}{piece}")));
        }
    }
    *items = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn expands_set_default_and_literal() {
        let e = env(&[("POD_IP", "10.0.0.5")]);
        assert_eq!(expand("ip ${POD_IP}", &e).unwrap(), "ip 10.0.0.5");
        assert_eq!(expand("${NS:-metal3}.svc", &e).unwrap(), "metal3.svc");
        assert_eq!(expand("${POD_IP:-x}", &e).unwrap(), "10.0.0.5");
        assert_eq!(expand("cost $$5 and $x", &e).unwrap(), "cost $5 and $x");
        assert_eq!(expand("${EMPTY:-}", &e).unwrap(), "");
    }

    fn expand_toml(text: &str, e: &HashMap<String, String>) -> (toml::Value, Vec<String>) {
        let mut tree = toml::Value::Table(toml::from_str(text).unwrap());
        let mut errors = Vec::new();
        expand_tree(&mut tree, "", e, &mut errors);
        let errors = errors.iter().map(|(p, e)| format!("{p}: {e}")).collect();
        (tree, errors)
    }

    #[test]
    fn list_keys_split_one_variable_into_items() {
        let e = env(&[
            ("POD_IPS", "10.0.0.5, fd00::5"),
            ("CIDRS", "10.0.0.0/8,fd00::/64"),
            ("NOTE", "a,b"),
        ]);
        let (tree, errors) = expand_toml(
            r#"
            [identity]
            ip_addresses = ["${POD_IPS}", "${EXTRA:-}"]
            other = ["${NOTE}"]
            [[listeners]]
            allow = ["*.ironic.metal3.svc", "ip:${CIDRS}"]
            "#,
            &e,
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            tree["identity"]["ip_addresses"],
            toml::Value::Array(vec!["10.0.0.5".into(), "fd00::5".into()])
        );
        // Other keys keep their commas.
        assert_eq!(
            tree["identity"]["other"],
            toml::Value::Array(vec!["a,b".into()])
        );
        assert_eq!(
            tree["listeners"][0]["allow"],
            toml::Value::Array(vec![
                "*.ironic.metal3.svc".into(),
                "ip:10.0.0.0/8".into(),
                "ip:fd00::/64".into()
            ])
        );
    }

    #[test]
    fn an_allow_list_that_expands_to_nothing_is_an_error() {
        let (_, errors) = expand_toml("[[listeners]]\nallow = [\"${CIDRS:-}\"]", &env(&[]));
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("listeners[0].allow: "), "{errors:?}");
        // Written empty on purpose, it stays allowed.
        let (_, errors) = expand_toml("[[listeners]]\nallow = []", &env(&[]));
        assert!(errors.is_empty());
    }

    #[test]
    fn set_but_empty_takes_the_default_like_the_shell() {
        let e = env(&[("EMPTY", "")]);
        assert_eq!(expand("${EMPTY:-6385}", &e).unwrap(), "6385");
        assert_eq!(expand("[${EMPTY}]", &e).unwrap(), "[]");
    }

    #[test]
    fn errors_name_the_variable() {
        let e = env(&[]);
        assert_eq!(
            expand("${NOPE}", &e),
            Err(InterpError::Unset("NOPE".into()))
        );
        assert!(matches!(
            expand("${OPEN", &e),
            Err(InterpError::Unterminated(_))
        ));
        assert!(matches!(expand("${1X}", &e), Err(InterpError::BadName(_))));
        assert!(matches!(expand("${A B}", &e), Err(InterpError::BadName(_))));
    }
}
