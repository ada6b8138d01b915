//! `--version` and `kit secrets`, driven through the built binary; the Secrets checked with
//! the tools an operator's cluster uses on them: base64 as kubelet decodes `data`, the htpasswd
//! entry with Apache's `htpasswd -v` (ironic-image's httpd reads the same file). That the kit
//! finds every Secret and key it references is checked against the rendered kit by
//! scripts/check-quickstart, and the containers started with them by scripts/check-entrypoints.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

fn ironic_proxy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ironic-proxy"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn s(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

fn ok(output: &Output) -> (String, String) {
    assert!(
        output.status.success(),
        "failed: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    (text(&output.stdout), text(&output.stderr))
}

/// Exit 1, one line on stderr, nothing on stdout (no half manifest); returns the line.
fn refused(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(output.stdout.is_empty(), "{}", text(&output.stdout));
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    stderr
}

fn ca_init(dir: &Path) {
    ok(&ironic_proxy(&[
        "ca",
        "init",
        "--out",
        s(dir),
        "--permit-dns",
        "metal3.svc",
    ]));
}

/// Secret name -> (namespace, key -> decoded value), from the documents `kit secrets` prints
/// (its fixed layout: `name:`/`namespace:` under metadata, `data:` last).
fn parse(yaml: &str) -> BTreeMap<String, (String, BTreeMap<String, Vec<u8>>)> {
    let mut out = BTreeMap::new();
    for doc in yaml.split("---\n").filter(|d| !d.trim().is_empty()) {
        assert!(doc.starts_with("apiVersion: v1\nkind: Secret\n"), "{doc}");
        let field = |key: &str| {
            doc.lines()
                .find_map(|l| l.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in {doc}"))
                .to_owned()
        };
        let (name, ns) = (field("  name: "), field("  namespace: "));
        let data_at = doc.find("\ndata:\n").expect("a data map") + "\ndata:\n".len();
        let data = doc[data_at..]
            .lines()
            .map(|l| {
                let (k, v) = l.trim_start().split_once(": ").expect("key: value");
                (k.to_owned(), STANDARD.decode(v).expect("base64 data"))
            })
            .collect();
        assert!(out.insert(name, (ns, data)).is_none(), "a name twice");
    }
    out
}

/// The password after `password ` on the stderr line that starts with `what`.
fn shown_password(stderr: &str, what: &str) -> String {
    let line = stderr
        .lines()
        .find(|l| l.starts_with(what))
        .unwrap_or_else(|| panic!("no {what:?} line in {stderr:?}"));
    line.rsplit_once("password ")
        .expect("password shown")
        .1
        .to_owned()
}

#[test]
fn version_names_version_commit_build_kind_and_crypto_module() {
    let (stdout, _) = ok(&ironic_proxy(&["--version"]));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!("ironic-proxy {}", env!("CARGO_PKG_VERSION")).as_str(),
            // The same variable the binary was compiled with, in the same cargo run.
            format!(
                "commit: {}",
                option_env!("IRONIC_PROXY_COMMIT").unwrap_or("unknown")
            )
            .as_str(),
            format!(
                "build: {}",
                option_env!("IRONIC_PROXY_BUILD_KIND").unwrap_or("debug")
            )
            .as_str(),
            if cfg!(feature = "fips") {
                "crypto: aws-lc-rs FIPS (the AWS-LC FIPS 140-3 module)"
            } else {
                "crypto: aws-lc-rs (AWS-LC)"
            },
        ]
    );
    // -V stays the one-line version scripts parse.
    let (short, _) = ok(&ironic_proxy(&["-V"]));
    assert_eq!(
        short.trim_end(),
        format!("ironic-proxy {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn kit_secrets_prints_every_secret_of_the_kit_and_shows_passwords_once() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    ca_init(&ca);
    let args = [
        "kit",
        "secrets",
        "--namespace",
        "metal3",
        "--ca-dir",
        s(&ca),
    ];
    let (stdout, stderr) = ok(&ironic_proxy(&args));
    let secrets = parse(&stdout);
    let keys = |name: &str| -> Vec<&str> { secrets[name].1.keys().map(String::as_str).collect() };
    assert_eq!(
        secrets.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "ironic-htpasswd",
            "ironic-mariadb",
            "ironic-proxy-ca",
            "ironic-proxy-egress",
            "ironic-proxy-metrics"
        ]
    );
    assert!(secrets.values().all(|(ns, _)| ns == "metal3"));
    // `--help` and the refusal of a Secret name count what is printed.
    let help = text(&ironic_proxy(&["kit", "--help"]).stdout);
    assert!(help.contains("the kit's five Secrets"), "{help}");
    let line = refused(&ironic_proxy(&[
        "kit",
        "secrets",
        "--namespace",
        "metal3",
        "--ca-dir",
        s(&ca),
        "--api-credentials-secret",
        "ironic-proxy-metrics",
    ]));
    assert!(line.contains("not one of the kit's five"), "{line}");
    assert_eq!(
        keys("ironic-proxy-ca"),
        ["ca-bundle.crt", "ca.crt", "ca.key"]
    );
    for file in ["ca.crt", "ca.key", "ca-bundle.crt"] {
        assert_eq!(
            secrets["ironic-proxy-ca"].1[file],
            fs::read(ca.join(file)).unwrap(),
            "{file}"
        );
    }
    assert_eq!(keys("ironic-htpasswd"), ["htpasswd"]);
    assert_eq!(keys("ironic-proxy-egress"), ["credentials"]);
    assert_eq!(keys("ironic-mariadb"), ["password", "username"]);
    assert_eq!(keys("ironic-proxy-metrics"), ["token"]);
    let token = &secrets["ironic-proxy-metrics"].1["token"];
    assert!(
        token.len() == 48 && token.iter().all(u8::is_ascii_hexdigit),
        "{token:?}"
    );

    // Two lines on stderr, each shown once and nowhere on stdout.
    assert_eq!(stderr.lines().count(), 2, "{stderr}");
    let api = shown_password(&stderr, "API credentials");
    let db = shown_password(&stderr, "database account");
    assert!(!stdout.contains(&api) && !stdout.contains(&STANDARD.encode(&api)));
    assert_eq!(secrets["ironic-mariadb"].1["password"], db.as_bytes());
    assert_eq!(secrets["ironic-mariadb"].1["username"], b"ironic");

    // The htpasswd entry: one bcrypt line Apache's htpasswd verifies with the shown password
    // and no other.
    let entry = text(&secrets["ironic-htpasswd"].1["htpasswd"]);
    assert!(
        entry.starts_with("ironic:$2y$05$") && entry.ends_with('\n'),
        "{entry}"
    );
    assert_eq!(entry.lines().count(), 1);
    let file = tmp.path().join("htpasswd");
    fs::write(&file, &entry).unwrap();
    let verify = |pw: &str| {
        Command::new("htpasswd")
            .args(["-vb", s(&file), "ironic", pw])
            .output()
            .expect("htpasswd (apache2-utils) is installed")
            .status
            .success()
    };
    assert!(verify(&api), "htpasswd -v refused the shown password");
    assert!(!verify(&format!("{api}x")));

    // Egress credentials: user:password, URL-safe (they go into HTTP_PROXY's userinfo).
    let creds = text(&secrets["ironic-proxy-egress"].1["credentials"]);
    let (user, pw) = creds.split_once(':').expect("user:password");
    assert_eq!(user, "ironic");
    assert_eq!(pw.len(), 48);
    assert!(pw.bytes().all(|c| c.is_ascii_hexdigit()), "{pw}");

    // A second run generates new ones.
    let (again, stderr2) = ok(&ironic_proxy(&args));
    let again = parse(&again);
    assert_ne!(shown_password(&stderr2, "API credentials"), api);
    assert_ne!(
        again["ironic-proxy-egress"].1["credentials"],
        secrets["ironic-proxy-egress"].1["credentials"]
    );
}

#[test]
fn kit_secrets_takes_an_existing_database_password() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    ca_init(&ca);
    let pw = tmp.path().join("db-password");
    fs::write(&pw, "s3cret-from-the-dba\n").unwrap();
    let (stdout, stderr) = ok(&ironic_proxy(&[
        "kit",
        "secrets",
        "--namespace",
        "ns1",
        "--ca-dir",
        s(&ca),
        "--db-user",
        "ironic_db",
        "--db-password-file",
        s(&pw),
    ]));
    let secrets = parse(&stdout);
    assert_eq!(
        secrets["ironic-mariadb"].1["password"],
        b"s3cret-from-the-dba"
    );
    assert_eq!(secrets["ironic-mariadb"].1["username"], b"ironic_db");
    assert_eq!(stderr.lines().count(), 1, "only the API password: {stderr}");
    assert!(!stderr.contains("s3cret"));
}

