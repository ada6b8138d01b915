//! Byte-level tools for adversarial tests, next to the shared support:
//!
//! - [`Tap`]: a unix-socket relay between the proxy and an upstream that records every byte the
//!   proxy sent on every connection, so a test sees exactly what reached "Ironic", not what a
//!   lenient HTTP parser made of it.
//! - [`parse_forwarded`]: a deliberately strict parser for those bytes. What the proxy forwards
//!   must be canonical HTTP/1.1 (CRLF lines, token names, one framing header at most, plain
//!   decimal Content-Length, `chunked` alone), so anything else is reported as an error.
//! - [`Rogue`]: a scripted upstream on a unix socket that answers raw bytes, stalls, closes or
//!   resets, to inject upstream faults.
//!
//! Everything runs on plain threads with bounded waits; dropping a value stops its threads.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------------
// Tap.

/// What the proxy sent on one upstream connection.
#[derive(Clone, Debug, Default)]
pub(crate) struct TapConn {
    pub bytes: Vec<u8>,
    /// The proxy closed (or reset) its side.
    pub closed: bool,
}

#[derive(Default)]
struct TapState {
    conns: Mutex<Vec<TapConn>>,
}

/// A relay from `front` (where the proxy connects) to `back` (the real upstream).
pub(crate) struct Tap {
    pub front: PathBuf,
    state: Arc<TapState>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Tap {
    pub(crate) fn start(front: &Path, back: &Path) -> Self {
        let _ = std::fs::remove_file(front);
        let listener = UnixListener::bind(front)
            .unwrap_or_else(|e| panic!("bind tap {}: {e}", front.display()));
        listener.set_nonblocking(true).expect("nonblocking tap");
        let state = Arc::new(TapState::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, back) = (state.clone(), stop.clone(), back.to_owned());
        let thread = std::thread::spawn(move || {
            while !sp.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => relay(client, &back, &st),
                    // Poll interval: the listener is non-blocking so that the loop sees `stop`.
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Self {
            front: front.to_owned(),
            state,
            stop,
            thread: Some(thread),
        }
    }

    /// `unix:/path` for the proxy config.
    pub(crate) fn address(&self) -> String {
        format!("unix:{}", self.front.display())
    }

    pub(crate) fn conns(&self) -> Vec<TapConn> {
        self.state.conns.lock().expect("tap").clone()
    }

    /// Where every connection's record ends now, to diff against later.
    pub(crate) fn mark(&self) -> Vec<usize> {
        self.conns().iter().map(|c| c.bytes.len()).collect()
    }

    /// Everything sent since `mark`, per connection (connections opened since included), with
    /// each connection's closed flag.
    pub(crate) fn since(&self, mark: &[usize]) -> Vec<TapConn> {
        self.conns()
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let from = mark.get(i).copied().unwrap_or(0).min(c.bytes.len());
                TapConn {
                    bytes: c.bytes[from..].to_vec(),
                    closed: c.closed,
                }
            })
            .filter(|c| !c.bytes.is_empty())
            .collect()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.front);
    }
}

fn relay(client: UnixStream, back: &Path, state: &Arc<TapState>) {
    let _ = client.set_nonblocking(false);
    let Ok(upstream) = UnixStream::connect(back) else {
        return; // the proxy sees the connection close: like a refused upstream
    };
    let index = {
        let mut conns = state.conns.lock().expect("tap");
        conns.push(TapConn::default());
        conns.len() - 1
    };
    let (mut c_read, mut u_write) = (
        client.try_clone().expect("clone"),
        upstream.try_clone().expect("clone"),
    );
    let st = state.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            match c_read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    st.conns.lock().expect("tap")[index]
                        .bytes
                        .extend_from_slice(&buf[..n]);
                    if u_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        st.conns.lock().expect("tap")[index].closed = true;
        let _ = u_write.shutdown(std::net::Shutdown::Write);
    });
    let (mut u_read, mut c_write) = (upstream, client);
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            match u_read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if c_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = c_write.shutdown(std::net::Shutdown::Write);
    });
}

// ------------------------------------------------------------------------------------------------
// Strict parsing of what the proxy forwarded.

