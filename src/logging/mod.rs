//! Where log lines go: stderr, with the access log written in batches.
//!
//! Every `tracing` event is one line on stderr, formatted by `tracing_subscriber`'s `fmt` layer
//! (text or JSON); this module decides when the bytes reach the file descriptor, and writes the
//! access line itself once the binary allows it ([`access`]: the same bytes, fewer instructions).
//! An access line (target `access`, one per request) is appended to an in-memory buffer instead
//! of costing a `write(2)` of its own. The buffer goes to stderr, oldest line first, when any of these
//! happens:
//!
//! - it holds [`CAPACITY`] bytes or more;
//! - [`INTERVAL`] has passed since a line entered it empty (a flusher thread, started with the
//!   first access line, sleeps that long and writes whatever is there);
//! - any other event is logged: its line is written right after the buffered ones, in one
//!   `write(2)`, so warnings and errors are never delayed and the stream keeps the order in
//!   which events happened (the `draining` line of a SIGTERM flushes the access log too);
//! - [`Stderr::flush`] is called, which the binary does when it exits ([`FlushOnDrop`]).
//!
//! So an access line reaches stderr at most [`INTERVAL`] after its request ended (plus the time
//! of the write itself), and nothing is lost on a graceful exit. A SIGKILL loses at most the
//! lines of the last [`INTERVAL`]. When stderr is slow (a full pipe), writers wait for it as
//! they did with one write per line; when it fails, the lines are dropped as they were.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::MakeWriter;

pub(crate) mod access;
mod json;
pub use access::Format as AccessFormat;
pub use json::AccessJson;

/// The buffer is written once it holds this many bytes: about 100 access lines (a JSON line is
/// about 300 bytes), and a single write that a 64 KiB pipe takes whole.
pub(crate) const CAPACITY: usize = 32 * 1024;

/// The longest an access line waits in the buffer.
pub(crate) const INTERVAL: Duration = Duration::from_millis(100);

/// The target of the access log lines (`proxy::log`).
const ACCESS: &str = "access";

/// A `MakeWriter` for `tracing_subscriber::fmt`: access lines buffered, others immediate, all
/// to stderr in the order they were logged. Clones share one buffer.
#[derive(Clone)]
pub struct Stderr(Arc<Shared>);

struct Shared {
    state: Mutex<State>,
    /// Wakes the flusher when a line enters an empty buffer.
    wake: Condvar,
}

struct State {
    buf: Vec<u8>,
    out: Box<dyn Write + Send>,
    flusher: Flusher,
    /// The access lines' timestamp.
    clock: access::Clock,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flusher {
    /// No access line yet: no thread.
    NotStarted,
    /// Waiting on `wake` for the buffer to fill.
    Idle,
    /// Woken, or sleeping `INTERVAL` before it writes.
    Busy,
    /// The thread could not be spawned: every access line is written at once.
    Unavailable,
}

impl Stderr {
    pub fn new() -> Self {
        Self::to(Box::new(io::stderr()))
    }

    /// The same over any output (tests).
    fn to(out: Box<dyn Write + Send>) -> Self {
        Self(Arc::new(Shared {
            state: Mutex::new(State {
                buf: Vec::new(),
                out,
                flusher: Flusher::NotStarted,
                clock: access::Clock::default(),
            }),
            wake: Condvar::new(),
        }))
    }

    /// Writes every buffered line now.
    pub fn flush(&self) {
        self.0.lock().write_out();
    }

    /// Flushes when dropped: hold it in `main` so the last lines are written however it returns.
    pub fn flush_on_drop(&self) -> FlushOnDrop {
        FlushOnDrop(self.clone())
    }

    /// From now on access lines are written by [`access`] straight into this sink, in `format`,
    /// instead of going through `tracing`'s formatter. Call it once, right after setting the
    /// global subscriber whose writer this is and whose event format `format` is
    /// (`tracing_subscriber`'s text format with [`Timestamp`] and no colours, or [`AccessJson`]).
    /// With `ansi` (colours on a terminal) the text lines stay `tracing`'s.
    pub fn write_access_lines(&self, format: AccessFormat, ansi: bool) {
        if format == AccessFormat::Text && ansi {
            return;
        }
        let _ = access::DIRECT.set(access::Direct {
            sink: self.clone(),
            format,
        });
    }

