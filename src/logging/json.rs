//! The JSON access line, without `tracing_subscriber`'s per-token adaptor.
//!
//! `tracing_subscriber`'s JSON format serialises each event with `serde_json` into an adaptor
//! from `io::Write` to `fmt::Write` that receives every quote, colon and comma separately and
//! checks each piece for UTF-8, on every access line. [`AccessJson`] makes the same
//! `serde_json` calls, in the same order, with the same `tracing-serde` visitor, into a reused byte
//! buffer, then hands the finished line over in one write. So the bytes are those of the standard
//! formatter; every other event, and an access event inside a span (whose JSON would carry
//! `span`/`spans`), goes to the standard formatter itself.

use super::Timestamp;
use serde::ser::{SerializeMap, Serializer as _};
use std::cell::RefCell;
use std::fmt;
use tracing::{Event, Subscriber};
use tracing_serde::AsSerde;
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// `--log-format json`: `tracing_subscriber`'s flattened JSON format with [`Timestamp`], and
/// its access lines (target `access`) written the fast way.
pub struct AccessJson {
    standard: Format<Json, Timestamp>,
}

impl AccessJson {
    pub fn new() -> Self {
        Self {
            standard: tracing_subscriber::fmt::format()
                .with_timer(Timestamp)
                .json()
                .flatten_event(true),
        }
    }
}

impl Default for AccessJson {
    fn default() -> Self {
        Self::new()
    }
}

thread_local! {
    /// The line being built; keeps its capacity between events of the thread.
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl<S, N> FormatEvent<S, N> for AccessJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let in_span = event.parent().is_some() || ctx.lookup_current().is_some();
        if meta.target() != super::ACCESS || in_span {
            return self.standard.format_event(ctx, writer, event);
        }
        LINE.with(|line| {
            let Ok(mut line) = line.try_borrow_mut() else {
                // Re-entered from inside a field's Display: the slow path.
                return self.standard.format_event(ctx, writer, event);
            };
            line.clear();
            serialize(&mut line, event).map_err(|_| fmt::Error)?;
            // serde_json writes UTF-8 only.
            let text = std::str::from_utf8(&line).map_err(|_| fmt::Error)?;
            writer.write_str(text)?;
            writer.write_char('\n')
        })
    }
}

/// The calls of `tracing_subscriber::fmt::format::json` for a flattened event outside spans,
/// with the default options (timestamp, level, fields, target).
fn serialize(out: &mut Vec<u8>, event: &Event<'_>) -> Result<(), serde_json::Error> {
    let meta = event.metadata();
    let mut timestamp = super::StackText::<32>::default();
    let mut ser = serde_json::Serializer::new(out);
    let mut map = ser.serialize_map(None)?;
    if Timestamp
        .format_time(&mut Writer::new(&mut timestamp))
        .is_ok()
    {
        map.serialize_entry("timestamp", timestamp.as_str())?;
    } else {
        let mut long = String::new();
        tracing_subscriber::fmt::time::SystemTime
            .format_time(&mut Writer::new(&mut long))
            .map_err(serde::ser::Error::custom)?;
        map.serialize_entry("timestamp", &long)?;
    }
    map.serialize_entry("level", &meta.level().as_serde())?;
    let mut visitor = tracing_serde::SerdeMapVisitor::new(map);
    event.record(&mut visitor);
    let mut map = visitor.take_serializer()?;
    map.serialize_entry("target", meta.target())?;
    map.end()
}
