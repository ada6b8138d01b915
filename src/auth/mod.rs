//! HTTP Basic authentication per listener (`[listeners.auth]`), as httpd enforces it in front
//! of Ironic in ironic-image, without httpd's costs.
//!
//! Owns three guarantees:
//! - Nothing reaches the upstream unauthenticated unless its path is public by the strict rule
//!   of [`public`] (literal, canonical, case-sensitive).
//! - bcrypt never runs on the event loop: verifications run on threads of their own at the
//!   lowest CPU priority (see [`verifier`]), at most half the CPUs at once for the whole
//!   process, with at most 32 more waiting (see [`Limiter`]); past that a request is answered 503
//!   without verifying, so a flood of wrong passwords costs a bounded share of CPU and other
//!   connections keep their latency.
//! - A credential verified once is remembered (see [`cache`]) until the file changes, so a
//!   keep-alive client pays bcrypt once, not per request; requests with the same credentials
//!   arriving while it is verified wait for that one verification (see [`inflight`]).
//!
//! The htpasswd file is re-read when its bytes change (polled like the certificates) and on
//! SIGHUP; a file that does not parse keeps the last good one, logs a warning and counts in
//! `ironic_proxy_reload_failures_total{what="htpasswd"}`. Outcomes are counted in
//! `ironic_proxy_auth_total{listener,outcome}`.

pub(crate) mod cache;
mod config;
pub(crate) mod htpasswd;
pub(crate) mod inflight;
pub(crate) mod public;
#[cfg(test)]
mod tests;
pub(crate) mod verifier;

pub(crate) use config::{from_toml, AuthConfig};
pub(crate) use htpasswd::{HtpasswdError, Users};
pub(crate) use public::is_public;

use crate::metrics::{AuthLabels, Metrics, ReloadLabels};
use arc_swap::ArcSwap;
use base64::Engine as _;
use http::{header, HeaderValue, Request};
use prometheus_client::metrics::counter::Counter;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The htpasswd file of `listeners[index]` is unusable at start-up.
    #[error("listeners[{index}].auth.htpasswd")]
    Htpasswd {
        index: usize,
        #[source]
        source: HtpasswdError,
    },
    #[error("cannot draw the credential cache key")]
    Random,
}

/// Why a request was not let through.
#[derive(Debug)]
pub enum Deny {
    /// 401 with this `WWW-Authenticate` challenge. `close` when the request has a body we did
    /// not read: the connection cannot be reused safely (RFC 9112 §9.6).
    Unauthorized { challenge: HeaderValue, close: bool },
    /// 503: the verification queue is full; nothing was verified.
    Busy { close: bool },
}

/// What happened to one request, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    OkCached,
    Public,
    NoCredentials,
    Malformed,
    UnknownUser,
    WrongPassword,
    QueueFull,
}

impl Outcome {
    pub(crate) const ALL: [Self; 8] = [
        Self::Ok,
        Self::OkCached,
        Self::Public,
        Self::NoCredentials,
        Self::Malformed,
        Self::UnknownUser,
        Self::WrongPassword,
        Self::QueueFull,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::OkCached => "ok_cached",
            Self::Public => "public",
            Self::NoCredentials => "no_credentials",
            Self::Malformed => "malformed",
            Self::UnknownUser => "unknown_user",
            Self::WrongPassword => "wrong_password",
            Self::QueueFull => "queue_full",
        }
    }
}

/// The process-wide bound on bcrypt work, shared by every listener (a flood on the API must
/// not starve the JSON-RPC listener's verifications of the CPU, nor the reverse).
pub(crate) struct Limiter {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    permits: usize,
    queue: usize,
}

impl Limiter {
    /// Half the CPUs (at least one) verify at once, so a flood leaves the other half to the
    /// event loop; 32 more may wait (a bcrypt of the cost a test or kit uses is short, so the
    /// queue drains well within a client's patience).
    fn global() -> &'static Self {
        static LIMITER: OnceLock<Limiter> = OnceLock::new();
        LIMITER.get_or_init(|| {
            let cpus = std::thread::available_parallelism().map_or(1, usize::from);
            Self::new((cpus / 2).max(1), 32)
        })
    }

    fn new(permits: usize, queue: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(permits)),
            waiting: AtomicUsize::new(0),
            permits,
            queue,
        }
    }

    /// How many verifications run at once (the size of the [`verifier`] pool).
    fn permits(&self) -> usize {
        self.permits
    }

    /// A verification slot, waiting in the bounded queue if need be; `None` when it is full.
    async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Some(p);
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        // Leaves the queue however the wait ends, also when the client goes away.
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _leave = Leave(&self.waiting);
        self.slots.clone().acquire_owned().await.ok()
    }
}