#[test]
fn kit_secrets_prints_api_credentials_for_clients_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    ca_init(&ca);
    let (stdout, stderr) = ok(&ironic_proxy(&[
        "kit",
        "secrets",
        "--namespace",
        "metal3",
        "--ca-dir",
        s(&ca),
        "--api-credentials-secret",
        "ironic-api-credentials",
    ]));
    let secrets = parse(&stdout);
    assert_eq!(secrets.len(), 6);
    let creds = &secrets["ironic-api-credentials"].1;
    assert_eq!(
        creds.keys().map(String::as_str).collect::<Vec<_>>(),
        ["htpasswd", "password", "username"]
    );
    assert_eq!(creds["username"], b"ironic");
    assert_eq!(
        creds["password"],
        shown_password(&stderr, "API credentials").as_bytes()
    );
    assert_eq!(creds["htpasswd"], secrets["ironic-htpasswd"].1["htpasswd"]);
    assert!(
        stderr.contains("also in the Secret ironic-api-credentials"),
        "{stderr}"
    );
}

#[test]
fn kit_secrets_refuses_bad_input_with_one_line_and_no_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    ca_init(&ca);
    let other = tmp.path().join("other");
    ca_init(&other);
    let run = |ns: &str, dir: &Path, extra: &[&str]| {
        let mut args = vec!["kit", "secrets", "--namespace", ns, "--ca-dir", s(dir)];
        args.extend_from_slice(extra);
        refused(&ironic_proxy(&args))
    };
    let line = run("Metal3", &ca, &[]);
    assert!(
        line.contains("\"Metal3\" is not a Kubernetes namespace name"),
        "{line}"
    );
    for name in ["ironic-htpasswd", "Bad_Name", "a..b"] {
        let line = run("metal3", &ca, &["--api-credentials-secret", name]);
        assert!(line.contains("is not a Secret name of its own"), "{line}");
    }
    let line = run("metal3", &ca, &["--api-user", "a:b"]);
    assert!(line.contains("--api-user \"a:b\""), "{line}");
    let line = run("metal3", &tmp.path().join("missing"), &[]);
    assert!(line.contains("missing/ca.crt"), "{line}");
    let empty = tmp.path().join("empty");
    fs::write(&empty, "\n").unwrap();
    let line = run("metal3", &ca, &["--db-password-file", s(&empty)]);
    assert!(line.contains("holds no password"), "{line}");

    // A bundle that does not hold the CA: the sidecars would not trust their own leaves.
    fs::copy(other.join("ca.crt"), ca.join("ca-bundle.crt")).unwrap();
    let line = run("metal3", &ca, &[]);
    assert!(
        line.contains("ca-bundle.crt does not contain the CA certificate"),
        "{line}"
    );
    fs::write(ca.join("ca-bundle.crt"), "not PEM").unwrap();
    let line = run("metal3", &ca, &[]);
    assert!(line.contains("no PEM CERTIFICATE block"), "{line}");
    fs::remove_file(ca.join("ca-bundle.crt")).unwrap();
    let line = run("metal3", &ca, &[]);
    assert!(
        line.contains("cannot read") && line.contains("ca-bundle.crt"),
        "{line}"
    );
    // A key that is not the CA's.
    fs::copy(other.join("ca.key"), ca.join("ca.key")).unwrap();
    let line = run("metal3", &ca, &[]);
    assert!(line.contains("does not match"), "{line}");
}

