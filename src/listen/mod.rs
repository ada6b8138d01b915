//! Accept loops: binding, the per-listener connection limit, TLS handshakes within the head
//! deadline, serving HTTP/1.1 or HTTP/2 (by ALPN), and graceful drain.
//!
//! Shutdown, the one mechanism: the server flips the `shutdown` watch; every accept loop stops
//! waiting for connections, takes those the kernel has already completed (its accept queue,
//! without waiting for more) and drops its socket (new connections are refused, logged
//! `stopped accepting` with the count taken); every connection task calls hyper's
//! `graceful_shutdown` (HTTP/1.1 closes after the in-flight response, HTTP/2 sends GOAWAY), or,
//! on a connection that has not begun its first request (taken from the queue, or accepted just
//! before the flip), does so once that request has begun: it is answered (`Connection: close`
//! on HTTP/1.1, GOAWAY after its first stream on HTTP/2) if it arrives within
//! `request_head_timeout` from accept, never closed unanswered. Idle connections that have
//! served a request close at once. [`Listener::drained`] resolves once the queue is taken and
//! every connection permit is back. The server bounds that wait by `limits.drain_timeout`.

mod bind;
mod conn;
mod driver;
mod guard;
mod io;
mod serve;
mod service;
mod sniff;

pub(crate) use bind::{bind, bind_tcp};
pub use serve::serve_stream;

