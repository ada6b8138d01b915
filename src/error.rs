//! Error reporting shared by every module: one line naming the problem and then its causes.
//!
//! The convention, crate-wide: an error's message names what failed in this module's words and
//! never repeats its cause; the cause is returned by `source()` (thiserror's `#[source]` or
//! `#[from]`), so [`chain`] prints each link once: `cannot load the identity: cannot read
//! /certs/tls.crt: No such file or directory (os error 2)`.

/// `a: b: c` from an error and its sources.
/// Always one line: multi-line messages (TOML's caret diagrams) keep their first line only.
pub fn chain(e: &dyn std::error::Error) -> String {
    let first_line = |e: &dyn std::error::Error| {
        let text = e.to_string();
        text.lines()
            .next()
            .unwrap_or_default()
            .trim_end()
            .to_owned()
    };
    let mut s = first_line(e);
    let mut cur = e.source();
    while let Some(c) = cur {
        let part = first_line(c);
        if !part.is_empty() && !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = c.source();
    }
    s
}
