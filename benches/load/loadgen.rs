//! The load benchmark's load generator: HTTP/1.1 over TLS 1.3 (rustls, X25519, optional client
//! certificate) or plain TCP, identical for every proxy under test, so its own cost is the same
//! for all of them. Raw HTTP/1.1 writes and a minimal response parser keep it cheap.
//!
//! Modes (each bounded in time; prints one JSON line):
//! - `throughput`: `--conns` keep-alive connections send back to back for `--duration` seconds.
//! - `rate`: `--rate` requests/s open-loop over `--conns` connections; per-request latency from
//!   the scheduled send time when the connection was late (no coordinated omission), else from
//!   the actual send; prints p50/p99/p99.9 in microseconds. With `--reconnect-every K` every
//!   K-th request on a connection says `Connection: close` and the next one opens a new
//!   connection with a full handshake (resumption off): an agent's heartbeats among kept-alive
//!   API calls, as Ironic's balancer sees them.
//! - `handshake`: `--conns` workers each loop: new TCP connection, full TLS handshake with
//!   resumption disabled, one request with `Connection: close`, close. With `--trust-any` the
//!   server's certificate and signature are not verified (the client's own cost, see
//!   [`TrustAny`]).
//! - `idle`: opens `--conns` connections, one request each, prints `{"open":N}`, then holds them
//!   until stdin closes or `--duration` passes.
//!
//! Usage: `loadgen MODE --addr 127.0.0.1:PORT [--plain] [--ca F] [--cert F --key F]
//! [--path /small] [--conns N] [--duration S] [--rate R] [--header "Name: value"]...
//! [--method POST --body '{"json": 1}'] [--heartbeat] [--trust-any] [--reconnect-every K]` (a body is sent as
//! `application/json`; `--heartbeat` sends an agent's heartbeat, [`HEARTBEAT_PATH`] and
//! [`HEARTBEAT_BODY`]).

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// An agent's heartbeat, as ironic-python-agent posts it: the fields of Ironic's
/// `HeartbeatController.post` (ironic/api/controllers/v1/ramdisk.py), all strings, 209 bytes.
const HEARTBEAT_PATH: &str = "/v1/heartbeat/1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
const HEARTBEAT_BODY: &str = concat!(
    r#"{"callback_url":"https://192.168.111.20:9999","agent_version":"9.13.1","#,
    r#""agent_token":"xG5Hb7dV2cQ9kL0pR4sT8uW1yZ3aB6eF9hJ2mN5qS8vWd1","#,
    r#""agent_verify_ca":"/etc/ironic-python-agent/ca.crt","agent_status":"start"}"#
);

#[derive(Clone)]
struct Opts {
    mode: String,
    addr: SocketAddr,
    plain: bool,
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    path: String,
    conns: usize,
    duration: f64,
    rate: f64,
    /// Extra request header lines (`--header "Authorization: Basic ..."`).
    headers: Vec<String>,
    method: String,
    /// A request body, sent with `Content-Type: application/json` and its `Content-Length`.
    body: Option<String>,
    /// `--trust-any`: the server's certificate and signature are not verified (see
    /// [`TrustAny`]).
    trust_any: bool,
    /// `--reconnect-every K` (rate mode): a new connection after every K requests; 0: never.
    reconnect_every: u32,
}

fn parse() -> Opts {
    let mut a = std::env::args().skip(1);
    let mode = a.next().unwrap_or_default();
    let mut o = Opts {
        mode,
        addr: "127.0.0.1:8443".parse().expect("literal"),
        plain: false,
        ca: None,
        cert: None,
        key: None,
        path: "/small".into(),
        conns: 16,
        duration: 3.0,
        rate: 1000.0,
        headers: Vec::new(),
        method: "GET".into(),
        body: None,
        trust_any: false,
        reconnect_every: 0,
    };
    while let Some(k) = a.next() {
        let mut v = || {
            a.next()
                .unwrap_or_else(|| die(&format!("{k} needs a value")))
        };
        match k.as_str() {
            "--addr" => o.addr = v().parse().unwrap_or_else(|_| die("bad --addr")),
            "--plain" => o.plain = true,
            "--ca" => o.ca = Some(v()),
            "--cert" => o.cert = Some(v()),
            "--key" => o.key = Some(v()),
            "--path" => o.path = v(),
            "--conns" => o.conns = v().parse().unwrap_or_else(|_| die("bad --conns")),
            "--duration" => o.duration = v().parse().unwrap_or_else(|_| die("bad --duration")),
            "--rate" => o.rate = v().parse().unwrap_or_else(|_| die("bad --rate")),
            "--header" => o.headers.push(v()),
            "--method" => o.method = v(),
            "--body" => o.body = Some(v()),
            "--trust-any" => o.trust_any = true,
            "--reconnect-every" => {
                o.reconnect_every = v().parse().unwrap_or_else(|_| die("bad --reconnect-every"));
            }
            "--heartbeat" => {
                o.method = "POST".into();
                o.path = HEARTBEAT_PATH.into();
                o.body = Some(HEARTBEAT_BODY.into());
            }
            other => die(&format!("unknown argument {other}")),
        }
    }
    o
}

