//! The sidecar profile's egress listener (`json-rpc-egress`): kept when
//! `IRONIC_PROXY_EGRESS_CREDENTIALS` names the credentials file Ironic's `HTTP_PROXY` carries,
//! removed when it is unset or `none` (Ironic then does its own TLS, as before).
//!
//! Its `plain_ports` are `IRONIC_PROXY_EGRESS_PLAIN_PORTS` (comma-separated; `none`: no port),
//! by default the httpd's port `IRONIC_PROXY_HTTPD_PORT` (6180): in Metal3 a conductor's peers
//! and its image server share an IP, Python's `no_proxy` ignores ports for an IP, so image
//! downloads reach the egress and are relayed in plain HTTP as they were sent before. With the
//! networking service's listener on (`IRONIC_PROXY_NETWORKING_RPC_SOCKET`), its port
//! (`IRONIC_PROXY_NETWORKING_RPC_PORT`, 6190) is added to `ports`: conductors' calls to
//! `ironic-networking` leave over mutual TLS too.
//!
//! `others` is `IRONIC_PROXY_EGRESS_OTHERS` (default `relay`): every other `http://` call of
//! Ironic (agents, images, Redfish over HTTP) is relayed in plain HTTP as it would have gone
//! direct, so the kit sets no `no_proxy` beyond loopback; `refuse` answers them 403.

use super::{Env, Origins};

/// The name of the profile's egress listener.
const NAME: &str = "json-rpc-egress";

/// The ports relayed in plain HTTP (see the module docs).
const PLAIN_PORTS: &str = "IRONIC_PROXY_EGRESS_PLAIN_PORTS";

/// Removes the egress listener unless `IRONIC_PROXY_EGRESS_CREDENTIALS` is set; when kept, its
/// keys' errors name the variables they came from.
pub(super) fn assemble(tree: &mut toml::Value, env: &dyn Env, origins: &mut Origins) {
    let Some(listeners) = tree
        .get_mut("listeners")
        .and_then(toml::Value::as_array_mut)
    else {
        return;
    };
    let Some(at) = listeners
        .iter()
        .position(|l| l.get("name").and_then(toml::Value::as_str) == Some(NAME))
    else {
        return;
    };
    let on = env
        .var("IRONIC_PROXY_EGRESS_CREDENTIALS")
        .is_some_and(|v| !v.is_empty() && v != "none");
    if !on {
        listeners.remove(at);
        return;
    }
    let plain = env.var(PLAIN_PORTS).filter(|v| !v.trim().is_empty());
    let (plain, plain_var) = match plain.as_deref() {
        Some("none") => (None, PLAIN_PORTS),
        Some(_) => (Some(format!("${{{PLAIN_PORTS}}}")), PLAIN_PORTS),
        None => (
            Some("${IRONIC_PROXY_HTTPD_PORT:-6180}".to_owned()),
            "IRONIC_PROXY_HTTPD_PORT",
        ),
    };
    let networking = env
        .var("IRONIC_PROXY_NETWORKING_RPC_SOCKET")
        .is_some_and(|v| !v.trim().is_empty());
    if let Some(e) = listeners[at]
        .get_mut("egress")
        .and_then(toml::Value::as_table_mut)
    {
        e.insert(
            "plain_ports".into(),
            toml::Value::Array(plain.into_iter().map(toml::Value::String).collect()),
        );
        if networking {
            if let Some(ports) = e.get_mut("ports").and_then(toml::Value::as_array_mut) {
                ports.push("${IRONIC_PROXY_NETWORKING_RPC_PORT:-6190}".into());
            }
        }
    }
    origins
        .keys
        .push((format!("listeners[{at}].egress.plain_ports"), plain_var));
    origins.keys.push((
        format!("listeners[{at}].listen"),
        "IRONIC_PROXY_EGRESS_LISTEN",
    ));
    origins.keys.push((
        format!("listeners[{at}].egress.credentials"),
        "IRONIC_PROXY_EGRESS_CREDENTIALS",
    ));
    origins.keys.push((
        format!("listeners[{at}].egress.others"),
        "IRONIC_PROXY_EGRESS_OTHERS",
    ));
}

#[cfg(test)]
mod tests {
    use crate::config::profile::load;
    use std::collections::HashMap;

