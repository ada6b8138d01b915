//! Full TLS 1.3 handshakes against the listener's own server configuration
//! ([`ironic_proxy::server_config`]), client and server driven in memory (no sockets, no
//! runtime), so the figure is rustls + aws-lc-rs work only: X25519, an ECDSA P-256 signature by
//! the server, the client's verification, and for `mutual` the client's signature and its
//! chain verification by the server. Resumption is off on the client, as in the load
//! benchmark's handshake mode.

use criterion::{criterion_group, criterion_main, Criterion};
use ironic_proxy::config::TlsMode;
use ironic_proxy::pki::{generate_ca, issue_leaf, CaSpec, IssuedLeaf, Issuer, LeafRequest};
use ironic_proxy::Material;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
use std::sync::Arc;
use std::time::Duration;

struct Pki {
    ca_der: CertificateDer<'static>,
    server: IssuedLeaf,
    client: IssuedLeaf,
}

fn pki() -> Pki {
    let ca = generate_ca(&CaSpec::default()).expect("CA");
    let issuer = Issuer::from_pem(&ca.cert_pem, &ca.key_pem).expect("CA loads");
    let leaf = |dns: &str| {
        issue_leaf(
            &issuer,
            &LeafRequest {
                dns_names: vec![dns.to_owned()],
                ip_addresses: vec!["127.0.0.1".parse().expect("address")],
                validity: Duration::from_secs(24 * 3600),
            },
        )
        .expect("leaf")
    };
    Pki {
        ca_der: CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).expect("CA PEM"),
        server: leaf("localhost"),
        client: leaf("conductor-0.ironic.metal3.svc"),
    }
}

fn roots(p: &Pki) -> Arc<RootCertStore> {
    let mut r = RootCertStore::empty();
    r.add(p.ca_der.clone()).expect("CA is a valid trust anchor");
    Arc::new(r)
}

fn material(p: &Pki) -> Material {
    let provider = ironic_proxy::crypto_provider();
    let key = rustls::sign::CertifiedKey::from_der(
        vec![p.server.cert_der.clone()],
        p.server.key_der.clone_key(),
        &provider,
    )
    .expect("key matches");
    Material {
        certified_key: Arc::new(key),
        roots: roots(p),
        chain_pem: p.server.cert_pem.clone(),
        key_pem: String::new(),
        trust_pem: String::new(),
        not_before: p.server.not_before,
        not_after: p.server.not_after,
        serial: p.server.serial_hex.clone(),
    }
}

fn client_config(p: &Pki, mutual: bool) -> Arc<ClientConfig> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    // What the load generator offers, and what OpenSSL 3.0 peers negotiate.
    provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519];
    let b = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots(p));
    let mut cfg = if mutual {
        b.with_client_auth_cert(
            vec![p.client.cert_der.clone()],
            p.client.key_der.clone_key(),
        )
        .expect("client key")
    } else {
        b.with_no_client_auth()
    };
    cfg.resumption = rustls::client::Resumption::disabled();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// Moves TLS bytes between the two ends until neither is handshaking.
fn handshake(client: &Arc<ClientConfig>, server: &Arc<ServerConfig>) {
    let name = ServerName::try_from("localhost").expect("name");
    let mut c = ClientConnection::new(client.clone(), name).expect("client");
    let mut s = ServerConnection::new(server.clone()).expect("server");
    let mut buf = Vec::with_capacity(8192);
    while c.is_handshaking() || s.is_handshaking() {
        buf.clear();
        c.write_tls(&mut buf).expect("client writes");
        let mut rd = &buf[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).expect("server reads");
        }
        s.process_new_packets().expect("server accepts");
        buf.clear();
        s.write_tls(&mut buf).expect("server writes");
        let mut rd = &buf[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).expect("client reads");
        }
        c.process_new_packets().expect("client accepts");
    }
}

fn handshakes(c: &mut Criterion) {
    let p = pki();
    let m = material(&p);
    let mut g = c.benchmark_group("tls13_handshake");
    for (label, mode, mutual) in [
        ("server", TlsMode::Server, false),
        ("mutual", TlsMode::Mutual, true),
    ] {
        let server = ironic_proxy::server_config(&m, mode, true).expect("server config");
        let client = client_config(&p, mutual);
        g.bench_function(label, |b| b.iter(|| handshake(&client, &server)));
    }
    g.finish();
}

criterion_group!(benches, handshakes);
criterion_main!(benches);
