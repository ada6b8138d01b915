//! Pure per-request and per-connection work: request header rewriting, `allow` matching of a
//! client identity, and the balancer's pick.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use http::{HeaderMap, HeaderValue, Version};
use ironic_proxy::allow::{is_allowed, AllowRule};
use ironic_proxy::headers::{self, Forwarded};
use ironic_proxy::{Load, Picker, Policy};
use std::hint::black_box;
use std::net::IpAddr;
use tokio::time::Instant;

/// What python-requests (Ironic's JSON-RPC client) sends.
fn typical_request() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("host", "10.0.0.5:6189"),
        ("user-agent", "python-requests/2.32.3"),
        ("accept-encoding", "gzip, deflate"),
        ("accept", "*/*"),
        ("connection", "keep-alive"),
        ("content-type", "application/json"),
        ("content-length", "187"),
        (
            "x-openstack-request-id",
            "req-6f1c5a0e-3a43-4f5d-9a6b-2b7c7e0d9a11",
        ),
    ] {
        h.append(k, HeaderValue::from_static(v));
    }
    h
}

fn rewrite(c: &mut Criterion) {
    let base = typical_request();
    let xfcc = HeaderValue::from_static(
        "Hash=4f2a...;Subject=\"CN=conductor-0.ironic.metal3.svc\";DNS=conductor-0.ironic.metal3.svc",
    );
    let host = HeaderValue::from_static("10.0.0.5:6189");
    let client = headers::ip_value("10.0.0.7".parse().expect("address"));
    let fwd = Forwarded {
        client_ip: client.as_ref(),
        proto: "https",
        host: Some(&host),
        xfcc: Some(&xfcc),
        version: Version::HTTP_11,
    };
    c.bench_function("headers::rewrite_request (8 fields, mTLS)", |b| {
        b.iter_batched_ref(
            || base.clone(),
            |h| headers::rewrite_request(h, black_box(&fwd)),
            BatchSize::SmallInput,
        );
    });
    c.bench_function("headers::check_framing", |b| {
        b.iter(|| headers::check_framing(Version::HTTP_11, black_box(&base)));
    });
}

fn allow(c: &mut Criterion) {
    let rules: Vec<AllowRule> = [
        "conductor-9.example.org",
        "*.ironic.metal3.svc",
        "ip:10.0.0.0/8",
    ]
    .iter()
    .map(|r| r.parse().expect("rule"))
    .collect();
    let dns = vec![
        "conductor-0.ironic.metal3.svc".to_owned(),
        "ironic.metal3.svc".to_owned(),
    ];
    let ips: Vec<IpAddr> = vec!["192.168.1.5".parse().expect("address")];
    c.bench_function("allow: wildcard match (3 rules, 2 DNS + 1 IP SANs)", |b| {
        b.iter(|| is_allowed(black_box(&rules), black_box(&dns), black_box(&ips)));
    });
    let outsider = vec!["evil.example.com".to_owned()];
    c.bench_function("allow: no match", |b| {
        b.iter(|| is_allowed(black_box(&rules), black_box(&outsider), black_box(&[])));
    });
}

struct Ep(usize);

impl Load for Ep {
    fn in_flight(&self) -> usize {
        self.0
    }
    fn is_available(&self, _now: Instant) -> bool {
        true
    }
}

fn pick(c: &mut Criterion) {
    let eps: Vec<Ep> = (0..3).map(Ep).collect();
    let now = Instant::now();
    for (label, policy) in [
        ("least_request", Policy::LeastRequest),
        ("round_robin", Policy::RoundRobin),
    ] {
        let picker = Picker::new(policy);
        c.bench_function(
            &format!("balance::Picker::pick {label} (3 endpoints)"),
            |b| {
                b.iter(|| picker.pick(black_box(&eps), &[], now));
            },
        );
    }
}

criterion_group!(benches, rewrite, allow, pick);
criterion_main!(benches);