/// One request as forwarded, parsed strictly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Wire {
    pub method: String,
    pub target: String,
    pub version: String,
    /// Names lower-cased, values as sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// `length`, `chunked` or `none`.
    pub framing: &'static str,
    /// Trailer fields of a chunked body.
    pub trailers: Vec<(String, String)>,
}

impl Wire {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// What one upstream connection carried: complete requests, then either nothing, an incomplete
/// request that was cut off (`partial`), or bytes that are not canonical HTTP/1.1 (`error`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Forwarded {
    pub requests: Vec<Wire>,
    pub partial: Option<Vec<u8>>,
    pub error: Option<String>,
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Splits a head into CRLF lines; any bare CR or LF is an error.
fn crlf_lines(head: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut lines = Vec::new();
    let mut rest = head;
    while !rest.is_empty() {
        let end = find(rest, b"\r\n").ok_or("line without CRLF")?;
        let line = &rest[..end];
        if line.contains(&b'\r') || line.contains(&b'\n') {
            return Err(format!(
                "bare CR or LF in {:?}",
                String::from_utf8_lossy(line)
            ));
        }
        lines.push(line);
        rest = &rest[end + 2..];
    }
    Ok(lines)
}

fn parse_field(line: &[u8]) -> Result<(String, String), String> {
    let colon = line
        .iter()
        .position(|b| *b == b':')
        .ok_or_else(|| format!("field without colon: {:?}", String::from_utf8_lossy(line)))?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    if name.is_empty() || !name.iter().all(|b| is_tchar(*b)) {
        return Err(format!(
            "bad field name {:?}",
            String::from_utf8_lossy(name)
        ));
    }
    let value = value.trim_ascii();
    if value
        .iter()
        .any(|b| (*b < 0x20 && *b != b'\t') || *b == 0x7f)
    {
        return Err(format!(
            "control byte in value of {}",
            String::from_utf8_lossy(name)
        ));
    }
    Ok((
        String::from_utf8_lossy(name).to_ascii_lowercase(),
        String::from_utf8_lossy(value).into_owned(),
    ))
}

/// Parses one request at the start of `raw`. `Ok(None)`: incomplete.
fn parse_one(raw: &[u8]) -> Result<Option<(Wire, usize)>, String> {
    let Some(head_end) = find(raw, b"\r\n\r\n") else {
        return Ok(None);
    };
    let lines = crlf_lines(&raw[..head_end + 2])?;
    let start = lines.first().ok_or("empty head")?;
    let parts: Vec<&[u8]> = start.split(|b| *b == b' ').collect();
    if parts.len() != 3 || parts.iter().any(|p| p.is_empty()) {
        return Err(format!(
            "bad request line {:?}",
            String::from_utf8_lossy(start)
        ));
    }
    let method = String::from_utf8_lossy(parts[0]).into_owned();
    if !parts[0].iter().all(|b| is_tchar(*b)) {
        return Err(format!("bad method {method:?}"));
    }
    let target = String::from_utf8_lossy(parts[1]).into_owned();
    if !parts[1].iter().all(|b| b.is_ascii_graphic()) {
        return Err(format!("bad target {target:?}"));
    }
    let version = String::from_utf8_lossy(parts[2]).into_owned();
    if version != "HTTP/1.1" {
        return Err(format!("forwarded version {version:?}"));
    }
    let mut headers = Vec::new();
    for line in &lines[1..] {
        if line.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
            return Err("obs-fold".into());
        }
        headers.push(parse_field(line)?);
    }
    let cl: Vec<&String> = headers
        .iter()
        .filter(|(n, _)| n == "content-length")
        .map(|(_, v)| v)
        .collect();
    let te: Vec<&String> = headers
        .iter()
        .filter(|(n, _)| n == "transfer-encoding")
        .map(|(_, v)| v)
        .collect();
    if headers.iter().filter(|(n, _)| n == "host").count() != 1 {
        return Err("not exactly one Host".into());
    }
    let mut pos = head_end + 4;
    let mut trailers = Vec::new();
    let (body, framing) = match (cl.as_slice(), te.as_slice()) {
        ([], []) => (Vec::new(), "none"),
        ([len], []) => {
            if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) || len.len() > 18 {
                return Err(format!("non-canonical Content-Length {len:?}"));
            }
            let n: usize = len.parse().map_err(|_| "Content-Length")?;
            if raw.len() < pos + n {
                return Ok(None);
            }
            let body = raw[pos..pos + n].to_vec();
            pos += n;
            (body, "length")
        }
        ([], [te]) if te.as_str() == "chunked" => {
            let mut body = Vec::new();
            loop {
                let Some(eol) = find(&raw[pos..], b"\r\n") else {
                    return Ok(None);
                };
                let line = &raw[pos..pos + eol];
                if line.is_empty() || line.len() > 16 || !line.iter().all(u8::is_ascii_hexdigit) {
                    return Err(format!(
                        "non-canonical chunk size {:?}",
                        String::from_utf8_lossy(line)
                    ));
                }
                let size = usize::from_str_radix(&String::from_utf8_lossy(line), 16)
                    .map_err(|e| e.to_string())?;
                pos += eol + 2;
                if size == 0 {
                    loop {
                        let Some(eol) = find(&raw[pos..], b"\r\n") else {
                            return Ok(None);
                        };
                        let line = &raw[pos..pos + eol];
                        pos += eol + 2;
                        if line.is_empty() {
                            break;
                        }
                        trailers.push(parse_field(line)?);
                    }
                    break;
                }
                if raw.len() < pos + size + 2 {
                    return Ok(None);
                }
                body.extend_from_slice(&raw[pos..pos + size]);
                if &raw[pos + size..pos + size + 2] != b"\r\n" {
                    return Err("chunk data without CRLF".into());
                }
                pos += size + 2;
            }
            (body, "chunked")
        }
        _ => {
            return Err(format!(
                "ambiguous framing forwarded: Content-Length {cl:?}, Transfer-Encoding {te:?}"
            ))
        }
    };
    Ok(Some((
        Wire {
            method,
            target,
            version,
            headers,
            body,
            framing,
            trailers,
        },
        pos,
    )))
}