/// A site overlay as an operator writes it, on the real kit (config/k8s/standalone): its
/// Namespace, the site facts as a patch of `ironic-proxy-site`, both images by digest. Each
/// field breaks one thing when changed.
struct Site {
    nodes: &'static str,
    vips: &'static str,
    dhcp: &'static str,
    psa: Option<&'static str>,
    proxy_digest: bool,
    /// Another file of the overlay (a workload of the operator's own).
    extra: Option<&'static str>,
}

const GOOD: Site = Site {
    nodes: "192.168.111.21,192.168.111.22,192.168.111.23",
    vips: "192.168.111.5",
    dhcp: "172.22.0.10,172.22.0.100",
    psa: Some("privileged"),
    proxy_digest: true,
    extra: None,
};

fn write_site(dir: &Path, site: &Site) {
    fs::create_dir_all(dir).unwrap();
    let kit = concat!(env!("CARGO_MANIFEST_DIR"), "/config/k8s/standalone");
    let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let proxy_digest = if site.proxy_digest {
        format!("    digest: {}\n", digest('1'))
    } else {
        "    newTag: \"0.1.0\"\n".to_owned()
    };
    let extra = if site.extra.is_some() {
        "  - extra.yaml\n"
    } else {
        ""
    };
    fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             namespace: metal3\nresources:\n  - {kit}\n{extra}\
             patches:\n  - path: site.yaml\n  - path: namespace.yaml\nimages:\n  - name: ironic-proxy\n    \
             newName: registry.example/ironic-proxy\n{proxy_digest}  \
             - name: quay.io/metal3-io/ironic\n    digest: {}\n",
            digest('2')
        ),
    )
    .unwrap();
    // A patch of the kit's own Namespace; null deletes the label (a strategic merge patch).
    let labels = format!(
        "  labels:\n    pod-security.kubernetes.io/enforce: {}\n",
        site.psa.unwrap_or("null")
    );
    fs::write(
        dir.join("namespace.yaml"),
        format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: metal3\n{labels}"),
    )
    .unwrap();
    fs::write(
        dir.join("site.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ironic-proxy-site\ndata:\n  \
             IRONIC_PROXY_NODE_ADDRESSES: \"{}\"\n  IRONIC_PROXY_API_VIPS: \"{}\"\n  \
             IRONIC_PROXY_PEER_CIDRS: \"192.168.111.0/24\"\n  \
             IRONIC_PROXY_PROVISIONING_CIDRS: \"172.22.0.0/24,192.168.111.0/24\"\n  \
             DHCP_RANGE: \"{}\"\n",
            site.nodes, site.vips, site.dhcp
        ),
    )
    .unwrap();
    if let Some(extra) = site.extra {
        fs::write(dir.join("extra.yaml"), extra).unwrap();
    }
}

