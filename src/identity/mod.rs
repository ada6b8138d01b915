//! The live identity: our certificate chain and key, and the trust bundle peers are checked
//! against.
//!
//! Owns one guarantee: every consumer sees a consistent [`Material`] (a chain, the key that
//! matches it, and the trust bundle) through a `watch` channel, and a value is only published
//! after it parsed and checked out. A failed reload keeps the last good value, logs a warning and
//! bumps `ironic_proxy_reload_failures_total`. Sources:
//! - static files (`cert`/`key`), re-read when their bytes change (polled every
//!   `watch_interval`, which also catches Kubernetes Secret volumes that swap a `..data`
//!   symlink) and on SIGHUP;
//! - self-issued leaves from the operator CA (`issuer_cert`/`issuer_key`), see [`rotate`].

pub(crate) mod expiry;
pub(crate) mod export;
mod load;
mod options;
pub(crate) mod rotate;
mod wall_timer;

pub(crate) use load::LoadError;
pub use load::{load_chain, load_key, load_trust};
pub use options::{ExportConfig, IdentityConfig, IdentitySource, IssuerConfig};

use crate::metrics::{Metrics, ReloadLabels};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{watch, Notify};

/// One consistent generation of identity material.
pub struct Material {
    pub certified_key: Arc<CertifiedKey>,
    pub roots: Arc<RootCertStore>,
    /// Leaf followed by any intermediates, PEM.
    pub chain_pem: String,
    /// PKCS#8 / SEC1 / PKCS#1 key, PEM. Only ever written to `export_dir`.
    pub key_pem: String,
    pub trust_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pub serial: String,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("serial", &self.serial)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Material {
    /// True while the certificate is inside its validity window.
    pub fn is_valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now < self.not_after
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A file named by a config key could not be loaded; the key leads the message.
    #[error("{key}")]
    File {
        key: &'static str,
        #[source]
        source: LoadError,
    },
    #[error("identity.cert {cert} does not match identity.key {key}")]
    KeyMismatch {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error(transparent)]
    Rotate(#[from] rotate::RotateError),
}

/// A running identity: the current material and a way to ask for a reload.
#[derive(Clone)]
pub struct Identity {
    rx: watch::Receiver<Arc<Material>>,
    reload: Arc<Notify>,
}

impl Identity {
    pub fn current(&self) -> Arc<Material> {
        self.rx.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<Material>> {
        self.rx.clone()
    }

    /// Re-read every file now (SIGHUP).
    pub fn reload(&self) {
        self.reload.notify_one();
    }
}

/// Loads the identity once, synchronously checking every file, and spawns the task that keeps it
/// current. Errors here are start-up errors: the process exits 1 with the message.
pub(crate) async fn start(
    cfg: &IdentityConfig,
    metrics: &Metrics,
) -> Result<Identity, IdentityError> {
    let reload = Arc::new(Notify::new());
    match &cfg.source {
        IdentitySource::Files { cert, key } => {
            // Fingerprint before loading: a change racing the load is then seen as a change.
            let seen = fingerprint(&[cert.clone(), key.clone(), cfg.trust.clone()]);
            let first = load_files(cfg, cert, key)?;
            record_expiry(metrics, &first);
            let (tx, rx) = watch::channel(Arc::new(first));
            let watcher = FileWatcher {
                seen,
                cfg: cfg.clone(),
                cert: cert.clone(),
                key: key.clone(),
                metrics: metrics.clone(),
                reload: reload.clone(),
                tx,
            };
            tokio::spawn(watcher.run());
            Ok(Identity { rx, reload })
        }
        IdentitySource::Issuer(issuer) => {
            let rx = rotate::start(cfg, issuer, metrics, reload.clone()).await?;
            Ok(Identity { rx, reload })
        }
    }
}

/// Loads static cert/key/trust files into one checked generation.
pub fn load_files(
    cfg: &IdentityConfig,
    cert: &Path,
    key: &Path,
) -> Result<Material, IdentityError> {
    let file = |key: &'static str| move |source| IdentityError::File { key, source };
    let chain = load_chain(cert).map_err(file("identity.cert"))?;
    let key_der = load_key(key).map_err(file("identity.key"))?;
    let (roots, trust_pem) = load_trust(&cfg.trust).map_err(file("identity.trust"))?;
    let provider = crate::crypto::provider();
    let certified =
        CertifiedKey::from_der(chain.certs.clone(), key_der.key, &provider).map_err(|source| {
            IdentityError::KeyMismatch {
                cert: cert.to_owned(),
                key: key.to_owned(),
                source,
            }
        })?;
    Ok(Material {
        certified_key: Arc::new(certified),
        roots: Arc::new(roots),
        chain_pem: chain.pem,
        key_pem: key_der.pem,
        trust_pem,
        not_before: chain.not_before,
        not_after: chain.not_after,
        serial: chain.serial,
    })
}

pub(crate) fn record_expiry(metrics: &Metrics, m: &Material) {
    expiry::record(metrics, m);
}

struct FileWatcher {
    /// The files' bytes as they were when the current generation was loaded.
    seen: Vec<Option<Vec<u8>>>,
    cfg: IdentityConfig,
    cert: PathBuf,
    key: PathBuf,
    metrics: Metrics,
    reload: Arc<Notify>,
    tx: watch::Sender<Arc<Material>>,
}

impl FileWatcher {
    /// Polls the files' bytes; reloads when they change or on demand. Polling content (not
    /// mtimes or inotify) is what survives every way files get replaced: in-place writes,
    /// renames, and Kubernetes' `..data` symlink swaps.
    async fn run(self) {
        let mut last = self.seen.clone();
        let mut tick =
            tokio::time::interval(self.cfg.watch_interval.max(Duration::from_millis(50)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                () = self.reload.notified() => true,
                () = self.tx.closed() => return,
            };
            let paths = [self.cert.clone(), self.key.clone(), self.cfg.trust.clone()];
            let Some(now) = off_loop(move || fingerprint(&paths)).await else {
                continue;
            };
            if !forced && now == last {
                continue;
            }
            last = now;
            let labels = ReloadLabels {
                what: "certificate",
            };
            let (cfg, cert, key) = (self.cfg.clone(), self.cert.clone(), self.key.clone());
            let Some(loaded) = off_loop(move || load_files(&cfg, &cert, &key)).await else {
                continue;
            };
            match loaded {
                Ok(m) => {
                    tracing::info!(serial = %m.serial, forced, "identity reloaded from files");
                    record_expiry(&self.metrics, &m);
                    self.metrics.reloads.get_or_create(&labels).inc();
                    self.tx.send_replace(Arc::new(m));
                }
                Err(e) => {
                    tracing::warn!(error = %crate::error::chain(&e), "identity reload failed; keeping the current certificate");
                    self.metrics.reload_failures.get_or_create(&labels).inc();
                }
            }
        }
    }
}

fn fingerprint(paths: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    paths.iter().map(|p| std::fs::read(p).ok()).collect()
}

/// Runs file reads, key generation, signing and export fsyncs on tokio's blocking pool: the
/// event loop is one thread on a one-CPU sidecar, and a slow disk or a signature must not stall
/// its connections. `None` if `f` panicked (contained and counted like any task's panic).
pub(crate) async fn off_loop<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// Loads and checks every identity file once without starting anything (`ironic-proxy check`).
pub async fn check(cfg: &IdentityConfig) -> Result<(), IdentityError> {
    match &cfg.source {
        IdentitySource::Files { cert, key } => load_files(cfg, cert, key).map(|_| ()),
        IdentitySource::Issuer(issuer) => {
            rotate::check(cfg, issuer)?;
            Ok(())
        }
    }
}
