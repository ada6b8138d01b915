//! The access line writer (`logging/access.rs`, which replaced `tracing_subscriber`'s formatter
//! for access lines) against that formatter, on arbitrary field values: for the text format and
//! the flattened JSON format, the bytes after the timestamp are those `tracing_subscriber`
//! writes for the same event (the timestamps are taken at different instants: their lengths
//! are compared), and the JSON line parses with `serde_json` back to exactly the values given,
//! under the keys `tracing_subscriber` uses.
//!
//! Input: a header of fixed-size fields (flags, status, bytes, duration's bits, the client's
//! address and port), then the string fields separated by 0xff, lossily decoded as UTF-8 (every
//! escape and multi-byte character reaches both writers).
#![no_main]

use ironic_proxy::{AccessFormat, AccessLine};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use tracing::Dispatch;

/// What a subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Formatters {
    text: Dispatch,
    json: Dispatch,
    out: Captured,
}

/// `tracing_subscriber`'s formatters as the proxy configured them before its own writer: no
/// colours, the default timer; JSON flattened.
fn formatters() -> &'static Formatters {
    static F: OnceLock<Formatters> = OnceLock::new();
    F.get_or_init(|| {
        let out = Captured::default();
        let (a, b) = (out.clone(), out.clone());
        let text = tracing_subscriber::fmt()
            .with_writer(move || a.clone())
            .with_ansi(false)
            .finish();
        let json = tracing_subscriber::fmt()
            .with_writer(move || b.clone())
            .with_ansi(false)
            .json()
            .flatten_event(true)
            .finish();
        Formatters {
            text: Dispatch::new(text),
            json: Dispatch::new(json),
            out,
        }
    })
}

/// `tracing_subscriber`'s bytes for the line's event in `format`.
fn standard(line: &AccessLine<'_>, format: AccessFormat) -> Vec<u8> {
    let f = formatters();
    let dispatch = match format {
        AccessFormat::Text => &f.text,
        AccessFormat::Json => &f.json,
    };
    tracing::dispatcher::with_default(dispatch, || line.to_event());
    std::mem::take(&mut *f.out.0.lock().expect("lock"))
}

/// The line without its timestamp: from the first `Z` (the timestamp's end) on, and where it was.
fn after_timestamp(line: &[u8]) -> (usize, &[u8]) {
    let at = line
        .iter()
        .position(|&b| b == b'Z')
        .expect("a timestamp ending in Z");
    (at, &line[at..])
}

fn take<const N: usize>(data: &mut &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    *data = &data[n..];
    out
}

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let [flags] = take::<1>(&mut rest);
    let status = u16::from_le_bytes(take(&mut rest));
    let bytes = u64::from_le_bytes(take(&mut rest));
    let duration_ms = f64::from_bits(u64::from_le_bytes(take(&mut rest)));
    let ip = take::<16>(&mut rest);
    let port = u16::from_le_bytes(take(&mut rest));
    let client = match flags & 0b1100 {
        0 => None,
        0b0100 => Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
            port,
        )),
        _ => Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
    };
    let mut strings = rest
        .split(|&b| b == 0xff)
        .map(|s| String::from_utf8_lossy(s).into_owned());
    let mut next = || strings.next().unwrap_or_default();
    let (listener, identity, method, path) = (next(), next(), next(), next());
    let (user_agent, upstream, rpc_method, blame) = (next(), next(), next(), next());
    let line = AccessLine {
        listener: &listener,
        client,
        identity: &identity,
        method: &method,
        path: &path,
        path_cut: flags & 1 != 0,
        user_agent: &user_agent,
        status,
        bytes,
        duration_ms,
        upstream: &upstream,
        rpc_method: &rpc_method,
        blame: &blame,
        complete: flags & 2 != 0,
    };

    for format in [AccessFormat::Text, AccessFormat::Json] {
        let ours = line.to_bytes(format);
        let theirs = standard(&line, format);
        let (ours_at, ours_rest) = after_timestamp(&ours);
        let (theirs_at, theirs_rest) = after_timestamp(&theirs);
        assert_eq!(
            ours_at, theirs_at,
            "{format:?}: timestamps of different lengths"
        );
        assert!(
            ours_rest == theirs_rest,
            "{format:?}: the line differs from tracing_subscriber's\n ours:   {:?}\n theirs: {:?}",
            String::from_utf8_lossy(ours_rest),
            String::from_utf8_lossy(theirs_rest)
        );
        if format == AccessFormat::Json {
            let parsed: Value = serde_json::from_slice(&ours).expect("our JSON line parses");
            let mut full_path = path.clone();
            if line.path_cut {
                full_path.push('…');
            }
            let client = client.map_or_else(|| "unix".to_owned(), |c| c.to_string());
            // The duration as serde_json writes and reads an f64 (null when not finite), so
            // that the comparison does not depend on the parser's last-digit rounding.
            let duration: Value =
                serde_json::from_str(&serde_json::to_string(&duration_ms).expect("f64"))
                    .expect("serde_json's own f64");
            let mut expected = json!({
                "level": "INFO",
                "listener": listener,
                "client": client,
                "identity": identity,
                "method": method,
                "path": full_path,
                "user_agent": user_agent,
                "status": status,
                "bytes": bytes,
                "duration_ms": duration,
                "upstream": upstream,
                "rpc_method": rpc_method,
                "blame": blame,
                "complete": line.complete,
                "target": "access",
            });
            let timestamp = parsed.get("timestamp").cloned().expect("a timestamp");
            assert!(timestamp.is_string(), "the timestamp is a string");
            expected["timestamp"] = timestamp;
            assert_eq!(
                parsed, expected,
                "the JSON line does not parse back to its values"
            );
        }
    }
});
