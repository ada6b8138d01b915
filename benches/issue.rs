//! Leaf issuance cost: a fresh ECDSA P-256 key plus signing by the CA, which is what every
//! renewal of a pod's identity pays. Also loading the CA, which a CA rotation pays.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use ironic_proxy::pki::{generate_ca, issue_leaf, CaSpec, Issuer, LeafRequest};

fn issuance(c: &mut Criterion) {
    let spec = CaSpec {
        permit_dns: vec!["metal3.svc".to_owned()],
        permit_ip: vec!["10.0.0.0/8".parse().expect("valid network")],
        ..CaSpec::default()
    };
    let ca = generate_ca(&spec).expect("CA generation");
    let issuer = Issuer::from_pem(&ca.cert_pem, &ca.key_pem).expect("CA loads");
    let request = LeafRequest {
        dns_names: vec![
            "ironic-0.ironic.metal3.svc".to_owned(),
            "ironic.metal3.svc".to_owned(),
        ],
        ip_addresses: vec!["10.1.2.3".parse().expect("valid address")],
        validity: Duration::from_secs(24 * 3600),
    };

    c.bench_function("issue_leaf (P-256 keygen + sign)", |b| {
        b.iter(|| issue_leaf(&issuer, &request).expect("issues"));
    });
    c.bench_function("Issuer::from_pem", |b| {
        b.iter(|| Issuer::from_pem(&ca.cert_pem, &ca.key_pem).expect("loads"));
    });
}

criterion_group!(benches, issuance);
criterion_main!(benches);
