//! The access line written straight into the log buffer, without `tracing`'s field visitor.
//!
//! An access line has a fixed set of fields whose types are known. Through `tracing` each field
//! goes through a `dyn Visit` call, most of them through `fmt` (`%` values), and the JSON ones
//! through `serde_json` per field; the timestamp is formatted from scratch per line, all of it
//! on the event loop of every request. Here the binary installs [`Direct`] once the subscriber is set
//! ([`super::Stderr::write_access_lines`]) and [`Line::log`] appends the line to the log buffer
//! itself: strings escaped in one pass, integers without `fmt`, the timestamp's date and time to
//! the second cached.
//!
//! The bytes are those `tracing_subscriber` writes for the same event (its text format, and its
//! flattened JSON format, both with [`super::Timestamp`]); the unit tests compare them. Whether
//! the line is written at all is still `tracing`'s decision (`event_enabled!` on the `access`
//! target, so `RUST_LOG=...,access=info` and `access=off` work as before), and it enters the
//! same buffer under the same lock as every other line, so the order of lines is kept. Without
//! [`Direct`] (tests, a terminal with colours, an event inside a span), the line is an ordinary
//! `tracing` event with the same fields.

use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::sync::OnceLock;

/// The fields of one access line (`proxy::log`), in the order they are written. Public (hidden)
/// for the `access_line` fuzz target only.
#[doc(hidden)]
pub struct Line<'a> {
    pub listener: &'a str,
    /// `None` on a unix socket listener: written as `unix`.
    pub client: Option<SocketAddr>,
    pub identity: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    /// The path was cut: `…` follows it.
    pub path_cut: bool,
    /// The request's `User-Agent`, bounded as `proxy::log` says; `-` when it sent none.
    pub user_agent: &'a str,
    pub status: u16,
    pub bytes: u64,
    pub duration_ms: f64,
    pub upstream: &'a str,
    pub rpc_method: &'a str,
    pub blame: &'a str,
    pub complete: bool,
}

/// For the `access_line` fuzz target, which compares the two (not part of the proxy's
/// interface).
#[doc(hidden)]
impl Line<'_> {
    /// The line as the proxy writes it in `format`, with its newline.
    pub fn to_bytes(&self, format: Format) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(format, &mut out, &mut Clock::default());
        out
    }

    /// The same line as the `tracing` event it replaces, for the caller's subscriber.
    pub fn to_event(&self) {
        self.event();
    }
}

/// How access lines are written once the binary has set its subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `tracing_subscriber`'s default text format, no colours.
    Text,
    /// Its flattened JSON format (`--log-format json`).
    Json,
}

/// The sink and format of the global subscriber; set once, by the binary.
pub(super) struct Direct {
    pub(super) sink: super::Stderr,
    pub(super) format: Format,
}

pub(super) static DIRECT: OnceLock<Direct> = OnceLock::new();