/// Parses everything one upstream connection carried.
pub(crate) fn parse_forwarded(raw: &[u8]) -> Forwarded {
    let mut out = Forwarded::default();
    let mut pos = 0;
    while pos < raw.len() {
        match parse_one(&raw[pos..]) {
            Ok(Some((w, used))) => {
                out.requests.push(w);
                pos += used;
            }
            Ok(None) => {
                out.partial = Some(raw[pos..].to_vec());
                break;
            }
            Err(e) => {
                out.error = Some(e);
                break;
            }
        }
    }
    out
}

// ------------------------------------------------------------------------------------------------
// Rogue upstream.

/// What a [`Rogue`] does with one request (its head and body as received).
#[derive(Clone, Debug)]
pub(crate) enum Act {
    /// Writes these bytes and keeps serving the connection.
    Reply(Vec<u8>),
    /// Writes these bytes and closes.
    ReplyClose(Vec<u8>),
    /// Writes these bytes, waits, writes the rest, keeps serving.
    Slow(Vec<u8>, Duration, Vec<u8>),
    /// Closes right after the head, without reading the body: the proxy sees a reset (or, with
    /// nothing left unread, the connection closing before a response).
    Reset,
    /// Sends nothing for this long, then closes.
    Stall(Duration),
    /// Answers right after the head, reads none of the body, holds the connection open this
    /// long, then closes: a server refusing an upload.
    Early(Vec<u8>, Duration),
}

/// One request a [`Rogue`] received.
#[derive(Clone, Debug)]
pub(crate) struct RogueHit {
    pub conn: usize,
    pub head: String,
    pub body: Vec<u8>,
}

impl RogueHit {
    /// The request target.
    pub(crate) fn target(&self) -> &str {
        self.head.split(' ').nth(1).unwrap_or("")
    }
}

pub(crate) type Script = Arc<dyn Fn(&RogueHit) -> Act + Send + Sync>;