fn die(msg: &str) -> ! {
    eprintln!("loadgen: {msg}");
    std::process::exit(2)
}

fn tls_config(o: &Opts, resume: bool) -> Arc<ClientConfig> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    // X25519 only: what OpenSSL 3.0 (HAProxy, nginx) and rustls all negotiate, so every proxy
    // does the same key exchange.
    provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519];
    let mut roots = RootCertStore::empty();
    let ca =
        o.ca.as_deref()
            .unwrap_or_else(|| die("--ca is required with TLS"));
    for c in CertificateDer::pem_file_iter(ca).unwrap_or_else(|e| die(&format!("{ca}: {e}"))) {
        roots
            .add(c.unwrap_or_else(|e| die(&format!("{ca}: {e}"))))
            .unwrap_or_else(|e| die(&format!("{ca}: {e}")));
    }
    let schemes = provider
        .signature_verification_algorithms
        .supported_schemes();
    let b = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3 is supported");
    let b = if o.trust_any {
        b.dangerous()
            .with_custom_certificate_verifier(Arc::new(TrustAny(schemes)))
    } else {
        b.with_root_certificates(roots)
    };
    let mut cfg = match (&o.cert, &o.key) {
        (Some(c), Some(k)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(c)
                .unwrap_or_else(|e| die(&format!("{c}: {e}")))
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| die(&format!("{c}: {e}")));
            let key = PrivateKeyDer::from_pem_file(k).unwrap_or_else(|e| die(&format!("{k}: {e}")));
            b.with_client_auth_cert(chain, key)
                .unwrap_or_else(|e| die(&format!("client cert: {e}")))
        }
        _ => b.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    if !resume {
        cfg.resumption = Resumption::disabled();
    }
    Arc::new(cfg)
}

/// The server is not verified: its chain and its handshake signature are two P-256
/// verifications, 40 % of this process's core in the handshake phase (perf), which made the load
/// generator the limit of that phase and left the fastest proxy idle half the time, paying a
/// wake-up per connection. Benchmark only: every proxy under test faces the same client, and the
/// server still signs as always (the client cannot tell the difference).
#[derive(Debug)]
struct TrustAny(Vec<SignatureScheme>);

impl ServerCertVerifier for TrustAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    // TLS 1.3 only (`tls_config`); as the TLS 1.3 signature otherwise.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_tls13_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.clone()
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

struct Client {
    opts: Opts,
    tls: Option<tokio_rustls::TlsConnector>,
    name: ServerName<'static>,
}

impl Client {
    async fn connect(&self) -> io::Result<Box<dyn Io>> {
        let tcp = TcpStream::connect(self.opts.addr).await?;
        tcp.set_nodelay(true)?;
        match &self.tls {
            None => Ok(Box::new(tcp)),
            Some(c) => Ok(Box::new(c.connect(self.name.clone(), tcp).await?)),
        }
    }
}

/// Sends `req` and reads one response into `buf`. Returns (status, body bytes, server closes).
async fn exchange(s: &mut dyn Io, req: &[u8], buf: &mut Vec<u8>) -> io::Result<(u16, usize, bool)> {
    s.write_all(req).await?;
    buf.clear();
    loop {
        if let Some(r) = parse_response(buf)? {
            return Ok(r);
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        if s.read_buf(buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed mid-response",
            ));
        }
    }
}

