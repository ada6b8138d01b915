//! Trust changes reach live mutual-TLS connections: a connection whose client chain no longer
//! verifies against the listener's current trust bundle is closed, at once when idle, after its
//! requests in flight otherwise.
//!
//! rustls verifies the client's chain once, at the handshake; a keep-alive connection would
//! otherwise carry an identity from a CA that was removed from `trust` (a CA rotation after a
//! compromise) for as long as the client keeps it busy. Each connection keeps its verified
//! chain ([`LiveChain`]) and the listener's TLS generation it was last checked under. Before a
//! request is served, one atomic load compares that generation with the listener's; only when
//! the configuration changed is the chain looked at again, and only when the trust bundle
//! itself changed (its digest differs; a renewal of our own certificate keeps it) is it
//! re-verified, with the listener's new verifier at the current time. So a request costs an
//! atomic compare, and a connection at most one verification per trust change.
//!
//! An idle connection sends no request to be checked before: each connection also waits on the
//! listener's change notice ([`LiveChain::distrusted`]), so every one is checked when the
//! configuration changes, within `watch_interval` of the new trust file, idle or not. The
//! listener's driver then ends it gracefully (`listen::driver`).

use super::ReloadableServer;
use prometheus_client::metrics::counter::Counter;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;

/// SHA-256 of a trust bundle's PEM.
type Digest = [u8; 32];

/// What a mutual listener's handshakes verified client chains against in one generation.
pub(crate) struct ClientTrust {
    verifier: Arc<dyn ClientCertVerifier>,
    /// Equal digests, equal roots: the chain need not be verified again.
    digest: Digest,
}

impl ClientTrust {
    pub(crate) fn new(verifier: Arc<dyn ClientCertVerifier>, trust_pem: &str) -> Self {
        let mut digest = [0; 32];
        digest.copy_from_slice(
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, trust_pem.as_bytes()).as_ref(),
        );
        Self { verifier, digest }
    }

    pub(crate) fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.verifier.clone()
    }

    /// Verifies `chain` (leaf first) as a handshake would now.
    fn verify(&self, chain: &[CertificateDer<'static>]) -> Result<(), rustls::Error> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err(rustls::Error::NoCertificatesPresented);
        };
        self.verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map(|_| ())
    }
}

/// One mutual listener's side of the checks: its TLS configuration and what a closed
/// connection is counted in. Shared by the listener's connections.
pub(crate) struct ListenerTrust {
    /// The listener's name, for logs.
    pub(crate) name: String,
    tls: Arc<ReloadableServer>,
    /// `ironic_proxy_untrusted_connections_closed_total` of this listener.
    closed: Counter,
}

impl ListenerTrust {
    pub(crate) fn new(name: String, tls: Arc<ReloadableServer>, closed: Counter) -> Arc<Self> {
        Arc::new(Self { name, tls, closed })
    }

    /// The listener's configuration changes (see [`LiveChain::distrusted`]).
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.tls.changes()
    }
}

/// A connection's verified client chain and the trust it last verified against.
pub(crate) struct LiveChain {
    listener: Arc<ListenerTrust>,
    /// The chain the client presented at the handshake (shared by the connections that
    /// presented the same one, see `client_id::Identities`).
    chain: Arc<[CertificateDer<'static>]>,
    /// The listener's TLS generation this connection was last checked under.
    seen: AtomicU64,
    state: Mutex<State>,
}

struct State {
    /// The trust bundle the chain last verified against.
    digest: Digest,
    /// Set once the chain failed: the connection is closing.
    failed: bool,
}

/// What a check found.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Trusted as at the handshake: serve on.
    Keep,
    /// The chain no longer verifies: serve this request, then close. Given once per
    /// connection (counted then), with rustls' reason.
    Close(rustls::Error),
    /// Already told to close.
    Closing,
}

impl LiveChain {
    /// The connection's chain, verified at its handshake under `generation` of the listener's
    /// configuration, whose client trust was `verified_by`.
    pub(crate) fn new(
        listener: Arc<ListenerTrust>,
        chain: Arc<[CertificateDer<'static>]>,
        generation: u64,
        verified_by: &ClientTrust,
    ) -> Self {
        Self {
            listener,
            chain,
            seen: AtomicU64::new(generation),
            state: Mutex::new(State {
                digest: verified_by.digest,
                failed: false,
            }),
        }
    }

    pub(crate) fn listener(&self) -> &ListenerTrust {
        &self.listener
    }

    /// Whether the connection may serve another request; called before each one. An atomic
    /// compare while the listener's configuration is the one last checked.
    pub(crate) fn check(&self) -> Verdict {
        if self.seen.load(Ordering::Relaxed) == self.listener.tls.generation() {
            return Verdict::Keep;
        }
        self.recheck()
    }

    #[cold]
    fn recheck(&self) -> Verdict {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.failed {
            return Verdict::Closing;
        }
        let (generation, current) = self.listener.tls.load_with_generation();
        // A mutual listener's configuration always has its client trust; without one there is
        // nothing to check against.
        if let Some(trust) = &current.clients {
            if trust.digest != state.digest {
                if let Err(e) = trust.verify(&self.chain) {
                    state.failed = true;
                    self.listener.closed.inc();
                    return Verdict::Close(e);
                }
                state.digest = trust.digest;
            }
        }
        self.seen.store(generation, Ordering::Relaxed);
        Verdict::Keep
    }

    /// Resolves with rustls' reason once the chain no longer verifies: checked at once (a
    /// change between the handshake and this call shows in the generation), then after every
    /// change that `changes` (the listener's, [`ListenerTrust::changes`]) announces. Never
    /// resolves while the chain verifies, nor once another check found it failing: that check
    /// reported it, and the connection is closing already.
    pub(crate) async fn distrusted(
        self: Arc<Self>,
        mut changes: watch::Receiver<u64>,
    ) -> rustls::Error {
        loop {
            match self.check() {
                Verdict::Close(reason) => return reason,
                Verdict::Closing => break,
                Verdict::Keep => {}
            }
            // Gone only with the listener's configuration: nothing will change any more.
            if changes.changed().await.is_err() {
                break;
            }
        }
        std::future::pending().await
    }
}

#[cfg(test)]
pub(crate) mod tests;