/// A raw upstream on a unix socket that answers as scripted.
pub(crate) struct Rogue {
    pub path: PathBuf,
    hits: Arc<Mutex<Vec<RogueHit>>>,
    conns: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Rogue {
    pub(crate) fn start(path: &Path, script: Script) -> Self {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)
            .unwrap_or_else(|e| panic!("bind rogue {}: {e}", path.display()));
        listener.set_nonblocking(true).expect("nonblocking");
        let hits = Arc::new(Mutex::new(Vec::new()));
        let conns = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, c, s) = (hits.clone(), conns.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let id = c.fetch_add(1, Ordering::SeqCst) + 1;
                        let (h, script, s) = (h.clone(), script.clone(), s.clone());
                        std::thread::spawn(move || rogue_conn(stream, id, &h, &script, &s));
                    }
                    // Poll interval: the listener is non-blocking so that the loop sees `stop`.
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Self {
            path: path.to_owned(),
            hits,
            conns,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn address(&self) -> String {
        format!("unix:{}", self.path.display())
    }

    pub(crate) fn hits(&self) -> Vec<RogueHit> {
        self.hits.lock().expect("hits").clone()
    }

    pub(crate) fn connections(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }
}

impl Drop for Rogue {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads bytes into `buf` until `done(buf)` says how much makes the item, the peer closes, or
/// the stop flag or a 30 s deadline passes.
fn read_until(
    s: &mut UnixStream,
    buf: &mut Vec<u8>,
    stop: &AtomicBool,
    done: impl Fn(&[u8]) -> Option<usize>,
) -> Option<usize> {
    let mut tmp = [0u8; 8192];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(n) = done(buf) {
            return Some(n);
        }
        if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
            return None;
        }
        match s.read(&mut tmp) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return None,
        }
    }
}

fn rogue_conn(
    mut s: UnixStream,
    id: usize,
    hits: &Mutex<Vec<RogueHit>>,
    script: &Script,
    stop: &AtomicBool,
) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = Vec::new();
    loop {
        // The head first: the script decides on it, before the body is read.
        let Some(end) = read_until(&mut s, &mut buf, stop, |b| find(b, b"\r\n\r\n")) else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let mut hit = RogueHit {
            conn: id,
            head,
            body: Vec::new(),
        };
        let act = script(&hit);
        if matches!(act, Act::Reset) {
            hits.lock().expect("hits").push(hit);
            // Whatever of the body is still unread makes this close a reset for the peer.
            return;
        }
        if let Act::Early(answer, hold) = act {
            hits.lock().expect("hits").push(hit);
            let _ = s.write_all(&answer);
            // Exercised: an upstream that stops reading after answering, as scripted.
            std::thread::sleep(hold);
            return;
        }
        let lower = hit.head.to_ascii_lowercase();
        let len: usize = lower
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim() == "content-length")
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0);
        let chunked = lower.contains("transfer-encoding: chunked");
        let Some(n) = read_until(&mut s, &mut buf, stop, |b| {
            if chunked {
                find(b, b"0\r\n\r\n").map(|p| p + 5)
            } else {
                (b.len() >= len).then_some(len)
            }
        }) else {
            return;
        };
        hit.body = buf.drain(..n).collect();
        hits.lock().expect("hits").push(hit);
        match act {
            Act::Reply(b) => {
                if s.write_all(&b).is_err() {
                    return;
                }
            }
            Act::ReplyClose(b) => {
                let _ = s.write_all(&b);
                let _ = s.shutdown(std::net::Shutdown::Both);
                return;
            }
            Act::Slow(a, pause, b) => {
                if s.write_all(&a).is_err() {
                    return;
                }
                // Exercised: a reply split by a pause, as scripted.
                std::thread::sleep(pause);
                if s.write_all(&b).is_err() {
                    return;
                }
            }
            Act::Reset => return,
            Act::Stall(d) => {
                // Exercised: a stalled upstream, as scripted.
                std::thread::sleep(d);
                return;
            }
            Act::Early(..) => unreachable!("answered before the body"),
        }
    }
}

/// A complete response with a Content-Length body.
pub(crate) fn response(status: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for h in headers {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}
