//! A bounded client load for fault tests: worker threads sending one method to a plain or TLS
//! listener, over keep-alive connections or a new connection per request, until a request
//! count, a time limit or `stop`. Every request's outcome is kept with the time it was sent and
//! the time it ended, so a test can count failures before and after an event (a signal, a kill).

use crate::support::{self, HttpConn, Stream, Workers};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to reach the listener.
#[derive(Clone)]
pub(crate) enum Dial {
    Plain(SocketAddr),
    /// TLS with this client config; the server name is `localhost`.
    Tls(SocketAddr, Arc<rustls::ClientConfig>),
}

/// What each worker sends.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub method: &'static str,
    /// Path prefix; `/<worker>/<n>` is appended, then `query` if any.
    pub path: String,
    pub query: String,
    pub body: Vec<u8>,
    /// A new connection for every request (else keep-alive, a new one only after a failure).
    pub fresh: bool,
    pub workers: usize,
    pub max_per_worker: usize,
    pub max_time: Duration,
    /// Pause between a worker's requests.
    pub pause: Duration,
}

impl Spec {
    pub(crate) fn get(path: &str) -> Self {
        Self {
            method: "GET",
            path: path.to_owned(),
            query: String::new(),
            body: Vec::new(),
            fresh: false,
            workers: 2,
            max_per_worker: 100_000,
            max_time: Duration::from_secs(60),
            pause: Duration::from_millis(2),
        }
    }

    pub(crate) fn post(path: &str) -> Self {
        Self {
            method: "POST",
            body: br#"{"method":"ping","params":{}}"#.to_vec(),
            ..Self::get(path)
        }
    }
}

/// One request as the client saw it.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    pub sent: Instant,
    pub ended: Instant,
    /// The status (200 expected), or what went wrong.
    pub result: Result<u16, String>,
    /// The leaf certificate serial the server presented on this request's connection (TLS).
    pub server_leaf: Option<Vec<u8>>,
}

impl Outcome {
    pub(crate) fn ok(&self) -> bool {
        self.result == Ok(200)
    }
}

/// The workers of one [`Spec`].
pub(crate) struct Load(Workers<Outcome>);

enum Conn {
    Plain(HttpConn<TcpStream>),
    Tls(Box<HttpConn<support::TlsStream>>, Vec<u8>),
}

fn connect(dial: &Dial) -> Result<Conn, String> {
    match dial {
        Dial::Plain(addr) => HttpConn::tcp(*addr)
            .map(Conn::Plain)
            .map_err(|e| format!("connect: {e}")),
        Dial::Tls(addr, cfg) => {
            let c = HttpConn::tls(*addr, cfg.clone()).map_err(|e| format!("TLS connect: {e}"))?;
            let leaf = c.peer_leaf();
            Ok(Conn::Tls(Box::new(c), leaf))
        }
    }
}

fn send<S: Stream>(
    c: &mut HttpConn<S>,
    spec: &Spec,
    path: &str,
    close: bool,
) -> Result<(u16, bool), String> {
    let headers: &[(&str, &str)] = if close {
        &[("Connection", "close")]
    } else {
        &[]
    };
    match c.request(spec.method, path, headers, &spec.body) {
        Ok(r) => {
            let closing = r
                .header("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"));
            Ok((r.status, closing))
        }
        Err(e) => Err(format!("{e}")),
    }
}

impl Load {
    pub(crate) fn start(dial: &Dial, spec: &Spec) -> Self {
        Self(Workers::start(
            spec.workers,
            spec.max_per_worker,
            spec.max_time,
            spec.pause,
            |w| {
                let (dial, spec) = (dial.clone(), spec.clone());
                let mut conn: Option<Conn> = None;
                move |n| {
                    let path = format!("{}/{w}/{n}{}", spec.path, spec.query);
                    let sent = Instant::now();
                    let mut leaf = None;
                    let result = (|| {
                        if conn.is_none() {
                            conn = Some(connect(&dial)?);
                        }
                        let (status, closing) = match conn.as_mut().expect("connected") {
                            Conn::Plain(c) => send(c, &spec, &path, spec.fresh)?,
                            Conn::Tls(c, l) => {
                                leaf = Some(l.clone());
                                send(c.as_mut(), &spec, &path, spec.fresh)?
                            }
                        };
                        if closing || spec.fresh {
                            conn = None;
                        }
                        Ok(status)
                    })();
                    if result != Ok(200) {
                        conn = None;
                    }
                    Outcome {
                        sent,
                        ended: Instant::now(),
                        result,
                        server_leaf: leaf,
                    }
                }
            },
        ))
    }

    /// Requests completed so far.
    pub(crate) fn completed(&self) -> usize {
        self.0.outcomes().len()
    }

    /// Waits until `n` more requests than now have completed (the load ran on whatever state
    /// the test just set up); panics after `timeout`.
    pub(crate) fn wait_more(&self, n: usize, timeout: Duration) {
        let target = self.completed() + n;
        support::poll_until(timeout, || (self.completed() >= target).then_some(()))
            .unwrap_or_else(|| panic!("fewer than {n} more requests completed in {timeout:?}"));
    }

    /// Waits for the workers to reach their request count or time limit; returns every outcome.
    pub(crate) fn wait(self) -> Vec<Outcome> {
        self.0.wait()
    }

    /// Stops the workers (after their current request) and returns every outcome.
    pub(crate) fn finish(self) -> Vec<Outcome> {
        self.0.finish()
    }
}

/// (requests, failures, a few failure messages).
pub(crate) fn tally(outcomes: &[Outcome]) -> (usize, usize, Vec<String>) {
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| match &o.result {
            Ok(s) => format!("status {s}"),
            Err(e) => e.clone(),
        })
        .collect();
    let sample = failed.iter().take(5).cloned().collect();
    (outcomes.len(), failed.len(), sample)
}
