//! Shared integration-test support: a per-test sandbox (temp dir, CA, server certificate), the
//! real proxy binary as a child process ([`proxy`]), a recording upstream on a unix socket
//! ([`upstream`]), certificates ([`pki`]), and small real clients: a byte-exact HTTP/1.1 client
//! over plain TCP or rustls, and wrappers around `curl`, `openssl` and Python.
//!
//! Everything here is synchronous on purpose: tests drive real processes and sockets with
//! blocking calls and explicit deadlines, so nothing depends on a test runtime's scheduling.

pub(crate) mod adversary;
pub(crate) mod backend;
pub(crate) mod dnsmasq;
pub(crate) mod files;
pub(crate) mod load;
pub(crate) mod node;
pub(crate) mod pki;
pub(crate) mod ports;
pub(crate) mod proxy;
pub(crate) mod role;
pub(crate) mod upstream;
pub(crate) mod wire;

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) use pki::{Ca, Leaf, LeafSpec};
pub(crate) use proxy::{Proxy, ProxyBuilder, Tls};
pub(crate) use upstream::Upstream;

/// How long any single client operation may block before the test fails instead of hanging.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The most a test allows a real process past the time it should act (a timeout, a drain, an
/// answer "at once"): it only catches a hang. A busy machine can delay any process by seconds,
/// so exact timing is asserted on tokio's paused clock instead (`src/listen/conn.rs`,
/// `src/listen/drive/tests.rs`, `tests/it/inmem.rs`).
pub(crate) const HANG: Duration = Duration::from_secs(10);

/// A temp dir with a CA and a server certificate for `localhost` / `127.0.0.1` in it.
pub(crate) struct Sandbox {
    pub dir: tempfile::TempDir,
    pub ca: Ca,
    pub server: Leaf,
}

impl Sandbox {
    pub(crate) fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ironic-proxy-test")
            .tempdir()
            .expect("create temp dir");
        let ca = Ca::new("ironic-proxy test CA");
        let server = ca.server_leaf();
        std::fs::write(dir.path().join("ca.crt"), &ca.pem).expect("write ca.crt");
        server.write(dir.path(), "tls");
        Self { dir, ca, server }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A unix socket path for an upstream, inside the sandbox.
    pub(crate) fn socket(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}.sock"))
    }

    /// A proxy builder with `[identity]` pointing at the sandbox's CA and server certificate.
    pub(crate) fn proxy(&self) -> ProxyBuilder {
        ProxyBuilder::new(self.dir.path()).identity(
            &self.path("ca.crt"),
            &self.path("tls.crt"),
            &self.path("tls.key"),
        )
    }

    /// [`Sandbox::proxy`] with `listeners` (name, TLS mode), all in front of the one upstream `up`.
    pub(crate) fn proxy_to(&self, up: &Upstream, listeners: &[(&str, Tls)]) -> ProxyBuilder {
        let address = up.address();
        listeners.iter().fold(self.proxy(), |b, &(name, tls)| {
            b.listener(name, tls, &address)
        })
    }

    /// Writes a client certificate as `<name>.crt` / `<name>.key`; returns both paths.
    pub(crate) fn client_files(&self, leaf: &Leaf, name: &str) -> (PathBuf, PathBuf) {
        leaf.write(self.dir.path(), name)
    }
}

/// The variable a workstation sets to skip the tests whose precondition it lacks, by the names
/// [`precondition`] gives them (`IRONIC_PROXY_TEST_OPT_OUT=netns,proc`). Refused where `CI` is
/// set: there a missing precondition fails the test.
pub(crate) const OPT_OUT: &str = "IRONIC_PROXY_TEST_OPT_OUT";

/// The file each skipped test appends its name to (`scripts/test` sets it and lists the names in
/// its final line, since nextest hides a passing test's stderr). Unset, the skip goes to
/// `opted-out.txt` under cargo's per-target temp dir.
pub(crate) const OPT_OUT_LOG: &str = "IRONIC_PROXY_OPT_OUT_LOG";

