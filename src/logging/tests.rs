use super::access::{self, Clock, Format};
use super::{AccessJson, Flusher, Stderr, Timestamp, CAPACITY, INTERVAL};
use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

/// What reached "stderr".
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A sink whose flusher thread never starts: only a full buffer, another line or `flush` write.
fn without_timer(out: &Captured) -> Stderr {
    let sink = Stderr::to(Box::new(out.clone()));
    sink.0.lock().flusher = Flusher::Busy;
    sink
}

fn json_subscriber(sink: &Stderr) -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::fmt()
        .with_writer(sink.clone())
        .with_ansi(false)
        .json()
        .flatten_event(true)
        .finish()
}

fn access(n: usize) {
    tracing::info!(target: "access", listener = "api", path = %format_args!("/v1/nodes/{n}"), n);
}

#[test]
fn access_lines_wait_and_other_lines_write_them_first_in_order() {
    let out = Captured::default();
    let sink = without_timer(&out);
    tracing::subscriber::with_default(json_subscriber(&sink), || {
        access(0);
        access(1);
        let early = out.lines();
        tracing::warn!(upstream = "unix:/x", "upstream refused");
        let lines = out.lines();
        assert!(early.is_empty(), "buffered, not written: {early:?}");
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains(r#""n":0"#), "{lines:?}");
        assert!(lines[1].contains(r#""n":1"#), "{lines:?}");
        assert!(lines[2].contains("upstream refused"), "{lines:?}");
    });
}

#[test]
fn a_full_buffer_is_written_whole_lines_only() {
    let out = Captured::default();
    let sink = without_timer(&out);
    tracing::subscriber::with_default(json_subscriber(&sink), || {
        let mut n = 0;
        while out.lines().is_empty() {
            access(n);
            n += 1;
            assert!(n < CAPACITY, "nothing written after {n} lines");
        }
        let written = out.lines();
        let bytes: usize = written.iter().map(|l| l.len() + 1).sum();
        assert!(bytes >= CAPACITY, "written at {bytes} bytes");
        // Whole lines, the oldest first, none skipped.
        for (i, l) in written.iter().enumerate() {
            assert!(
                l.ends_with(&format!(r#""n":{i},"target":"access"}}"#)),
                "{l}"
            );
        }
        assert_eq!(written.len(), n, "the line that filled it is written too");
    });
}

#[test]
fn the_flusher_writes_a_lone_line_after_the_interval_and_the_guard_writes_the_rest() {
    let out = Captured::default();
    let sink = Stderr::to(Box::new(out.clone()));
    tracing::subscriber::with_default(json_subscriber(&sink), || {
        let t0 = Instant::now();
        access(7);
        while out.lines().is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(10), "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(t0.elapsed() >= INTERVAL, "written before the interval");
        assert_eq!(out.lines().len(), 1);
        // The flusher is idle again; a second burst wakes it.
        access(8);
        access(9);
        {
            let _guard = sink.flush_on_drop();
        }
        let lines = out.lines();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[2].contains(r#""n":9"#), "{lines:?}");
    });
}

#[test]
fn text_lines_are_the_same_bytes_as_unbuffered() {
    // The same events through the plain stderr-like writer and through the sink.
    let direct = Captured::default();
    let d = direct.clone();
    let plain = tracing_subscriber::fmt()
        .with_writer(move || d.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    let out = Captured::default();
    let sink = Stderr::to(Box::new(out.clone()));
    let buffered = tracing_subscriber::fmt()
        .with_writer(sink.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    let events = || {
        access(1);
        tracing::error!(e = "x", "boom");
        access(2);
    };
    tracing::subscriber::with_default(plain, events);
    tracing::subscriber::with_default(buffered, events);
    sink.flush();
    assert_eq!(direct.lines(), out.lines());
    assert_eq!(out.lines().len(), 3);
}

#[test]
fn the_timestamp_is_tracing_subscribers_in_one_write() {
    /// Counts the writes it gets.
    #[derive(Default)]
    struct Writes(String, usize);
    impl std::fmt::Write for Writes {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.1 += 1;
            self.0.push_str(s);
            Ok(())
        }
    }
    let (mut ours, mut theirs) = (Writes::default(), Writes::default());
    SystemTime
        .format_time(&mut Writer::new(&mut theirs))
        .unwrap();
    Timestamp.format_time(&mut Writer::new(&mut ours)).unwrap();
    assert_eq!(ours.1, 1, "one write");
    assert!(theirs.1 > 1, "the default writes in pieces: {}", theirs.1);
    // The same layout (the clock moved between the two calls: compare all but the seconds).
    assert_eq!(ours.0.len(), theirs.0.len(), "{} / {}", ours.0, theirs.0);
    assert_eq!(ours.0[..16], theirs.0[..16], "{} / {}", ours.0, theirs.0);
    assert!(
        ours.0.ends_with('Z') && ours.0.as_bytes()[10] == b'T',
        "{}",
        ours.0
    );
}

/// The same events through `tracing_subscriber`'s JSON format and through [`AccessJson`]; the
/// timestamps (taken at different instants) are cut off before comparing.
#[test]
fn access_json_lines_are_the_standard_json_bytes() {
    fn lines(subscriber: impl tracing::Subscriber + Send + Sync, out: &Captured) -> Vec<String> {
        tracing::subscriber::with_default(subscriber, || {
            let odd = "quote \" backslash \\ newline \n tab \t nul \u{0} del \u{7f} é 東 🦀 \
                       cr \r bs \u{8} ff \u{c} esc \u{1b} us \u{1f} nbsp \u{a0} e\u{301}";
            let peer: std::net::SocketAddr = "[::1]:6385".parse().unwrap();
            for duration_ms in [0.0, 0.1, 1e-7, 123_456.789, f64::NAN, 2.5e21] {
                tracing::info!(
                    target: "access",
                    listener = %"api",
                    client = %peer,
                    identity = odd,
                    method = %"GET",
                    path = %format_args!("/v1/{odd}"),
                    status = 200_u16,
                    bytes = u64::MAX,
                    signed = -5_i64,
                    duration_ms,
                    upstream = "unix:/run/ironic.sock",
                    complete = false,
                );
            }
            tracing::warn!(error = %"boom \"x\"", "not an access line");
            let span = tracing::info_span!("health", endpoint = "e1");
            let _entered = span.enter();
            tracing::info!(target: "access", path = "/in/a/span", status = 200_u16);
        });
        out.lines()
            .into_iter()
            .map(|l| {
                let end = l.find("Z\",").expect("a timestamp");
                l[end..].to_owned()
            })
            .collect()
    }
    let standard_out = Captured::default();
    let o = standard_out.clone();
    let standard = tracing_subscriber::fmt()
        .with_writer(move || o.clone())
        .json()
        .flatten_event(true)
        .finish();
    let ours_out = Captured::default();
    let o = ours_out.clone();
    let ours = tracing_subscriber::fmt()
        .with_writer(move || o.clone())
        .json()
        .flatten_event(true)
        .event_format(AccessJson::new())
        .finish();
    let expected = lines(standard, &standard_out);
    assert_eq!(expected.len(), 8, "{expected:#?}");
    assert!(expected[7].contains("\"spans\""), "{}", expected[7]);
    assert_eq!(lines(ours, &ours_out), expected);
}

/// Strings that need escaping in JSON or quoting in Rust's `Debug`, and some that do not.
const ODD: &[&str] = &[
    "",
    "-",
    "api",
    "plain ascii ~!@#$%^&*()_+{}|:<>?`-=[];',./",
    "quote \" backslash \\ slash /",
    "\"",
    "\\",
    "newline \n tab \t cr \r backspace \u{8} formfeed \u{c} nul \u{0} esc \u{1b} us \u{1f}",
    "del \u{7f} nbsp \u{a0} é 東 🦀 combining e\u{301} zero width \u{200b} bidi \u{202e}",
    "\u{301} starts with a combining mark",
    "/v1/nodes/\"><script>",
    "unix:/run/ironic \"quoted\".sock",
];

/// Lines with every kind of field value the proxy can log.
fn access_lines() -> Vec<access::Line<'static>> {
    let clients: [Option<std::net::SocketAddr>; 5] = [
        Some("127.0.0.1:6385".parse().unwrap()),
        Some("255.255.255.255:65535".parse().unwrap()),
        Some("0.0.0.0:0".parse().unwrap()),
        Some("[::ffff:10.1.2.3]:443".parse().unwrap()),
        None,
    ];
    let durations = [
        0.0,
        0.1,
        1e-7,
        0.000_123,
        123_456.789,
        1e16,
        2.5e21,
        f64::NAN,
    ];
    let mut lines = Vec::new();
    for (i, odd) in ODD.iter().enumerate() {
        let next = ODD[(i + 1) % ODD.len()];
        lines.push(access::Line {
            listener: odd,
            client: clients[i % clients.len()],
            identity: next,
            method: if i % 2 == 0 { "GET" } else { odd },
            path: odd,
            path_cut: i % 3 == 0,
            user_agent: [next, odd, "-"][i % 3],
            status: [200, 0, 599, 999, u16::MAX][i % 5],
            bytes: [0, 1, 4096, u64::MAX][i % 4],
            duration_ms: durations[i % durations.len()],
            upstream: next,
            rpc_method: odd,
            blame: ["-", "client", "upstream", "proxy"][i % 4],
            complete: i % 2 == 0,
        });
    }
    let v6: std::net::SocketAddr = "[fe80::1%2]:80".parse().unwrap();
    lines.push(access::Line {
        client: Some(v6),
        duration_ms: f64::INFINITY,
        ..access::Line {
            listener: "server",
            client: None,
            identity: "-",
            method: "PATCH",
            path: "/v1/nodes/1",
            path_cut: false,
            user_agent: "curl/8.5.0",
            status: 202,
            bytes: 12,
            duration_ms: 0.25,
            upstream: "unix:/run/ironic.sock",
            rpc_method: "-",
            blame: "-",
            complete: true,
        }
    });
    lines
}

/// Each line as `tracing_subscriber`'s formatter writes its event (`standard`) and as
/// `access::Line::write` does, one string per line (a text line may hold a newline of a field),
/// the timestamps cut off (taken at different instants).
fn both(format: Format) -> (Vec<String>, Vec<String>) {
    let out = Captured::default();
    let o = out.clone();
    let lines = access_lines();
    let standard = tracing_subscriber::fmt()
        .with_writer(move || o.clone())
        .with_ansi(false);
    let take = || String::from_utf8(std::mem::take(&mut *out.0.lock().unwrap())).unwrap();
    let log = || {
        lines
            .iter()
            .map(|l| (l.event(), take()).1)
            .collect::<Vec<_>>()
    };
    let expected = match format {
        Format::Text => tracing::subscriber::with_default(standard.finish(), log),
        Format::Json => {
            tracing::subscriber::with_default(standard.json().flatten_event(true).finish(), log)
        }
    };
    let mut clock = Clock::default();
    let direct = lines.iter().map(|line| {
        let mut direct = Vec::new();
        line.write(format, &mut direct, &mut clock);
        String::from_utf8(direct).unwrap()
    });
    let cut = |l: &str| {
        let end = l.find('Z').expect("a timestamp");
        assert_eq!(end, if format == Format::Json { 40 } else { 26 }, "{l}");
        assert!(l.ends_with('\n'), "{l}");
        l[end..].to_owned()
    };
    let expected: Vec<String> = expected.iter().map(|l| cut(l)).collect();
    assert_eq!(expected.len(), lines.len());
    (expected, direct.map(|l| cut(&l)).collect())
}

#[test]
fn direct_text_access_lines_are_tracing_subscribers_bytes() {
    let (expected, direct) = both(Format::Text);
    for (theirs, ours) in expected.iter().zip(&direct) {
        assert_eq!(ours, theirs);
    }
    // Rust's quoting was exercised, not only the plain case.
    assert!(
        expected
            .iter()
            .any(|l| l.contains(r#"identity="quote \" backslash \\ slash /""#)),
        "{expected:#?}"
    );
}

#[test]
fn direct_json_access_lines_are_tracing_subscribers_bytes() {
    let (expected, direct) = both(Format::Json);
    for (theirs, ours) in expected.iter().zip(&direct) {
        assert_eq!(ours, theirs);
    }
    assert!(
        expected
            .iter()
            .any(|l| l.contains(r#"esc \u001b us \u001f"#)),
        "{expected:#?}"
    );
}

#[test]
fn json_strings_are_escaped_as_serde_json_does() {
    let every_ascii: String = (0..=0x7f_u8).map(char::from).collect();
    for s in ODD.iter().copied().chain([every_ascii.as_str()]) {
        let mut ours = vec![b'"'];
        access::json_str(&mut ours, s);
        ours.push(b'"');
        assert_eq!(
            String::from_utf8(ours).unwrap(),
            serde_json::to_string(s).unwrap()
        );
    }
}

#[test]
fn the_client_prints_as_before() {
    assert_eq!(access::Client(None).to_string(), "unix");
    let peer = "[::1]:6385".parse().unwrap();
    assert_eq!(access::Client(Some(peer)).to_string(), "[::1]:6385");
}

#[test]
fn the_cached_timestamp_prefix_is_the_calendar_date() {
    for (second, text) in [
        (0, "1970-01-01T00:00:00."),
        (951_782_400, "2000-02-29T00:00:00."),
        (951_868_799, "2000-02-29T23:59:59."),
        (1_796_083_199, "2026-11-30T23:59:59."),
        (4_107_542_400, "2100-03-01T00:00:00."),
        (253_402_300_799, "9999-12-31T23:59:59."),
    ] {
        let p = access::prefix(second).expect("in range");
        assert_eq!(std::str::from_utf8(&p).unwrap(), text);
    }
    assert_eq!(access::prefix(253_402_300_800), None, "year 10000");
    // A second, then a line later in the same second, then the next second.
    let at = |s: u64, micros: u32| {
        std::time::UNIX_EPOCH + Duration::from_secs(s) + Duration::from_micros(micros.into())
    };
    let mut clock = Clock::default();
    let mut out = Vec::new();
    clock.write_at(at(951_868_799, 7), &mut out);
    clock.write_at(at(951_868_799, 999_999), &mut out);
    clock.write_at(at(951_868_800, 120_000), &mut out);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "2000-02-29T23:59:59.000007Z2000-02-29T23:59:59.999999Z2000-03-01T00:00:00.120000Z"
    );
}

#[test]
fn the_cached_timestamp_is_tracing_subscribers_now() {
    let mut clock = Clock::default();
    for _ in 0..100 {
        let mut before = String::new();
        SystemTime
            .format_time(&mut Writer::new(&mut before))
            .unwrap();
        let mut ours = Vec::new();
        clock.write(&mut ours);
        let mut after = String::new();
        SystemTime
            .format_time(&mut Writer::new(&mut after))
            .unwrap();
        let ours = String::from_utf8(ours).unwrap();
        assert_eq!(ours.len(), before.len(), "{ours} / {before}");
        assert!(
            before <= ours && ours <= after,
            "{before} <= {ours} <= {after}"
        );
        if before[..20] == after[..20] {
            assert_eq!(ours[..20], before[..20]);
        }
    }
}

#[test]
fn direct_access_lines_are_buffered_and_keep_their_order() {
    let out = Captured::default();
    let sink = without_timer(&out);
    let lines = access_lines();
    tracing::subscriber::with_default(json_subscriber(&sink), || {
        sink.append_access(|buf, clock| lines[0].write(Format::Json, buf, clock));
        access(1);
        sink.append_access(|buf, clock| lines[2].write(Format::Json, buf, clock));
        assert!(out.lines().is_empty(), "buffered, not written");
        tracing::warn!("then a warning");
        let written = out.lines();
        assert_eq!(written.len(), 4, "{written:?}");
        assert!(
            written[0].contains(r#""client":"127.0.0.1:6385""#),
            "{written:?}"
        );
        assert!(written[1].contains(r#""n":1"#), "{written:?}");
        assert!(
            written[2].contains(r#""client":"0.0.0.0:0""#),
            "{written:?}"
        );
        assert!(written[3].contains("then a warning"), "{written:?}");
    });
}

#[test]
fn in_span_is_whether_the_thread_is_in_a_span() {
    let sink = without_timer(&Captured::default());
    tracing::subscriber::with_default(json_subscriber(&sink), || {
        assert!(!access::in_span());
        let span = tracing::info_span!("health", endpoint = "e1");
        let entered = span.enter();
        assert!(access::in_span());
        drop(entered);
        assert!(!access::in_span());
    });
}

#[test]
fn eight_bytes_at_a_time_find_every_byte_that_needs_escaping() {
    // Backgrounds next to the bytes that matter: space, `!` and `#` around `"`, `[` and `]`
    // around `\`, `~` before DEL.
    for background in [b'a', b' ', b'!', b'#', b'[', b']', b'~', b'0'] {
        for lane in 0..8 {
            for byte in 0..=u8::MAX {
                let mut bytes = [background; 8];
                bytes[lane] = byte;
                let x = u64::from_le_bytes(bytes);
                let json = byte < 0x20 || byte == b'"' || byte == b'\\';
                assert_eq!(access::special(x, false), json, "{bytes:?}");
                assert_eq!(access::special(x, true), json || byte >= 0x7f, "{bytes:?}");
            }
        }
    }
}

#[test]
fn strings_escaped_at_every_offset_are_serde_json_and_debug_bytes() {
    let specials = [
        "\"", "\\", "\n", "\u{0}", "\u{1f}", "\u{7f}", "é", "🦀", "\u{301}", "\u{a0}",
    ];
    for len in 0..20 {
        for at in 0..=len {
            for special in specials {
                let s = format!("{}{special}{}", "p".repeat(at), "q".repeat(len - at));
                let mut json = vec![b'"'];
                access::json_str(&mut json, &s);
                json.push(b'"');
                assert_eq!(
                    String::from_utf8(json).unwrap(),
                    serde_json::to_string(&s).unwrap()
                );
                let mut debug = Vec::new();
                access::debug_str(&mut debug, &s);
                assert_eq!(String::from_utf8(debug).unwrap(), format!("{s:?}"));
            }
            let plain = "r".repeat(len);
            let mut debug = Vec::new();
            access::debug_str(&mut debug, &plain);
            assert_eq!(String::from_utf8(debug).unwrap(), format!("{plain:?}"));
        }
    }
}
