//! The sidecar profile's egress listener (`json-rpc-egress`): kept when
//! `IRONIC_PROXY_EGRESS_CREDENTIALS` names the credentials file Ironic's `HTTP_PROXY` carries,
//! removed when it is unset or `none` (Ironic then does its own TLS, as before).

use super::{Env, Origins};

/// The name of the profile's egress listener.
const NAME: &str = "json-rpc-egress";

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
    origins.keys.push((
        format!("listeners[{at}].listen"),
        "IRONIC_PROXY_EGRESS_LISTEN",
    ));
    origins.keys.push((
        format!("listeners[{at}].egress.credentials"),
        "IRONIC_PROXY_EGRESS_CREDENTIALS",
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
}
