//! `[admin]`: from its raw table to [`AdminConfig`].
//!
//! `listen` is one address or a list of them (a list item may carry several, comma-separated,
//! so one variable can hold them all); each is bound on its own. `bearer_token_file` protects
//! `/metrics` only: the probes (`/healthz`, `/readyz`) stay open, since kubelet sends no
//! credentials.

use super::{msg, Fields};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub struct AdminConfig {
    /// Every address the admin listener binds; never empty.
    pub listen: Vec<SocketAddr>,
    /// `/metrics` requires `Authorization: Bearer <this file's content>`.
    pub bearer_token_file: Option<PathBuf>,
}

pub(super) fn admin_from_raw(a: super::raw::RawAdmin, f: &mut Fields) -> Option<AdminConfig> {
    let items: Vec<(String, String)> = match a.listen {
        toml::Value::String(s) => vec![("admin.listen".to_owned(), s)],
        toml::Value::Array(v) => {
            let mut items = Vec::with_capacity(v.len());
            for (i, item) in v.into_iter().enumerate() {
                let path = format!("admin.listen[{i}]");
                match item {
                    toml::Value::String(s) => items.push((path, s)),
                    _ => f.push(
                        path,
                        msg("expected an address string like \"10.0.0.5:9901\""),
                    ),
                }
            }
            items
        }
        _ => {
            f.push(
                "admin.listen",
                msg("expected an address or a list of addresses"),
            );
            return None;
        }
    };
    let before = f.errors.len();
    let mut listen: Vec<SocketAddr> = Vec::with_capacity(items.len());
    for (path, s) in items {
        if let Some(addr) = f.parse::<SocketAddr>(&path, s.trim()) {
            if listen.contains(&addr) {
                f.push(path, msg(format!("{addr} is listed twice")));
            } else {
                listen.push(addr);
            }
        }
    }
    if listen.is_empty() && f.errors.len() == before {
        f.push(
            "admin.listen",
            msg("at least one address is required (an empty list binds nothing)"),
        );
    }
    let bearer_token_file = match a.bearer_token_file {
        Some(p) if p.trim().is_empty() => {
            f.push(
                "admin.bearer_token_file",
                msg("is empty: give the token file's path"),
            );
            None
        }
        p => p.map(PathBuf::from),
    };
    (f.errors.len() == before).then_some(AdminConfig {
        listen,
        bearer_token_file,
    })
}
