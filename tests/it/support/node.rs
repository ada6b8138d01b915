//! The real `ironic-proxy` binary run from a config text the test writes in full (issuer
//! identities, `[dns]`, upstream tables: what `ProxyBuilder` does not cover), a CA and leaves
//! made with the binary's own `ca init` / `cert issue`, certificate inspection helpers, and a
//! bounded load generator.

use crate::support::proxy::start_ready;
use crate::support::{self, HttpConn, Output, Proxy, Workers};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A port for a server on `ip` (any loopback address): reserved for this test process on every
/// address, outside the ephemeral range ([`super::ports`]).
pub(crate) fn free_port_on(ip: IpAddr) -> u16 {
    let port = super::ports::reserve();
    // Checked on `ip` too: a reserved port is free on 127.0.0.1, not necessarily on `ip`.
    std::net::TcpListener::bind(SocketAddr::new(ip, port))
        .unwrap_or_else(|e| panic!("reserved port {port} is taken on {ip}: {e}"));
    port
}

/// A TOML basic string.
pub(crate) fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `p` as a TOML string.
pub(crate) fn tp(p: &Path) -> String {
    toml_str(&p.display().to_string())
}

/// A running `ironic-proxy run` with one proxy listener (at `listen`) and an admin listener;
/// everything about the process itself is its [`Proxy`] (what it derefs to).
pub(crate) struct Node {
    pub name: String,
    proxy: Proxy,
    pub listen: SocketAddr,
}

impl Deref for Node {
    type Target = Proxy;

    fn deref(&self) -> &Proxy {
        &self.proxy
    }
}

impl DerefMut for Node {
    fn deref_mut(&mut self) -> &mut Proxy {
        &mut self.proxy
    }
}

impl AsMut<Proxy> for Node {
    fn as_mut(&mut self) -> &mut Proxy {
        &mut self.proxy
    }
}

impl Node {
    /// Writes `render(admin port, listen address)` as `<name>.toml` in `dir`, starts the proxy
    /// with its listener on `listen_ip`, and waits until `/readyz` answers 200 (see
    /// [`start_ready`]).
    pub(crate) fn start(
        dir: &Path,
        name: &str,
        listen_ip: IpAddr,
        render: impl Fn(u16, SocketAddr) -> String,
    ) -> Self {
        start_ready(Duration::from_secs(15), || {
            Self::spawn(dir, name, listen_ip, &render)
        })
    }

    /// Writes the config and starts the process without waiting for anything.
    pub(crate) fn spawn(
        dir: &Path,
        name: &str,
        listen_ip: IpAddr,
        render: impl Fn(u16, SocketAddr) -> String,
    ) -> Self {
        let listen = SocketAddr::new(listen_ip, free_port_on(listen_ip));
        Self::spawn_at(dir, name, listen, render)
    }

    /// Like [`Self::spawn`] with the listener on a given address (for proxies that must know
    /// each other's address before either starts).
    pub(crate) fn spawn_at(
        dir: &Path,
        name: &str,
        listen: SocketAddr,
        render: impl Fn(u16, SocketAddr) -> String,
    ) -> Self {
        let admin = support::free_port();
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, render(admin, listen)).expect("write config");
        Self {
            name: name.to_owned(),
            proxy: Proxy::spawn(&config, admin, HashMap::new(), false, Some(name)),
            listen,
        }
    }
}

/// Runs `ironic-proxy ARGS` to completion (for `check`, `ca`, `cert`).
pub(crate) fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    support::proxy::command(args, env, &["IRONIC_PROXY_CONFIG"])
}

/// `ironic-proxy ca init --out DIR EXTRA...`; returns (ca.crt, ca.key).
pub(crate) fn ca_init(dir: &Path, extra: &[&str]) -> (PathBuf, PathBuf) {
    let out = dir.display().to_string();
    let mut args = vec!["ca", "init", "--out", &out];
    args.extend_from_slice(extra);
    let o = cli(&args, &[]);
    assert!(o.ok(), "ca init: {o:?}");
    (dir.join("ca.crt"), dir.join("ca.key"))
}