/// `kit check` on `site` with a CA that permits the namespace's names and the nodes' network:
/// (exit code, stdout).
fn kit_check(site: &Site) -> (Option<i32>, String) {
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    ok(&ironic_proxy(&[
        "ca",
        "init",
        "--out",
        s(&ca),
        "--permit-dns",
        "metal3.svc",
        "--permit-ip",
        "192.168.111.0/24",
    ]));
    let dir = tmp.path().join("site");
    write_site(&dir, site);
    let out = ironic_proxy(&["kit", "check", "--site", s(&dir), "--ca-dir", s(&ca)]);
    (out.status.code(), text(&out.stdout))
}

/// The checks that failed, by name.
fn failed(report: &str) -> Vec<&str> {
    report
        .lines()
        .filter_map(|l| l.strip_prefix("FAIL "))
        .filter_map(|l| l.split_once(':').map(|(name, _)| name))
        .collect()
}

/// The one FAIL line of `report`: it names its check, what is wrong, its fix and its row in
/// docs/troubleshoot.md, which exists.
fn only_failure<'a>(report: &'a str, check: &str) -> &'a str {
    assert_eq!(failed(report), [check], "{report}");
    let line = report
        .lines()
        .find(|l| l.starts_with("FAIL "))
        .expect("a FAIL line");
    let anchor = format!("kit-check-{}", check.replace(['.', '_'], "-"));
    assert!(
        line.contains(". Fix: ") && line.ends_with(&format!("See docs/troubleshoot.md#{anchor}")),
        "{line}"
    );
    let doc =
        fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/troubleshoot.md")).unwrap();
    assert!(
        doc.contains(&format!("id=\"{anchor}\"")),
        "no row #{anchor} in troubleshoot.md"
    );
    line
}