fn bad(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// `Some` once `buf` holds a whole response (Content-Length or chunked framing).
fn parse_response(buf: &[u8]) -> io::Result<Option<(u16, usize, bool)>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| bad("non-UTF-8 head"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("empty head"))?;
    let status: u16 = status_line
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let (mut len, mut chunked, mut close) = (None, false, false);
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            len = Some(v.parse::<usize>().map_err(|_| bad("bad content-length"))?);
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            chunked = v.eq_ignore_ascii_case("chunked");
        } else if k.eq_ignore_ascii_case("connection") {
            close = v.eq_ignore_ascii_case("close");
        }
    }
    let body = &buf[end + 4..];
    if chunked {
        let mut pos = 0;
        let mut total = 0;
        loop {
            let Some(nl) = body[pos..].windows(2).position(|w| w == b"\r\n") else {
                return Ok(None);
            };
            let size_str = std::str::from_utf8(&body[pos..pos + nl]).map_err(|_| bad("chunk"))?;
            let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad("bad chunk size"))?;
            pos += nl + 2;
            if size == 0 {
                return Ok((body.len() >= pos + 2).then_some((status, total, close)));
            }
            if body.len() < pos + size + 2 {
                return Ok(None);
            }
            pos += size + 2;
            total += size;
        }
    }
    let len = len.unwrap_or(0);
    Ok((body.len() >= len).then_some((status, len, close)))
}

#[derive(Default)]
struct Tally {
    ok: u64,
    errors: u64,
    bytes: u64,
    latencies_us: Vec<u32>,
    first_error: Option<String>,
}

impl Tally {
    fn merge(&mut self, o: Self) {
        self.ok += o.ok;
        self.errors += o.errors;
        self.bytes += o.bytes;
        self.latencies_us.extend(o.latencies_us);
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }
    fn error(&mut self, e: impl std::fmt::Display) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }
}

fn request_bytes(o: &Opts, close: bool) -> Vec<u8> {
    let mut extra: String = o.headers.iter().map(|h| format!("{h}\r\n")).collect();
    if let Some(b) = &o.body {
        extra += &format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        );
    }
    let mut req = format!(
        "{} {} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: loadgen\r\nAccept: */*\r\n{extra}{}\r\n",
        o.method,
        o.path,
        if close { "Connection: close\r\n" } else { "" }
    )
    .into_bytes();
    req.extend_from_slice(o.body.as_deref().unwrap_or("").as_bytes());
    req
}

