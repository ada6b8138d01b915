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
            let odd = "quote \" backslash \\ newline \n tab \t nul \u{0} del \u{7f} é 東 🦀";
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
