//! A static file server, as Ironic's httpd serves `[deploy]http_root`: `GET`/`HEAD` of a path
//! answers 200 with the file, its `Last-Modified` and `Content-Length`, or 404; `/health`
//! answers 200. For find tests each instance can also answer slowly, with a fixed status, or with
//! bytes that are not HTTP, and be stopped (every connection closed, a killed process to peers).
//! Every request's headers are recorded. Runs on its own thread and runtime.

use crate::support::ports::KeptListener;
use crate::support::upstream::{header_pairs, serve_on_thread};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::io::AsyncWriteExt;

/// How a server answers (health checks on `/health` always get 200 unless `Garbage`/stopped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Normal,
    /// Every answer but health checks waits this long.
    Slow(Duration),
    /// Every answer but health checks has this status and no file.
    Status(u16),
    /// Bytes that are not an HTTP response, then close.
    Garbage,
}

/// One request as received.
#[derive(Clone, Debug)]
pub(crate) struct FileHit {
    pub headers: Vec<(String, String)>,
}

impl FileHit {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        crate::support::header(&self.headers, name)
    }
}

#[derive(Default)]
struct State {
    files: HashMap<String, (Vec<u8>, SystemTime)>,
    mode: Option<Mode>,
    hits: Vec<FileHit>,
}

pub(crate) struct FileServer {
    pub addr: SocketAddr,
    /// Kept bound while stopped: a restart never binds the port again.
    listener: KeptListener,
    state: Arc<Mutex<State>>,
    running: Option<(
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<()>,
    )>,
}

impl FileServer {
    pub(crate) fn start(listener: KeptListener) -> Self {
        let mut s = Self {
            addr: listener.local_addr().expect("address"),
            listener,
            state: Arc::new(Mutex::new(State::default())),
            running: None,
        };
        s.run();
        s
    }

    fn run(&mut self) {
        let listener = self.listener.handle();
        listener.set_nonblocking(true).expect("nonblocking");
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = serve_on_thread(
            &format!("files-{}", self.addr),
            serve(listener, self.state.clone(), stopped),
        );
        self.running = Some((stop, thread));
    }

    /// Writes a file with its modification time.
    pub(crate) fn put(&self, path: &str, body: &[u8], modified: SystemTime) {
        self.state
            .lock()
            .expect("state")
            .files
            .insert(path.to_owned(), (body.to_vec(), modified));
    }

    pub(crate) fn remove(&self, path: &str) {
        self.state.lock().expect("state").files.remove(path);
    }

    pub(crate) fn set_mode(&self, mode: Mode) {
        self.state.lock().expect("state").mode = Some(mode);
    }

    /// Requests received, health checks excluded.
    pub(crate) fn hits(&self) -> Vec<FileHit> {
        self.state.lock().expect("state").hits.clone()
    }

    pub(crate) fn clear_hits(&self) {
        self.state.lock().expect("state").hits.clear();
    }

    /// Closes the listener and every connection.
    pub(crate) fn stop(&mut self) {
        if let Some((stop, thread)) = self.running.take() {
            // Refused from now on, as a killed process's port would be; the bind stays.
            self.listener.close();
            let _ = stop.send(());
            let _ = thread.join();
        }
    }

    /// Starts again on the same address, the same socket listening again.
    pub(crate) fn restart(&mut self) {
        self.listener.reopen();
        self.run();
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(
    listener: TcpListener,
    state: Arc<Mutex<State>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (mut io, _) = tokio::select! {
            r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
            _ = &mut stopped => break,
        };
        let state = state.clone();
        if state.lock().expect("state").mode == Some(Mode::Garbage) {
            conns.spawn(async move {
                let _ = io.write_all(b"\x00\x01garbage, not HTTP\r\n\r\n").await;
                let _ = io.shutdown().await;
            });
            continue;
        }
        conns.spawn(async move {
            let svc = hyper::service::service_fn(move |req| answer(req, state.clone()));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(io), svc)
                .await;
        });
    }
    conns.abort_all();
}

async fn answer(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    // A connection opened before the switch to `Garbage` must not go on answering in HTTP (a
    // stress run saw a pooled one give the proxy a 404): the service's error makes hyper close
    // it without an answer, so every request after the switch fails, as on a new connection.
    if state.lock().expect("state").mode == Some(Mode::Garbage) {
        return Err(std::io::Error::other(
            "garbage mode: no HTTP on this connection",
        ));
    }
    let path = req.uri().path().to_owned();
    if path == "/health" {
        return Ok(Response::new(Full::new(Bytes::from_static(b"ok"))));
    }
    let (file, mode) = {
        let mut s = state.lock().expect("state");
        s.hits.push(FileHit {
            headers: header_pairs(req.headers()),
        });
        (s.files.get(&path).cloned(), s.mode.clone())
    };
    let mut resp = Response::new(Full::new(Bytes::new()));
    match mode {
        // Exercised: the slow file server a test asked for.
        Some(Mode::Slow(d)) => tokio::time::sleep(d).await,
        Some(Mode::Status(code)) => {
            *resp.status_mut() = hyper::StatusCode::from_u16(code).expect("status");
            return Ok(resp);
        }
        _ => {}
    }
    match file {
        Some((body, modified)) => {
            let h = resp.headers_mut();
            h.insert(
                hyper::header::LAST_MODIFIED,
                httpdate::fmt_http_date(modified).parse().expect("date"),
            );
            h.insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain"),
            );
            h.insert(hyper::header::CONTENT_LENGTH, body.len().into());
            *resp.body_mut() = Full::new(Bytes::from(body));
        }
        None => *resp.status_mut() = hyper::StatusCode::NOT_FOUND,
    }
    Ok(resp)
}
