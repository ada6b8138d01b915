//! Builds and runs everything a configuration describes, and drains it on demand.
//!
//! Start-up order: metrics, identity (every file checked), upstreams, TLS configurations, bind
//! every listener (any failure is a start-up error), admin, then accept. `/readyz` turns 200 once
//! all listeners are bound. Shutdown order is documented in [`crate::listen`].

use crate::admin::{self, IdentityCheck, Readiness};
use crate::config::{Config, ListenAddr, TlsMode};
use crate::discovery::{self, DiscoveryOptions, Target};
use crate::identity::{self, Identity, IdentityError};
use crate::listen::{self, ListenError, Listener};
use crate::metrics::Metrics;
use crate::proxy::pool::{Pool, PoolOptions};
use crate::proxy::Proxy;
use crate::tls::{self, ReloadableServer, TlsError};
use arc_swap::ArcSwap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
    #[error("admin.listen: cannot bind {addr}: {source}")]
    Admin {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("listeners[{index}].upstream: {reason}")]
    Upstream { index: usize, reason: String },
}

/// `/readyz` needs a healthy endpoint in every upstream.
struct PoolCheck(Arc<Pool>);

impl admin::Check for PoolCheck {
    fn check(&self) -> Result<(), String> {
        self.0.is_ready()
    }
}

/// The client TLS configuration for peers, following identity changes.
fn peer_client_config(id: &Identity) -> Result<Arc<ArcSwap<rustls::ClientConfig>>, ServerError> {
    let cfg = tls::peer::client_config(&id.current())
        .map_err(|e| ServerError::Tls(TlsError::Config(e)))?;
    let swap = Arc::new(ArcSwap::new(cfg));
    let mut rx = id.subscribe();
    let target = swap.clone();
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let m = rx.borrow_and_update().clone();
            match tls::peer::client_config(&m) {
                Ok(c) => target.store(c),
                Err(e) => tracing::warn!(error = %e, "keeping the previous peer TLS configuration"),
            }
        }
    });
    Ok(swap)
}

/// The runtime `run` uses. On one CPU (a sidecar's usual CPU limit, or an affinity mask; both
/// count in `available_parallelism`) a current-thread runtime: every task on the one thread, no
/// hand-offs between a worker and the thread that blocks on the main future, no work-stealing
/// queues, one thread's memory. On more CPUs the multi-thread runtime with one worker each.
/// `IRONIC_PROXY_WORKER_THREADS=N` overrides the CPU count (1 = current-thread).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let threads = std::env::var("IRONIC_PROXY_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
}

/// Every task runs under tokio, which catches a panic in it and ends only that task (one
/// connection, one health checker); the release profile keeps `panic = "unwind"` for that. This
/// hook makes each such panic visible: logged through tracing with its location, and counted
/// in `ironic_proxy_panics_total`. The process keeps serving.
fn contain_panics(metrics: &Metrics) {
    let counter = metrics.panics.clone();
    std::panic::set_hook(Box::new(move |info| {
        counter.inc();
        let location = info.location().map(ToString::to_string).unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(%location, %message, "panic contained in a task; the process keeps running");
    }));
}

/// A started server.
pub struct Server {
    pub metrics: Metrics,
    pub readiness: Arc<Readiness>,
    pub identity: Option<Identity>,
    /// Listener names and the addresses actually bound.
    pub bound: Vec<(String, ListenAddr)>,
    pub admin_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    drained: Vec<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    drain_timeout: Duration,
}

use std::pin::Pin;