/// One generation of the htpasswd file.
struct Generation {
    number: u64,
    users: Users,
}

/// A listener's authentication gate.
pub struct Gate {
    cfg: AuthConfig,
    challenge: HeaderValue,
    users: ArcSwap<Generation>,
    cache: cache::Cache,
    inflight: inflight::InFlight,
    counters: Vec<Counter>,
}

/// Longest `Authorization` value looked at; Basic credentials are short, a longer value is
/// malformed without being decoded.
const MAX_CREDENTIALS: usize = 4096;

impl Gate {
    /// Loads the file (an error names `listeners[index].auth.htpasswd` and the line) and starts
    /// following it: polled every `watch_interval`, and re-read on SIGHUP.
    pub fn start(
        listener: &str,
        index: usize,
        cfg: &AuthConfig,
        watch_interval: Duration,
        metrics: &Metrics,
    ) -> Result<Arc<Self>, AuthError> {
        let seen = std::fs::read(&cfg.htpasswd).ok();
        let users =
            Users::load(&cfg.htpasswd).map_err(|source| AuthError::Htpasswd { index, source })?;
        let gate = Arc::new(Self::new(listener, cfg, users, metrics)?);
        tokio::spawn(follow(
            Arc::downgrade(&gate),
            cfg.htpasswd.clone(),
            seen,
            watch_interval,
            metrics.clone(),
        ));
        Ok(gate)
    }

    fn new(
        listener: &str,
        cfg: &AuthConfig,
        users: Users,
        metrics: &Metrics,
    ) -> Result<Self, AuthError> {
        // The realm was checked to be printable ASCII without quotes when the config parsed.
        let challenge = HeaderValue::from_str(&format!("Basic realm=\"{}\"", cfg.realm))
            .unwrap_or_else(|_| HeaderValue::from_static("Basic"));
        let counters = Outcome::ALL
            .iter()
            .map(|o| {
                metrics
                    .auth
                    .get_or_create(&AuthLabels {
                        listener: listener.to_owned(),
                        outcome: o.label(),
                    })
                    .clone()
            })
            .collect();
        Ok(Self {
            cfg: cfg.clone(),
            challenge,
            users: ArcSwap::from_pointee(Generation { number: 0, users }),
            cache: cache::Cache::new().map_err(|_| AuthError::Random)?,
            inflight: inflight::InFlight::default(),
            counters,
        })
    }

    /// Lets `req` through or says why not. On the way through, `Authorization` is removed
    /// when `forward_authorization = false`.
    pub async fn admit<B>(&self, req: &mut Request<B>) -> Result<(), Deny> {
        let outcome = if is_public(&self.cfg.public, req.uri().path()) {
            Outcome::Public
        } else {
            self.verify(req.headers()).await
        };
        self.counters[outcome as usize].inc();
        match outcome {
            Outcome::Ok | Outcome::OkCached | Outcome::Public => {
                if !self.cfg.forward_authorization {
                    req.headers_mut().remove(header::AUTHORIZATION);
                }
                Ok(())
            }
            refused => {
                let h = req.headers();
                let close = h.contains_key(header::TRANSFER_ENCODING)
                    || h.get(header::CONTENT_LENGTH)
                        .is_some_and(|v| v.as_bytes() != b"0");
                Err(if refused == Outcome::QueueFull {
                    Deny::Busy { close }
                } else {
                    Deny::Unauthorized {
                        challenge: self.challenge.clone(),
                        close,
                    }
                })
            }
        }
    }

    /// Checks the Basic credentials in `field` (`Proxy-Authorization` on an egress listener)
    /// the way [`Self::admit`] checks `Authorization`, and counts the outcome. No path is public.
    pub(crate) async fn check_field(
        &self,
        headers: &http::HeaderMap,
        field: &http::HeaderName,
    ) -> Outcome {
        let outcome = self.verify_field(headers, field).await;
        self.counters[outcome as usize].inc();
        outcome
    }

    async fn verify(&self, headers: &http::HeaderMap) -> Outcome {
        self.verify_field(headers, &header::AUTHORIZATION).await
    }