/// Whether a test whose precondition `name` is `met` runs. Unmet, the test fails naming `what`
/// it needs, unless `name` is listed in [`OPT_OUT`] outside CI: then it is skipped, says so on
/// stderr and records the test's name in [`OPT_OUT_LOG`].
pub(crate) fn precondition(name: &str, met: bool, what: &str) -> bool {
    if met {
        return true;
    }
    let opted_out =
        std::env::var(OPT_OUT).is_ok_and(|list| list.split(',').any(|n| n.trim() == name));
    assert!(
        opted_out,
        "precondition `{name}` missing: {what}; on a workstation without it, set {OPT_OUT}={name} \
         to skip this test"
    );
    assert!(
        std::env::var_os("CI").is_none_or(|v| v.is_empty()),
        "precondition `{name}` missing: {what}; {OPT_OUT} is refused where CI is set"
    );
    // libtest (and nextest, which runs one test per process through it) names the test's thread
    // after the test.
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_owned();
    let log = std::env::var_os(OPT_OUT_LOG).map_or_else(
        || PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("opted-out.txt"),
        PathBuf::from,
    );
    let line = format!("{test} ({name})\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    // A skip that cannot be recorded would be a silent one: fail instead.
    if let Err(e) = written {
        panic!("record the skip of {test} in {}: {e}", log.display());
    }
    eprintln!("SKIPPED ({OPT_OUT} lists `{name}`): {what}");
    false
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub(crate) fn poll_until<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        // Poll interval of this helper, the one every wait is built on.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A port for a server the test starts (the proxy binds it right after): outside the kernel's
/// ephemeral range and reserved for this test process ([`ports`]), so nothing else takes it in
/// between.
pub(crate) fn free_port() -> u16 {
    ports::reserve()
}

// ------------------------------------------------------------------------------------------------
// A byte-exact HTTP/1.1 client.

/// A response as read off the wire.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of a header (case-insensitive name).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    pub(crate) fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as a flat JSON object (see [`json_object`]).
    pub(crate) fn json(&self) -> BTreeMap<String, String> {
        json_object(&self.text())
    }
}

/// The first value of the header `name` (case-insensitive) among `headers`.
pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Every value of the header `name` (case-insensitive) among `headers`, in order.
pub(crate) fn header_values<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// Streams the client helpers can set timeouts on.
pub(crate) trait Stream: Read + Write {
    fn tcp(&self) -> &TcpStream;
}

impl Stream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

pub(crate) type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

impl Stream for TlsStream {
    fn tcp(&self) -> &TcpStream {
        self.get_ref()
    }
}

/// One client connection that sends raw bytes and parses responses.
pub(crate) struct HttpConn<S: Stream> {
    r: BufReader<S>,
}

impl HttpConn<TcpStream> {
    /// A plain TCP connection.
    pub(crate) fn tcp(addr: SocketAddr) -> io::Result<Self> {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        s.set_nodelay(true)?;
        Ok(Self::new(s))
    }
}

impl HttpConn<TlsStream> {
    /// A TLS connection with the handshake completed.
    pub(crate) fn tls(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> io::Result<Self> {
        Ok(Self::new(tls_connect(addr, cfg)?))
    }

    /// The leaf certificate the server presented (DER).
    pub(crate) fn peer_leaf(&self) -> Vec<u8> {
        peer_leaf(self.r.get_ref())
    }
}

impl<S: Stream> HttpConn<S> {
    pub(crate) fn new(s: S) -> Self {
        Self {
            r: BufReader::new(s),
        }
    }

    pub(crate) fn stream(&self) -> &S {
        self.r.get_ref()
    }

    /// Writes bytes exactly as given.
    pub(crate) fn send(&mut self, raw: &[u8]) -> io::Result<()> {
        let s = self.r.get_mut();
        s.write_all(raw)?;
        s.flush()
    }

    /// A simple request with `Host` and, when there is a body, `Content-Length`.
    pub(crate) fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
        for (n, v) in headers {
            raw.push_str(&format!("{n}: {v}\r\n"));
        }
        if !body.is_empty() || method == "POST" || method == "PUT" {
            raw.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        raw.push_str("\r\n");
        let mut bytes = raw.into_bytes();
        bytes.extend_from_slice(body);
        self.send(&bytes)?;
        self.read_response()
    }

    pub(crate) fn get(&mut self, path: &str) -> io::Result<Response> {
        self.request("GET", path, &[], b"")
    }

    /// Reads one response (not for HEAD requests): status line, headers, body framed by
    /// Content-Length, chunked, or (no framing) until EOF.
    pub(crate) fn read_response(&mut self) -> io::Result<Response> {
        let line = self.line()?;
        if line.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before a response",
            ));
        }
        let mut parts = line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        if !version.starts_with("HTTP/1.") {
            return Err(io::Error::other(format!("bad status line {line:?}")));
        }
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::other(format!("bad status line {line:?}")))?;
        let mut headers = Vec::new();
        loop {
            let h = self.line()?;
            if h.is_empty() {
                break;
            }
            let (n, v) = h
                .split_once(':')
                .ok_or_else(|| io::Error::other(format!("bad header line {h:?}")))?;
            headers.push((n.trim().to_owned(), v.trim().to_owned()));
        }
        let mut resp = Response {
            status,
            headers,
            body: Vec::new(),
        };
        if status / 100 == 1 || status == 204 || status == 304 {
            return Ok(resp);
        }
        let chunked = resp
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        if chunked {
            loop {
                let size_line = self.line()?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                        .map_err(|_| io::Error::other(format!("bad chunk size {size_line:?}")))?;
                if size == 0 {
                    while !self.line()?.is_empty() {}
                    break;
                }
                let mut chunk = vec![0; size];
                self.r.read_exact(&mut chunk)?;
                resp.body.extend_from_slice(&chunk);
                self.line()?;
            }
        } else if let Some(len) = resp.header("content-length") {
            let len: usize = len
                .parse()
                .map_err(|_| io::Error::other("bad content-length"))?;
            resp.body = vec![0; len];
            self.r.read_exact(&mut resp.body)?;
        } else {
            self.r.read_to_end(&mut resp.body)?;
        }
        Ok(resp)
    }

    fn line(&mut self) -> io::Result<String> {
        let mut buf = Vec::new();
        self.r.read_until(b'\n', &mut buf)?;
        while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            buf.pop();
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// Everything the server sends until it closes the connection or `quiet` passes without a
    /// byte; the bool says whether the connection was closed.
    pub(crate) fn drain(&mut self, quiet: Duration) -> (Vec<u8>, bool) {
        let _ = self.r.get_ref().tcp().set_read_timeout(Some(quiet));
        let mut out = self.r.buffer().to_vec();
        self.r.consume(out.len());
        let mut buf = [0u8; 4096];
        let closed = loop {
            match self.r.get_mut().read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if is_timeout(&e) => break false,
                Err(_) => break true,
            }
        };
        let _ = self.r.get_ref().tcp().set_read_timeout(Some(IO_TIMEOUT));
        (out, closed)
    }

    /// The first response head, waited for as long as the read timeout allows, then whatever
    /// follows until the server closes or `quiet` passes without a byte, as [`Self::drain`]:
    /// the quiet bounds only the look for bytes after the answer, never the wait for the
    /// answer itself, which a loaded machine can delay past any quiet window.
    pub(crate) fn head_then_drain(&mut self, quiet: Duration) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        while !out.ends_with(b"\r\n\r\n") {
            match self.r.read_until(b'\n', &mut out) {
                Ok(0) | Err(_) => return (out, true),
                Ok(_) => {}
            }
        }
        let (rest, closed) = self.drain(quiet);
        out.extend(rest);
        (out, closed)
    }

    /// Waits up to `within` for the server to close the connection; panics if it sends data.
    /// Returns how long it took, or `None` if the connection stayed open.
    pub(crate) fn wait_closed(&mut self, within: Duration) -> Option<Duration> {
        let start = Instant::now();
        let (data, closed) = self.drain(within);
        assert!(
            data.is_empty(),
            "expected the connection to close silently, got {:?}",
            String::from_utf8_lossy(&data)
        );
        closed.then(|| start.elapsed())
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Splits a byte stream into the status codes of the HTTP/1.1 responses it holds (status lines
/// only; good enough to count responses when their bodies are the proxy's short JSON).
pub(crate) fn status_lines(raw: &[u8]) -> Vec<u16> {
    let text = String::from_utf8_lossy(raw);
    text.split("\r\n")
        .filter_map(|l| l.strip_prefix("HTTP/1.1 "))
        .filter_map(|l| l.get(..3)?.parse().ok())
        .collect()
}

// ------------------------------------------------------------------------------------------------
// Client load.

/// Client worker threads for a bounded load, each recording one outcome per request in a list
/// they share. Stopped (after their current request) and joined on drop.
pub(crate) struct Workers<T> {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<T>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl<T: Clone + Send + 'static> Workers<T> {
    /// Starts `workers` threads. Worker `w` calls the step `worker(w)` gave it with `n` = 0, 1,
    /// ... until it has made `max_per_worker` requests, `max_time` has passed or it is stopped,
    /// records each outcome, and waits `pause` after each.
    pub(crate) fn start<S>(
        workers: usize,
        max_per_worker: usize,
        max_time: Duration,
        pause: Duration,
        worker: impl Fn(usize) -> S,
    ) -> Self
    where
        S: FnMut(usize) -> T + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..workers)
            .map(|w| {
                let (stop, outcomes) = (stop.clone(), outcomes.clone());
                let mut step = worker(w);
                std::thread::spawn(move || {
                    let deadline = Instant::now() + max_time;
                    for n in 0..max_per_worker {
                        if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                            break;
                        }
                        let outcome = step(n);
                        outcomes.lock().expect("outcomes").push(outcome);
                        if !pause.is_zero() {
                            // Exercised: the pause between requests the test asked for.
                            std::thread::sleep(pause);
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            outcomes,
            threads,
        }
    }

    /// Outcomes so far.
    pub(crate) fn outcomes(&self) -> Vec<T> {
        self.outcomes.lock().expect("outcomes").clone()
    }

    /// Waits for the workers to reach their count or time limit; returns every outcome.
    pub(crate) fn wait(mut self) -> Vec<T> {
        self.join();
        self.outcomes()
    }

    /// Stops the workers (after their current request) and returns every outcome.
    pub(crate) fn finish(mut self) -> Vec<T> {
        self.stop.store(true, Ordering::Relaxed);
        self.join();
        self.outcomes()
    }
}

impl<T> Workers<T> {
    fn join(&mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl<T> Drop for Workers<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.join();
    }
}

// ------------------------------------------------------------------------------------------------
// rustls clients.

/// A client config trusting `ca_pem`, optionally presenting `client`, offering `alpn`.
pub(crate) fn tls_client_config(
    ca_pem: &str,
    client: Option<&Leaf>,
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let client = client.map(|leaf| {
        (
            vec![CertificateDer::from(leaf.der.clone())],
            PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("key PEM"),
        )
    });
    client_config_with(ca_pem, client, alpn)
}

/// A rustls client config (our one crypto provider, safe default versions) trusting every
/// certificate in `ca_pem`, presenting `client` (chain and key) if given, offering `alpn`.
pub(crate) fn client_config_with(
    ca_pem: &str,
    client: Option<(
        Vec<rustls_pki_types::CertificateDer<'static>>,
        rustls_pki_types::PrivateKeyDer<'static>,
    )>,
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("add CA");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_root_certificates(roots);
    let mut cfg = match client {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .expect("client cert"),
    };
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}

/// Connects and completes the TLS handshake (server name `localhost`).
pub(crate) fn tls_connect(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> io::Result<TlsStream> {
    let tcp = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    tcp.set_read_timeout(Some(IO_TIMEOUT))?;
    tcp.set_write_timeout(Some(IO_TIMEOUT))?;
    tcp.set_nodelay(true)?;
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("server name");
    let conn = rustls::ClientConnection::new(cfg, name).map_err(io::Error::other)?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}

/// The leaf certificate (DER) the server presented on a TLS stream.
pub(crate) fn peer_leaf(s: &TlsStream) -> Vec<u8> {
    s.conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .expect("server presented a certificate")
}

/// Lower-case hex SHA-256.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// ------------------------------------------------------------------------------------------------
// External clients.

/// What an external command did.
#[derive(Debug)]
pub(crate) struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub(crate) fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs a command to completion with `stdin` fed in; panics if it cannot start or runs longer
/// than 30 seconds.
pub(crate) fn run(cmd: &mut Command, stdin: &[u8]) -> Output {
    run_timeout(cmd, stdin, Duration::from_secs(30))
}

/// [`run`] with a deadline: the child is killed (by its PID) and the test fails when it passes.
pub(crate) fn run_timeout(cmd: &mut Command, stdin: &[u8], timeout: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read(Box::new(child.stderr.take().expect("stderr")));
    let status = poll_until(timeout, || child.try_wait().ok().flatten());
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{cmd:?} still running after {timeout:?}; stderr: {}",
            stderr.join().unwrap_or_default()
        );
    };
    let _ = writer.join();
    Output {
        code: status.code(),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// `curl -sS --max-time 10 ARGS...`.
pub(crate) fn curl(args: &[&str]) -> Output {
    run(
        Command::new("curl")
            .args(["-sS", "--max-time", "10"])
            .args(args),
        b"",
    )
}

/// Runs a Python 3 script with arguments. The deadline is only a hang guard: the scripts bound
/// their own requests (`timeout=` of up to 120 s), and the guard must outlast them, or a slow
/// machine fails a request that was still progressing (a 100 MB upload through TLS in the debug
/// build took over 30 s in a stress run at a load average of 25).
pub(crate) fn python(script: &str, args: &[&str]) -> Output {
    run_timeout(
        Command::new("python3").arg("-c").arg(script).args(args),
        b"",
        Duration::from_secs(300),
    )
}

/// Parses `text` as a JSON object with Python's `json` module (a real parser: the test fails on
/// anything that is not valid JSON). Returns the top-level keys; string values as they are, any
/// other value as its JSON text.
pub(crate) fn json_object(text: &str) -> BTreeMap<String, String> {
    const SCRIPT: &str = r#"
import json, sys
d = json.loads(sys.stdin.read())
assert isinstance(d, dict), "not a JSON object"
for k, v in d.items():
    v = v if isinstance(v, str) else json.dumps(v)
    print(json.dumps(k) + "\t" + json.dumps(v))
"#;
    let out = run(
        Command::new("python3").arg("-c").arg(SCRIPT),
        text.as_bytes(),
    );
    assert!(
        out.ok(),
        "not a JSON object: {text:?}\npython: {}",
        out.stderr
    );
    out.stdout
        .lines()
        .map(|l| {
            // `"key"<TAB>"value"`: json.dumps escapes tabs inside strings, so the split is exact.
            let (k, v) = l.split_once('\t').expect("key and value");
            (unescape(&k[1..k.len() - 1]), unescape(&v[1..v.len() - 1]))
        })
        .collect()
}

/// Undoes json.dumps escaping for the strings `json_object` prints.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                if let Some(ch) = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                    out.push(ch);
                }
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

// ------------------------------------------------------------------------------------------------
// Prometheus text.

/// Sums the samples of `name` whose labels include every pair in `labels`; `None` when there is
/// no such sample at all.
pub(crate) fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (n, lbl) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if n != name {
            continue;
        }
        let have: Vec<(&str, &str)> = lbl
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        if labels.iter().all(|want| have.contains(want)) {
            let v: f64 = value.parse().unwrap_or(f64::NAN);
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}
