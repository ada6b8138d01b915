//! rustls configurations for listeners (and, later, peers), client identity extraction and
//! `allow` authorisation.
//!
//! One crypto provider for everything: aws-lc-rs. Protocols: TLS 1.3 and 1.2 with rustls'
//! default suites (ECDHE + AEAD only). Server configurations are rebuilt from every new
//! [`Material`] generation and swapped into an `ArcSwap`, so the next handshake uses the new
//! certificate and trust bundle. Established connections follow through the configuration's
//! generation number ([`Reloadable::generation`]) and its change notice
//! ([`Reloadable::changes`]): a mutual-TLS server connection whose client chain no longer
//! verifies against a new trust bundle is closed at once, or after its requests in flight
//! ([`trust`]), and a pooled client connection made with an older identity generation is not
//! given another request and is closed once idle (`proxy::upstream`).

pub mod allow;
mod client_id;
pub(crate) mod peer;
pub(crate) mod stream;
pub(crate) mod trust;

pub use client_id::ClientIdentity;
pub(crate) use client_id::Identities;

use crate::crypto::{policy, provider};
use crate::identity::Material;
use arc_swap::ArcSwap;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How a listener speaks TLS (`tls` of a listener).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    None,
    Server,
    Mutual,
    /// TLS for clients that start a handshake, plain HTTP (restricted to `plaintext` routes)
    /// for the others; decided from the connection's first byte.
    Optional,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot build the client certificate verifier")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    #[error("invalid TLS configuration")]
    Config(#[source] rustls::Error),
}

/// The listeners' provider: [`provider`] with TLS 1.3's `AES_128_GCM_SHA256` first (listeners
/// choose the suite: `ignore_client_order`). Same 128-bit security level as `AES_256_GCM_SHA384`
/// (Mozilla's "modern" profile and Go's crypto/tls put it first), but SHA-256 runs on the CPU's
/// SHA extensions where aws-lc's SHA-384 falls back to generic code on some CPUs, and AES-128
/// has 10 rounds instead of 14.
fn listener_provider() -> rustls::crypto::CryptoProvider {
    let mut p = provider();
    if policy::current().orders_suites() {
        return p;
    }
    let preferred = rustls::CipherSuite::TLS13_AES_128_GCM_SHA256;
    if let Some(i) = p.cipher_suites.iter().position(|s| s.suite() == preferred) {
        let suite = p.cipher_suites.remove(i);
        p.cipher_suites.insert(0, suite);
    }
    p
}

/// Builds the server configuration of one listener from one identity generation.
pub fn server_config(
    material: &Material,
    mode: TlsMode,
    http2: bool,
) -> Result<Arc<ServerConfig>, TlsError> {
    let verifier = match mode {
        TlsMode::Mutual => Some(client_verifier(material)?),
        _ => None,
    };
    server_config_with(material, verifier, http2)
}

/// The verifier of a mutual listener's client chains: chain to `trust`, validity window and the
/// clientAuth EKU, checked by webpki; a missing or invalid certificate fails the handshake. The
/// same verifier re-checks live connections after a trust change ([`trust`]).
fn client_verifier(material: &Material) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    WebPkiClientVerifier::builder_with_provider(
        material.roots.clone(),
        Arc::new(listener_provider()),
    )
    .build()
    .map_err(TlsError::Verifier)
}

/// A listener's TLS from one identity generation: the server configuration and, for a mutual
/// listener, the client verifier inside it with the digest of the trust bundle it was built
/// from.
pub(crate) struct ListenerTls {
    pub(crate) config: Arc<ServerConfig>,
    pub(crate) clients: Option<trust::ClientTrust>,
}

/// [`ListenerTls`] of one listener from one identity generation.
pub(crate) fn listener_tls(
    material: &Material,
    mode: TlsMode,
    http2: bool,
) -> Result<Arc<ListenerTls>, TlsError> {
    let clients = match mode {
        TlsMode::Mutual => Some(trust::ClientTrust::new(
            client_verifier(material)?,
            &material.trust_pem,
        )),
        _ => None,
    };
    let config = server_config_with(
        material,
        clients.as_ref().map(trust::ClientTrust::verifier),
        http2,
    )?;
    Ok(Arc::new(ListenerTls { config, clients }))
}

