//! A sidecar's certificate carries the VIP (issue 50): `IRONIC_PROXY_API_VIPS` on the `sidecar`
//! profile adds the addresses clients dial besides the pod's to the issued leaf, so a client
//! that dials the VIP (held by whichever node keepalived picked) verifies the sidecar behind it;
//! a VIP outside the CA's name constraints is refused, naming the variable. The real binary and
//! real curl, a recording upstream on Ironic's unix sockets.

use crate::support;
use crate::support::{node, role};

use role::Role;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use support::{curl, Upstream};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// A sidecar on 127.0.0.1 with `vips`, its Ironic sockets and export in `dir`, its CA in `ca`.
fn env(
    dir: &Path,
    ca: &Path,
    admin: SocketAddr,
    api: u16,
    vips: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("POD_NAME", "ironic-0".into()),
        ("POD_NAMESPACE", "metal3".into()),
        ("POD_IPS", "127.0.0.1".into()),
        ("IRONIC_PROXY_API_VIPS", vips.into()),
        ("IRONIC_PROXY_PEER_CIDRS", "127.0.0.0/8".into()),
        ("IRONIC_PROXY_TRUST", s(&ca.join("ca.crt"))),
        ("IRONIC_PROXY_ISSUER_DIR", s(ca)),
        ("IRONIC_PROXY_EXPORT_DIR", s(&dir.join("export"))),
        ("IRONIC_PROXY_API_SOCKET", s(&dir.join("ironic.sock"))),
        ("IRONIC_PROXY_RPC_SOCKET", s(&dir.join("json-rpc.sock"))),
        ("IRONIC_PROXY_ADMIN_LISTEN", admin.to_string()),
        ("IRONIC_PROXY_BIND", "127.0.0.1".into()),
        ("IRONIC_PROXY_API_PORT", api.to_string()),
        ("IRONIC_PROXY_RPC_PORT", node::free_port_on(LO).to_string()),
        ("IRONIC_PROXY_PEERS", "none".into()),
        ("IRONIC_PROXY_HTPASSWD", "none".into()),
    ]
}

/// `GET /v1/nodes` on `https://HOST:PORT`, the connection made to 127.0.0.1 (where the VIP
/// would route on the node that holds it), the certificate verified against the name `host`.
fn get_as(host: &str, api: u16, cacert: &str) -> support::Output {
    curl(&[
        "--cacert",
        cacert,
        "--connect-to",
        &format!("{host}:{api}:127.0.0.1:{api}"),
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("https://{host}:{api}/v1/nodes"),
    ])
}

#[test]
fn a_client_dialling_the_vip_verifies_the_sidecar() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    // Constrained as `ca init` advises for a site: the namespace's names, the nodes' network.
    node::ca_init(
        &ca,
        &["--permit-dns", "metal3.svc", "--permit-ip", "127.0.0.0/8"],
    );
    let _api_up = Upstream::start(&dir.path().join("ironic.sock"));
    let _rpc_up = Upstream::start(&dir.path().join("json-rpc.sock"));
    let admin = SocketAddr::new(LO, node::free_port_on(LO));
    let api = node::free_port_on(LO);
    let env = env(dir.path(), &ca, admin, api, "127.0.0.2");
    let mut sidecar = Role::spawn(&["run", "--profile", "sidecar"], &env, admin);
    sidecar.wait_ready(Duration::from_secs(20));
    let cacert = s(&ca.join("ca.crt"));
    let o = get_as("127.0.0.2", api, &cacert);
    assert_eq!(
        o.stdout, "200",
        "the VIP is in the sidecar's certificate: {o:?}"
    );
    // The precondition of the check above: an address the leaf does not name fails to verify.
    let o = get_as("127.0.0.3", api, &cacert);
    assert_eq!(
        o.code,
        Some(60),
        "curl: the certificate does not name 127.0.0.3: {o:?}"
    );
}

#[test]
fn a_vip_outside_the_cas_constraints_is_refused_naming_the_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    node::ca_init(
        &ca,
        &["--permit-dns", "metal3.svc", "--permit-ip", "127.0.0.0/8"],
    );
    let admin = SocketAddr::new(LO, node::free_port_on(LO));
    let env = env(dir.path(), &ca, admin, node::free_port_on(LO), "10.0.0.5");
    let set: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let unset: Vec<&str> = role::PROFILE_VARS
        .iter()
        .copied()
        .filter(|v| !set.iter().any(|(k, _)| k == v))
        .collect();
    let o = support::proxy::command(&["check", "--profile", "sidecar"], &set, &unset);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(
        o.stderr.contains(
            "scale-out: ca: IP:10.0.0.5 (from IRONIC_PROXY_API_VIPS) outside the CA's name \
             constraints"
        ),
        "{o:?}"
    );
    // `run` refuses before serving, with the same words.
    let o = support::proxy::command(&["run", "--profile", "sidecar"], &set, &unset);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(
        o.stderr.starts_with(
            "ironic-proxy: scale-out: ca: IP:10.0.0.5 (from IRONIC_PROXY_API_VIPS) outside"
        ),
        "{o:?}"
    );
}