    /// Appends one access line built by `line`, as the `fmt` layer's writes would.
    fn append_access(&self, line: impl FnOnce(&mut Vec<u8>, &mut access::Clock)) {
        let mut state = self.0.lock();
        let state = &mut *state;
        line(&mut state.buf, &mut state.clock);
        state.after_line(&self.0, true);
    }
}

impl Default for Stderr {
    fn default() -> Self {
        Self::new()
    }
}

/// See [`Stderr::flush_on_drop`].
pub struct FlushOnDrop(Stderr);

impl Drop for FlushOnDrop {
    fn drop(&mut self) {
        self.0.flush();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing under this lock panics halfway through an update that matters: a poisoned
        // buffer is still a buffer of whole lines.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    fn write_out(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        // A failed write (stderr closed) drops the lines, as an unbuffered write would: the
        // buffer must not grow without bound.
        let _ = self.out.write_all(&self.buf);
        let _ = self.out.flush();
        self.buf.clear();
        if self.buf.capacity() > 4 * CAPACITY {
            // One huge line (a long panic message) must not keep its memory.
            self.buf = Vec::with_capacity(CAPACITY + CAPACITY / 2);
        }
    }
}

/// Runs on its own thread: each time a line enters the empty buffer, sleeps [`INTERVAL`] so
/// later lines join it, then writes them all.
fn flusher(shared: &Shared) {
    let mut state = shared.lock();
    loop {
        if state.buf.is_empty() {
            state.flusher = Flusher::Idle;
            state = shared
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.flusher = Flusher::Busy;
            continue;
        }
        drop(state);
        std::thread::sleep(INTERVAL);
        state = shared.lock();
        state.write_out();
    }
}

/// One event's line, appended while the lock is held; decides on drop whether to write.
pub struct Line<'a> {
    shared: &'a Arc<Shared>,
    state: MutexGuard<'a, State>,
    buffered: bool,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.state.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        self.state.after_line(self.shared, self.buffered);
    }
}

impl State {
    /// A line was appended: writes the buffer unless the line is `buffered` and fits, else
    /// makes sure the flusher will.
    fn after_line(&mut self, shared: &Arc<Shared>, buffered: bool) {
        if !buffered || self.buf.len() >= CAPACITY {
            self.write_out();
            return;
        }
        match self.flusher {
            Flusher::Busy => {}
            Flusher::Idle => {
                self.flusher = Flusher::Busy;
                shared.wake.notify_one();
            }
            Flusher::NotStarted => {
                let shared = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("log-flush".into())
                    // It only sleeps and writes.
                    .stack_size(64 * 1024)
                    .spawn(move || flusher(&shared));
                if spawned.is_ok() {
                    // The new thread waits for this lock, finds the line, sleeps, writes it.
                    self.flusher = Flusher::Busy;
                } else {
                    self.flusher = Flusher::Unavailable;
                    self.write_out();
                }
            }
            Flusher::Unavailable => self.write_out(),
        }
    }
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            shared: &self.0,
            state: self.0.lock(),
            buffered: false,
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line<'a> {
        Line {
            shared: &self.0,
            state: self.0.lock(),
            buffered: meta.target() == ACCESS,
        }
    }
}

/// `tracing_subscriber`'s default timestamp (`SystemTime`: RFC 3339 UTC with microseconds),
/// handed to the formatter in one piece. The JSON formatter collects the timestamp in a new
/// `String` for every event; written in one go it allocates once instead of growing three times.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timestamp;

impl FormatTime for Timestamp {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        let system = tracing_subscriber::fmt::time::SystemTime;
        let mut text = StackText::<32>::default();
        if system.format_time(&mut Writer::new(&mut text)).is_ok() {
            w.write_str(text.as_str())
        } else {
            // A year beyond the buffer (after 10^10): in pieces, as before.
            system.format_time(w)
        }
    }
}

/// Up to `N` bytes of text formatted on the stack: a timestamp (`2026-11-30T14:20:00.000000Z` is
/// 27 bytes), an IP address in the access log (the longest IPv6 form is 45). A write that does
/// not fit fails with `fmt::Error`.
pub(crate) struct StackText<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Default for StackText<N> {
    fn default() -> Self {
        Self {
            buf: [0; N],
            len: 0,
        }
    }
}

impl<const N: usize> StackText<N> {
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl<const N: usize> std::fmt::Write for StackText<N> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(std::fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
