//! A real HTTP/1.1 upstream on a unix socket (hyper 1) that records every request it receives
//! (connection id, method, path, headers, body) and answers configurable responses.
//!
//! It runs on its own thread and runtime, so tests can block freely. Requests are recorded as
//! soon as their body has been read, before any configured delay, so a test can see that a
//! request is in flight at the upstream. A request whose body broke off is recorded with
//! `complete = false`; a request hyper could not even parse is counted in `malformed`.
//!
//! The default responder reads its instructions from the query string: `status=N`,
//! `delay_ms=N`, `size=N` (a body of N `x` bytes instead of the JSON echo) and `hop=1` (add
//! hop-by-hop headers to the response, which the proxy must strip).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UnixListener;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    /// Which upstream connection (1, 2, ...) carried it.
    pub conn: u64,
    pub method: String,
    /// Path and query.
    pub path: String,
    pub version: String,
    /// Names lower-cased (as hyper stores them), in arrival order, duplicates kept.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub complete: bool,
}

impl Recorded {
    /// The first value of a header (case-insensitive name).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        super::header(&self.headers, name)
    }

    /// Every value of a header.
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        super::header_values(&self.headers, name)
    }

    /// The query parameter `key`, if present.
    pub(crate) fn query(&self, key: &str) -> Option<&str> {
        let q = self.path.split_once('?')?.1;
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }
}

/// A hyper header map as (name, value) pairs in its order; values not UTF-8 are made so lossily.
pub(crate) fn header_pairs(map: &hyper::HeaderMap) -> Vec<(String, String)> {
    let mut pairs = Vec::with_capacity(map.len());
    for (n, v) in map {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        pairs.push((n.as_str().to_owned(), v));
    }
    pairs
}

/// What to answer.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub delay: Duration,
}

pub(crate) type Responder = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

/// The default responder (see the module docs).
pub(crate) fn default_reply(r: &Recorded) -> Reply {
    let status = r
        .query("status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let delay = Duration::from_millis(
        r.query("delay_ms")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
    );
    let body = match r.query("size").and_then(|s| s.parse::<usize>().ok()) {
        Some(n) => vec![b'x'; n],
        None => format!(
            "{{\"upstream\":\"ok\",\"method\":\"{}\",\"path\":\"{}\",\"received\":{}}}",
            r.method,
            r.path.split('?').next().unwrap_or(""),
            r.body.len()
        )
        .into_bytes(),
    };
    let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
    if r.query("hop") == Some("1") {
        for (n, v) in [
            ("connection", "x-upstream-hop"),
            ("x-upstream-hop", "secret"),
            ("keep-alive", "timeout=5"),
            ("proxy-authenticate", "Basic"),
            ("x-upstream-end", "kept"),
        ] {
            headers.push((n.to_owned(), v.to_owned()));
        }
    }
    Reply {
        status,
        headers,
        body,
        delay,
    }
}

#[derive(Default)]
struct State {
    records: Mutex<Vec<Recorded>>,
    connections: AtomicU64,
    malformed: AtomicU64,
}

/// A running recording upstream; stops (and removes its socket) when dropped.
pub(crate) struct Upstream {
    pub path: PathBuf,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    /// Starts on `path` with the default responder.
    pub(crate) fn start(path: &Path) -> Self {
        Self::start_with(path, Arc::new(default_reply))
    }