impl Line<'_> {
    /// Logs the line: the caller has checked that the `access` target is enabled at INFO.
    pub(crate) fn log(&self) {
        match DIRECT.get() {
            Some(direct) if !in_span() => direct
                .sink
                .append_access(|buf, clock| self.write(direct.format, buf, clock)),
            _ => self.event(),
        }
    }

    /// The same line as a `tracing` event (the fields of `proxy::log` before this module).
    pub(super) fn event(&self) {
        tracing::info!(
            target: "access",
            listener = %self.listener,
            client = %Client(self.client),
            identity = self.identity,
            method = %self.method,
            path = %Path(self.path, self.path_cut),
            user_agent = self.user_agent,
            status = self.status,
            bytes = self.bytes,
            duration_ms = self.duration_ms,
            upstream = self.upstream,
            rpc_method = self.rpc_method,
            blame = self.blame,
            complete = self.complete,
        );
    }

    /// Appends the line, with its newline, in `format`.
    pub(super) fn write(&self, format: Format, out: &mut Vec<u8>, clock: &mut Clock) {
        match format {
            Format::Text => self.text(out, clock),
            Format::Json => self.json(out, clock),
        }
    }

    /// `tracing_subscriber`'s `Format<Full>`: `{timestamp}  INFO access: name=value ...`, where
    /// `%` values are written as they are and `&str` values in Rust's `Debug` quoting.
    fn text(&self, out: &mut Vec<u8>, clock: &mut Clock) {
        clock.write(out);
        out.extend_from_slice(b"  INFO access: listener=");
        out.extend_from_slice(self.listener.as_bytes());
        out.extend_from_slice(b" client=");
        client(out, self.client);
        out.extend_from_slice(b" identity=");
        debug_str(out, self.identity);
        out.extend_from_slice(b" method=");
        out.extend_from_slice(self.method.as_bytes());
        out.extend_from_slice(b" path=");
        out.extend_from_slice(self.path.as_bytes());
        if self.path_cut {
            out.extend_from_slice("…".as_bytes());
        }
        out.extend_from_slice(b" user_agent=");
        debug_str(out, self.user_agent);
        out.extend_from_slice(b" status=");
        integer(out, self.status);
        out.extend_from_slice(b" bytes=");
        integer(out, self.bytes);
        out.extend_from_slice(b" duration_ms=");
        // `Debug` of an f64 (`0.1`, `1e-7`, `NaN`): rare enough digits to leave to `fmt`.
        let _ = write!(Utf8(out), "{:?}", self.duration_ms);
        out.extend_from_slice(b" upstream=");
        debug_str(out, self.upstream);
        out.extend_from_slice(b" rpc_method=");
        debug_str(out, self.rpc_method);
        out.extend_from_slice(b" blame=");
        debug_str(out, self.blame);
        out.extend_from_slice(if self.complete {
            b" complete=true\n"
        } else {
            b" complete=false\n"
        });
    }

    /// `tracing_subscriber`'s flattened JSON: timestamp, level, the fields, target.
    fn json(&self, out: &mut Vec<u8>, clock: &mut Clock) {
        out.extend_from_slice(b"{\"timestamp\":\"");
        clock.write(out);
        out.extend_from_slice(b"\",\"level\":\"INFO\",\"listener\":\"");
        json_str(out, self.listener);
        // An address as text has no character JSON escapes.
        out.extend_from_slice(b"\",\"client\":\"");
        client(out, self.client);
        out.extend_from_slice(b"\",\"identity\":\"");
        json_str(out, self.identity);
        out.extend_from_slice(b"\",\"method\":\"");
        json_str(out, self.method);
        out.extend_from_slice(b"\",\"path\":\"");
        json_str(out, self.path);
        if self.path_cut {
            out.extend_from_slice("…".as_bytes());
        }
        out.extend_from_slice(b"\",\"user_agent\":\"");
        json_str(out, self.user_agent);
        out.extend_from_slice(b"\",\"status\":");
        integer(out, self.status);
        out.extend_from_slice(b",\"bytes\":");
        integer(out, self.bytes);
        out.extend_from_slice(b",\"duration_ms\":");
        // serde_json's own float writer (`null` for NaN and infinities).
        let _ = serde_json::to_writer(&mut *out, &self.duration_ms);
        out.extend_from_slice(b",\"upstream\":\"");
        json_str(out, self.upstream);
        out.extend_from_slice(b"\",\"rpc_method\":\"");
        json_str(out, self.rpc_method);
        out.extend_from_slice(b"\",\"blame\":\"");
        json_str(out, self.blame);
        out.extend_from_slice(if self.complete {
            b"\",\"complete\":true,\"target\":\"access\"}\n"
        } else {
            b"\",\"complete\":false,\"target\":\"access\"}\n"
        });
    }
}

/// Whether the thread is inside a span: its events carry the span's fields, which only the
/// standard formatters write.
pub(super) fn in_span() -> bool {
    tracing::dispatcher::get_default(|d| d.current_span().id().is_some())
}

