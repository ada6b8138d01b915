//! TCP backends for load-balancing tests: real HTTP/1.1 servers (hyper) on chosen loopback
//! addresses (`127.0.x.y`, several on one port so that one DNS name with several A records
//! reaches all of them), optionally serving TLS with a given certificate.
//!
//! Each backend answers every request with its own id (body and `x-backend` header) after a
//! configurable delay, and answers its health path ([`HEALTH_PATH`]) with 200 or 503 as the test
//! decides. It records what it received (requests and health checks apart, with the time they
//! arrived, and the client certificate on TLS) and can be stopped, which closes its listener and
//! every open connection at once, and restarted on the same address.
//!
//! It runs on its own thread and runtime, so tests can block freely.

use crate::support::ports::{self, KeptListener};
use crate::support::upstream::{accept_until, header_pairs, serve_on_thread};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The path health checks must use (`health = { path = "/health" }`).
pub(crate) const HEALTH_PATH: &str = "/health";

/// One request as the backend received it.
#[derive(Clone, Debug)]
pub(crate) struct Hit {
    pub at: Instant,
    /// The leaf certificate (DER) the client presented, on TLS backends that asked for one.
    pub client_cert: Option<Vec<u8>>,
    /// The request's fields as parsed (names lower-cased), in order.
    pub headers: Vec<(String, String)>,
}

/// TLS for a backend: its certificate and key (PEM), and optionally a CA whose client
/// certificates it asks for (and records; a client without one is still served).
#[derive(Clone, Debug)]
pub(crate) struct BackendTls {
    pub cert_pem: String,
    pub key_pem: String,
    pub client_ca_pem: Option<String>,
}

struct Shared {
    id: String,
    delay_ms: AtomicU64,
    healthy: AtomicBool,
    hits: Mutex<Vec<Hit>>,
    /// Health checks received: when, and whether they were answered 200.
    checks: Mutex<Vec<(Instant, bool)>>,
    handshake_failures: AtomicU64,
    /// Connections served to their end (closed by either side).
    closed: AtomicU64,
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// A running (or stopped) backend.
pub(crate) struct Backend {
    pub addr: SocketAddr,
    /// Kept bound while stopped: a restart never binds the port again.
    listener: KeptListener,
    shared: Arc<Shared>,
    tls: Option<Arc<rustls::ServerConfig>>,
    running: Option<Running>,
}

/// Binds one listener per address, all on the same port, reserved for this test process
/// outside the ephemeral range ([`ports`]); each keeps its socket across stop and restart.
pub(crate) fn bind_same_port(ips: &[IpAddr]) -> Vec<KeptListener> {
    for _ in 0..100 {
        let port = ports::reserve();
        let all: Vec<KeptListener> = ips
            .iter()
            .map_while(|ip| KeptListener::bind(SocketAddr::new(*ip, port)).ok())
            .collect();
        if all.len() == ips.len() {
            return all;
        }
    }
    panic!("no port free on all of {ips:?}");
}

/// `127.0.<net>.<host>`.
pub(crate) fn ip(net: u8, host: u8) -> IpAddr {
    IpAddr::from([127, 0, net, host])
}

impl Backend {
    /// Starts a plain HTTP backend on `listener`, healthy, answering at once.
    pub(crate) fn start(id: &str, listener: KeptListener) -> Self {
        Self::start_with(id, listener, None)
    }

    /// Starts a backend serving TLS.
    pub(crate) fn start_tls(id: &str, listener: KeptListener, tls: &BackendTls) -> Self {
        Self::start_with(id, listener, Some(server_config(tls)))
    }

    fn start_with(
        id: &str,
        listener: KeptListener,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Self {
        let shared = Arc::new(Shared {
            id: id.to_owned(),
            delay_ms: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            hits: Mutex::new(Vec::new()),
            checks: Mutex::new(Vec::new()),
            handshake_failures: AtomicU64::new(0),
            closed: AtomicU64::new(0),
        });
        let mut b = Self {
            addr: listener.local_addr().expect("local address"),
            listener,
            shared,
            tls,
            running: None,
        };
        b.run();
        b
    }

    fn run(&mut self) {
        let listener = self.listener.handle();
        listener.set_nonblocking(true).expect("nonblocking");
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = serve_on_thread(
            &format!("backend-{}", self.shared.id),
            serve(listener, self.shared.clone(), self.tls.clone(), stopped),
        );
        self.running = Some(Running { stop, thread });
    }

    pub(crate) fn id(&self) -> &str {
        &self.shared.id
    }

    /// Closes the listener and every connection (a killed process, as far as peers can tell).
    pub(crate) fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            // Refused from now on, as a killed process's port would be; the bind stays.
            self.listener.close();
            let _ = r.stop.send(());
            let _ = r.thread.join();
        }
    }