use crate::config::{Limits, ListenAddr, ListenerConfig, TlsMode};
use crate::metrics::{HandshakeLabels, ListenerLabels, Metrics};
use crate::proxy::{ConnInfo, Proxy};
use crate::tls::trust::{ListenerTrust, LiveChain};
use crate::tls::{Identities, ListenerTls, ReloadableServer};
use conn::ConnClock;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("listener {name:?}: cannot bind {addr}")]
    Bind {
        name: String,
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// A bound socket.
pub(crate) enum Bound {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Bound {
    /// The address actually bound (port 0 resolved), as `ListenAddr`.
    pub(crate) fn local_addr(&self) -> ListenAddr {
        match self {
            Self::Tcp(l) => l.local_addr().map_or(
                ListenAddr::Tcp(SocketAddr::from(([0, 0, 0, 0], 0))),
                ListenAddr::Tcp,
            ),
            Self::Unix(_, p) => ListenAddr::Unix(p.clone()),
        }
    }
}

/// One listener: its socket, TLS, service and limits.
pub(crate) struct Listener {
    pub name: String,
    cfg: ListenerConfig,
    /// Taken by [`Listener::run`], which alone owns the socket: connection tasks share the
    /// rest, and must not keep the socket open (and the kernel accepting) while draining.
    bound: Option<Bound>,
    tls: Option<Arc<ReloadableServer>>,
    proxy: Arc<Proxy>,
    limits: Limits,
    metrics: Metrics,
    /// This listener's series, resolved once: accepting takes no lock and allocates no label.
    active: Gauge,
    parked: Gauge,
    rejected: Counter,
    permits: Arc<Semaphore>,
    /// Turns true once [`Listener::run`] has taken the accept queue and dropped the socket:
    /// until then a connection may still be taken and served, so draining waits for it.
    stopped: watch::Sender<bool>,
    /// Mutual TLS: the client identities parsed so far, shared by connections.
    identities: Identities,
    /// Mutual TLS: what connections re-check their client chain against after a trust change.
    trust: Option<Arc<ListenerTrust>>,
}

impl Listener {
    pub(crate) fn new(
        cfg: ListenerConfig,
        bound: Bound,
        tls: Option<Arc<ReloadableServer>>,
        proxy: Arc<Proxy>,
        limits: Limits,
        metrics: Metrics,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(limits.max_connections));
        let labels = ListenerLabels {
            listener: cfg.name.clone(),
        };
        let active = metrics.active_connections.get_or_create(&labels).clone();
        let rejected = metrics.rejected_connections.get_or_create(&labels).clone();
        let parked = metrics.parked_connections.get_or_create(&labels).clone();
        let trust = tls
            .as_ref()
            .filter(|_| cfg.tls == TlsMode::Mutual)
            .map(|t| {
                let closed = metrics.untrusted_connections_closed.get_or_create(&labels);
                ListenerTrust::new(cfg.name.clone(), t.clone(), closed.clone())
            });
        Self {
            name: cfg.name.clone(),
            cfg,
            bound: Some(bound),
            tls,
            proxy,
            limits,
            metrics,
            active,
            parked,
            rejected,
            permits,
            stopped: watch::Sender::new(false),
            identities: Identities::default(),
            trust,
        }
    }

    /// Resolves when this listener has stopped accepting (its queue taken) and every one of its
    /// connections has closed.
    pub(crate) fn drained(&self) -> impl Future<Output = ()> + Send + 'static {
        let permits = self.permits.clone();
        let n = u32::try_from(self.limits.max_connections).unwrap_or(u32::MAX);
        let mut stopped = self.stopped.subscribe();
        async move {
            // An error: the listener is gone, and with it anything it could still accept.
            let _ = stopped.wait_for(|s| *s).await;
            let _ = permits.acquire_many(n).await;
        }
    }

    /// Accepts until `shutdown` turns true, then takes the connections the kernel has already
    /// completed and drops the socket: from then on new connections are refused while the
    /// open ones drain.
    pub(crate) async fn run(mut self, shutdown: watch::Receiver<bool>) {
        let Some(bound) = self.bound.take() else {
            self.stopped.send_replace(true);
            return;
        };
        let this = Arc::new(self);
        let mut stop = shutdown.clone();
        loop {
            let accepted = tokio::select! {
                // The drain first: from then on the queue is taken by `accept_queued`.
                biased;
                _ = stop.wait_for(|s| *s) => break,
                r = accept(&bound) => r,
            };
            match accepted {
                Ok((io, peer)) => {
                    this.spawn(io, peer, &shutdown);
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning; the loop never dies.
                    tracing::warn!(listener = %this.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        let path = match &bound {
            Bound::Unix(_, path) => Some(path.clone()),
            Bound::Tcp(_) => None,
        };
        let queued = accept_queued(bound, this.limits.max_connections, |io, peer| {
            this.spawn(io, peer, &shutdown)
        });
        if let Some(path) = path {
            let _ = std::fs::remove_file(path);
        }
        tracing::info!(listener = %this.name, queued, "stopped accepting");
        this.stopped.send_replace(true);
    }

    /// Serves an accepted connection in its own task, or closes it at once when the listener
    /// is at `max_connections`. Returns whether it is served.
    fn spawn(
        self: &Arc<Self>,
        io: Stream,
        peer: Option<SocketAddr>,
        shutdown: &watch::Receiver<bool>,
    ) -> bool {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.rejected.inc();
            drop(io);
            return false;
        };
        let this = self.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            this.active.inc();
            match io {
                // Egress: every read ACKed at once (see `proxy::egress::quickack`).
                Stream::Tcp(s) if this.cfg.egress.is_some() => {
                    let s = crate::proxy::egress::quickack::QuickAck::new(s);
                    this.connection(s, peer, shutdown).await;
                }
                Stream::Tcp(s) => this.connection(s, peer, shutdown).await,
                Stream::Unix(s) => this.connection(s, peer, shutdown).await,
            }
            this.active.dec();
            drop(permit);
        });
        true
    }

    async fn connection<S>(&self, io: S, peer: Option<SocketAddr>, shutdown: watch::Receiver<bool>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let accepted = Instant::now();
        if self.cfg.tls != TlsMode::Optional {
            return self.connection_as(io, peer, shutdown, accepted, true).await;
        }
        // One port for both (see `sniff`): the first byte, within the head deadline.
        let deadline = accepted + self.limits.request_head_timeout;
        let first = tokio::time::timeout_at(deadline, sniff::first_byte(io)).await;
        let Ok(Ok(Some(io))) = first else {
            // Closed, broken, or silent until the deadline: nothing to answer.
            return;
        };
        let tls = io.first() == Some(sniff::TLS_HANDSHAKE);
        Box::pin(self.connection_as(io, peer, shutdown, accepted, tls)).await;
    }

    /// Serves a connection accepted at `accepted`, over TLS when the listener has it and `tls`.
    async fn connection_as<S>(
        &self,
        io: S,
        peer: Option<SocketAddr>,
        shutdown: watch::Receiver<bool>,
        accepted: Instant,
        tls: bool,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let clock = ConnClock::new(
            accepted,
            self.limits.request_head_timeout,
            self.limits.idle_timeout,
        );
        let head_deadline = accepted + self.limits.request_head_timeout;
        let Some(tls) = self.tls.as_ref().filter(|_| tls) else {
            let info = ConnInfo::new(peer, false);
            return Self::serve(self.context(), io, false, info, None, clock, shutdown).await;
        };
        // The generation goes with the connection: a later one means the trust may have
        // changed since its client chain was verified (`tls::trust`).
        let (generation, current) = tls.load_with_generation();
        // Boxed, like the connection below: the handshake's state lives only as long as the
        // handshake, instead of setting the size of every connection's task.
        let handshake = Box::pin(tokio::time::timeout_at(
            head_deadline,
            crate::tls::stream::accept(current.config.clone(), io),
        ));
        let serving = match handshake.await {
            Ok(Ok(stream)) => {
                let verified = Verified {
                    generation,
                    by: &current,
                };
                self.secured(stream, peer, clock, shutdown, &verified)
            }
            Ok(Err(e)) => return self.handshake_failed(peer, classify(&e), &e.to_string()),
            Err(_) => {
                return self.handshake_failed(
                    peer,
                    "timeout",
                    "handshake not finished within request_head_timeout",
                )
            }
        };
        if let Some(serving) = serving {
            serving.await;
        }
    }

    /// The connection's future once its TLS handshake is done, `None` when the client's
    /// certificate cannot be read. Not async, so the stream is not kept twice in the task.
    fn secured<S>(
        &self,
        stream: crate::tls::stream::ServerStream<S>,
        peer: Option<SocketAddr>,
        clock: Arc<ConnClock>,
        shutdown: watch::Receiver<bool>,
        verified: &Verified<'_>,
    ) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let session = stream.session();
        let h2 = session.alpn_protocol() == Some(b"h2");
        let mut info = ConnInfo::new(peer, true);
        let mut live = None;
        if self.cfg.tls == TlsMode::Mutual {
            let client = session
                .peer_certificates()
                .and_then(|chain| self.identities.get(chain));
            let Some(client) = client else {
                self.handshake_failed(peer, "bad_certificate", "client certificate unreadable");
                return None;
            };
            if let (Some(trust), Some(by)) = (&self.trust, &verified.by.clients) {
                live = Some(Arc::new(LiveChain::new(
                    trust.clone(),
                    client.chain,
                    verified.generation,
                    by,
                )));
            }
            let (id, xfcc) = (client.identity, client.xfcc);
            info.allowed = id.is_allowed(&self.cfg.allow);
            if !info.allowed {
                tracing::warn!(listener = %self.name, client = %peer.map_or_else(|| "unix".to_owned(), |p| p.to_string()), identity = %id.display_name(), "client certificate outside allow; answering 403");
            }
            // Shared with the listener's other connections from the same certificate; every
            // request's copy is a reference count.
            info.xfcc = xfcc;
            info.identity = Some(id);
        }
        Some(Self::serve(
            self.context(),
            stream,
            h2,
            info,
            live,
            clock,
            shutdown,
        ))
    }

    fn handshake_failed(&self, peer: Option<SocketAddr>, reason: &'static str, detail: &str) {
        tracing::info!(listener = %self.name, client = %peer.map_or_else(|| "unix".to_owned(), |p| p.to_string()), reason, detail, "TLS handshake failed");
        self.metrics
            .tls_handshake_failures
            .get_or_create(&HandshakeLabels {
                listener: self.name.clone(),
                reason,
            })
            .inc();
    }
}

