//! statefulset/'s virtual media (issue 52): the BMC fetches the ISO through the LoadBalancer
//! address, which lands on any pod; that pod's sidecar (`sidecar` profile with
//! `IRONIC_PROXY_VMEDIA_TLS_PORT`, as the kit sets it) finds the file on whichever pod's httpd
//! holds it (the conductor that built it), through the headless Service's A records. Real
//! binary, real curl verifying the certificate for the LoadBalancer address, a real DNS server
//! (dnsmasq) answering the Service's name, three httpd stand-ins on three pod addresses.

use crate::support;
use crate::support::backend::bind_same_port;
use crate::support::dnsmasq::Dnsmasq;
use crate::support::files::FileServer;
use crate::support::{node, role};

use role::Role;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};
use support::{curl, Upstream};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// The LoadBalancer address of the Service ironic-vip (IRONIC_PROXY_API_VIPS).
const LB: &str = "127.0.0.9";
const ISO: &str = "/redfish/boot-1be26c0b-03f2-4d2e-ae87-c02d7f33c123.iso";

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `GET https://LB:PORT/PATH` as a BMC sends it, the connection made to the pod the
/// LoadBalancer picked (127.0.0.1), the certificate verified for the LoadBalancer address.
fn bmc_get(vmedia: u16, path: &str, cacert: &str) -> support::Output {
    curl(&[
        "--cacert",
        cacert,
        "--connect-to",
        &format!("{LB}:{vmedia}:127.0.0.1:{vmedia}"),
        "-w",
        "\n%{http_code}",
        &format!("https://{LB}:{vmedia}{path}"),
    ])
}

#[test]
fn the_bmc_gets_the_iso_from_whichever_pod_built_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    // As `kit check` wants it for this layout: the Service's subdomain, the pod network and
    // the LoadBalancer address inside the constraints.
    node::ca_init(
        &ca,
        &["--permit-dns", "metal3.svc", "--permit-ip", "127.0.0.0/8"],
    );
    // Three pods' httpd on one port, as ironic-image's runs on 6180 in every pod.
    let httpd: Vec<FileServer> = bind_same_port(&[
        LO,
        IpAddr::from([127, 0, 0, 2]),
        IpAddr::from([127, 0, 0, 3]),
    ])
    .into_iter()
    .map(FileServer::start)
    .collect();
    let port = httpd[0].addr.port();
    let now = SystemTime::now();
    for h in &httpd {
        // ironic-image's httpd lists its DocumentRoot on `/`: the route's health path.
        h.put("/", b"index", now);
    }
    // The conductor of the second pod owns the node and built its ISO.
    httpd[1].put(ISO, b"the ISO of node 1be26c0b", now);
    let mut dns = Dnsmasq::start("cluster.local", 1);
    dns.set_hosts(&[
        ("127.0.0.1", "ironic.metal3.svc.cluster.local"),
        ("127.0.0.2", "ironic.metal3.svc.cluster.local"),
        ("127.0.0.3", "ironic.metal3.svc.cluster.local"),
    ]);
    let _api_up = Upstream::start(&dir.path().join("ironic.sock"));
    let _rpc_up = Upstream::start(&dir.path().join("json-rpc.sock"));
    let admin = SocketAddr::new(LO, node::free_port_on(LO));
    let vmedia = node::free_port_on(LO);
    let env: Vec<(&str, String)> = vec![
        ("POD_NAME", "ironic-0".into()),
        ("POD_NAMESPACE", "metal3".into()),
        ("POD_IPS", "127.0.0.1".into()),
        ("IRONIC_PROXY_API_VIPS", LB.into()),
        ("IRONIC_PROXY_PEER_CIDRS", "127.0.0.0/8".into()),
        ("IRONIC_PROXY_TRUST", s(&ca.join("ca.crt"))),
        ("IRONIC_PROXY_ISSUER_DIR", s(&ca)),
        ("IRONIC_PROXY_EXPORT_DIR", s(&dir.path().join("export"))),
        (
            "IRONIC_PROXY_API_SOCKET",
            s(&dir.path().join("ironic.sock")),
        ),
        (
            "IRONIC_PROXY_RPC_SOCKET",
            s(&dir.path().join("json-rpc.sock")),
        ),
        ("IRONIC_PROXY_ADMIN_LISTEN", admin.to_string()),
        ("IRONIC_PROXY_BIND", "127.0.0.1".into()),
        ("IRONIC_PROXY_API_PORT", node::free_port_on(LO).to_string()),
        ("IRONIC_PROXY_RPC_PORT", node::free_port_on(LO).to_string()),
        ("IRONIC_PROXY_HTPASSWD", "none".into()),
        ("IRONIC_PROXY_DNS_SERVERS", dns.addr().to_string()),
        ("IRONIC_PROXY_HTTPD_PORT", port.to_string()),
        ("IRONIC_PROXY_VMEDIA_TLS_PORT", vmedia.to_string()),
    ];
    let mut sidecar = Role::spawn(&["run", "--profile", "sidecar"], &env, admin);
    sidecar.wait_ready(Duration::from_secs(20));
    let cacert = s(&ca.join("ca.crt"));

    // Until the route's health checks have seen the peers (interval 2 s).
    let deadline = Instant::now() + Duration::from_secs(15);
    let o = loop {
        let o = bmc_get(vmedia, ISO, &cacert);
        if o.stdout.ends_with("\n200") || Instant::now() > deadline {
            break o;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        o.stdout,
        "the ISO of node 1be26c0b\n200",
        "{o:?}\n{}",
        sidecar.logs().join("\n")
    );
    assert!(!httpd[1].hits().is_empty(), "the owner's httpd served it");

    // The node moves to the third pod's conductor (a takeover), which builds the ISO again:
    // the same URL, the same pod picked by the LoadBalancer, the new owner's copy.
    httpd[1].remove(ISO);
    httpd[2].put(ISO, b"the ISO of node 1be26c0b, rebuilt", SystemTime::now());
    let o = bmc_get(vmedia, ISO, &cacert);
    assert_eq!(o.stdout, "the ISO of node 1be26c0b, rebuilt\n200", "{o:?}");

    // On no pod: 404, not another file.
    let o = bmc_get(vmedia, "/redfish/boot-none.iso", &cacert);
    assert!(o.stdout.ends_with("\n404"), "{o:?}");
}