/// A certificate and key in PEM, read from files.
#[derive(Clone, Debug)]
pub(crate) struct Pem {
    pub cert: String,
    pub key: String,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

/// `ironic-proxy cert issue` from the CA `(ca.crt, ca.key)` into `out` with `sans` (`--dns X`,
/// `--ip Y`, ...).
pub(crate) fn cert_issue(ca: &(PathBuf, PathBuf), out: &Path, sans: &[&str]) -> Pem {
    let (c, k, o) = (
        ca.0.display().to_string(),
        ca.1.display().to_string(),
        out.display().to_string(),
    );
    let mut args = vec![
        "cert",
        "issue",
        "--ca-cert",
        &c,
        "--ca-key",
        &k,
        "--out",
        &o,
    ];
    args.extend_from_slice(sans);
    let r = cli(&args, &[]);
    assert!(r.ok(), "cert issue: {r:?}");
    let (cert_path, key_path) = (out.join("tls.crt"), out.join("tls.key"));
    Pem {
        cert: std::fs::read_to_string(&cert_path).expect("tls.crt"),
        key: std::fs::read_to_string(&key_path).expect("tls.key"),
        cert_path,
        key_path,
    }
}

/// The first certificate of a PEM text, DER.
pub(crate) fn pem_der(pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .expect("a PEM certificate")
        .expect("valid PEM")
        .to_vec()
}

/// Serial number (hex, colon-separated as x509-parser prints it).
pub(crate) fn serial(der: &[u8]) -> String {
    let (_, c) = x509_parser::parse_x509_certificate(der).expect("certificate parses");
    c.raw_serial_as_string()
}

/// SANs as `DNS:name` / `IP:addr`.
pub(crate) fn sans(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let (_, c) = x509_parser::parse_x509_certificate(der).expect("certificate parses");
    let mut out = Vec::new();
    if let Ok(Some(san)) = c.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => out.push(format!("DNS:{d}")),
                GeneralName::IPAddress(b) if b.len() == 4 => {
                    let a: [u8; 4] = (*b).try_into().expect("4 bytes");
                    out.push(format!("IP:{}", IpAddr::from(a)));
                }
                GeneralName::IPAddress(b) if b.len() == 16 => {
                    let a: [u8; 16] = (*b).try_into().expect("16 bytes");
                    out.push(format!("IP:{}", IpAddr::from(a)));
                }
                other => out.push(format!("{other:?}")),
            }
        }
    }
    out
}

/// `notAfter` as a Unix timestamp.
pub(crate) fn not_after(der: &[u8]) -> i64 {
    let (_, c) = x509_parser::parse_x509_certificate(der).expect("certificate parses");
    c.validity().not_after.timestamp()
}

/// Whether the private key (PEM) belongs to the certificate (PEM, first block), the way rustls
/// checks a configured pair (`CertifiedKey::keys_match`).
pub(crate) fn key_matches(cert_pem: &str, key_pem: &str) -> Result<(), String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate".into());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("key PEM: {e}"))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("key: {e}"))?;
    rustls::sign::CertifiedKey::new(certs, signing)
        .keys_match()
        .map_err(|e| e.to_string())
}

/// A rustls client config trusting `ca_pem`, presenting `client` (cert PEM, key PEM) if given.
pub(crate) fn client_config(
    ca_pem: &str,
    client: Option<(&str, &str)>,
) -> Arc<rustls::ClientConfig> {
    let client = client.map(|(cert, key)| {
        (
            CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<_, _>>()
                .expect("client cert PEM"),
            PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("client key PEM"),
        )
    });
    support::client_config_with(ca_pem, client, &[b"http/1.1"])
}

/// A TLS connection to `addr` verifying the server as `name`, handshake completed.
pub(crate) fn tls_conn(
    addr: SocketAddr,
    name: &str,
    cfg: Arc<rustls::ClientConfig>,
) -> std::io::Result<HttpConn<support::TlsStream>> {
    let tcp = TcpStream::connect_timeout(&addr, support::IO_TIMEOUT)?;
    tcp.set_read_timeout(Some(support::IO_TIMEOUT))?;
    tcp.set_write_timeout(Some(support::IO_TIMEOUT))?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(name.to_owned()).map_err(std::io::Error::other)?;
    let conn = rustls::ClientConnection::new(cfg, name).map_err(std::io::Error::other)?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(HttpConn::new(s))
}

// ------------------------------------------------------------------------------------------------
// Issuer-mode configs.

/// A TOML array of strings.
pub(crate) fn toml_list(items: &[&str]) -> String {
    let items: Vec<String> = items.iter().map(|s| toml_str(s)).collect();
    format!("[{}]", items.join(", "))
}

