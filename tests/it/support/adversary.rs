//! The rig every adversarial test runs on: the real proxy with a `none`, a `server` and a
//! `mutual` listener in front of one recording upstream, reached through a [`Tap`] that keeps
//! the exact bytes the proxy forwarded; raw-byte cases sent over plain TCP or rustls; and the
//! checks every case ends with: what the client got, what reached the upstream (parsed
//! strictly), and a normal request still served afterwards.
//!

use crate::support::wire::{parse_forwarded, Tap, Wire};
use crate::support::{self, tls_client_config, HttpConn, Leaf, Proxy, ProxyBuilder, Sandbox, Tls};
use crate::support::{poll_until, Upstream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which listener a case goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `tls = "none"`, plain TCP.
    Plain,
    /// `tls = "server"` over rustls, HTTP/1.1 by ALPN.
    Server,
    /// `tls = "mutual"` over rustls with a valid client certificate, HTTP/1.1 by ALPN.
    Mutual,
}

pub(crate) const ALL: [Target; 3] = [Target::Plain, Target::Server, Target::Mutual];

impl Target {
    pub(crate) fn listener(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Server => "api",
            Self::Mutual => "rpc",
        }
    }
}

/// What a case's client saw.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub bytes: Vec<u8>,
    pub statuses: Vec<u16>,
    pub closed: bool,
}

/// What the upstream got during a case.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reached {
    pub requests: Vec<Wire>,
    /// Requests cut off before they were complete (aborted by the proxy).
    pub partial: usize,
    /// Bytes that were not canonical HTTP/1.1.
    pub errors: Vec<String>,
}

pub(crate) struct Rig {
    pub sb: Sandbox,
    pub up: Upstream,
    pub tap: Tap,
    pub proxy: Proxy,
    pub client: Leaf,
    server_cfg: Arc<rustls::ClientConfig>,
    mutual_cfg: Arc<rustls::ClientConfig>,
    normal: std::sync::atomic::AtomicUsize,
}

impl Rig {
    /// The three listeners; `tune` sets limits.
    pub(crate) fn new(tune: impl FnOnce(ProxyBuilder) -> ProxyBuilder) -> Self {
        let sb = Sandbox::new();
        let up = Upstream::start(&sb.socket("ironic"));
        let tap = Tap::start(&sb.socket("tap"), &up.path);
        let builder = sb
            .proxy()
            .listener("plain", Tls::None, &tap.address())
            .listener("api", Tls::Server, &tap.address())
            .listener("rpc", Tls::Mutual, &tap.address());
        let proxy = tune(builder).start();
        let client = sb.ca.client_leaf(&["conductor-0.ironic.test"]);
        let server_cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
        let mutual_cfg = tls_client_config(&sb.ca.pem, Some(&client), &[b"http/1.1"]);
        Self {
            sb,
            up,
            tap,
            proxy,
            client,
            server_cfg,
            mutual_cfg,
            normal: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub(crate) fn addr(&self, t: Target) -> std::net::SocketAddr {
        self.proxy.addr(t.listener())
    }

    pub(crate) fn tls_config(&self, t: Target) -> Arc<rustls::ClientConfig> {
        match t {
            Target::Mutual => self.mutual_cfg.clone(),
            _ => self.server_cfg.clone(),
        }
    }

    /// Opens a connection of the target's kind and hands it to `f`.
    pub(crate) fn with_conn<R>(&self, t: Target, f: impl FnOnce(&mut dyn Conn) -> R) -> R {
        match t {
            Target::Plain => {
                let mut c = HttpConn::tcp(self.addr(t)).expect("connect");
                f(&mut c)
            }
            _ => {
                let mut c = HttpConn::tls(self.addr(t), self.tls_config(t)).expect("TLS connect");
                f(&mut c)
            }
        }
    }

    /// Sends `raw` on a new connection (write errors ignored: the proxy may close early) and
    /// collects everything until the proxy closes or `quiet` passes without a byte. When nothing
    /// at all came within `quiet` and the connection is open, it waits up to 2 s more for a
    /// first byte: on a starved machine an answer can take longer than `quiet` (seen in CI: a
    /// case served upstream in 1 ms whose answer the client never waited for). Only a case
    /// that leaves the connection open and silent pays for that wait.
    pub(crate) fn exchange(&self, t: Target, raw: &[u8], quiet: Duration) -> Seen {
        self.with_conn(t, |c| {
            let _ = c.send_raw(raw);
            let (mut bytes, mut closed) = c.drain_for(quiet);
            if bytes.is_empty() && !closed {
                (bytes, closed) = c.drain_for(Duration::from_secs(2));
            }
            Seen {
                statuses: statuses(&bytes),
                bytes,
                closed,
            }
        })
    }

    /// What reached the upstream since `mark`, once the tap has been quiet for 100 ms.
    pub(crate) fn reached_since(&self, mark: &[usize]) -> Reached {
        let mut last = self.tap.since(mark);
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            // Quiescence: what reached the upstream is read once the tap stays quiet.
            std::thread::sleep(Duration::from_millis(100));
            let now = self.tap.since(mark);
            let same = now.len() == last.len()
                && now
                    .iter()
                    .zip(&last)
                    .all(|(a, b)| a.bytes.len() == b.bytes.len());
            last = now;
            if same || Instant::now() > deadline {
                break;
            }
        }
        let mut r = Reached::default();
        for conn in last {
            let f = parse_forwarded(&conn.bytes);
            r.requests.extend(f.requests);
            if f.partial.is_some() {
                r.partial += 1;
            }
            if let Some(e) = f.error {
                r.errors.push(e);
            }
        }
        r
    }

    /// A normal GET on a new connection: must get 200 and reach the upstream exactly once.
    pub(crate) fn normal_request(&self, t: Target) -> Result<(), String> {
        let n = self
            .normal
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = format!("/normal/{}/{n}", t.listener());
        let mark = self.tap.mark();
        let r = self
            .with_conn(t, |c| c.get_path(&path))
            .map_err(|e| format!("normal request on {t:?}: {e}"))?;
        if r.0 != 200 {
            return Err(format!("normal request on {t:?}: status {} {}", r.0, r.1));
        }
        let reached = self.reached_since(&mark);
        let got: Vec<(&str, &str)> = reached
            .requests
            .iter()
            .map(|w| (w.method.as_str(), w.target.as_str()))
            .collect();
        if got != [("GET", path.as_str())] || reached.partial > 0 || !reached.errors.is_empty() {
            return Err(format!(
                "normal request on {t:?}: upstream got {got:?} (partial {}, errors {:?})",
                reached.partial, reached.errors
            ));
        }
        Ok(())
    }
}

/// A client connection of either kind, object-safe.
pub(crate) trait Conn {
    fn send_raw(&mut self, raw: &[u8]) -> std::io::Result<()>;
    fn drain_for(&mut self, quiet: Duration) -> (Vec<u8>, bool);
    /// GET `path`; (status, body text).
    fn get_path(&mut self, path: &str) -> std::io::Result<(u16, String)>;
}

impl<S: support::Stream> Conn for HttpConn<S> {
    fn send_raw(&mut self, raw: &[u8]) -> std::io::Result<()> {
        // In pieces, so that a proxy closing early is noticed between them.
        for piece in raw.chunks(64 * 1024) {
            self.send(piece)?;
        }
        Ok(())
    }

