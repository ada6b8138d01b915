use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ipnet::IpNet;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{ServerName, UnixTime};
use x509_parser::extensions::ParsedExtension;

use super::constraints::{check_dns_name, dns_within, NameConstraints, San};
use super::*;

const HOUR: Duration = Duration::from_secs(3600);

fn ca(permit_dns: &[&str], permit_ip: &[&str]) -> Issuer {
    let spec = CaSpec {
        permit_dns: permit_dns.iter().map(|s| (*s).to_owned()).collect(),
        permit_ip: permit_ip.iter().map(|s| s.parse().unwrap()).collect(),
        ..CaSpec::default()
    };
    let generated = generate_ca(&spec).unwrap();
    Issuer::from_pem(&generated.cert_pem, &generated.key_pem).unwrap()
}

fn request(dns: &[&str], ip: &[&str]) -> LeafRequest {
    LeafRequest {
        dns_names: dns.iter().map(|s| (*s).to_owned()).collect(),
        ip_addresses: ip.iter().map(|s| s.parse().unwrap()).collect(),
        validity: 24 * HOUR,
    }
}

/// A CA made with rcgen directly, for shapes `generate_ca` never produces.
fn raw_ca(edit: impl FnOnce(&mut CertificateParams)) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "raw CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    edit(&mut params);
    (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
}

fn since_epoch(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()
}

#[test]
fn dns_subtree_matching_follows_verifiers() {
    assert!(dns_within("metal3.svc", "metal3.svc"));
    assert!(dns_within("a.b.Metal3.svc", "metal3.SVC"));
    assert!(!dns_within("badmetal3.svc", "metal3.svc"));
    assert!(!dns_within("metal3.svc", ".metal3.svc"));
    assert!(dns_within("a.metal3.svc", ".metal3.svc"));
    assert!(dns_within("anything.example", ""));
    assert!(!dns_within("svc", "metal3.svc"));
}

#[test]
fn constraints_refuse_outside_names_and_addresses() {
    let c = NameConstraints::permitting(
        &["metal3.svc".to_owned()],
        &["10.0.0.0/8".parse::<IpNet>().unwrap()],
    )
    .unwrap();
    let dns = |n: &str| San::Dns(n.to_owned());
    let ip = |a: &str| San::Ip(a.parse().unwrap());
    assert!(c.permits(&dns("p0.ironic.metal3.svc")));
    assert!(c.permits(&dns("*.ironic.metal3.svc")));
    assert!(!c.permits(&dns("evil.example.com")));
    assert!(c.permits(&ip("10.255.0.1")));
    assert!(!c.permits(&ip("11.0.0.1")));
    // An IPv6 address is never inside an IPv4 subtree.
    assert!(!c.permits(&ip("::ffff:10.0.0.1")));
}

#[test]
fn permitting_one_type_excludes_the_other_entirely() {
    let dns_only = NameConstraints::permitting(&["metal3.svc".to_owned()], &[]).unwrap();
    assert!(!dns_only.permits(&San::Ip("10.0.0.1".parse().unwrap())));
    assert!(!dns_only.permits(&San::Ip("::1".parse().unwrap())));
    assert_eq!(
        dns_only.to_string(),
        "permitted DNS:metal3.svc; excluded IP:0.0.0.0/0, IP:::/0"
    );
    let ip_only = NameConstraints::permitting(&[], &["10.0.0.0/8".parse().unwrap()]).unwrap();
    assert!(!ip_only.permits(&San::Dns("localhost".to_owned())));
    assert!(ip_only.permits(&San::Ip("10.0.0.1".parse().unwrap())));
    assert!(NameConstraints::permitting(&[], &[]).is_none());
}

#[test]
fn excluded_subtree_catches_wildcards_that_reach_it() {
    let mut c = NameConstraints::default();
    c.excluded.dns.push("admin.metal3.svc".to_owned());
    assert!(!c.permits(&San::Dns("*.metal3.svc".to_owned())));
    assert!(!c.permits(&San::Dns("x.admin.metal3.svc".to_owned())));
    assert!(c.permits(&San::Dns("*.other.metal3.svc".to_owned())));
}