/// The `[identity]` table of an issuer-mode node: trust and issuer from `ca`, a certificate for
/// `dns` and `ips` valid for `validity`. Callers append their own keys (renewal, export).
pub(crate) fn issuer_identity(
    ca: &(PathBuf, PathBuf),
    dns: &[&str],
    ips: &[&str],
    validity: &str,
) -> String {
    let (ca_crt, ca_key) = (tp(&ca.0), tp(&ca.1));
    format!(
        "[identity]\ntrust = {ca_crt}\nissuer_cert = {ca_crt}\nissuer_key = {ca_key}\n\
         dns_names = {}\nip_addresses = {}\nvalidity = \"{validity}\"\n",
        toml_list(dns),
        toml_list(ips)
    )
}

/// A whole issuer-mode config: `identity` (see [`issuer_identity`]), `[admin]`, one mutual
/// listener, `json-rpc`, in front of the unix socket `sock` (with `allow` rules if given), then
/// `extra` tables.
pub(crate) fn issuer_node(
    identity: String,
    allow: Option<&[&str]>,
    sock: &Path,
    extra: String,
) -> impl Fn(u16, SocketAddr) -> String {
    let allow = allow.map_or(String::new(), |a| format!("allow = {}\n", toml_list(a)));
    let sock = toml_str(&format!("unix:{}", sock.display()));
    move |admin, listen| {
        format!(
            r#"{identity}
[admin]
listen = "127.0.0.1:{admin}"

[[listeners]]
name = "json-rpc"
listen = "{listen}"
tls = "mutual"
{allow}upstream = {sock}
{extra}"#
        )
    }
}

/// Issuer-mode config for `localhost` / 127.0.0.1 renewing `renew_before` the end of
/// `validity`, optionally exporting to `export`, with [`issuer_node`]'s mutual listener in front
/// of `sock`. `drain_timeout`, if given, is the only `[limits]` key.
pub(crate) fn issuer_config(
    ca: &(PathBuf, PathBuf),
    validity: &str,
    renew_before: &str,
    export: Option<&Path>,
    drain_timeout: Option<&str>,
    sock: &Path,
) -> impl Fn(u16, SocketAddr) -> String {
    let mut identity = issuer_identity(ca, &["localhost"], &["127.0.0.1"], validity);
    identity.push_str(&format!("renew_before = \"{renew_before}\"\n"));
    if let Some(d) = export {
        identity.push_str(&format!("export_dir = {}\n", tp(d)));
    }
    let limits = drain_timeout.map_or(String::new(), |d| {
        format!("\n[limits]\ndrain_timeout = \"{d}\"\n")
    });
    issuer_node(identity, None, sock, limits)
}

// ------------------------------------------------------------------------------------------------
// Load balancer configs.

/// A proxy with one listener named `api` whose upstream has peers found through DNS.
#[derive(Clone, Debug)]
pub(crate) struct Lb {
    /// The DNS server to ask (`[dns] servers`).
    pub dns: SocketAddr,
    /// `[dns] refresh`.
    pub refresh: String,
    /// `upstream.dns`: `name:port`.
    pub target: String,
    /// `upstream.local`, if any (`unix:/path`).
    pub local: Option<String>,
    pub balance: String,
    /// `health.interval`; the health path is `/health` (the backends' `HEALTH_PATH`).
    pub interval: String,
    /// `health.unhealthy_after`.
    pub unhealthy_after: u32,
    /// `upstream.tls`.
    pub tls_peers: bool,
    /// The listener's `tls` (`none`, `server`, `mutual`).
    pub listener_tls: String,
    /// A whole `[identity]` table, if any.
    pub identity: Option<String>,
}

impl Lb {
    /// Plain listener, round robin, no local, no TLS, refresh and health interval 1 s.
    pub(crate) fn new(dns: SocketAddr, target: &str) -> Self {
        Self {
            dns,
            refresh: "1s".into(),
            target: target.into(),
            local: None,
            balance: "round_robin".into(),
            interval: "1s".into(),
            unhealthy_after: 2,
            tls_peers: false,
            listener_tls: "none".into(),
            identity: None,
        }
    }

