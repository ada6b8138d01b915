//! Self-issued identity from the operator CA: a fresh key pair in memory, a leaf for exactly the
//! configured SANs, checked against our own trust bundle before it is published, renewed at
//! `validity - renew_before` (minus up to 10 % of `renew_before` as jitter, so a fleet started
//! together does not renew together), and re-issued at once when the issuer or trust files
//! change (CA rotation) or on SIGHUP.
//!
//! The renewal time is kept on both clocks: a tokio deadline (monotonic) and a wall-clock timer
//! ([`WallTimer`]), with the wall clock also compared at every `watch_interval` tick in case the
//! timer cannot be created. Certificate validity is wall-clock time, and the monotonic clock
//! stops while a virtual machine is frozen while the wall clock is stepped forward on resume.
//! With the monotonic deadline alone, a 10 s freeze of the whole machine (seen in CI on
//! 2026-12-03: every process, Ironic included, silent for 10 s; afterwards one sidecar renewed,
//! the other two still waited out their monotonic time) left us serving, and exporting, a
//! certificate that had expired during the freeze.
//!
//! A failed renewal retries with exponential backoff (1 s .. 60 s) and keeps serving the current
//! certificate; `/readyz` fails only once no valid certificate is left. The private key lives in
//! memory and in `export_dir` only.

use super::export::{write_atomic, ExportOptions};
use super::wall_timer::WallTimer;
use super::{load_trust, record_expiry, LoadError, Material};
use super::{ExportConfig, IdentityConfig, IssuerConfig};
use crate::dns_name::{DnsName, DnsNameError};
use crate::metrics::{Metrics, ReloadLabels};
use crate::pki::{issue_leaf, Issuer, LeafRequest, PkiError};
use rustls::client::danger::ServerCertVerifier;
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{watch, Notify};