#[test]
fn dns_name_syntax_is_checked() {
    for good in [
        "localhost",
        "a-b.example",
        "*.ironic.metal3.svc",
        "X1.Example",
    ] {
        check_dns_name(good).unwrap();
    }
    for bad in [
        "", "a..b", "-a.b", "a-.b", "a_b.c", "a.", "10.0.0.1", "*", "a.*.b", "é.com",
    ] {
        let err = check_dns_name(bad).unwrap_err();
        assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
    }
}

#[test]
fn leaf_has_exactly_the_requested_sans_usages_and_validity() {
    let issuer = ca(&[], &[]);
    let req = request(&["b.example", "a.example"], &["10.0.0.7", "::1"]);
    let before = SystemTime::now();
    let leaf = issue_leaf(&issuer, &req).unwrap();

    let summary = summarize(&leaf.cert_der).unwrap();
    assert_eq!(
        summary.sans,
        ["DNS:b.example", "DNS:a.example", "IP:10.0.0.7", "IP:::1"]
    );
    assert_eq!(summary.subject, "CN=b.example");
    assert_eq!(summary.issuer, "CN=ironic-proxy CA");
    assert_eq!(summary.key_type, "ECDSA P-256");
    assert!(!summary.is_ca);
    assert_eq!(summary.serial_hex, leaf.serial_hex);
    assert_eq!(
        (summary.not_before, summary.not_after),
        (leaf.not_before, leaf.not_after)
    );
    assert_eq!(
        since_epoch(leaf.not_after) - since_epoch(leaf.not_before),
        24 * 3600 + 60
    );
    assert!(since_epoch(leaf.not_before) + 61 >= since_epoch(before));
    assert!(since_epoch(leaf.not_before) + 60 <= since_epoch(SystemTime::now()));

    let (_, cert) = x509_parser::parse_x509_certificate(&leaf.cert_der).unwrap();
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth && !eku.any);
    let ku = cert.key_usage().unwrap().unwrap();
    assert!(ku.critical && ku.value.digital_signature() && !ku.value.key_cert_sign());
    assert!(!cert.basic_constraints().unwrap().unwrap().value.ca);
    let has_aki = cert.iter_extensions().any(|e| {
        matches!(
            e.parsed_extension(),
            ParsedExtension::AuthorityKeyIdentifier(_)
        )
    });
    assert!(has_aki);

    assert!(leaf.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(leaf.cert_pem.matches("BEGIN CERTIFICATE").count(), 1);
    assert!(leaf.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
    assert!(!format!("{leaf:?}").contains("PRIVATE"));
}

#[test]
fn serials_are_positive_16_bytes_and_distinct() {
    let issuer = ca(&[], &[]);
    let serials: Vec<String> = (0..20)
        .map(|_| {
            issue_leaf(&issuer, &request(&["a.example"], &[]))
                .unwrap()
                .serial_hex
        })
        .collect();
    for serial in &serials {
        assert_eq!(serial.len(), 32);
        assert!(u8::from_str_radix(&serial[..2], 16).unwrap() < 0x80);
    }
    let mut unique = serials.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), serials.len());
}

#[test]
fn ip_only_leaf_has_an_empty_subject_and_critical_san() {
    let issuer = ca(&["metal3.svc"], &["10.0.0.0/8"]);
    let leaf = issue_leaf(&issuer, &request(&[], &["10.1.2.3"])).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&leaf.cert_der).unwrap();
    assert_eq!(cert.subject().iter().count(), 0);
    assert!(cert.subject_alternative_name().unwrap().unwrap().critical);
}

#[test]
fn issued_leaf_verifies_with_webpki_as_server_and_client() {
    let issuer = ca(&["metal3.svc"], &["10.0.0.0/8"]);
    let leaf = issue_leaf(&issuer, &request(&["p0.metal3.svc"], &["10.0.0.9"])).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(issuer.cert_der().clone()).unwrap();
    let roots = Arc::new(roots);
    let now = UnixTime::now();

    let server = rustls::client::WebPkiServerVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .unwrap();
    for name in ["p0.metal3.svc", "10.0.0.9"] {
        let name = ServerName::try_from(name).unwrap();
        server
            .verify_server_cert(&leaf.cert_der, &[], &name, &[], now)
            .unwrap();
    }
    let other = ServerName::try_from("p1.metal3.svc").unwrap();
    assert!(server
        .verify_server_cert(&leaf.cert_der, &[], &other, &[], now)
        .is_err());

    let client = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
        .build()
        .unwrap();
    client.verify_client_cert(&leaf.cert_der, &[], now).unwrap();
}