    fn drain_for(&mut self, quiet: Duration) -> (Vec<u8>, bool) {
        self.drain(quiet)
    }

    fn get_path(&mut self, path: &str) -> std::io::Result<(u16, String)> {
        let r = self.get(path)?;
        Ok((r.status, r.text()))
    }
}

/// Status codes of the HTTP/1.x responses in a byte stream, parsed in sequence (status line,
/// fields, then a body framed by Content-Length or chunked; none for 1xx, 204 and 304). Parsing
/// stops at the first thing that is not a response.
pub(crate) fn statuses(raw: &[u8]) -> Vec<u16> {
    let mut out = Vec::new();
    let mut rest = raw;
    while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let Some(code) = status_line
            .strip_prefix("HTTP/1.")
            .and_then(|s| s.get(2..5))
            .and_then(|s| s.parse::<u16>().ok())
        else {
            break;
        };
        out.push(code);
        rest = &rest[end + 4..];
        if code / 100 == 1 || code == 204 || code == 304 {
            continue;
        }
        let field = |name: &str| {
            head.split("\r\n")
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim().to_owned())
        };
        if field("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            loop {
                let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
                    return out;
                };
                let size = usize::from_str_radix(
                    String::from_utf8_lossy(&rest[..eol])
                        .split(';')
                        .next()
                        .unwrap_or(""),
                    16,
                );
                let Ok(size) = size else { return out };
                rest = &rest[eol + 2..];
                if size == 0 {
                    // No trailers from the proxy: the final CRLF.
                    rest = rest.get(2..).unwrap_or_default();
                    break;
                }
                rest = rest.get(size + 2..).unwrap_or_default();
            }
        } else if let Some(len) = field("content-length").and_then(|v| v.parse::<usize>().ok()) {
            rest = rest.get(len..).unwrap_or_default();
        } else {
            break;
        }
    }
    out
}

/// Waits until the proxy process still answers `/healthz`.
pub(crate) fn alive(proxy: &Proxy) -> bool {
    poll_until(Duration::from_secs(5), || {
        proxy
            .admin_get("/healthz")
            .ok()
            .filter(|r| r.status == 200)
            .map(|_| ())
    })
    .is_some()
}