    pub(crate) fn start_with(path: &Path, responder: Responder) -> Self {
        let _ = std::fs::remove_file(path);
        let std_listener = std::os::unix::net::UnixListener::bind(path)
            .unwrap_or_else(|e| panic!("bind upstream {}: {e}", path.display()));
        std_listener.set_nonblocking(true).expect("nonblocking");
        let state = Arc::new(State::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = serve_on_thread(
            "upstream",
            serve(std_listener, state.clone(), responder, stopped),
        );
        Self {
            path: path.to_owned(),
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `unix:/path`, as the proxy config wants it.
    pub(crate) fn address(&self) -> String {
        format!("unix:{}", self.path.display())
    }

    /// Every request received so far, complete or not.
    pub(crate) fn all(&self) -> Vec<Recorded> {
        self.state.records.lock().expect("records").clone()
    }

    /// Requests received in full.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.all().into_iter().filter(|r| r.complete).collect()
    }

    /// Connections accepted so far.
    pub(crate) fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Connections on which hyper failed to parse a request.
    pub(crate) fn malformed(&self) -> u64 {
        self.state.malformed.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` requests (complete or not) arrived; returns them all.
    pub(crate) fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Recorded> {
        super::poll_until(timeout, || {
            let all = self.all();
            (all.len() >= n).then_some(all)
        })
        .unwrap_or_else(|| {
            panic!(
                "upstream got {} request(s), expected {n}: {:#?}",
                self.all().len(),
                self.all()
            )
        })
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn serve(
    std_listener: std::os::unix::net::UnixListener,
    state: Arc<State>,
    responder: Responder,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = UnixListener::from_std(std_listener).expect("tokio listener");
    while let Some(stream) = accept_until(|| listener.accept(), &mut stopped).await {
        let conn_id = state.connections.fetch_add(1, Ordering::SeqCst) + 1;
        let state = state.clone();
        let responder = responder.clone();
        tokio::spawn(async move {
            let st = state.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let state = st.clone();
                let responder = responder.clone();
                async move { Ok::<_, Infallible>(handle(req, conn_id, &state, &responder).await) }
            });
            if let Err(e) = http1::Builder::new()
                .keep_alive(true)
                // Ironic's server (cheroot) bounds a head's bytes, not its fields: a request
                // of the proxy's 100 fields arrives with the forwarding headers added.
                .max_headers(1024)
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                if e.is_parse() || e.is_parse_status() {
                    state.malformed.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
}

/// Runs `server` to completion on a new thread named `name`, on a runtime of its own; when it
/// returns, dropping the runtime cancels every task it spawned (their sockets close).
pub(crate) fn serve_on_thread(
    name: &str,
    server: impl Future<Output = ()> + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let runtime = format!("{name} runtime");
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect(&runtime)
                .block_on(server);
        })
        .unwrap_or_else(|e| panic!("spawn {name} thread: {e}"))
}

/// The next connection `accept` gives (failed accepts are skipped), or `None` once `stopped`
/// fires.
pub(crate) async fn accept_until<S, A, F>(
    mut accept: impl FnMut() -> F,
    stopped: &mut tokio::sync::oneshot::Receiver<()>,
) -> Option<S>
where
    F: Future<Output = std::io::Result<(S, A)>>,
{
    loop {
        tokio::select! {
            r = accept() => {
                if let Ok((s, _)) = r {
                    return Some(s);
                }
            }
            _ = &mut *stopped => return None,
        }
    }
}

async fn handle(
    req: Request<Incoming>,
    conn: u64,
    state: &State,
    responder: &Responder,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let (body, complete) = match body.collect().await {
        Ok(b) => (b.to_bytes().to_vec(), true),
        Err(_) => (Vec::new(), false),
    };
    let rec = Recorded {
        conn,
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.to_string(), |pq| pq.as_str().to_owned()),
        version: format!("{:?}", parts.version),
        headers: header_pairs(&parts.headers),
        body,
        complete,
    };
    let reply = responder(&rec);
    state.records.lock().expect("records").push(rec);
    if !reply.delay.is_zero() {
        // Exercised: the slow upstream a test asked for.
        tokio::time::sleep(reply.delay).await;
    }
    let mut resp = Response::new(Full::new(Bytes::from(reply.body)));
    *resp.status_mut() = hyper::StatusCode::from_u16(reply.status).expect("status");
    for (n, v) in reply.headers {
        resp.headers_mut().append(
            hyper::header::HeaderName::from_bytes(n.as_bytes()).expect("header name"),
            hyper::header::HeaderValue::from_str(&v).expect("header value"),
        );
    }
    resp
}
