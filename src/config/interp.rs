//! `${VAR}` and `${VAR:-default}` interpolation of every string in the configuration.
//!
//! Interpolation runs on the parsed TOML tree before typing, so every string value (including
//! array items and nested tables) is covered and errors carry the key path of the value. `$$`
//! writes a literal `$`. Environment reads go through [`Env`] so tests never touch the process
//! environment.

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
}

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
            match (env.var(name), default) {
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