#[test]
fn kit_check_passes_a_correct_overlay_on_the_kit() {
    let (code, report) = kit_check(&GOOD);
    assert_eq!(code, Some(0), "{report}");
    for check in [
        "site",
        "ca",
        "nodes.ca",
        "nodes.peer_cidrs",
        "vip.ca",
        "vip.nodes",
        "names.ca",
        "dhcp.ranges",
        "dhcp.overlap",
        "provisioning.network",
        "host_ports",
        "conductor_name",
        "ipa.verify",
        "namespace.psa",
        "images.digest",
    ] {
        assert!(
            report.contains(&format!("PASS {check}: ")),
            "{check}: {report}"
        );
    }
    assert!(report.ends_with("15 checks, 0 failed\n"), "{report}");
}

#[test]
fn kit_check_names_each_broken_fact_with_its_fix() {
    let (code, report) = kit_check(&Site {
        vips: "10.0.0.5",
        ..GOOD
    });
    assert_eq!(code, Some(1), "{report}");
    let line = only_failure(&report, "vip.ca");
    assert!(
        line.contains("10.0.0.5 (IRONIC_PROXY_API_VIPS) outside the CA's name constraints"),
        "{line}"
    );

    // The second node's address inside the range dnsmasq leases from.
    let (_, report) = kit_check(&Site {
        dhcp: "192.168.111.22,192.168.111.40",
        ..GOOD
    });
    let line = only_failure(&report, "dhcp.overlap");
    assert!(
        line.contains(
            "192.168.111.22 (IRONIC_PROXY_NODE_ADDRESSES) in 192.168.111.22-192.168.111.40"
        ),
        "{line}"
    );
    let (_, report) = kit_check(&Site {
        dhcp: "172.22.1.10,172.22.1.100",
        ..GOOD
    });
    only_failure(&report, "dhcp.ranges");
    let (_, report) = kit_check(&Site {
        nodes: "192.168.111.21,10.1.0.22",
        ..GOOD
    });
    // The node off the provisioning network is also where hosts could not reach it.
    assert_eq!(
        failed(&report),
        ["nodes.ca", "nodes.peer_cidrs", "provisioning.network"],
        "{report}"
    );

    let (_, report) = kit_check(&Site { psa: None, ..GOOD });
    let line = only_failure(&report, "namespace.psa");
    assert!(
        line.contains("has no pod-security.kubernetes.io/enforce label"),
        "{line}"
    );
    let (_, report) = kit_check(&Site {
        psa: Some("baseline"),
        ..GOOD
    });
    let line = only_failure(&report, "namespace.psa");
    assert!(
        line.contains("enforce: baseline: host-network pods are refused"),
        "{line}"
    );

    let (_, report) = kit_check(&Site {
        proxy_digest: false,
        ..GOOD
    });
    let line = only_failure(&report, "images.digest");
    assert!(
        line.contains("registry.example/ironic-proxy:0.1.0 in DaemonSet/ironic (ironic-proxy)"),
        "{line}"
    );
}

