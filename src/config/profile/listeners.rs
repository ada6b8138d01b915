//! The optional listeners of the sidecar profiles, each switched on by a variable:
//!
//! - `IRONIC_PROXY_NETWORKING_RPC_SOCKET`: the unix socket where Ironic's networking service
//!   (`ironic-networking`, Ironic 34+) serves its JSON-RPC (`[ironic_networking_json_rpc]
//!   unix_socket`). The listener `networking-json-rpc` on `IRONIC_PROXY_NETWORKING_RPC_PORT`
//!   (default 6190, IrSO's port) is a copy of the conductors' `json-rpc` listener: mTLS with
//!   the same `allow`, so the same callers (the conductors) are authorised.
//! - `IRONIC_PROXY_IPXE_TLS_PORT`: iPXE over TLS on that port (ironic-image's `IPXE_TLS_PORT`,
//!   default 8084 there; `ironic-config/apache2-ipxe.conf.j2`), listener `ipxe-tls`: the
//!   per-node iPXE files found on whichever conductor has them (`find = "newest"`), the rest
//!   from the local httpd.
//! - `IRONIC_PROXY_VMEDIA_TLS_PORT`: virtual media over TLS (IrSO's 6183, ironic-image's
//!   `VMEDIA_TLS_PORT`; `apache2-vmedia.conf.j2` serves `/redfish/` and `/ilo/` there), listener
//!   `vmedia-tls`: those images found on the conductor that built them.
//!
//! The boot listeners reach Ironic's httpd on `127.0.0.1:IRONIC_PROXY_HTTPD_PORT` (default 6180)
//! and on every peer through the headless Service, as `config/sidecar-boot.toml` does over plain
//! HTTP; `IRONIC_PROXY_PEERS=none` leaves only the local httpd.

use super::{Env, ProfileError};

const NETWORKING_SOCKET: &str = "IRONIC_PROXY_NETWORKING_RPC_SOCKET";
const IPXE_PORT: &str = "IRONIC_PROXY_IPXE_TLS_PORT";
const VMEDIA_PORT: &str = "IRONIC_PROXY_VMEDIA_TLS_PORT";

const HTTPD: &str = "127.0.0.1:${IRONIC_PROXY_HTTPD_PORT:-6180}";
const PEERS: &str = "${IRONIC_PROXY_SERVICE:-ironic}.${POD_NAMESPACE}.svc.\
    ${IRONIC_PROXY_CLUSTER_DOMAIN:-cluster.local}:${IRONIC_PROXY_HTTPD_PORT:-6180}";

/// Adds the listeners whose variables are set to `tree` (a sidecar profile's).
pub(super) fn assemble(tree: &mut toml::Value, env: &dyn Env) -> Result<(), ProfileError> {
    let var = |name: &'static str| env.var(name).filter(|v| !v.trim().is_empty());
    let peers = env.var("IRONIC_PROXY_PEERS").as_deref() != Some("none");
    let Some(listeners) = tree
        .get_mut("listeners")
        .and_then(toml::Value::as_array_mut)
    else {
        return Ok(());
    };
    if let Some(socket) = var(NETWORKING_SOCKET) {
        let rpc = listeners
            .iter()
            .find(|l| l.get("name").and_then(toml::Value::as_str) == Some("json-rpc"))
            .and_then(toml::Value::as_table)
            .cloned();
        let Some(mut l) = rpc else {
            return Err(ProfileError::Variable {
                var: NETWORKING_SOCKET,
                value: socket,
                reason: "this profile has no JSON-RPC listener to copy",
            });
        };
        l.insert("name".into(), "networking-json-rpc".into());
        l.insert(
            "listen".into(),
            "${IRONIC_PROXY_BIND:-[::]}:${IRONIC_PROXY_NETWORKING_RPC_PORT:-6190}".into(),
        );
        let path = socket.replace('$', "$$");
        l.insert("upstream".into(), format!("unix:{path}").into());
        listeners.push(toml::Value::Table(l));
    }
    // Health checks: boot.ipxe is on every instance's httpd (written at conductor start);
    // vmedia's httpd has no such file, its DocumentRoot listing ("/", Options Indexes) answers.
    for (var_name, name, routes, health) in [
        (IPXE_PORT, "ipxe-tls", ipxe_routes(peers), "/boot.ipxe"),
        (VMEDIA_PORT, "vmedia-tls", vmedia_routes(peers), "/"),
    ] {
        let Some(port) = var(var_name) else {
            continue;
        };
        let port = port.trim();
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(ProfileError::Variable {
                var: var_name,
                value: port.to_owned(),
                reason: "expected a port number (1-65535)",
            });
        }
        let mut l = toml::Table::new();
        l.insert("name".into(), name.into());
        l.insert(
            "listen".into(),
            format!("${{IRONIC_PROXY_BIND:-[::]}}:{port}").into(),
        );
        l.insert("tls".into(), "server".into());
        l.insert("upstream".into(), upstream(peers, None, health));
        l.insert("routes".into(), toml::Value::Array(routes));
        listeners.push(toml::Value::Table(l));
    }
    Ok(())
}

/// An upstream on the local httpd, with the peers' unless turned off; `find` asks them all.
fn upstream(peers: bool, find: Option<&str>, health: &str) -> toml::Value {
    let mut t = toml::Table::new();
    t.insert("local".into(), HTTPD.into());
    if peers {
        t.insert("dns".into(), PEERS.into());
    }
    if let Some(timeout) = find {
        t.insert("find".into(), "newest".into());
        t.insert("find_timeout".into(), timeout.into());
    }
    let health = format!(
        "{{ path = \"{health}\", interval = \"2s\", timeout = \"1s\", unhealthy_after = 2, \
         healthy_after = 1 }}"
    );
    if let Ok(h) = toml::from_str::<toml::Table>(&format!("h = {health}")) {
        if let Some(h) = h.get("h") {
            t.insert("health".into(), h.clone());
        }
    }
    toml::Value::Table(t)
}

fn route(paths: &[&str], upstream: toml::Value) -> toml::Value {
    let mut r = toml::Table::new();
    r.insert(
        "paths".into(),
        toml::Value::Array(paths.iter().map(|p| (*p).into()).collect()),
    );
    r.insert("upstream".into(), upstream);
    toml::Value::Table(r)
}

/// Per-node iPXE files exist only on the owning conductor's httpd (as in
/// config/sidecar-boot.toml).
fn ipxe_routes(peers: bool) -> Vec<toml::Value> {
    vec![route(
        &["/boot.ipxe", "/pxelinux.cfg/*", "/grub.cfg-01-*"],
        upstream(peers, Some("2s"), "/boot.ipxe"),
    )]
}

/// A node's virtual media image exists only on the httpd of the conductor that built it.
fn vmedia_routes(peers: bool) -> Vec<toml::Value> {
    vec![route(
        &["/redfish/*", "/ilo/*"],
        upstream(peers, Some("2s"), "/"),
    )]
}
