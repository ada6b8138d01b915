//! Live connections and trust changes, in memory: identity generations from real CAs (the
//! `pki` module's), published through the same follower a listener uses.

use super::*;
use crate::identity::rotate::issue;
use crate::identity::{IdentityConfig, IdentitySource, IssuerConfig, Material};
use crate::pki::{generate_ca, issue_leaf, CaSpec, GeneratedCa, Issuer, LeafRequest};
use crate::tls::{listener_tls, Reloadable, TlsMode};
use std::path::Path;
use std::time::Duration;
use tokio::sync::watch;

pub(crate) fn ca(name: &str) -> GeneratedCa {
    generate_ca(&CaSpec {
        name: name.to_owned(),
        ..CaSpec::default()
    })
    .expect("CA")
}

/// An identity generation issued by `issuer`, trusting `trust` (PEM), as the rotator makes it.
pub(crate) fn material(dir: &Path, issuer: &GeneratedCa, trust: &str) -> Material {
    let (cert, key, bundle) = (
        dir.join("issuer.crt"),
        dir.join("issuer.key"),
        dir.join("trust.crt"),
    );
    std::fs::write(&cert, &issuer.cert_pem).expect("write");
    std::fs::write(&key, &issuer.key_pem).expect("write");
    std::fs::write(&bundle, trust).expect("write");
    let ic = IssuerConfig {
        issuer_cert: cert,
        issuer_key: key,
        dns_names: vec!["ironic-0.ironic.test".to_owned()],
        ip_addresses: vec![],
        validity: Duration::from_secs(3600),
        renew_before: Duration::from_secs(1200),
    };
    let cfg = IdentityConfig {
        trust: bundle,
        source: IdentitySource::Issuer(ic.clone()),
        export: None,
        watch_interval: Duration::from_secs(1),
    };
    issue(&cfg, &ic).expect("a generation")
}

/// A client chain (leaf only) from `ca`.
pub(crate) fn client_chain(ca: &GeneratedCa) -> Arc<[CertificateDer<'static>]> {
    let issuer = Issuer::from_pem(&ca.cert_pem, &ca.key_pem).expect("issuer");
    let leaf = issue_leaf(
        &issuer,
        &LeafRequest {
            dns_names: vec!["conductor.ironic.test".to_owned()],
            ip_addresses: vec![],
            validity: Duration::from_secs(3600),
        },
    )
    .expect("leaf");
    vec![leaf.cert_der].into()
}

/// Publishes `m` and waits until the listener's follower has stored it.
pub(crate) async fn publish(
    tx: &watch::Sender<Arc<Material>>,
    tls: &ReloadableServer,
    m: Material,
) {
    let before = tls.generation();
    tx.send_replace(Arc::new(m));
    for _ in 0..10_000 {
        if tls.generation() != before {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the follower never stored the new generation");
}

#[tokio::test]
async fn a_chain_is_reverified_only_when_the_trust_changes_and_closes_once_it_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca1, ca2) = (ca("ca-1"), ca("ca-2"));
    let (tx, rx) = watch::channel(Arc::new(material(dir.path(), &ca1, &ca1.cert_pem)));
    let (tls, follower) = Reloadable::follow(rx, "api".to_owned(), |m| {
        listener_tls(m, TlsMode::Mutual, false)
    })
    .expect("listener TLS");
    let closed = Counter::default();
    let listener = ListenerTrust::new("api".to_owned(), tls.clone(), closed.clone());
    let (generation, current) = tls.load_with_generation();
    let trust = current.clients.as_ref().expect("a mutual listener");
    let chain = client_chain(&ca1);
    trust.verify(&chain).expect("verifies at the handshake");
    let live = LiveChain::new(listener, chain, generation, trust);
    assert!(matches!(live.check(), Verdict::Keep));

    // Our own certificate renewed, the trust unchanged: the next check sees a new generation
    // and moves on without verifying (the digest is equal).
    publish(&tx, &tls, material(dir.path(), &ca1, &ca1.cert_pem)).await;
    assert!(matches!(live.check(), Verdict::Keep));
    assert_eq!(live.seen.load(Ordering::Relaxed), tls.generation());

    // Both CAs trusted (a rotation under way): the chain still verifies.
    let both = format!("{}{}", ca1.cert_pem, ca2.cert_pem);
    publish(&tx, &tls, material(dir.path(), &ca2, &both)).await;
    assert!(matches!(live.check(), Verdict::Keep));
    assert_eq!(closed.get(), 0);

    // CA 2 alone: the chain no longer verifies; the connection is told once, with the reason.
    publish(&tx, &tls, material(dir.path(), &ca2, &ca2.cert_pem)).await;
    match live.check() {
        Verdict::Close(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        )) => {}
        other => panic!("expected Close(UnknownIssuer), got {other:?}"),
    }
    assert!(matches!(live.check(), Verdict::Closing));
    assert_eq!(closed.get(), 1, "counted once per connection");
    follower.abort();
}

#[tokio::test]
async fn a_connection_made_after_the_change_is_checked_against_the_trust_it_was_made_under() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca1, ca2) = (ca("ca-1"), ca("ca-2"));
    let both = format!("{}{}", ca1.cert_pem, ca2.cert_pem);
    let (tx, rx) = watch::channel(Arc::new(material(dir.path(), &ca1, &both)));
    let (tls, follower) = Reloadable::follow(rx, "api".to_owned(), |m| {
        listener_tls(m, TlsMode::Mutual, false)
    })
    .expect("listener TLS");
    let listener = ListenerTrust::new("api".to_owned(), tls.clone(), Counter::default());
    publish(&tx, &tls, material(dir.path(), &ca2, &ca2.cert_pem)).await;
    // A client of CA 2 handshakes under the new trust: nothing to re-check.
    let (generation, current) = tls.load_with_generation();
    let trust = current.clients.as_ref().expect("a mutual listener");
    let live = LiveChain::new(listener, client_chain(&ca2), generation, trust);
    for _ in 0..3 {
        assert!(matches!(live.check(), Verdict::Keep));
    }
    follower.abort();
}
