//! Builds and runs everything a configuration describes, and drains it on demand.
//!
//! Start-up order: metrics, identity (every file checked), upstreams, TLS configurations, bind
//! every listener (any failure is a start-up error), admin, then accept. `/readyz` turns 200 once
//! all listeners are bound. Shutdown order is documented in [`crate::listen`].

use crate::admin::{self, IdentityCheck, Readiness};
use crate::config::{Config, ListenAddr, TlsMode, UpstreamAddr};
use crate::identity::{self, Identity, IdentityError};
use crate::listen::{self, ListenError, Listener};
use crate::metrics::Metrics;
use crate::proxy::upstream::Endpoint;
use crate::proxy::{Proxy, Upstream};
use crate::tls::{self, ReloadableServer, TlsError};
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
    #[error("admin.listen: cannot bind {addr}: {source}")]
    Admin {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("listeners[{index}].upstream: {reason}")]
    Upstream { index: usize, reason: String },
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
            let local = match &lc.upstream.local {
                Some(addr) => Some(Arc::new(Endpoint::new(
                    addr.clone(),
                    None,
                    config.limits.header_bytes,
                ))),
                None => None,
            };
            if local.is_none() {
                return Err(ServerError::Upstream {
                    index,
                    reason: "DNS peers are not supported by this build yet; set local".into(),
                });
            }
            if let Some(UpstreamAddr::Unix(_)) = &lc.upstream.local {
                // A missing socket is fine at start: Ironic may come up after us (502 meanwhile).
            }
            let upstream = Upstream {
                name: lc.name.clone(),
                local,
            };
            let proxy = Arc::new(Proxy::new(
                &lc.name,
                upstream,
                config.limits.clone(),
                metrics.clone(),
            ));
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