#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error("identity.issuer_cert/issuer_key")]
    Issuer(#[source] PkiError),
    #[error("identity.dns_names/ip_addresses")]
    Issue(#[source] PkiError),
    #[error(transparent)]
    Trust(#[from] LoadError),
    #[error("identity: the issued certificate does not verify against identity.trust")]
    Verify(#[source] rustls::Error),
    #[error("identity: cannot build a verifier from identity.trust")]
    Verifier(#[source] rustls::client::VerifierBuilderError),
    #[error("identity: the first SAN is not a name a client can verify")]
    Name(#[source] DnsNameError),
    #[error("identity: the issued certificate and key do not form a TLS identity")]
    Tls(#[source] rustls::Error),
    #[error("identity.export_dir {dir}")]
    Export {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Issues one generation: leaf + key + trust, verified as a client and as a server certificate.
pub(crate) fn issue(cfg: &IdentityConfig, ic: &IssuerConfig) -> Result<Material, RotateError> {
    let issuer =
        Issuer::from_files(&ic.issuer_cert, &ic.issuer_key).map_err(RotateError::Issuer)?;
    let (roots, trust_pem) = load_trust(&cfg.trust)?;
    let req = LeafRequest {
        dns_names: ic.dns_names.clone(),
        ip_addresses: ic.ip_addresses.clone(),
        validity: ic.validity,
    };
    let leaf = issue_leaf(&issuer, &req).map_err(RotateError::Issue)?;
    // Send the issuer along unless it is a root (then every verifier already has it).
    let self_signed = x509_parser::parse_x509_certificate(issuer.cert_der())
        .is_ok_and(|(_, c)| c.subject() == c.issuer());
    let mut chain: Vec<CertificateDer<'static>> = vec![leaf.cert_der.clone()];
    let mut chain_pem = leaf.cert_pem.clone();
    if !self_signed {
        chain.push(issuer.cert_der().clone());
        chain_pem.push_str(issuer.cert_pem());
    }
    let roots = Arc::new(roots);
    verify(&roots, &chain, &req)?;
    let provider = crate::crypto::provider();
    let certified =
        CertifiedKey::from_der(chain, leaf.key_der, &provider).map_err(RotateError::Tls)?;
    Ok(Material {
        certified_key: Arc::new(certified),
        roots,
        chain_pem,
        key_pem: leaf.key_pem,
        trust_pem,
        not_before: leaf.not_before,
        not_after: leaf.not_after,
        serial: leaf.serial_hex,
    })
}

/// Our leaf must pass what our peers will check: the chain to `trust` (with the CA's name
/// constraints), clientAuth for JSON-RPC calls we make, serverAuth for the first SAN.
fn verify(
    roots: &Arc<rustls::RootCertStore>,
    chain: &[CertificateDer<'static>],
    req: &LeafRequest,
) -> Result<(), RotateError> {
    let provider = Arc::new(crate::crypto::provider());
    let now = UnixTime::now();
    let client = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .map_err(RotateError::Verifier)?;
    client
        .verify_client_cert(&chain[0], &chain[1..], now)
        .map_err(RotateError::Verify)?;
    let server =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots.clone(), provider)
            .build()
            .map_err(RotateError::Verifier)?;
    let name = match (req.dns_names.first(), req.ip_addresses.first()) {
        (Some(dns), _) => DnsName::parse(dns)
            .map_err(RotateError::Name)?
            .to_server_name(),
        (None, Some(ip)) => ServerName::IpAddress((*ip).into()),
        // `issue_leaf` refuses a request without SANs before this runs.
        (None, None) => return Err(RotateError::Name(DnsNameError::Empty)),
    };
    server
        .verify_server_cert(&chain[0], &chain[1..], &name, &[], now)
        .map_err(RotateError::Verify)?;
    Ok(())
}

/// Writes tls.crt, tls.key and ca.crt as one generation.
pub(crate) fn export(e: &ExportConfig, m: &Material) -> Result<(), RotateError> {
    let files: [(&str, &[u8]); 3] = [
        ("tls.crt", m.chain_pem.as_bytes()),
        ("tls.key", m.key_pem.as_bytes()),
        ("ca.crt", m.trust_pem.as_bytes()),
    ];
    write_atomic(
        &e.dir,
        &files,
        &ExportOptions {
            mode: e.mode,
            gid: e.group,
        },
    )
    .map_err(|source| RotateError::Export {
        dir: e.dir.clone(),
        source,
    })
}

/// `ironic-proxy check`: issue once in memory, write nothing.
pub(super) fn check(cfg: &IdentityConfig, ic: &IssuerConfig) -> Result<(), RotateError> {
    issue(cfg, ic).map(|_| ())
}

pub(super) async fn start(
    cfg: &IdentityConfig,
    ic: &IssuerConfig,
    metrics: &Metrics,
    reload: Arc<Notify>,
) -> Result<watch::Receiver<Arc<Material>>, RotateError> {
    let first = issue(cfg, ic)?;
    if let Some(e) = &cfg.export {
        export(e, &first)?;
    }
    record_expiry(metrics, &first);
    tracing::info!(serial = %first.serial, not_after = %humantime::format_rfc3339_seconds(first.not_after), "issued our certificate");
    let (tx, rx) = watch::channel(Arc::new(first));
    let task = Rotator {
        cfg: cfg.clone(),
        ic: ic.clone(),
        metrics: metrics.clone(),
        reload,
        tx,
        wall: SystemTime::now,
        timer: WallTimer::new()
            .inspect_err(|err| {
                tracing::warn!(error = %err, "no wall-clock timer; renewals after a clock step wait for the next watch_interval tick");
            })
            .ok(),
    };
    tokio::spawn(task.run());
    Ok(rx)
}

struct Rotator {
    cfg: IdentityConfig,
    ic: IssuerConfig,
    metrics: Metrics,
    reload: Arc<Notify>,
    tx: watch::Sender<Arc<Material>>,
    /// The wall clock; tests step it without moving tokio's clock, as a suspend does.
    wall: fn() -> SystemTime,
    /// Fires at the renewal time on the wall clock; `None` if the kernel refused a timerfd.
    timer: Option<WallTimer>,
}

/// When the next renewal is due, on both clocks (see the module documentation).
struct Due {
    at: tokio::time::Instant,
    wall: SystemTime,
}

impl Due {
    /// Why we renew when the wall clock got there first: the two clocks drift apart by
    /// milliseconds (NTP slews one of them), so only a lead of seconds names a freeze.
    fn wall_reason(&self) -> &'static str {
        if self.at > tokio::time::Instant::now() + Duration::from_secs(1) {
            "renewal (the wall clock ran ahead: suspend or clock step)"
        } else {
            "renewal"
        }
    }
}

/// The shortest time between two renewals.
const MIN_RENEW_GAP: Duration = Duration::from_secs(1);

/// When the current certificate should be renewed, as a delay from now.
fn renew_in(m: &Material, renew_before: Duration, now: SystemTime) -> Duration {
    let jitter_max = renew_before / 10;
    let jitter = Duration::from_secs_f64(jitter_max.as_secs_f64() * fastrand::f64());
    let at = m
        .not_after
        .checked_sub(renew_before + jitter)
        .unwrap_or(now);
    // notAfter has whole seconds only, so with validity close to renew_before the due time can
    // already have passed at issuance; a floor keeps renewals from running back to back.
    at.duration_since(now)
        .unwrap_or(Duration::ZERO)
        .max(MIN_RENEW_GAP)
}

impl Rotator {
    /// The bytes of the issuer's files and the trust bundle, read off the event loop.
    async fn files(&self) -> Option<Vec<Option<Vec<u8>>>> {
        let paths = [
            self.ic.issuer_cert.clone(),
            self.ic.issuer_key.clone(),
            self.cfg.trust.clone(),
        ];
        super::off_loop(move || paths.iter().map(|p| std::fs::read(p).ok()).collect()).await
    }

    /// Issues a generation and exports it (when configured) off the event loop: key generation,
    /// signing and the export's fsyncs.
    async fn issue_and_export(
        &self,
    ) -> Option<Result<(Material, Option<Result<(), RotateError>>), RotateError>> {
        let (cfg, ic) = (self.cfg.clone(), self.ic.clone());
        super::off_loop(move || {
            let m = issue(&cfg, &ic)?;
            let exported = cfg.export.as_ref().map(|e| export(e, &m));
            Ok((m, exported))
        })
        .await
    }

    fn arm(&self, due: &Due) {
        if let Some(timer) = &self.timer {
            if let Err(err) = timer.arm(due.wall) {
                tracing::warn!(error = %err, "cannot arm the wall-clock renewal timer");
            }
        }
    }

    /// Completes when the wall-clock timer fires; never without one, or if waiting on it fails
    /// (the monotonic deadline and the watch ticks still hold).
    async fn wall_timer(&self) {
        match &self.timer {
            Some(timer) => {
                if let Err(err) = timer.fired().await {
                    tracing::warn!(error = %err, "the wall-clock renewal timer failed");
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }

    async fn run(self) {
        let mut backoff = Duration::from_secs(1);
        let after = |delay: Duration| Due {
            at: tokio::time::Instant::now() + delay,
            wall: (self.wall)() + delay,
        };
        let renew_at = |m: &Material| after(renew_in(m, self.ic.renew_before, (self.wall)()));
        let mut due = renew_at(&self.tx.borrow());
        self.arm(&due);
        let mut seen = self.files().await;
        let mut poll =
            tokio::time::interval(self.cfg.watch_interval.max(Duration::from_millis(50)));
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let why = tokio::select! {
                () = tokio::time::sleep_until(due.at) => "renewal",
                () = self.wall_timer() => {
                    if (self.wall)() < due.wall {
                        // The clock was set, but not past our time.
                        self.arm(&due);
                        continue;
                    }
                    due.wall_reason()
                }
                () = self.reload.notified() => "SIGHUP",
                _ = poll.tick() => {
                    let now = self.files().await;
                    if now != seen {
                        seen = now;
                        "issuer or trust files changed"
                    } else if (self.wall)() >= due.wall {
                        due.wall_reason()
                    } else {
                        continue;
                    }
                }
                () = self.tx.closed() => return,
            };
            let Some(issued) = self.issue_and_export().await else {
                // The work panicked: counted by the panic hook; try again after the backoff.
                due = after(backoff);
                self.arm(&due);
                continue;
            };
            match issued {
                Ok((m, exported)) => {
                    if let Some(Err(err)) = exported {
                        // Keep serving the new certificate: Ironic keeps the last exported
                        // pair, which stays valid until its own expiry.
                        tracing::warn!(error = %crate::error::chain(&err), "export failed");
                        self.metrics
                            .reload_failures
                            .get_or_create(&ReloadLabels { what: "export" })
                            .inc();
                    }
                    tracing::info!(serial = %m.serial, not_after = %humantime::format_rfc3339_seconds(m.not_after), reason = why, "renewed our certificate");
                    record_expiry(&self.metrics, &m);
                    self.metrics.certificate_renewals.inc();
                    due = renew_at(&m);
                    self.arm(&due);
                    self.tx.send_replace(Arc::new(m));
                    backoff = Duration::from_secs(1);
                }
                Err(err) => {
                    tracing::warn!(error = %crate::error::chain(&err), reason = why, retry_in = ?backoff,
                        "renewal failed; keeping the current certificate");
                    self.metrics.certificate_renewal_failures.inc();
                    due = after(backoff);
                    self.arm(&due);
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::IdentitySource;
    use crate::pki::{generate_ca, CaSpec};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Seconds the fake wall clock is ahead of the real one: a suspend of that length.
    static STEP: AtomicU64 = AtomicU64::new(0);

    fn stepped_wall() -> SystemTime {
        SystemTime::now() + Duration::from_secs(STEP.load(Ordering::SeqCst))
    }

    /// A machine frozen past our renewal time (monotonic clock stopped, wall clock stepped on
    /// resume) renews at the next watch tick instead of waiting out the monotonic deadline.
    #[tokio::test(start_paused = true)]
    async fn a_wall_clock_step_past_the_renewal_time_renews_at_the_next_tick() {
        let dir = tempfile::tempdir().unwrap();
        let ca = generate_ca(&CaSpec::default()).unwrap();
        let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        std::fs::write(&cert, &ca.cert_pem).unwrap();
        std::fs::write(&key, &ca.key_pem).unwrap();
        let ic = IssuerConfig {
            issuer_cert: cert.clone(),
            issuer_key: key,
            dns_names: vec!["ironic-0.example".to_owned()],
            ip_addresses: vec![],
            validity: Duration::from_secs(3600),
            renew_before: Duration::from_secs(1200),
        };
        let watch_interval = Duration::from_secs(2);
        let cfg = IdentityConfig {
            trust: cert,
            source: IdentitySource::Issuer(ic.clone()),
            export: None,
            watch_interval,
        };
        let first = issue(&cfg, &ic).unwrap();
        let first_serial = first.serial.clone();
        let (tx, mut rx) = watch::channel(Arc::new(first));
        let rotator = Rotator {
            cfg,
            ic,
            metrics: Metrics::new(),
            reload: Arc::new(Notify::new()),
            tx,
            wall: stepped_wall,
            // The kernel's timer follows the real wall clock, which this test does not step.
            timer: None,
        };
        tokio::spawn(rotator.run());

        // Ten ticks with both clocks in step: the renewal is 40 minutes away.
        tokio::time::sleep(watch_interval * 10).await;
        assert!(!rx.has_changed().unwrap(), "no renewal before it is due");

        // The wall clock jumps 45 minutes (past the renewal time, 15 before expiry); tokio's
        // deadline is still 40 minutes away.
        STEP.store(45 * 60, Ordering::SeqCst);
        tokio::time::timeout(watch_interval + Duration::from_millis(500), rx.changed())
            .await
            .expect("renewed within one watch interval of the step")
            .unwrap();
        assert_ne!(rx.borrow().serial, first_serial);
    }
}
