//! A second reader of HTTP/1.1 request streams, for the framing hyper resolves out of sight.
//!
//! hyper settles two ambiguities before the service sees a request, in ways RFC 9112 allows
//! but this proxy does not (ambiguous framing is refused, never forwarded):
//!
//! - `Content-Length` with `Transfer-Encoding`: it drops `Content-Length` and reads the body as
//!   chunked (RFC 9112 §6.3 item 3 lets a server do that, or reject).
//! - `Content-Length` repeated with one value: it keeps a single field (RFC 9110 §8.6 lets a
//!   recipient fold them, or reject).
//!
//! The connection's stream (`conn::WatchedStream`) passes every byte hyper reads through a
//! [`Guard`] as well. The guard finds each request head with the parser hyper uses
//! (`http1::parse_request_head`: httparse, same configuration and field limit, hyper's server
//! rules for the body), notes whether that head carried either ambiguity, and steps over its
//! body exactly as hyper will (by `Content-Length`, or with the upstream client's own chunked
//! decoder, `http1::Chunked`, which follows hyper's), so its notes stay in step with the
//! requests the service receives. The service takes one note per request ([`Guard::take`]): an
//! ambiguous head, a missing note or a note for another method means the request is refused
//! with 400 and the connection closed.
//!
//! When the guard cannot follow (a head hyper will refuse, a body hyper will fail on), it stops;
//! hyper closes such a connection itself, and any request that still reached the service would
//! find no note and be refused.

use crate::http1::{self, Chunked, RequestBody};
use http::Method;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Why a request was refused.
pub(crate) const UNVERIFIED: &str = "request framing could not be verified";

/// What the guard saw in one request head.
#[derive(Debug)]
struct Note {
    method: Method,
    ambiguous: Option<&'static str>,
}

#[derive(Debug)]
enum Phase {
    Head,
    Length(u64),
    Chunked(Chunked),
    Lost,
}

struct State {
    phase: Phase,
    /// Bytes of a head that is not complete yet.
    head: Vec<u8>,
    max_head: usize,
    notes: VecDeque<Note>,
}

/// One connection's second reader. Shared by the IO wrapper and the service.
pub(crate) struct Guard(Mutex<State>);

impl Guard {
    /// `max_head`: the listener's `header_bytes`; hyper refuses longer heads.
    pub(crate) fn new(max_head: usize) -> Arc<Self> {
        Arc::new(Self(Mutex::new(State {
            phase: Phase::Head,
            head: Vec::new(),
            max_head: max_head.max(8192),
            notes: VecDeque::new(),
        })))
    }

    /// Takes the note of the next request: `Err` with the reason when it must be refused.
    pub(crate) fn take(&self, method: &Method) -> Result<(), &'static str> {
        let note = self.0.lock().ok().and_then(|mut s| s.notes.pop_front());
        match note {
            Some(n) if n.method == method => n.ambiguous.map_or(Ok(()), Err),
            _ => Err(UNVERIFIED),
        }
    }

    /// Whether the client is in the middle of sending something: a head begun, a body not
    /// read to its end, or bytes the guard could not follow. False between requests.
    pub(crate) fn mid_message(&self) -> bool {
        self.0.lock().map_or(true, |s| {
            !matches!(s.phase, Phase::Head) || !s.head.is_empty()
        })
    }

    /// Follows bytes as hyper will read them.
    pub(crate) fn feed(&self, bytes: &[u8]) {
        if let Ok(mut s) = self.0.lock() {
            s.feed(bytes);
        }
    }
}

impl State {
    fn feed(&mut self, data: &[u8]) {
        let mut pos = 0;
        while pos < data.len() {
            let rest = &data[pos..];
            match &mut self.phase {
                Phase::Lost => return,
                Phase::Length(n) => {
                    let k = usize::try_from(*n).unwrap_or(usize::MAX).min(rest.len());
                    *n -= k as u64;
                    pos += k;
                    if *n == 0 {
                        self.phase = Phase::Head;
                    }
                }
                Phase::Chunked(chunks) => match chunks.skip(rest) {
                    Ok((used, done)) => {
                        pos += used;
                        if done {
                            self.phase = Phase::Head;
                        }
                    }
                    // hyper fails the body here too, and closes the connection.
                    Err(_) => self.phase = Phase::Lost,
                },
                Phase::Head => {
                    // A head can only be complete once a line feed has arrived.
                    let fresh = self.head.is_empty();
                    if !rest.contains(&b'\n') {
                        self.head.extend_from_slice(rest);
                        if self.head.len() > self.max_head {
                            self.phase = Phase::Lost;
                        }
                        return;
                    }
                    let before = self.head.len();
                    let parsed = if fresh {
                        parse_head(rest)
                    } else {
                        self.head.extend_from_slice(rest);
                        parse_head(&self.head)
                    };
                    match parsed {
                        Parsed::Complete(used, note, next) => {
                            pos += used - before;
                            self.head.clear();
                            self.notes.push_back(note);
                            self.phase = next;
                        }
                        Parsed::Partial => {
                            if fresh {
                                self.head.extend_from_slice(rest);
                            }
                            if self.head.len() > self.max_head {
                                self.phase = Phase::Lost;
                            }
                            return;
                        }
                        Parsed::Invalid => {
                            self.phase = Phase::Lost;
                            return;
                        }
                    }
                }
            }
        }
    }
}