    /// Starts again on the same address, the same socket listening again (the records are
    /// kept).
    pub(crate) fn restart(&mut self) {
        assert!(self.running.is_none(), "backend {} is running", self.id());
        self.listener.reopen();
        self.run();
    }

    pub(crate) fn set_healthy(&self, ok: bool) {
        self.shared.healthy.store(ok, Ordering::SeqCst);
    }

    pub(crate) fn set_delay(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.shared.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Requests received (health checks excluded).
    pub(crate) fn hits(&self) -> Vec<Hit> {
        self.shared.hits.lock().expect("hits").clone()
    }

    pub(crate) fn hit_count(&self) -> usize {
        self.shared.hits.lock().expect("hits").len()
    }

    /// Health checks received: arrival time and whether the answer was 200.
    pub(crate) fn checks(&self) -> Vec<(Instant, bool)> {
        self.shared.checks.lock().expect("checks").clone()
    }

    /// TLS handshakes that failed (the client refused our certificate, say).
    pub(crate) fn handshake_failures(&self) -> u64 {
        self.shared.handshake_failures.load(Ordering::SeqCst)
    }

    /// Connections served to their end: closed by the client, or broken.
    pub(crate) fn connections_closed(&self) -> u64 {
        self.shared.closed.load(Ordering::SeqCst)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

fn server_config(tls: &BackendTls) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions");
    let builder = match &tls.client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(c.expect("client CA PEM")).expect("add client CA");
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .allow_unauthenticated()
                    .build()
                    .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(tls.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("backend certificate PEM");
    let key = PrivateKeyDer::from_pem_slice(tls.key_pem.as_bytes()).expect("backend key PEM");
    let mut cfg = builder
        .with_single_cert(certs, key)
        .expect("backend certificate and key");
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

async fn serve(
    std_listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(std_listener).expect("tokio listener");
    while let Some(stream) = accept_until(|| listener.accept(), &mut stopped).await {
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_conn(TokioIo::new(stream), shared, None).await,
                Some(cfg) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
                    let accepted =
                        tokio::time::timeout(Duration::from_secs(5), acceptor.accept(stream)).await;
                    match accepted {
                        Ok(Ok(s)) => {
                            let cert = s
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(|c| c.to_vec());
                            serve_conn(TokioIo::new(s), shared, cert).await;
                        }
                        _ => {
                            shared.handshake_failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }
        });
    }
}

async fn serve_conn<I>(io: I, shared: Arc<Shared>, client_cert: Option<Vec<u8>>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let closed = shared.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let shared = shared.clone();
        let cert = client_cert.clone();
        async move { Ok::<_, Infallible>(handle(req, &shared, cert).await) }
    });
    let _ = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, svc)
        .await;
    closed.closed.fetch_add(1, Ordering::SeqCst);
}

async fn handle(
    req: Request<Incoming>,
    shared: &Shared,
    client_cert: Option<Vec<u8>>,
) -> Response<Full<Bytes>> {
    let at = Instant::now();
    let (parts, body) = req.into_parts();
    let _ = body.collect().await;
    let reply = |status: u16, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
        r.headers_mut().insert(
            "x-backend",
            hyper::header::HeaderValue::from_str(&shared.id).expect("backend id"),
        );
        r
    };
    if parts.uri.path() == HEALTH_PATH {
        let ok = shared.healthy.load(Ordering::SeqCst);
        shared.checks.lock().expect("checks").push((at, ok));
        return reply(if ok { 200 } else { 503 }, shared.id.clone());
    }
    shared.hits.lock().expect("hits").push(Hit {
        at,
        client_cert,
        headers: header_pairs(&parts.headers),
    });
    let delay = shared.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        // Exercised: the slow backend a test asked for.
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    reply(200, shared.id.clone())
}
