//! Builds and runs everything a configuration describes, and drains it on demand.
//!
//! Start-up order: metrics, identity (every file checked), upstreams, TLS configurations, bind
//! every listener (any failure is a start-up error), admin, then accept; last, the executable's
//! pages that only start-up used are given back ([`crate::trim`]). `/readyz` turns 200 once all
//! listeners are bound. Shutdown order is documented in [`crate::listen`].

use crate::admin::{self, IdentityCheck, Readiness};
use crate::config::{Config, ListenAddr, TlsMode, UpstreamConfig};
use crate::discovery::{self, DiscoveryError, DiscoveryOptions};
use crate::identity::{self, Identity, IdentityError};
use crate::listen::{self, ListenError, Listener};
use crate::metrics::Metrics;
use crate::proxy::pool::{Pool, PoolOptions};
use crate::proxy::Proxy;
use crate::tls::{self, ReloadableClient, ReloadableServer, TlsError};
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
    #[error("admin.listen: cannot bind {addr}")]
    Admin {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    AdminToken(#[from] admin::TokenError),
    #[error("{upstream}: cannot start DNS discovery")]
    Discovery {
        /// Key path of the upstream (`listeners[0].upstream`, `listeners[0].routes[1].upstream`).
        upstream: String,
        #[source]
        source: DiscoveryError,
    },
    #[error(transparent)]
    Egress(#[from] crate::proxy::egress::EgressError),
    #[error("{upstream}.tls: tls = true needs an [identity]")]
    PeerTlsWithoutIdentity { upstream: String },
}

/// `/readyz` needs a healthy endpoint in every upstream.
struct PoolCheck(Arc<Pool>);

impl admin::Check for PoolCheck {
    fn check(&self) -> Result<(), String> {
        self.0.is_ready()
    }
}

/// Background tasks that live as long as the server (discovery loops, TLS configuration
/// followers, the admin endpoint): stopped when the drain ends, not left to the runtime.
#[derive(Default)]
struct Tasks(Vec<tokio::task::AbortHandle>);

impl Tasks {
    fn add(&mut self, task: &tokio::task::JoinHandle<()>) {
        self.0.push(task.abort_handle());
    }
}

/// What every upstream pool is built from, beyond its own table.
struct PoolContext<'a> {
    config: &'a Config,
    identity: Option<&'a Identity>,
    metrics: &'a Metrics,
}

impl PoolContext<'_> {
    /// The pool of one upstream table (a listener's or a route's), with its DNS discovery and
    /// its peers' TLS configuration. `path` is the table's key path, for errors.
    fn pool(
        &self,
        name: String,
        u: &UpstreamConfig,
        path: &str,
        tasks: &mut Tasks,
    ) -> Result<Arc<Pool>, ServerError> {
        let dns = match &u.dns {
            None => None,
            Some(target) => {
                let opts = DiscoveryOptions {
                    servers: self.config.dns.servers.clone(),
                    refresh: self.config.dns.refresh,
                    min_ttl: Duration::from_secs(1),
                    hold_on_empty: self.config.dns.hold_on_empty,
                    fallback: u.fallback.clone(),
                };
                let (rx, task) =
                    discovery::spawn(name.clone(), target.clone(), opts, self.metrics.clone())
                        .map_err(|source| ServerError::Discovery {
                            upstream: path.to_owned(),
                            source,
                        })?;
                tasks.add(&task);
                Some(rx)
            }
        };
        let peer_tls = match (u.tls, self.identity) {
            (false, _) => None,
            (true, None) => {
                return Err(ServerError::PeerTlsWithoutIdentity {
                    upstream: path.to_owned(),
                })
            }
            (true, Some(id)) => {
                let (reloadable, task) = ReloadableClient::follow(
                    id.subscribe(),
                    format!("{name} (peers)"),
                    tls::peer::client_config,
                )
                .map_err(|e| ServerError::Tls(TlsError::Config(e)))?;
                tasks.add(&task);
                Some(reloadable)
            }
        };
        Ok(Pool::new(PoolOptions {
            name,
            local: u.local.clone(),
            local_tls: None,
            dns,
            peer_tls,
            balance: u.balance,
            health: u.health.clone(),
            retries: u.retries,
            limits: crate::proxy::upstream::EndpointLimits::from_config(&self.config.limits),
            metrics: self.metrics.clone(),
            report: true,
        }))
    }
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
    /// The first of [`Self::admin_addrs`].
    pub admin_addr: Option<SocketAddr>,
    /// Every address the admin listener is bound to, in `[admin] listen` order.
    pub admin_addrs: Vec<SocketAddr>,
    shutdown: watch::Sender<bool>,
    drained: Vec<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    drain_timeout: Duration,
    tasks: Tasks,
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
        let mut tasks = Tasks::default();
        let ctx = PoolContext {
            config: &config,
            identity: identity.as_ref(),
            metrics: &metrics,
        };
        let mut listeners = Vec::new();
        let mut bound = Vec::new();
        for (index, lc) in config.listeners.iter().enumerate() {
            let upstream = ctx.pool(
                lc.name.clone(),
                &lc.upstream,
                &format!("listeners[{index}].upstream"),
                &mut tasks,
            )?;
            // An egress listener has no upstream of its own to be ready with.
            if lc.egress.is_none() {
                readiness.add(Box::new(PoolCheck(upstream.clone())));
            }
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
                proxy = proxy.with_routes(route_table(index, lc, &ctx, &mut tasks)?);
            }
            if let Some(e) = &lc.egress {
                proxy = proxy.with_egress(Some(egress(index, lc, e, &ctx, &mut tasks)?));
            }
            let proxy = Arc::new(proxy);
            let tls = match (lc.tls, &identity) {
                (TlsMode::None, _) | (_, None) => None,
                (mode, Some(id)) => {
                    let http2 = lc.http2;
                    let (reloadable, task) =
                        ReloadableServer::follow(id.subscribe(), lc.name.clone(), move |m| {
                            tls::listener_tls(m, mode, http2)
                        })?;
                    tasks.add(&task);
                    Some(reloadable)
                }
            };
            let sock = listen::bind(&lc.name, &lc.listen, config.limits.handover).await?;
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
        // Every admin address is bound before any is served: a failed bind stops the start with
        // none of them answering.
        let mut admin_addrs = Vec::new();
        if let Some(a) = &config.admin {
            let token = match &a.bearer_token_file {
                Some(path) => {
                    let every = config
                        .identity
                        .as_ref()
                        .map_or(Duration::from_secs(2), |i| i.watch_interval);
                    let (token, task) = admin::MetricsToken::start(path, every, &metrics)?;
                    tasks.add(&task);
                    Some(token)
                }
                None => None,
            };
            let mut bound_admin = Vec::with_capacity(a.listen.len());
            for addr in &a.listen {
                let l = listen::bind_tcp(*addr, config.limits.handover).map_err(|source| {
                    ServerError::Admin {
                        addr: *addr,
                        source,
                    }
                })?;
                admin_addrs.push(l.local_addr().unwrap_or(*addr));
                bound_admin.push(l);
            }
            for l in bound_admin {
                tasks.add(&tokio::spawn(admin::serve(
                    l,
                    metrics.clone(),
                    readiness.clone(),
                    token.clone(),
                )));
            }
        }
        let admin_addr = admin_addrs.first().copied();
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
        // Last: what start-up ran is in the executable's resident pages, most of it never to
        // run again; the request path faults back what it uses.
        crate::memory_release::executable_pages();
        tasks.add(&tokio::spawn(crate::memory_release::when_idle(
            config.limits.idle_trim,
        )));
        Ok(Self {
            metrics,
            readiness,
            identity,
            bound,
            admin_addr,
            admin_addrs,
            shutdown,
            drained,
            drain_timeout: config.limits.drain_timeout,
            tasks,
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
        for task in &self.tasks.0 {
            task.abort();
        }
        clean
    }
}

/// The egress gate of listener `index`, with its own follower of the identity's client
/// configuration (every new connection to a peer presents the current certificate).
fn egress(
    index: usize,
    lc: &crate::config::ListenerConfig,
    e: &crate::config::EgressConfig,
    ctx: &PoolContext<'_>,
    tasks: &mut Tasks,
) -> Result<Arc<crate::proxy::egress::Egress>, ServerError> {
    let Some(id) = ctx.identity else {
        return Err(ServerError::PeerTlsWithoutIdentity {
            upstream: format!("listeners[{index}].egress"),
        });
    };
    let (client, task) = ReloadableClient::follow(
        id.subscribe(),
        format!("{} (egress)", lc.name),
        tls::peer::client_config,
    )
    .map_err(|e| ServerError::Tls(TlsError::Config(e)))?;
    tasks.add(&task);
    let every = ctx
        .config
        .identity
        .as_ref()
        .map_or(Duration::from_secs(2), |i| i.watch_interval);
    Ok(crate::proxy::egress::Egress::start(
        &lc.name,
        index,
        e,
        client,
        every,
        crate::proxy::upstream::EndpointLimits::from_config(&ctx.config.limits),
        ctx.metrics,
    )?)
}

/// The routes of listener `index`: one pool per route, built as a listener's (its own DNS
/// discovery and health checks). Route pools do not gate `/readyz`: a listener stays ready
/// while its default upstream is.
fn route_table(
    index: usize,
    lc: &crate::config::ListenerConfig,
    ctx: &PoolContext<'_>,
    tasks: &mut Tasks,
) -> Result<crate::proxy::route::Routes, ServerError> {
    use crate::proxy::find_newest::Finder;
    use crate::proxy::route::{Route, Routes, Target as RouteTarget};
    let mut routes = Vec::with_capacity(lc.routes.len());
    for (r, rc) in lc.routes.iter().enumerate() {
        // Named after the listener and route, for logs and the upstream metrics.
        let pool = ctx.pool(
            format!("{}/routes[{r}]", lc.name),
            &rc.upstream,
            &format!("listeners[{index}].routes[{r}].upstream"),
            tasks,
        )?;
        let target = match rc.find {
            Some(crate::config::Find::Newest) => RouteTarget::Find(Arc::new(Finder::new(
                pool,
                rc.find_timeout,
                &lc.name,
                ctx.metrics,
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