    fn pod(extra: &[(&str, &str)]) -> HashMap<String, String> {
        [
            ("POD_NAME", "ironic-0"),
            ("POD_NAMESPACE", "metal3"),
            ("POD_IPS", "192.168.111.21"),
            ("IRONIC_PROXY_PEER_CIDRS", "192.168.111.0/24,fd00:1101::/64"),
            ("IRONIC_PROXY_HTPASSWD", "none"),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    #[test]
    fn the_sidecar_has_an_egress_listener_only_with_credentials() {
        for off in [&[][..], &[("IRONIC_PROXY_EGRESS_CREDENTIALS", "none")][..]] {
            let c = load("sidecar", &pod(off)).expect("sidecar");
            assert!(c.listeners.iter().all(|l| l.egress.is_none()));
        }
        let on = pod(&[
            (
                "IRONIC_PROXY_EGRESS_CREDENTIALS",
                "/shared/ironic-proxy/egress",
            ),
            ("IRONIC_PROXY_RPC_PORT", "6190"),
        ]);
        let c = load("sidecar", &on).expect("sidecar");
        let l = c
            .listeners
            .iter()
            .find(|l| l.name == "json-rpc-egress")
            .expect("egress listener");
        assert_eq!(l.listen.to_string(), "127.0.0.1:8090");
        let e = l.egress.as_ref().expect("egress");
        assert_eq!(e.ports, [6190]);
        assert_eq!(e.plain_ports, [6180]);
        assert!(e.allows_host("ironic-1.ironic.metal3.svc"));
        assert!(e.allows_host("192.168.111.22"));
        assert!(e.allows_host("fd00:1101::7"));
        assert!(!e.allows_host("192.168.112.1"));
        assert!(!e.allows_host("example.org"));
        let bad = pod(&[
            ("IRONIC_PROXY_EGRESS_CREDENTIALS", "/e"),
            ("IRONIC_PROXY_EGRESS_LISTEN", "0.0.0.0:8090"),
        ]);
        let err = crate::error::chain(&load("sidecar", &bad).expect_err("refused"));
        assert!(
            err.contains("listeners[2].listen (from IRONIC_PROXY_EGRESS_LISTEN)"),
            "{err}"
        );
    }

    fn egress_of(env: &HashMap<String, String>) -> crate::config::EgressConfig {
        let c = load("sidecar", env).expect("sidecar");
        c.listeners
            .iter()
            .find_map(|l| l.egress.clone())
            .expect("egress listener")
    }

    #[test]
    fn the_egress_relays_the_httpd_port_plain_and_adds_the_networking_port() {
        let on = [("IRONIC_PROXY_EGRESS_CREDENTIALS", "/e")];
        let e = egress_of(&pod(&[on[0], ("IRONIC_PROXY_HTTPD_PORT", "6280")]));
        assert_eq!(
            (e.ports.as_slice(), e.plain_ports.as_slice()),
            (&[6189][..], &[6280][..])
        );
        let e = egress_of(&pod(&[
            on[0],
            ("IRONIC_PROXY_EGRESS_PLAIN_PORTS", "6180,8080"),
        ]));
        assert_eq!(e.plain_ports, [6180, 8080]);
        let e = egress_of(&pod(&[on[0], ("IRONIC_PROXY_EGRESS_PLAIN_PORTS", "none")]));
        assert!(e.plain_ports.is_empty());
        let e = egress_of(&pod(&[
            on[0],
            (
                "IRONIC_PROXY_NETWORKING_RPC_SOCKET",
                "/shared/networking.sock",
            ),
            ("IRONIC_PROXY_NETWORKING_RPC_PORT", "6191"),
        ]));
        assert_eq!(
            (e.ports.as_slice(), e.plain_ports.as_slice()),
            (&[6189, 6191][..], &[6180][..])
        );
        assert_eq!(e.others, crate::config::EgressOthers::Relay);
        let e = egress_of(&pod(&[on[0], ("IRONIC_PROXY_EGRESS_OTHERS", "refuse")]));
        assert_eq!(e.others, crate::config::EgressOthers::Refuse);
        let bad = pod(&[on[0], ("IRONIC_PROXY_EGRESS_OTHERS", "open")]);
        let err = crate::error::chain(&load("sidecar", &bad).expect_err("refused"));
        assert!(
            err.contains("egress.others (from IRONIC_PROXY_EGRESS_OTHERS): \"open\" is not"),
            "{err}"
        );
        let clash = pod(&[on[0], ("IRONIC_PROXY_EGRESS_PLAIN_PORTS", "6189")]);
        let err = crate::error::chain(&load("sidecar", &clash).expect_err("refused"));
        assert!(
            err.contains("egress.plain_ports (from IRONIC_PROXY_EGRESS_PLAIN_PORTS): port 6189"),
            "{err}"
        );
    }
}