    async fn verify_field(&self, headers: &http::HeaderMap, field: &http::HeaderName) -> Outcome {
        let mut values = headers.get_all(field).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return if headers.contains_key(field) {
                Outcome::Malformed
            } else {
                Outcome::NoCredentials
            };
        };
        let Some((user, password)) = parse_basic(value.as_bytes()) else {
            return Outcome::Malformed;
        };
        let generation = self.users.load_full();
        let tag = self.cache.tag(&user, &password);
        if self.cache.contains(generation.number, &tag) {
            return Outcome::OkCached;
        }
        let (hash, known) = match generation.users.hash(&user) {
            Some(h) => (h.to_owned(), true),
            None => match generation.users.decoy() {
                Some(h) => (h.to_owned(), false),
                None => return Outcome::UnknownUser,
            },
        };
        // The same credentials already being verified: wait for that answer.
        let leader = match self.inflight.join(generation.number, tag) {
            inflight::Turn::Lead(leader) => leader,
            inflight::Turn::Follow(answer) => {
                return match (known, inflight::answer(answer).await) {
                    (_, None) => Outcome::QueueFull,
                    (true, Some(true)) => Outcome::OkCached,
                    (true, Some(false)) => Outcome::WrongPassword,
                    (false, Some(_)) => Outcome::UnknownUser,
                };
            }
        };
        // A leader that verified these credentials may have ended between the cache look above
        // and `join`: it filled the cache before it left, so a second look finds its answer
        // instead of a second bcrypt run.
        if self.cache.contains(generation.number, &tag) {
            leader.finish(true);
            return Outcome::OkCached;
        }
        let limiter = Limiter::global();
        let Some(permit) = limiter.acquire().await else {
            return Outcome::QueueFull;
        };
        let verified = verifier::Pool::global(limiter.permits())
            .verify(password, hash, permit)
            .await;
        if known && verified {
            self.cache.insert(generation.number, tag);
        }
        leader.finish(verified);
        match (known, verified) {
            (true, true) => Outcome::Ok,
            (true, false) => Outcome::WrongPassword,
            (false, _) => Outcome::UnknownUser,
        }
    }

    /// Publishes a new file generation and forgets every cached credential.
    fn replace(&self, users: Users) {
        let number = self.users.load().number + 1;
        self.cache.reset(number);
        self.users.store(Arc::new(Generation { number, users }));
    }
}

/// `Basic <base64(user:password)>` (RFC 7617): the scheme case-insensitive, one or more spaces,
/// padded standard base64, a UTF-8 user without control characters, a password without NUL.
/// `None` for anything else, including other schemes.
pub(crate) fn parse_basic(value: &[u8]) -> Option<(String, Vec<u8>)> {
    if value.len() > MAX_CREDENTIALS || value.len() < 6 {
        return None;
    }
    let (scheme, rest) = value.split_at(5);
    if !scheme.eq_ignore_ascii_case(b"basic") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii_start();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token)
        .ok()?;
    let colon = decoded.iter().position(|b| *b == b':')?;
    let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
    let user = std::str::from_utf8(user).ok()?;
    if user.is_empty() || user.chars().any(char::is_control) || password.contains(&0) {
        return None;
    }
    Some((user.to_owned(), password.to_vec()))
}

/// Follows the file until the gate is dropped.
async fn follow(
    gate: Weak<Gate>,
    path: PathBuf,
    mut seen: Option<Vec<u8>>,
    interval: Duration,
    metrics: Metrics,
) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let labels = ReloadLabels { what: "htpasswd" };
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
        };
        let Some(gate) = gate.upgrade() else { return };
        let now = std::fs::read(&path).ok();
        if !forced && now == seen {
            continue;
        }
        seen = now;
        match Users::load(&path) {
            Ok(users) => {
                tracing::info!(file = %path.display(), users = users.len(), forced, "htpasswd reloaded");
                gate.replace(users);
                metrics.reloads.get_or_create(&labels).inc();
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %crate::error::chain(&e), "htpasswd reload failed; keeping the current users");
                metrics.reload_failures.get_or_create(&labels).inc();
            }
        }
    }
}

/// Loads every listener's htpasswd file once (`ironic-proxy check`).
pub fn check(index: usize, cfg: &AuthConfig) -> Result<usize, AuthError> {
    Users::load(&cfg.htpasswd)
        .map(|u| u.len())
        .map_err(|source| AuthError::Htpasswd { index, source })
}