#[test]
fn refuses_sans_outside_constraints_naming_the_san() {
    let issuer = ca(&["metal3.svc"], &["10.0.0.0/8"]);
    let err = issue_leaf(&issuer, &request(&["ok.metal3.svc", "evil.example"], &[])).unwrap_err();
    assert!(matches!(&err, PkiError::SanNotPermitted { san, .. } if san == "DNS:evil.example"));
    assert!(err.to_string().contains("DNS:evil.example"), "{err}");
    let err = issue_leaf(&issuer, &request(&["ok.metal3.svc"], &["192.168.1.1"])).unwrap_err();
    assert!(err.to_string().contains("IP:192.168.1.1"), "{err}");

    let dns_only = ca(&["metal3.svc"], &[]);
    let err = issue_leaf(&dns_only, &request(&["ok.metal3.svc"], &["10.0.0.1"])).unwrap_err();
    assert!(err.to_string().contains("IP:10.0.0.1"), "{err}");
}

#[test]
fn refuses_empty_sans_bad_names_and_bad_validity() {
    let issuer = ca(&[], &[]);
    assert!(matches!(
        issue_leaf(&issuer, &request(&[], &[])),
        Err(PkiError::NoSans)
    ));
    let err = issue_leaf(&issuer, &request(&["bad_name.example"], &[])).unwrap_err();
    assert!(err.to_string().contains("bad_name.example"), "{err}");
    let mut req = request(&["a.example"], &[]);
    req.validity = Duration::ZERO;
    assert!(matches!(
        issue_leaf(&issuer, &req),
        Err(PkiError::InvalidValidity)
    ));
}

#[test]
fn leaf_never_outlives_its_ca() {
    let spec = CaSpec {
        validity: 2 * HOUR,
        ..CaSpec::default()
    };
    let generated = generate_ca(&spec).unwrap();
    let issuer = Issuer::from_pem(&generated.cert_pem, &generated.key_pem).unwrap();
    let leaf = issue_leaf(&issuer, &request(&["a.example"], &[])).unwrap();
    assert_eq!(leaf.not_after, issuer.not_after());
}

#[test]
fn generated_ca_is_a_constrained_signing_ca() {
    let spec = CaSpec {
        name: "test CA".to_owned(),
        permit_dns: vec!["metal3.svc".to_owned()],
        permit_ip: vec!["10.0.0.0/8".parse().unwrap()],
        ..CaSpec::default()
    };
    let generated = generate_ca(&spec).unwrap();
    let issuer = Issuer::from_pem(&generated.cert_pem, &generated.key_pem).unwrap();
    assert_eq!(
        issuer.constraints().unwrap(),
        "permitted DNS:metal3.svc, IP:10.0.0.0/8"
    );
    let (_, cert) = x509_parser::parse_x509_certificate(issuer.cert_der()).unwrap();
    let bc = cert.basic_constraints().unwrap().unwrap();
    assert!(bc.critical && bc.value.ca && bc.value.path_len_constraint == Some(0));
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.key_cert_sign() && ku.crl_sign() && !ku.digital_signature());
    assert!(cert.name_constraints().unwrap().unwrap().critical);
    assert_eq!(cert.subject().to_string(), "CN=test CA");
    assert!(generate_ca(&CaSpec {
        permit_dns: vec!["a..b".into()],
        ..spec
    })
    .is_err());
}

#[test]
fn loading_refuses_mismatched_key_non_ca_and_garbage() {
    let a = generate_ca(&CaSpec::default()).unwrap();
    let b = generate_ca(&CaSpec::default()).unwrap();
    assert!(matches!(
        Issuer::from_pem(&a.cert_pem, &b.key_pem),
        Err(PkiError::KeyMismatch)
    ));
    assert!(matches!(
        Issuer::from_pem("junk", &a.key_pem),
        Err(PkiError::NoCertificate)
    ));
    assert!(matches!(
        Issuer::from_pem(&a.cert_pem, "junk"),
        Err(PkiError::BadKey { .. })
    ));

    let issuer = Issuer::from_pem(&a.cert_pem, &a.key_pem).unwrap();
    let leaf = issue_leaf(&issuer, &request(&["a.example"], &[])).unwrap();
    let err = Issuer::from_pem(&leaf.cert_pem, &leaf.key_pem).unwrap_err();
    assert!(matches!(err, PkiError::NotCa));

    let (cert, key) = raw_ca(|p| p.key_usages = vec![KeyUsagePurpose::DigitalSignature]);
    assert!(matches!(
        Issuer::from_pem(&cert, &key),
        Err(PkiError::CaCannotSign)
    ));
}