impl Server {
    pub async fn start(config: Config) -> Result<Self, ServerError> {
        let metrics = Metrics::new();
        contain_panics(&metrics);
        // Before any TLS configuration is built.
        crate::crypto::policy::install(&config.tls);
        let readiness = Arc::new(Readiness::default());
        let identity = match &config.identity {
            Some(cfg) => Some(identity::start(cfg, &metrics).await?),
            None => None,
        };
        if let Some(id) = &identity {
            readiness.add(Box::new(IdentityCheck(id.clone())));
        }
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut listeners = Vec::new();
        let mut bound = Vec::new();
        for (index, lc) in config.listeners.iter().enumerate() {
            let dns = match &lc.upstream.dns {
                None => None,
                Some(target) => {
                    let err = |reason: String| ServerError::Upstream { index, reason };
                    let target: Target = target
                        .parse()
                        .map_err(|e: discovery::DiscoveryError| err(e.to_string()))?;
                    let opts = DiscoveryOptions {
                        servers: config.dns.servers.clone(),
                        refresh: config.dns.refresh,
                        min_ttl: Duration::from_secs(1),
                        hold_on_empty: config.dns.hold_on_empty,
                        fallback: lc.upstream.fallback.clone(),
                    };
                    let (rx, _task) =
                        discovery::spawn(lc.name.clone(), target, opts, metrics.clone())
                            .map_err(|e| err(e.to_string()))?;
                    Some(rx)
                }
            };
            let peer_tls = match (lc.upstream.tls, &identity) {
                (false, _) => None,
                (true, None) => {
                    return Err(ServerError::Upstream {
                        index,
                        reason: "tls = true needs an [identity]".into(),
                    })
                }
                (true, Some(id)) => Some(peer_client_config(id)?),
            };
            let upstream = Pool::new(PoolOptions {
                name: lc.name.clone(),
                local: lc.upstream.local.clone(),
                dns,
                peer_tls,
                balance: lc.upstream.balance,
                health: lc.upstream.health.clone(),
                retries: lc.upstream.retries,
                max_response_head: config.limits.header_bytes,
                metrics: metrics.clone(),
            });
            readiness.add(Box::new(PoolCheck(upstream.clone())));
            let gate = match &lc.auth {
                Some(a) => {
                    let every = config
                        .identity
                        .as_ref()
                        .map_or(Duration::from_secs(2), |i| i.watch_interval);
                    Some(crate::auth::Gate::start(
                        &lc.name, index, a, every, &metrics,
                    )?)
                }
                None => None,
            };
            let mut proxy = Proxy::new(&lc.name, upstream, config.limits.clone(), metrics.clone())
                .with_auth(gate)
                .with_jsonrpc(lc.jsonrpc);
            if !lc.routes.is_empty() {
                proxy = proxy.with_routes(route_table(
                    index,
                    lc,
                    &config,
                    identity.as_ref(),
                    &metrics,
                )?);
            }
            let proxy = Arc::new(proxy);
            let tls = match (lc.tls, &identity) {
                (TlsMode::None, _) | (_, None) => None,
                (mode, Some(id)) => {
                    let cfg = tls::server_config(&id.current(), mode, lc.http2)?;
                    let reloadable = ReloadableServer::new(cfg);
                    tokio::spawn(reloadable.clone().follow(
                        id.subscribe(),
                        mode,
                        lc.http2,
                        lc.name.clone(),
                    ));
                    Some(reloadable)
                }
            };
            let sock = listen::bind(&lc.name, &lc.listen).await?;
            bound.push((lc.name.clone(), sock.local_addr()));
            listeners.push(Listener::new(
                lc.clone(),
                sock,
                tls,
                proxy,
                config.limits.clone(),
                metrics.clone(),
            ));
        }
        let admin_addr = match &config.admin {
            Some(a) => {
                let l = tokio::net::TcpListener::bind(a.listen)
                    .await
                    .map_err(|source| ServerError::Admin {
                        addr: a.listen,
                        source,
                    })?;
                let addr = l.local_addr().ok();
                tokio::spawn(admin::serve(l, metrics.clone(), readiness.clone()));
                addr
            }
            None => None,
        };
        let mut drained: Vec<Pin<Box<dyn std::future::Future<Output = ()> + Send>>> = Vec::new();
        for l in listeners {
            drained.push(Box::pin(l.drained()));
            tokio::spawn(l.run(shutdown_rx.clone()));
        }
        readiness.set_bound();
        // Logged once started: a start-up failure stays one line on stderr.
        tracing::info!(
            fips = crate::crypto::fips(),
            min_version = ?config.tls.min_version,
            "crypto: aws-lc-rs"
        );
        for (name, addr) in &bound {
            tracing::info!(listener = %name, %addr, "listening");
        }
        Ok(Self {
            metrics,
            readiness,
            identity,
            bound,
            admin_addr,
            shutdown,
            drained,
            drain_timeout: config.limits.drain_timeout,
        })
    }