#[test]
fn kit_check_finds_a_host_port_claimed_twice() {
    // An operator's own host-network exporter on the sidecar's admin port.
    let exporter = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: node-exporter\n\
                    spec:\n  template:\n    spec:\n      hostNetwork: true\n      containers:\n\
                    \x20       - name: exporter\n          image: quay.io/prometheus/node-exporter@sha256:\
                    3333333333333333333333333333333333333333333333333333333333333333\n          \
                    ports:\n            - containerPort: 9901\n";
    let (code, report) = kit_check(&Site {
        extra: Some(exporter),
        ..GOOD
    });
    assert_eq!(code, Some(1), "{report}");
    let line = only_failure(&report, "host_ports");
    assert!(
        line.contains(
            "TCP 9901 by DaemonSet/ironic (ironic-proxy) and DaemonSet/node-exporter (exporter)"
        ),
        "{line}"
    );
    // Off the host network, the same port claims nothing on the node.
    let pod_network = exporter.replace("hostNetwork: true", "hostNetwork: false");
    let leaked: &'static str = Box::leak(pod_network.into_boxed_str());
    let (code, report) = kit_check(&Site {
        extra: Some(leaked),
        ..GOOD
    });
    assert_eq!(code, Some(0), "{report}");
}

/// An overlay of statefulset/ (the pod-network layout): `site` patches the site ConfigMap's
/// data (YAML lines), `components` are added, the CA permits `permit_dns` and `permit_ip`.
/// (exit code, stdout).
fn kit_check_statefulset(
    site: &str,
    components: &[&str],
    permit_dns: &str,
    permit_ip: &[&str],
) -> (Option<i32>, String) {
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    let mut args = vec!["ca", "init", "--out", s(&ca), "--permit-dns", permit_dns];
    for ip in permit_ip {
        args.extend(["--permit-ip", ip]);
    }
    ok(&ironic_proxy(&args));
    let dir = tmp.path().join("site");
    fs::create_dir_all(&dir).unwrap();
    let k8s = concat!(env!("CARGO_MANIFEST_DIR"), "/config/k8s");
    let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let components: String = components
        .iter()
        .map(|c| format!("  - {k8s}/components/{c}\n"))
        .collect();
    fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             namespace: metal3\nresources:\n  - {k8s}/statefulset\ncomponents:\n{components}\
             patches:\n  - path: site.yaml\nimages:\n  - name: ironic-proxy\n    \
             newName: registry.example/ironic-proxy\n    digest: {}\n  \
             - name: quay.io/metal3-io/ironic\n    digest: {}\n",
            digest('1'),
            digest('2')
        ),
    )
    .unwrap();
    fs::write(
        dir.join("site.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ironic-proxy-site\ndata:\n{site}"
        ),
    )
    .unwrap();
    let out = ironic_proxy(&["kit", "check", "--site", s(&dir), "--ca-dir", s(&ca)]);
    (out.status.code(), text(&out.stdout))
}

const STS_SITE: &str = "  IRONIC_PROXY_PEER_CIDRS: \"10.244.0.0/16\"\n  \
                        IRONIC_PROXY_API_VIPS: \"192.168.111.4\"\n";