fn integer(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// The client as `SocketAddr`'s `Display` writes it; IPv4 without `fmt`.
fn client(out: &mut Vec<u8>, client: Option<SocketAddr>) {
    match client {
        Some(SocketAddr::V4(v4)) => {
            let [a, b, c, d] = v4.ip().octets();
            integer(out, a);
            for octet in [b, c, d] {
                out.push(b'.');
                integer(out, octet);
            }
            out.push(b':');
            integer(out, v4.port());
        }
        Some(v6) => {
            let _ = write!(Utf8(out), "{v6}");
        }
        None => out.extend_from_slice(b"unix"),
    }
}

/// `{:?}` of a `&str`: quoted, and as it is when every byte is printable ASCII other than `"`
/// and `\` (the common case); otherwise Rust's own escaping.
pub(super) fn debug_str(out: &mut Vec<u8>, s: &str) {
    let chunks = s.as_bytes().chunks_exact(8);
    let rest = chunks.remainder();
    let plain = chunks
        .map(|c| <[u8; 8]>::try_from(c).map_or(u64::MAX, u64::from_le_bytes))
        .all(|x| !special(x, true))
        && rest
            .iter()
            .all(|&b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\');
    if plain {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = write!(Utf8(out), "{s:?}");
    }
}

/// The contents of a JSON string as `serde_json` writes them (`format_escaped_str_contents`):
/// `"` and `\` escaped, the control characters below 0x20 as `\b \t \n \f \r` or `\u00xx`
/// (lowercase hex), everything else, DEL and non-ASCII included, as it is. One pass, eight
/// bytes at a time while none needs anything, copying runs of bytes that need nothing.
pub(super) fn json_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(chunk) = bytes
            .get(i..i + 8)
            .and_then(|c| <[u8; 8]>::try_from(c).ok())
        {
            if !special(u64::from_le_bytes(chunk), false) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        i += 1;
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            b'\t' => b't',
            b'\n' => b'n',
            0x0c => b'f',
            b'\r' => b'r',
            0..=0x1f => b'u',
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i - 1]);
        start = i;
        if short == b'u' {
            let (hi, lo) = (HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]);
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', hi, lo]);
        } else {
            out.extend_from_slice(&[b'\\', short]);
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Whether any of the eight bytes in `x` is a control character below 0x20, `"` or `\`, or,
/// with `non_ascii`, 0x7f or above. Exact as a yes or no (the per-byte flags of these bit
/// tricks can be wrong only next to a byte that is flagged rightly).
pub(super) fn special(x: u64, non_ascii: bool) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let below_space = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
    let quote = zero_byte(x ^ (ONES * u64::from(b'"')));
    let backslash = zero_byte(x ^ (ONES * u64::from(b'\\')));
    let high = if non_ascii {
        (x | x.wrapping_add(ONES)) & HIGH
    } else {
        0
    };
    below_space | quote | backslash | high != 0
}

/// `fmt` into the line buffer (only whole `str`s are written, so it stays UTF-8).
struct Utf8<'a>(&'a mut Vec<u8>);

impl fmt::Write for Utf8<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// The client for the `tracing` event.
pub(super) struct Client(pub(super) Option<SocketAddr>);

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(peer) => fmt::Display::fmt(&peer, f),
            None => f.write_str("unix"),
        }
    }
}

/// The path for the `tracing` event, with `…` when it was cut.
struct Path<'a>(&'a str, bool);

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)?;
        if self.1 {
            f.write_str("…")?;
        }
        Ok(())
    }
}

/// `tracing_subscriber::fmt::time::SystemTime`'s timestamp (`2026-11-30T14:20:00.123456Z`, UTC,
/// microseconds truncated), with the text up to the second kept until the second changes.
#[derive(Default)]
pub(super) struct Clock {
    /// Seconds since the epoch that `prefix` shows; 0 before the first line.
    second: u64,
    /// `YYYY-MM-DDTHH:MM:SS.`
    prefix: [u8; 20],
}

impl Clock {
    pub(super) fn write(&mut self, out: &mut Vec<u8>) {
        self.write_at(std::time::SystemTime::now(), out);
    }

    pub(super) fn write_at(&mut self, now: std::time::SystemTime, out: &mut Vec<u8>) {
        let Ok(since) = now.duration_since(std::time::UNIX_EPOCH) else {
            return Self::standard(out);
        };
        let second = since.as_secs();
        if second != self.second || second == 0 {
            let Some(prefix) = prefix(second) else {
                return Self::standard(out);
            };
            self.prefix = prefix;
            self.second = second;
        }
        out.extend_from_slice(&self.prefix);
        let mut micros = since.subsec_micros();
        let mut digits = [b'0'; 6];
        for digit in digits.iter_mut().rev() {
            *digit = b'0' + (micros % 10) as u8;
            micros /= 10;
        }
        out.extend_from_slice(&digits);
        out.push(b'Z');
    }

    /// Before 1970 or after 9999: `tracing_subscriber`'s own formatting.
    fn standard(out: &mut Vec<u8>) {
        use tracing_subscriber::fmt::time::FormatTime as _;
        let mut text = String::new();
        let _ = super::Timestamp
            .format_time(&mut tracing_subscriber::fmt::format::Writer::new(&mut text));
        out.extend_from_slice(text.as_bytes());
    }
}

/// `YYYY-MM-DDTHH:MM:SS.` of a time `second`s after the epoch, for years up to 9999.
pub(super) fn prefix(second: u64) -> Option<[u8; 20]> {
    let of_day = second % 86_400;
    // Once a second (the prefix is kept), so the `time` crate's calendar, not one of our own.
    let date = time::OffsetDateTime::from_unix_timestamp(i64::try_from(second).ok()?)
        .ok()?
        .date();
    let (year, month, day) = (date.year(), u8::from(date.month()), date.day());
    let year = u16::try_from(year).ok().filter(|y| *y <= 9999)?;
    let mut p = *b"0000-00-00T00:00:00.";
    let two = |p: &mut [u8; 20], at: usize, n: u64| {
        p[at] = b'0' + (n / 10) as u8;
        p[at + 1] = b'0' + (n % 10) as u8;
    };
    let y = u64::from(year);
    two(&mut p, 0, y / 100);
    two(&mut p, 2, y % 100);
    two(&mut p, 5, u64::from(month));
    two(&mut p, 8, u64::from(day));
    two(&mut p, 11, of_day / 3600);
    two(&mut p, 14, of_day / 60 % 60);
    two(&mut p, 17, of_day % 60);
    Some(p)
}