    pub(crate) fn render(&self) -> impl Fn(u16, SocketAddr) -> String {
        let me = self.clone();
        move |admin, listen| {
            let mut o = me.identity.clone().unwrap_or_default();
            o.push_str(&format!(
                r#"
[admin]
listen = "127.0.0.1:{admin}"

[dns]
servers = ["{dns}"]
refresh = "{refresh}"

[limits]
upstream_timeout = "5s"
drain_timeout = "1s"

[[listeners]]
name = "api"
listen = "{listen}"
tls = "{tls}"

[listeners.upstream]
dns = "{target}"
balance = "{balance}"
tls = {tls_peers}
health = {{ path = "/health", interval = "{interval}", timeout = "500ms", unhealthy_after = {unhealthy}, healthy_after = 1 }}
"#,
                dns = me.dns,
                refresh = me.refresh,
                tls = me.listener_tls,
                target = me.target,
                balance = me.balance,
                tls_peers = me.tls_peers,
                interval = me.interval,
                unhealthy = me.unhealthy_after,
            ));
            if let Some(local) = &me.local {
                o.push_str(&format!("local = {}\n", toml_str(local)));
            }
            o
        }
    }
}

/// Upstream endpoints of the `api` upstream in `state` (`healthy`, `unhealthy`, `ejected`).
pub(crate) fn endpoints(node: &Node, state: &str) -> f64 {
    node.metric(
        "ironic_proxy_upstream_endpoints",
        &[("upstream", "api"), ("state", state)],
    )
}

// ------------------------------------------------------------------------------------------------
// Load.

/// One request's outcome as the client saw it.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    /// When the request was sent.
    pub sent: Instant,
    /// When its answer (or failure) came.
    pub at: Instant,
    /// The answering backend (`x-backend`), or the error: a status other than 200 or an I/O
    /// failure.
    pub result: Result<String, String>,
}

/// Worker threads sending `GET /load/<worker>/<n>` over keep-alive connections to a plain
/// listener until stopped, a request count or a time limit is reached; every outcome recorded.
pub(crate) struct Load(Workers<Outcome>);

impl Load {
    pub(crate) fn start(
        addr: SocketAddr,
        workers: usize,
        max_per_worker: usize,
        max: Duration,
    ) -> Self {
        Self::start_method(addr, "GET", workers, max_per_worker, max)
    }

    /// Like [`Self::start`] with another method (`POST`: an empty body, never retried by the
    /// proxy once sent).
    pub(crate) fn start_method(
        addr: SocketAddr,
        method: &'static str,
        workers: usize,
        max_per_worker: usize,
        max: Duration,
    ) -> Self {
        Self(Workers::start(
            workers,
            max_per_worker,
            max,
            Duration::ZERO,
            |w| {
                let mut conn: Option<HttpConn<TcpStream>> = None;
                move |n| {
                    let path = format!("/load/{w}/{n}");
                    let sent = Instant::now();
                    let result = request_backend(&mut conn, addr, method, &path);
                    Outcome {
                        sent,
                        at: Instant::now(),
                        result,
                    }
                }
            },
        ))
    }

    /// Outcomes so far.
    pub(crate) fn outcomes(&self) -> Vec<Outcome> {
        self.0.outcomes()
    }

    /// Waits for the workers to reach their count or time limit; returns every outcome.
    pub(crate) fn wait(self) -> Vec<Outcome> {
        self.0.wait()
    }

    /// Stops the workers and returns every outcome.
    pub(crate) fn finish(self) -> Vec<Outcome> {
        self.0.finish()
    }
}

/// One GET on a reused connection (opened when missing, dropped after any failure); returns the
/// backend id from `x-backend`, or what went wrong.
pub(crate) fn get_backend(
    conn: &mut Option<HttpConn<TcpStream>>,
    addr: SocketAddr,
    path: &str,
) -> Result<String, String> {
    request_backend(conn, addr, "GET", path)
}

/// Like [`get_backend`] with any method (no body).
pub(crate) fn request_backend(
    conn: &mut Option<HttpConn<TcpStream>>,
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> Result<String, String> {
    if conn.is_none() {
        *conn = Some(HttpConn::tcp(addr).map_err(|e| format!("connect: {e}"))?);
    }
    let c = conn.as_mut().expect("connected");
    match c.request(method, path, &[], b"") {
        Ok(r) if r.status == 200 => {
            if r.header("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"))
            {
                *conn = None;
            }
            Ok(r.header("x-backend").unwrap_or("(none)").to_owned())
        }
        Ok(r) => {
            *conn = None;
            Err(format!("{} {}", r.status, r.text()))
        }
        Err(e) => {
            *conn = None;
            Err(format!("{e}"))
        }
    }
}

/// Failures among outcomes, for messages.
pub(crate) fn failures(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().err().cloned())
        .collect()
}

/// Requests answered by `id`.
pub(crate) fn answered_by(outcomes: &[Outcome], id: &str) -> usize {
    outcomes
        .iter()
        .filter(|o| o.result.as_deref() == Ok(id))
        .count()
}
