//! A watch on the raw HTTP/1.1 bytes for framing that hyper silently repairs.
//!
//! hyper handles a head with both `Content-Length` and `Transfer-Encoding` the way RFC 9112 §6.1
//! permits (drop `Content-Length`, frame by chunked, close after the response) and folds
//! identical repeated `Content-Length` fields into one, so the request our service sees no longer
//! shows what was sent. DESIGN.md wants both refused with 400, never forwarded. This scanner looks
//! at every line start of the bytes read from an HTTP/1.1 connection and flags a block (lines up
//! to an empty line) that names `Content-Length` together with `Transfer-Encoding`, or
//! `Content-Length` twice. Once flagged, every request of the connection is refused and the
//! connection closed.
//!
//! It cannot tell a head from a body, so a body carrying such lines at raw line starts (an HTTP
//! message inside a body, with CRLF line ends) also taints its connection. JSON bodies never do:
//! JSON escapes control characters inside strings. Cost: one `memchr` pass over the bytes read.

/// Longest field name we need to see, plus the colon.
const PREFIX: usize = 18;

#[derive(Debug)]
pub(crate) struct Scan {
    at_line_start: bool,
    line: [u8; PREFIX],
    len: usize,
    content_length: u8,
    transfer_encoding: bool,
}

impl Default for Scan {
    fn default() -> Self {
        Self {
            at_line_start: true,
            line: [0; PREFIX],
            len: 0,
            content_length: 0,
            transfer_encoding: false,
        }
    }
}

impl Scan {
    /// Feeds bytes as they are read; true once an ambiguous block was seen.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> bool {
        let mut found = false;
        let mut i = 0;
        while i < bytes.len() {
            if !self.at_line_start {
                match memchr::memchr(b'\n', &bytes[i..]) {
                    Some(p) => {
                        i += p + 1;
                        self.at_line_start = true;
                        self.len = 0;
                    }
                    None => return found,
                }
                continue;
            }
            let b = bytes[i];
            i += 1;
            if b == b'\n' {
                let blank = self.len == 0 || (self.len == 1 && self.line[0] == b'\r');
                if blank {
                    self.content_length = 0;
                    self.transfer_encoding = false;
                } else {
                    found |= self.classify();
                }
                self.len = 0;
                continue;
            }
            self.line[self.len] = b.to_ascii_lowercase();
            self.len += 1;
            if b == b':' || self.len == PREFIX {
                found |= self.classify();
                self.at_line_start = false;
            }
        }
        found
    }

    fn classify(&mut self) -> bool {
        let name = &self.line[..self.len];
        let name = name.strip_suffix(b":").unwrap_or(name);
        let name = name.trim_ascii();
        if name == b"content-length" {
            self.content_length = self.content_length.saturating_add(1);
        } else if name == b"transfer-encoding" {
            self.transfer_encoding = true;
        }
        (self.content_length > 0 && self.transfer_encoding) || self.content_length > 1
    }
}

#[cfg(test)]
mod tests {
    use super::Scan;

    fn flags(chunks: &[&[u8]]) -> bool {
        let mut s = Scan::default();
        chunks.iter().fold(false, |acc, c| s.feed(c) | acc)
    }

    #[test]
    fn flags_cl_with_te_in_either_order_and_across_reads() {
        assert!(flags(&[
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
        assert!(flags(&[
            b"POST / HTTP/1.1\r\nTRANSFER-ENCODING: chunked\r\ncontent-length: 5\r\n\r\n"
        ]));
        assert!(flags(&[
            b"POST / HTTP/1.1\r\nContent-Le",
            b"ngth: 5\r\nTransfer-",
            b"Encoding: x\r\n\r\n"
        ]));
        assert!(flags(&[
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"
        ]));
    }

    #[test]
    fn plain_requests_pass() {
        assert!(!flags(&[
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
        ]));
        assert!(!flags(&[
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        ]));
        // Two requests on one connection, each with one Content-Length.
        assert!(!flags(&[
            b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
            b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nho",
        ]));
        assert!(!flags(&[
            b"{\"content-length\": 1, \"transfer-encoding\": 2}\n"
        ]));
        assert!(!flags(&[
            b"GET / HTTP/1.1\r\nX-Content-Length: 1\r\nTransfer-Encoding-X: 2\r\n\r\n"
        ]));
    }
}