#[test]
fn kit_check_knows_the_statefulset_layout() {
    // The pod network and the LoadBalancer address inside the CA, the Service's names under
    // --permit-dns; no node address, no DHCP range, and the Namespace's level is not
    // `privileged`'s business: nothing runs on the host network.
    let (code, report) = kit_check_statefulset(
        STS_SITE,
        &["database", "deploy-ramdisk"],
        "ironic.metal3.svc",
        &["10.244.0.0/16", "192.168.111.4/32"],
    );
    assert_eq!(code, Some(0), "{report}");
    for check in [
        "site",
        "ca",
        "pods.ca",
        "vip.ca",
        "vip.pods",
        "names.ca",
        "dhcp.layout",
        "host_ports",
        "conductor_name",
        "ipa.verify",
        "namespace.psa",
        "images.digest",
    ] {
        assert!(
            report.contains(&format!("PASS {check}: ")),
            "{check}: {report}"
        );
    }
    for absent in ["nodes.ca", "nodes.peer_cidrs", "vip.nodes", "dhcp.ranges"] {
        assert!(!report.contains(absent), "{absent}: {report}");
    }
    assert!(
        report.contains(
            "PASS names.ca: ironic.metal3.svc, ironic-0.ironic.metal3.svc, \
             ironic-1.ironic.metal3.svc, ironic-2.ironic.metal3.svc inside"
        ),
        "{report}"
    );
    assert!(report.ends_with("12 checks, 0 failed\n"), "{report}");
}

#[test]
fn kit_check_names_what_the_statefulset_layout_lacks() {
    let pods = ["10.244.0.0/16", "192.168.111.0/24"];
    // A CA without the pod network, or with only half of it.
    let (code, report) = kit_check_statefulset(
        STS_SITE,
        &[],
        "metal3.svc",
        &["10.244.0.0/17", "192.168.111.0/24"],
    );
    assert_eq!(code, Some(1), "{report}");
    let line = only_failure(&report, "pods.ca");
    assert!(
        line.contains("10.244.0.0/16 (IRONIC_PROXY_PEER_CIDRS) not inside one --permit-ip"),
        "{line}"
    );
    // The names under another subdomain than the Service's.
    let (_, report) = kit_check_statefulset(STS_SITE, &[], "other.svc", &pods);
    let line = only_failure(&report, "names.ca");
    assert!(
        line.contains("ironic.metal3.svc, ironic-0.ironic.metal3.svc, ironic-1.ironic.metal3.svc"),
        "{line}"
    );
    assert!(line.contains("--permit-dns metal3.svc"), "{line}");
    // No LoadBalancer address, or one from the pod network.
    let (_, report) = kit_check_statefulset(
        "  IRONIC_PROXY_PEER_CIDRS: \"10.244.0.0/16\"\n  IRONIC_PROXY_API_VIPS: \"\"\n",
        &[],
        "metal3.svc",
        &pods,
    );
    let line = only_failure(&report, "vip.ca");
    assert!(line.contains("IRONIC_PROXY_API_VIPS is not set"), "{line}");
    let (_, report) = kit_check_statefulset(
        "  IRONIC_PROXY_PEER_CIDRS: \"10.244.0.0/16\"\n  IRONIC_PROXY_API_VIPS: \"10.244.9.9\"\n",
        &[],
        "metal3.svc",
        &pods,
    );
    only_failure(&report, "vip.pods");
    // components/dhcp does not belong here; its host-network dnsmasq brings the node
    // addresses' check back (the site does not set them).
    let (_, report) = kit_check_statefulset(STS_SITE, &["dhcp"], "metal3.svc", &pods);
    assert_eq!(failed(&report), ["nodes.ca", "dhcp.layout"], "{report}");
    // components/balancer runs on the host network too: the nodes' addresses are asked for,
    // and pass when given inside the CA.
    // (No nodes.peer_cidrs: no conductor runs on a node's address.)
    let (_, report) = kit_check_statefulset(STS_SITE, &["balancer"], "metal3.svc", &pods);
    let line = only_failure(&report, "nodes.ca");
    assert!(
        line.contains("IRONIC_PROXY_NODE_ADDRESSES is not set"),
        "{line}"
    );
    let with_nodes = format!("{STS_SITE}  IRONIC_PROXY_NODE_ADDRESSES: \"192.168.111.21\"\n");
    let (code, report) = kit_check_statefulset(&with_nodes, &["balancer"], "metal3.svc", &pods);
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report.contains("PASS namespace.psa: Namespace metal3 has"),
        "{report}"
    );
}