enum Parsed {
    Complete(usize, Note, Phase),
    Partial,
    Invalid,
}

/// The guard's note on a request head, and how its body follows.
fn parse_head(buf: &[u8]) -> Parsed {
    let head = match http1::parse_request_head(buf) {
        Ok(Some(head)) => head,
        Ok(None) => return Parsed::Partial,
        Err(_) => return Parsed::Invalid,
    };
    // A request target has no fragment (RFC 9112 §3.2); `http` drops one without a word, so
    // `/a#/b` would reach Ironic as `/a`. Refused, as HAProxy does.
    let ambiguous = if head.fragment {
        Some("fragment in the request target")
    } else if head.transfer_encoding && head.length_fields > 0 {
        Some("both Content-Length and Transfer-Encoding")
    } else if head.length_fields > 1 {
        Some("repeated Content-Length")
    } else {
        None
    };
    let next = match head.body {
        // hyper refuses the request and closes.
        Err(_) => Phase::Lost,
        Ok(RequestBody::Empty) => Phase::Head,
        Ok(RequestBody::Length(n)) => Phase::Length(n),
        Ok(RequestBody::Chunked) => Phase::Chunked(Chunked::default()),
    };
    Parsed::Complete(
        head.len,
        Note {
            method: head.method,
            ambiguous,
        },
        next,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every note the guard took from `stream`, in order.
    fn notes(stream: &[u8]) -> Vec<(String, Option<&'static str>)> {
        let g = Guard::new(65536);
        g.feed(stream);
        let s = g.0.lock().unwrap();
        s.notes
            .iter()
            .map(|n| (n.method.to_string(), n.ambiguous))
            .collect()
    }

    #[test]
    fn flags_what_hyper_hides() {
        let both = Some("both Content-Length and Transfer-Encoding");
        for head in [
            "Content-Length: 5\r\nTransfer-Encoding: chunked",
            "Transfer-Encoding: chunked\r\nContent-Length: 5",
            "content-length: 0\r\ntransfer-encoding: chunked",
        ] {
            let raw = format!("POST / HTTP/1.1\r\nHost: x\r\n{head}\r\n\r\n0\r\n\r\n");
            assert_eq!(notes(raw.as_bytes()), [("POST".to_owned(), both)], "{head}");
        }
        let raw =
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(
            notes(raw),
            [("POST".to_owned(), Some("repeated Content-Length"))]
        );
    }

    #[test]
    fn stays_in_step_over_bodies_whole_or_byte_by_byte() {
        let hidden = "GET /hidden HTTP/1.1\r\nHost: x\r\n\r\n";
        let n = hidden.len();
        let stream = format!(
            "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n{hidden}\
             \r\nPOST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
             5;ext=1\r\nhello\r\n{n:x} \r\n{hidden}\r\n0\r\nX-T: 1\r\n\r\n\
             DELETE /c HTTP/1.1\r\nHost: x\r\n\r\n"
        );
        let want = [
            ("POST".to_owned(), None),
            ("POST".to_owned(), None),
            ("DELETE".to_owned(), None),
        ];
        assert_eq!(notes(stream.as_bytes()), want);
        let g = Guard::new(65536);
        for b in stream.as_bytes() {
            g.feed(std::slice::from_ref(b));
        }
        assert_eq!(g.take(&Method::POST), Ok(()));
        assert_eq!(g.take(&Method::POST), Ok(()));
        assert_eq!(g.take(&Method::DELETE), Ok(()));
        assert_eq!(g.take(&Method::GET), Err(UNVERIFIED), "no hidden request");
    }

    #[test]
    fn out_of_step_or_lost_means_refused() {
        let g = Guard::new(65536);
        g.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(g.take(&Method::POST), Err(UNVERIFIED));
        let g = Guard::new(65536);
        g.feed(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        g.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(g.take(&Method::POST), Ok(()));
        assert_eq!(
            g.take(&Method::GET),
            Err(UNVERIFIED),
            "lost after a bad chunk"
        );
        // A trailer section that is not header fields: hyper's decoder (and so the shared one)
        // fails the body there.
        let g = Guard::new(65536);
        g.feed(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nno field\r\n\r\n");
        g.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(g.take(&Method::POST), Ok(()));
        assert_eq!(
            g.take(&Method::GET),
            Err(UNVERIFIED),
            "lost after bad trailers"
        );
    }
}