fn server_config_with(
    material: &Material,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    http2: bool,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(listener_provider());
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(policy::current().versions())
        .map_err(TlsError::Config)?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(
        material.certified_key.clone(),
    )));
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    config.ignore_client_order = true;
    // No session resumption, TLS 1.3 tickets or TLS 1.2 session IDs. Every handshake verifies
    // the client's certificate anew: a resumed session would carry an identity past its
    // short-lived certificate's expiry. And no Metal3 client resumes
    // (Python requests / urllib3 as Ironic and IPA use it never pass a session; Go's net/http
    // as BMO uses it has no ClientSessionCache by default), so tickets were pure cost: two
    // encrypted NewSessionTicket messages, one more sendto and a 256-entry cache holding
    // session secrets and client chains, per full handshake.
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(Arc::new(config))
}

/// A TLS configuration (a listener's server side, the peers' client side) rebuilt from every
/// identity generation and swapped in: the next handshake uses it. A generation that does not
/// build keeps the previous configuration (logged). Every swap bumps [`Self::generation`], so
/// a connection can tell with one atomic load whether the configuration it was made with is
/// still the current one, and publishes the new number to [`Self::changes`], so that idle
/// connections and pools can act on a swap without waiting for their next request.
pub struct Reloadable<T> {
    current: ArcSwap<T>,
    /// Bumped after every store: a reader that sees a number sees that configuration or a
    /// newer one ([`Self::load_with_generation`]).
    generation: AtomicU64,
    /// The generation, sent after it was bumped: a receiver woken by it loads the new
    /// configuration.
    changed: watch::Sender<u64>,
}

/// A listener's server configuration.
pub(crate) type ReloadableServer = Reloadable<ListenerTls>;
/// The client configuration towards peers.
pub(crate) type ReloadableClient = Reloadable<rustls::ClientConfig>;

impl<T: Send + Sync + 'static> Reloadable<T> {
    /// A configuration that does not change (tests, benches).
    pub fn fixed(config: Arc<T>) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::new(config),
            generation: AtomicU64::new(0),
            changed: watch::Sender::new(0),
        })
    }

    /// Builds the configuration from the identity's current generation, then follows its
    /// changes until the identity goes away; the returned task is the follower.
    pub fn follow<E: std::error::Error>(
        mut rx: watch::Receiver<Arc<Material>>,
        what: String,
        build: impl Fn(&Material) -> Result<Arc<T>, E> + Send + 'static,
    ) -> Result<(Arc<Self>, JoinHandle<()>), E> {
        let first = build(&rx.borrow_and_update())?;
        let this = Self::fixed(first);
        let target = this.clone();
        let task = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let material = rx.borrow_and_update().clone();
                match build(&material) {
                    Ok(cfg) => {
                        target.current.store(cfg);
                        // After the store (Release): see `load_with_generation`.
                        let generation = target.generation.fetch_add(1, Ordering::Release) + 1;
                        // From here on new handshakes follow the new identity, and live
                        // connections and pools are told: the moment a rotation takes effect.
                        tracing::info!(%what, generation, serial = %material.serial, "TLS configuration follows the new identity");
                        target.changed.send_replace(generation);
                    }
                    Err(e) => {
                        tracing::warn!(%what, error = %crate::error::chain(&e), "keeping the previous TLS configuration")
                    }
                }
            }
        });
        Ok((this, task))
    }

    pub fn load(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// Receives every new generation number, after its configuration was stored. A receiver
    /// made after a change does not see that change as new: compare [`Self::generation`] with
    /// the one a connection was made under first.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The number of configurations stored since the first.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current configuration and a generation number it is at least as new as. The number
    /// is read first: a swap in between labels the newer configuration with the older number,
    /// which only makes a connection look outdated one swap early, never current when it is
    /// not.
    pub fn load_with_generation(&self) -> (u64, Arc<T>) {
        let generation = self.generation();
        (generation, self.current.load_full())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn listeners_prefer_aes_128_gcm_sha256() {
        let p = super::listener_provider();
        assert_eq!(
            p.cipher_suites[0].suite(),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        );
        assert_eq!(
            p.cipher_suites.len(),
            crate::crypto::provider().cipher_suites.len()
        );
    }
}
