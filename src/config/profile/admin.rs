//! The profiles' `[admin]`: where the admin endpoints listen, and the `/metrics` token.
//!
//! `IRONIC_PROXY_ADMIN_LISTEN`: addresses, comma-separated; a bare IP (`10.0.0.5`, `fd00::5`,
//! `[fd00::5]`) takes the template's port (9901 sidecar, 9902 balancer). Unset: every address
//! of `POD_IPS` and `127.0.0.1`. Never `[::]`: both roles run on the host network, where every
//! address includes the provisioning network's, on which the machines being provisioned live.
//! The pod IPs are where kubelet's HTTP probes and Prometheus connect (a probe without `host`
//! dials the pod IP); loopback keeps `kubectl port-forward` working. Without either variable
//! the template's default stays: loopback only.
//!
//! `IRONIC_PROXY_METRICS_TOKEN_FILE`: `bearer_token_file`; unset or `none`: `/metrics` open.

use super::{Env, Origins};
use std::net::{IpAddr, SocketAddr};

const LISTEN: &str = "IRONIC_PROXY_ADMIN_LISTEN";
const TOKEN: &str = "IRONIC_PROXY_METRICS_TOKEN_FILE";

pub(super) fn assemble(tree: &mut toml::Value, env: &dyn Env, origins: &mut Origins) {
    let Some(admin) = tree.get_mut("admin").and_then(toml::Value::as_table_mut) else {
        return;
    };
    let var = |name: &str| env.var(name).filter(|v| !v.trim().is_empty());
    if let Some(file) = var(TOKEN).filter(|v| v.trim() != "none") {
        admin.insert(
            "bearer_token_file".into(),
            toml::Value::String(file.replace('$', "$$")),
        );
        origins
            .keys
            .push(("admin.bearer_token_file".to_owned(), TOKEN));
    }
    let port = admin
        .get("listen")
        .and_then(|l| l.get(0))
        .and_then(toml::Value::as_str)
        .and_then(template_port)
        .expect("every profile template's admin.listen is [\"${IRONIC_PROXY_ADMIN_LISTEN:-ADDR}\"] (tested)");
    let (value, from) = match (var(LISTEN), var("POD_IPS")) {
        (Some(v), _) => (v, LISTEN),
        (None, Some(ips)) => (format!("{ips},127.0.0.1"), "POD_IPS"),
        (None, None) => return,
    };
    let mut items: Vec<toml::Value> = Vec::new();
    for p in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bare = p
            .strip_prefix('[')
            .and_then(|p| p.strip_suffix(']'))
            .unwrap_or(p);
        let item = match bare.parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, port).to_string(),
            // Anything else is typed by the config parser, whose error names the variable.
            Err(_) => p.to_owned(),
        };
        let item = toml::Value::String(item.replace('$', "$$"));
        // POD_IPS may hold 127.0.0.1 itself (a test, a one-node lab): bound once.
        if !items.contains(&item) {
            items.push(item);
        }
    }
    admin.insert("listen".into(), toml::Value::Array(items));
    origins.keys.push(("admin.listen".to_owned(), from));
}

/// The port of the template's default address, `${VAR:-ADDR}`.
fn template_port(listen: &str) -> Option<u16> {
    let default = listen.split_once(":-")?.1.strip_suffix('}')?;
    default.parse::<SocketAddr>().ok().map(|a| a.port())
}

#[cfg(test)]
mod tests {
    use super::super::load;
    use std::collections::HashMap;

    fn env(extra: &[(&str, &str)]) -> HashMap<String, String> {
        [
            ("POD_NAME", "ironic-x"),
            ("POD_NAMESPACE", "metal3"),
            ("POD_IPS", "192.168.111.21,fd00:1101::21"),
            ("IRONIC_PROXY_PEER_CIDRS", "192.168.111.0/24,fd00:1101::/64"),
            ("IRONIC_PROXY_HTPASSWD", "none"),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    fn listen(profile: &str, extra: &[(&str, &str)]) -> Vec<String> {
        let c = load(profile, &env(extra)).unwrap();
        c.admin
            .unwrap()
            .listen
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn the_pod_ips_and_loopback_by_default_never_every_address() {
        assert_eq!(
            listen("sidecar", &[]),
            [
                "192.168.111.21:9901",
                "[fd00:1101::21]:9901",
                "127.0.0.1:9901"
            ]
        );
        assert_eq!(
            listen("balancer", &[]),
            [
                "192.168.111.21:9902",
                "[fd00:1101::21]:9902",
                "127.0.0.1:9902"
            ]
        );
        assert_eq!(
            listen("sidecar", &[("POD_IPS", "127.0.0.1")]),
            ["127.0.0.1:9901"]
        );
        let mut e = env(&[]);
        e.remove("POD_IPS");
        e.insert("IRONIC_PROXY_IDENTITY".into(), "files".into());
        let c = load("sidecar", &e).unwrap();
        assert_eq!(c.admin.unwrap().listen[0].to_string(), "127.0.0.1:9901");
    }

    #[test]
    fn the_variable_takes_addresses_and_bare_ips() {
        assert_eq!(
            listen(
                "sidecar",
                &[(
                    "IRONIC_PROXY_ADMIN_LISTEN",
                    "10.0.0.5, [fd00::5] ,[::1]:9999,"
                )]
            ),
            ["10.0.0.5:9901", "[fd00::5]:9901", "[::1]:9999"]
        );
        let e = load(
            "sidecar",
            &env(&[("IRONIC_PROXY_ADMIN_LISTEN", "10.0.0.5,node-1:9901")]),
        )
        .unwrap_err();
        let msg = crate::error::chain(&e);
        assert!(
            msg.contains("admin.listen[1] (from IRONIC_PROXY_ADMIN_LISTEN)"),
            "{msg}"
        );
    }

    #[test]
    fn the_token_file_comes_from_its_variable() {
        let c = load(
            "sidecar",
            &env(&[("IRONIC_PROXY_METRICS_TOKEN_FILE", "/auth/metrics/token")]),
        )
        .unwrap();
        assert_eq!(
            c.admin.unwrap().bearer_token_file.unwrap().to_str(),
            Some("/auth/metrics/token")
        );
        for off in ["none", ""] {
            let c = load(
                "balancer",
                &env(&[("IRONIC_PROXY_METRICS_TOKEN_FILE", off)]),
            )
            .unwrap();
            assert!(c.admin.unwrap().bearer_token_file.is_none());
        }
    }
}