/// The configuration a connection's handshake ran under.
struct Verified<'a> {
    generation: u64,
    by: &'a ListenerTls,
}

async fn accept(bound: &Bound) -> std::io::Result<(Stream, Option<SocketAddr>)> {
    match bound {
        Bound::Tcp(l) => {
            let (s, peer) = l.accept().await?;
            let _ = s.set_nodelay(true);
            Ok((Stream::Tcp(s), Some(peer)))
        }
        Bound::Unix(l, _) => {
            let (s, _) = l.accept().await?;
            Ok((Stream::Unix(s), None))
        }
    }
}

/// Takes, without waiting, the connections the kernel completed on `bound` before the drain
/// (its accept queue), hands each to `serve` and closes the socket; at most `limit` of them,
/// and none after `serve` turns one away (the listener is full: the rest would be too).
/// Returns how many were served. A client the kernel completed has sent its request, or is
/// about to, into a socket it believes served: closing it unanswered would look to it like a
/// lost request.
///
/// The socket is taken back from the runtime and accepted from directly (it stays
/// non-blocking): an `accept` future would wait for the runtime to have seen the socket
/// readable, and a connection completed since the runtime last looked would be closed
/// unanswered with the socket.
fn accept_queued(
    bound: Bound,
    limit: usize,
    mut serve: impl FnMut(Stream, Option<SocketAddr>) -> bool,
) -> usize {
    let mut next: Box<dyn FnMut() -> std::io::Result<(Stream, Option<SocketAddr>)>> = match bound {
        Bound::Tcp(l) => {
            let l = match l.into_std() {
                Ok(l) => l,
                Err(e) => return drain_failed(&e),
            };
            Box::new(move || {
                let (s, peer) = l.accept()?;
                s.set_nonblocking(true)?;
                let s = tokio::net::TcpStream::from_std(s)?;
                let _ = s.set_nodelay(true);
                Ok((Stream::Tcp(s), Some(peer)))
            })
        }
        Bound::Unix(l, _) => {
            let l = match l.into_std() {
                Ok(l) => l,
                Err(e) => return drain_failed(&e),
            };
            Box::new(move || {
                let (s, _) = l.accept()?;
                s.set_nonblocking(true)?;
                Ok((Stream::Unix(tokio::net::UnixStream::from_std(s)?), None))
            })
        }
    };
    let mut served = 0;
    let mut tries = 0;
    while tries < limit {
        tries += 1;
        match next() {
            Ok((io, peer)) => {
                if !serve(io, peer) {
                    break;
                }
                served += 1;
            }
            // Accept queue empty: every connection completed before now is taken.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // One queued connection aborted by its client, or a signal: the next one.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                drain_failed(&e);
                break;
            }
        }
    }
    served
}

fn drain_failed(e: &std::io::Error) -> usize {
    tracing::warn!(error = %e, "accept failed while draining; closing the accept queue");
    0
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

fn classify(e: &std::io::Error) -> &'static str {
    use rustls::Error as R;
    match e.get_ref().and_then(|i| i.downcast_ref::<R>()) {
        Some(R::NoCertificatesPresented) => "no_client_cert",
        Some(R::InvalidCertificate(_)) => "bad_certificate",
        Some(R::PeerIncompatible(_)) => "incompatible",
        Some(
            R::InvalidMessage(_)
            | R::InappropriateMessage { .. }
            | R::InappropriateHandshakeMessage { .. },
        ) => "protocol",
        Some(R::AlertReceived(_)) => "alert_received",
        Some(_) => "other",
        None if e.kind() == std::io::ErrorKind::UnexpectedEof => "eof",
        None => "io",
    }
}

#[cfg(test)]
mod tests;