/// Closed loop on one keep-alive connection until `end`; reconnects if the server closes.
async fn throughput_worker(c: Arc<Client>, end: Instant) -> Tally {
    let mut t = Tally::default();
    let req = request_bytes(&c.opts, false);
    let mut buf = Vec::with_capacity(80 * 1024);
    'outer: while Instant::now() < end {
        let mut s = match c.connect().await {
            Ok(s) => s,
            Err(e) => {
                t.error(e);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        while Instant::now() < end {
            match exchange(&mut *s, &req, &mut buf).await {
                Ok((200, n, close)) => {
                    t.ok += 1;
                    t.bytes += n as u64;
                    if close {
                        continue 'outer;
                    }
                }
                Ok((st, _, _)) => {
                    t.error(format!("status {st}"));
                    continue 'outer;
                }
                Err(e) => {
                    t.error(e);
                    continue 'outer;
                }
            }
        }
    }
    t
}

/// Open loop: this connection's share of the rate, from `offset` after `start`, until `end`.
async fn rate_worker(
    c: Arc<Client>,
    start: Instant,
    offset: Duration,
    interval: Duration,
    end: Instant,
) -> Tally {
    let mut t = Tally::default();
    let req = request_bytes(&c.opts, false);
    let last = request_bytes(&c.opts, true);
    let every = c.opts.reconnect_every;
    let mut buf = Vec::with_capacity(80 * 1024);
    let mut s = match c.connect().await {
        Ok(s) => s,
        Err(e) => {
            t.error(e);
            return t;
        }
    };
    let mut k: u32 = 0;
    loop {
        let scheduled = start + offset + interval * k;
        k += 1;
        if scheduled >= end {
            break;
        }
        // The previous request said `Connection: close`: this one starts a new connection.
        if every > 0 && k > 1 && (k - 1) % every == 0 {
            s = match c.connect().await {
                Ok(n) => n,
                Err(e) => {
                    t.error(e);
                    return t;
                }
            };
        }
        let req = if every > 0 && k % every == 0 {
            &last
        } else {
            &req
        };
        let now = Instant::now();
        // Late because the previous answer took too long: count from the schedule (the
        // waiting is the server's doing). On time: sleep, then count from the actual send, so
        // the timer's millisecond granularity is not charged to the server.
        let from = if now > scheduled {
            scheduled
        } else {
            tokio::time::sleep_until(scheduled.into()).await;
            Instant::now()
        };
        match exchange(&mut *s, req, &mut buf).await {
            Ok((200, n, _)) => {
                t.ok += 1;
                t.bytes += n as u64;
                let us = from.elapsed().as_micros();
                t.latencies_us.push(u32::try_from(us).unwrap_or(u32::MAX));
            }
            Ok((st, _, _)) => t.error(format!("status {st}")),
            Err(e) => {
                t.error(e);
                match c.connect().await {
                    Ok(n) => s = n,
                    Err(e) => {
                        t.error(e);
                        return t;
                    }
                }
            }
        }
    }
    t
}

/// A new connection and full handshake per request.
async fn handshake_worker(c: Arc<Client>, end: Instant) -> Tally {
    let mut t = Tally::default();
    let req = request_bytes(&c.opts, true);
    let mut buf = Vec::with_capacity(8 * 1024);
    while Instant::now() < end {
        let mut s = match c.connect().await {
            Ok(s) => s,
            Err(e) => {
                t.error(e);
                continue;
            }
        };
        match exchange(&mut *s, &req, &mut buf).await {
            Ok((200, n, _)) => {
                t.ok += 1;
                t.bytes += n as u64;
            }
            Ok((st, _, _)) => t.error(format!("status {st}")),
            Err(e) => t.error(e),
        }
    }
    t
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

async fn run(o: Opts) {
    let resume = o.mode != "handshake" && o.reconnect_every == 0;
    let tls = (!o.plain).then(|| tokio_rustls::TlsConnector::from(tls_config(&o, resume)));
    let c = Arc::new(Client {
        opts: o.clone(),
        tls,
        name: ServerName::try_from("localhost").expect("literal name"),
    });
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(o.duration);
    let mut tasks = Vec::new();
    match o.mode.as_str() {
        "throughput" => {
            for _ in 0..o.conns {
                tasks.push(tokio::spawn(throughput_worker(c.clone(), end)));
            }
        }
        "handshake" => {
            for _ in 0..o.conns {
                tasks.push(tokio::spawn(handshake_worker(c.clone(), end)));
            }
        }
        "rate" => {
            #[allow(clippy::cast_precision_loss)]
            let interval = Duration::from_secs_f64(o.conns as f64 / o.rate);
            let begin = start + Duration::from_millis(200);
            for i in 0..o.conns {
                #[allow(clippy::cast_possible_truncation)]
                let offset = interval * i as u32 / o.conns as u32;
                tasks.push(tokio::spawn(rate_worker(
                    c.clone(),
                    begin,
                    offset,
                    interval,
                    end + Duration::from_millis(200),
                )));
            }
        }
        "idle" => return idle(c, o.conns, Duration::from_secs_f64(o.duration)).await,
        other => die(&format!("unknown mode {other:?}")),
    }
    let mut total = Tally::default();
    for t in tasks {
        if let Ok(t) = t.await {
            total.merge(t);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    total.latencies_us.sort_unstable();
    let l = &total.latencies_us;
    #[allow(clippy::cast_precision_loss)]
    let rps = total.ok as f64
        / if o.mode == "rate" {
            o.duration
        } else {
            elapsed
        };
    println!(
        "{{\"mode\":\"{}\",\"ok\":{},\"errors\":{},\"bytes\":{},\"elapsed\":{:.3},\"rps\":{:.1},\
         \"p50_us\":{},\"p99_us\":{},\"p999_us\":{},\"first_error\":{:?}}}",
        o.mode,
        total.ok,
        total.errors,
        total.bytes,
        elapsed,
        rps,
        percentile(l, 0.5),
        percentile(l, 0.99),
        percentile(l, 0.999),
        total.first_error.unwrap_or_default(),
    );
}

/// Opens `n` connections (50 at a time), one request each, then holds them.
async fn idle(c: Arc<Client>, n: usize, hold: Duration) {
    let req = request_bytes(&c.opts, false);
    let sem = Arc::new(tokio::sync::Semaphore::new(50));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let c = c.clone();
        let req = req.clone();
        let sem = sem.clone();
        tasks.push(tokio::spawn(async move {
            let _p = sem.acquire().await.ok()?;
            let mut s = c.connect().await.ok()?;
            let mut buf = Vec::with_capacity(4096);
            match exchange(&mut *s, &req, &mut buf).await {
                Ok((200, _, false)) => Some(s),
                _ => None,
            }
        }));
    }
    let mut open = Vec::new();
    for t in tasks {
        if let Ok(Some(s)) = t.await {
            open.push(s);
        }
    }
    println!("{{\"open\":{}}}", open.len());
    // Hold until the driver closes stdin, bounded by `hold`.
    let stdin = tokio::task::spawn_blocking(|| {
        let mut sink = [0u8; 64];
        let _ = io::Read::read(&mut io::stdin(), &mut sink);
    });
    let _ = tokio::time::timeout(hold, stdin).await;
    drop(open);
}

fn main() {
    let o = parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(o));
}