#[test]
fn loading_refuses_expired_and_future_cas() {
    let (cert, key) = raw_ca(|p| {
        p.not_before = rcgen::date_time_ymd(2000, 1, 1);
        p.not_after = rcgen::date_time_ymd(2001, 1, 1);
    });
    let err = Issuer::from_pem(&cert, &key).unwrap_err();
    assert!(matches!(err, PkiError::CaExpired { .. }));
    assert_eq!(
        err.to_string(),
        "CA certificate expired at 2001-01-01T00:00:00Z"
    );

    let (cert, key) = raw_ca(|p| p.not_before = rcgen::date_time_ymd(4000, 1, 1));
    assert!(matches!(
        Issuer::from_pem(&cert, &key),
        Err(PkiError::CaNotYetValid { .. })
    ));
}

#[test]
fn loading_refuses_directory_name_constraints() {
    let (cert, key) = raw_ca(|p| {
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(DnType::OrganizationName, "metal3");
        p.name_constraints = Some(rcgen::NameConstraints {
            permitted_subtrees: vec![GeneralSubtree::DirectoryName(dn)],
            excluded_subtrees: vec![],
        });
    });
    let err = Issuer::from_pem(&cert, &key).unwrap_err();
    assert!(matches!(
        err,
        PkiError::UnsupportedConstraint {
            kind: "directoryName"
        }
    ));
}

#[test]
fn summary_fingerprint_and_validity_warning() {
    let issuer = ca(&[], &[]);
    let leaf = issue_leaf(&issuer, &request(&["a.example"], &[])).unwrap();
    let summary = summarize(&leaf.cert_der).unwrap();
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &leaf.cert_der);
    let hex: Vec<String> = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    assert_eq!(summary.sha256_fingerprint, hex.join(":"));
    assert_eq!(summary.sha256_fingerprint.len(), 32 * 3 - 1);

    assert_eq!(summary.validity_warning(SystemTime::now()), None);
    let later = summary.not_after + Duration::from_secs(1);
    assert!(summary
        .validity_warning(later)
        .unwrap()
        .starts_with("certificate expired at "));
    let earlier = summary.not_before - Duration::from_secs(1);
    assert!(summary
        .validity_warning(earlier)
        .unwrap()
        .contains("not valid before"));
    let shown = summary.to_string();
    for field in [
        "subject:",
        "SANs:",
        "issuer:",
        "not before:",
        "not after:",
        "key type:",
    ] {
        assert!(shown.contains(field), "{shown}");
    }
    assert!(summarize(b"not a certificate").is_err());
}

#[test]
fn issuer_debug_never_shows_the_key() {
    let issuer = ca(&[], &[]);
    let debug = format!("{issuer:?}");
    assert!(
        !debug.contains("PRIVATE") && debug.contains("Issuer"),
        "{debug}"
    );
}

#[test]
fn wildcard_leaf_inside_constraints_verifies_with_webpki() {
    let issuer = ca(&["metal3.svc"], &["10.0.0.0/8"]);
    let leaf = issue_leaf(&issuer, &request(&["*.ironic.metal3.svc"], &[])).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(issuer.cert_der().clone()).unwrap();
    let server =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
    let name = ServerName::try_from("p0.ironic.metal3.svc").unwrap();
    server
        .verify_server_cert(&leaf.cert_der, &[], &name, &[], UnixTime::now())
        .unwrap();
}

#[test]
fn issuer_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Issuer>();
    assert_send_sync::<IssuedLeaf>();
    assert_send_sync::<PkiError>();
}