    /// Stops accepting, fails `/readyz`, lets in-flight requests finish within `drain_timeout`.
    /// Returns true when every connection closed in time.
    pub async fn drain(self) -> bool {
        self.readiness.set_draining();
        let _ = self.shutdown.send(true);
        let all = futures_util::future::join_all(self.drained);
        let clean = tokio::time::timeout(self.drain_timeout, all).await.is_ok();
        if clean {
            tracing::info!("drained");
        } else {
            tracing::warn!(timeout = ?self.drain_timeout, "drain timeout: closing remaining connections");
        }
        clean
    }
}

/// The routes of listener `index`: one pool per route, built as a listener's (its own DNS
/// discovery and health checks). Route pools do not gate `/readyz`: a listener stays ready
/// while its default upstream is.
fn route_table(
    index: usize,
    lc: &crate::config::ListenerConfig,
    config: &Config,
    identity: Option<&Identity>,
    metrics: &Metrics,
) -> Result<crate::proxy::route::Routes, ServerError> {
    use crate::proxy::find::Finder;
    use crate::proxy::route::{Route, Routes, Target as RouteTarget};
    let mut routes = Vec::with_capacity(lc.routes.len());
    for (r, rc) in lc.routes.iter().enumerate() {
        let err = |reason: String| ServerError::Upstream {
            index,
            reason: format!("routes[{r}]: {reason}"),
        };
        // Named after the listener and route, for logs and the upstream metrics.
        let name = format!("{}/routes[{r}]", lc.name);
        let u = &rc.upstream;
        let dns = match &u.dns {
            None => None,
            Some(target) => {
                let target: Target = target
                    .parse()
                    .map_err(|e: discovery::DiscoveryError| err(e.to_string()))?;
                let opts = DiscoveryOptions {
                    servers: config.dns.servers.clone(),
                    refresh: config.dns.refresh,
                    min_ttl: Duration::from_secs(1),
                    hold_on_empty: config.dns.hold_on_empty,
                    fallback: u.fallback.clone(),
                };
                let (rx, _task) = discovery::spawn(name.clone(), target, opts, metrics.clone())
                    .map_err(|e| err(e.to_string()))?;
                Some(rx)
            }
        };
        let peer_tls = match (u.tls, identity) {
            (false, _) => None,
            (true, None) => return Err(err("tls = true needs an [identity]".into())),
            (true, Some(id)) => Some(peer_client_config(id)?),
        };
        let pool = Pool::new(PoolOptions {
            name: name.clone(),
            local: u.local.clone(),
            dns,
            peer_tls,
            balance: u.balance,
            health: u.health.clone(),
            retries: u.retries,
            max_response_head: config.limits.header_bytes,
            metrics: metrics.clone(),
        });
        let target = match rc.find {
            Some(crate::config::Find::Newest) => RouteTarget::Find(Arc::new(Finder::new(
                pool,
                rc.find_timeout,
                &lc.name,
                metrics,
            ))),
            None => RouteTarget::Forward(pool),
        };
        routes.push(Route {
            patterns: rc.paths.clone(),
            methods: rc.methods.clone(),
            plaintext: rc.plaintext,
            target,
        });
    }
    Ok(Routes::new(lc.tls, routes))
}