/// A leaf for `dns` signed by `issuer` with rcgen directly, past `issue_leaf`'s checks, and
/// whether rustls' verifier accepts it for `name`: what our refusals are measured against.
fn webpki_accepts_unchecked_leaf(issuer: &Issuer, dns: &str, name: &str) -> bool {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec![dns.to_owned()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = params.signed_by(&key, issuer.signer()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(issuer.cert_der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let server =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
    let name = ServerName::try_from(name.to_owned()).unwrap();
    server
        .verify_server_cert(leaf.der(), &[], &name, &[], UnixTime::now())
        .is_ok()
}

#[test]
fn wildcards_need_two_labels_after_the_star_as_webpki_does() {
    let issuer = ca(&[], &[]);
    assert!(!webpki_accepts_unchecked_leaf(&issuer, "*.svc", "a.svc"));
    assert!(webpki_accepts_unchecked_leaf(
        &issuer,
        "*.metal3.svc",
        "a.metal3.svc"
    ));
    let err = issue_leaf(&issuer, &request(&["*.svc"], &[])).unwrap_err();
    assert!(
        matches!(&err, PkiError::InvalidDnsName { name, .. } if name == "*.svc"),
        "{err}"
    );
    issue_leaf(&issuer, &request(&["*.metal3.svc"], &[])).unwrap();
}

/// webpki fails every DNS SAN checked against a DNS subtree it cannot read (here one with a
/// trailing or a doubled dot); `issue_leaf` refuses such SANs instead of signing them, and still
/// signs an IP-only leaf, which webpki accepts.
#[test]
fn unreadable_dns_subtrees_refuse_dns_sans_as_webpki_does() {
    for (permitted, excluded) in [(vec!["metal3.svc."], vec![]), (vec![], vec!["x..svc"])] {
        let (cert, key) = raw_ca(|p| {
            let subtrees = |names: &[&str]| {
                names
                    .iter()
                    .map(|n| GeneralSubtree::DnsName((*n).to_owned()))
                    .collect()
            };
            p.name_constraints = Some(rcgen::NameConstraints {
                permitted_subtrees: subtrees(&permitted),
                excluded_subtrees: subtrees(&excluded),
            });
        });
        let issuer = Issuer::from_pem(&cert, &key).unwrap();
        assert!(!webpki_accepts_unchecked_leaf(
            &issuer,
            "a.metal3.svc",
            "a.metal3.svc"
        ));
        let err = issue_leaf(&issuer, &request(&["a.metal3.svc"], &[])).unwrap_err();
        assert!(
            matches!(&err, PkiError::SanNotPermitted { san, .. } if san == "DNS:a.metal3.svc"),
            "{err}"
        );
        issue_leaf(&issuer, &request(&[], &["10.0.0.1"])).unwrap();
    }
}

#[test]
fn permit_dns_suffixes_follow_webpki_constraint_syntax() {
    let spec = |dns: &str| CaSpec {
        permit_dns: vec![dns.to_owned()],
        ..CaSpec::default()
    };
    for good in ["metal3.svc", ".metal3.svc", "_tcp.metal3.svc"] {
        generate_ca(&spec(good)).unwrap();
    }
    for bad in ["metal3.svc.", "10.0.0", "-a.svc", "", "."] {
        let err = generate_ca(&spec(bad)).unwrap_err();
        assert!(
            matches!(&err, PkiError::InvalidDnsName { name, .. } if name == bad),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn a_network_is_permitted_only_whole() {
    let c = NameConstraints::permitting(
        &["metal3.svc".to_owned()],
        &[
            "10.244.0.0/16".parse().unwrap(),
            "10.245.0.0/16".parse().unwrap(),
        ],
    )
    .unwrap();
    assert!(c.permits_network(&"10.244.0.0/16".parse().unwrap()));
    assert!(c.permits_network(&"10.244.3.0/24".parse().unwrap()));
    // Half outside, or only inside the union of two subtrees.
    assert!(!c.permits_network(&"10.244.0.0/15".parse().unwrap()));
    assert!(!c.permits_network(&"10.0.0.0/8".parse().unwrap()));
    // IPv4 subtrees hold no IPv6 network; `permitting` with no IP at all excludes every address.
    assert!(!c.permits_network(&"fd00::/64".parse().unwrap()));
    let dns_only = NameConstraints::permitting(&["metal3.svc".to_owned()], &[]).unwrap();
    assert!(!dns_only.permits_network(&"10.244.0.0/16".parse().unwrap()));
    assert!(NameConstraints::default().permits_network(&"10.244.0.0/16".parse().unwrap()));
}
