//! Chunked transfer coding (RFC 9112 §7.1), decoded by the rules of hyper's decoder (`hyper`
//! 1.x `proto/h1/decode.rs`, which its client and its server share), state for state: what
//! hyper accepts is accepted here and what it refuses is refused (the differential fuzz target
//! `fuzz/fuzz_targets/h1_differential.rs` holds the response side to that). In short:
//!
//! - a chunk size is hex digits, any number of them as long as the value fits in 64 bits;
//! - after it, spaces and tabs, then `;` and extensions, or CR LF; an extension ends at the
//!   first CR, which must be followed by LF; a bare LF in it is an error; the extensions of
//!   the whole body may total 16 KiB;
//! - chunk data is followed by CR LF;
//! - the trailer section (up to 16 KiB and 100 fields) must parse as header fields (httparse,
//!   `http`'s name and value rules); it is then dropped.
//!
//! One decoder, two uses: [`Chunked::decode`] takes a body's data out of a buffer (the upstream
//! client), [`Chunked::skip`] steps over a body in bytes it does not own (the listener's framing
//! guard, which follows what hyper's server reads). Both are [`Chunked::step`].

use super::Error;
use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};

/// The chunk extensions of one body may not total more (hyper's `CHUNKED_EXTENSIONS_LIMIT`).
const MAX_EXTENSIONS: u64 = 16 * 1024;

/// The trailer section may not be longer (hyper's `TRAILER_LIMIT`).
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// Nor have more fields (hyper's default `h1_max_headers`).
const MAX_TRAILER_FIELDS: usize = 100;

/// What [`Chunked::decode`] found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    Data(Bytes),
    /// The last chunk and the trailer section have been read.
    End,
    /// More bytes are needed.
    More,
}

/// What [`Chunked::step`] found after the framing bytes it used.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// This many bytes of chunk data come next.
    Data(usize),
    /// The last chunk and the trailer section have been read.
    End,
    /// Every byte given was framing; more are needed.
    More,
}

/// A chunked body's decoder. Trailer fields are checked and dropped.
#[derive(Debug, Default)]
pub(crate) struct Chunked {
    state: State,
    size: u64,
    extensions: u64,
    /// The trailer section so far (`None`: none yet).
    trailers: Option<BytesMut>,
    trailer_fields: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The first digit of a chunk size.
    #[default]
    Start,
    Size,
    /// Spaces and tabs after the size.
    SizeLws,
    Extension,
    SizeLf,
    Body,
    BodyCr,
    BodyLf,
    /// After the last chunk's line: CR LF, or the first byte of a trailer field.
    EndCr,
    EndLf,
    Trailer,
    TrailerLf,
    Done,
}

impl Chunked {
    /// Decodes from the front of `buf`, consuming what it uses.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, Error> {
        let (framing, step) = self.step(buf);
        buf.advance(framing);
        Ok(match step? {
            Step::Data(n) => Decoded::Data(buf.split_to(n).freeze()),
            Step::End => Decoded::End,
            Step::More => Decoded::More,
        })
    }

    /// Steps over `bytes`, data and framing alike: how many it used, and whether the body
    /// ended there (what follows is the next message's).
    pub(crate) fn skip(&mut self, bytes: &[u8]) -> Result<(usize, bool), Error> {
        let mut used = 0;
        loop {
            let (framing, step) = self.step(&bytes[used..]);
            used += framing;
            match step? {
                Step::Data(n) => used += n,
                Step::End => return Ok((used, true)),
                Step::More => return Ok((used, false)),
            }
        }
    }

    /// Reads framing from the front of `bytes` up to the next chunk data, the body's end or the
    /// end of `bytes`: the framing bytes used, and what comes after them. The data itself
    /// (`Step::Data(n)`: the `n` bytes after the framing) counts as read once returned.
    pub(crate) fn step(&mut self, bytes: &[u8]) -> (usize, Result<Step, Error>) {
        let mut used = 0;
        loop {
            match self.state {
                State::Done => return (used, Ok(Step::End)),
                State::Body => {
                    let left = bytes.len() - used;
                    if left == 0 {
                        return (used, Ok(Step::More));
                    }
                    let n = usize::try_from(self.size).unwrap_or(usize::MAX).min(left);
                    self.size -= n as u64;
                    if self.size == 0 {
                        self.state = State::BodyCr;
                    }
                    return (used, Ok(Step::Data(n)));
                }
                _ => {}
            }
            let Some(&byte) = bytes.get(used) else {
                return (used, Ok(Step::More));
            };
            used += 1;
            match self.next(byte) {
                Ok(state) => self.state = state,
                Err(e) => return (used, Err(e)),
            }
            if self.state == State::Done {
                if let Err(e) = self.check_trailers() {
                    return (used, Err(e));
                }
            }
        }
    }

    /// The state after `byte` in every state but `Body` and `Done`.
    fn next(&mut self, byte: u8) -> Result<State, Error> {
        Ok(match (self.state, byte) {
            (State::Start | State::Size, b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F') => {
                let digit = (byte as char).to_digit(16).map_or(0, u64::from);
                self.size = self
                    .size
                    .checked_mul(16)
                    .and_then(|s| s.checked_add(digit))
                    .ok_or(Error::ChunkSizeOverflow)?;
                State::Size
            }
            (State::Start, _) => return Err(Error::ChunkSizeWithoutDigit),
            (State::Size | State::SizeLws, b' ' | b'\t') => State::SizeLws,
            (State::Size | State::SizeLws, b';') => State::Extension,
            (State::Size | State::SizeLws, b'\r') => State::SizeLf,
            (State::Size | State::SizeLws, _) => return Err(Error::InvalidChunkSize),
            (State::Extension, b'\r') => State::SizeLf,
            (State::Extension, b'\n') => return Err(Error::BareLfInExtension),
            (State::Extension, _) => {
                self.extensions += 1;
                if self.extensions >= MAX_EXTENSIONS {
                    return Err(Error::ExtensionsTooLong);
                }
                State::Extension
            }
            (State::SizeLf, b'\n') if self.size == 0 => State::EndCr,
            (State::SizeLf, b'\n') => State::Body,
            (State::SizeLf, _) => return Err(Error::ChunkSizeLineWithoutLf),
            (State::BodyCr, b'\r') => State::BodyLf,
            (State::BodyLf, b'\n') => State::Start,
            (State::BodyCr | State::BodyLf, _) => return Err(Error::ChunkDataWithoutCrlf),
            (State::EndCr, b'\r') => {
                self.push_trailer(byte)?;
                State::EndLf
            }
            (State::EndCr, _) => {
                self.trailers.get_or_insert_with(BytesMut::new);
                self.push_trailer(byte)?;
                State::Trailer
            }
            (State::EndLf, b'\n') => {
                self.push_trailer(byte)?;
                State::Done
            }
            (State::EndLf, _) => return Err(Error::ChunkedEndWithoutLf),
            (State::Trailer, _) => {
                self.push_trailer(byte)?;
                if byte == b'\r' {
                    State::TrailerLf
                } else {
                    State::Trailer
                }
            }
            (State::TrailerLf, b'\n') => {
                if self.trailer_fields >= MAX_TRAILER_FIELDS {
                    return Err(Error::TooManyTrailerFields);
                }
                self.trailer_fields += 1;
                self.push_trailer(byte)?;
                State::EndCr
            }
            (State::TrailerLf, _) => return Err(Error::TrailerFieldWithoutLf),
            // `step` never asks about these; a state that does not move is the safe answer.
            (State::Body | State::Done, _) => self.state,
        })
    }

    /// Keeps a byte of the trailer section, once one has begun.
    fn push_trailer(&mut self, byte: u8) -> Result<(), Error> {
        if let Some(t) = self.trailers.as_mut() {
            t.extend_from_slice(&[byte]);
            if t.len() >= MAX_TRAILER_BYTES {
                return Err(Error::TrailerTooLong);
            }
        }
        Ok(())
    }

    /// The trailer section must be header fields (as hyper's `decode_trailers` checks).
    fn check_trailers(&mut self) -> Result<(), Error> {
        let Some(raw) = self.trailers.take() else {
            return Ok(());
        };
        let mut fields = vec![httparse::EMPTY_HEADER; self.trailer_fields];
        match httparse::parse_headers(&raw, &mut fields) {
            Ok(httparse::Status::Complete((_, fields))) => {
                for f in fields.iter() {
                    HeaderName::from_bytes(f.name.as_bytes())
                        .map_err(|_| Error::InvalidTrailerName)?;
                    HeaderValue::from_bytes(f.value).map_err(|_| Error::InvalidTrailerValue)?;
                }
                Ok(())
            }
            Ok(httparse::Status::Partial) | Err(_) => Err(Error::MalformedTrailer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` fed in pieces of `step` bytes; the data, or the first error.
    fn dechunk(wire: &[u8], step: usize) -> Result<(Vec<u8>, usize), Error> {
        let mut d = Chunked::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in wire.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                match d.decode(&mut buf)? {
                    Decoded::Data(b) => out.extend_from_slice(&b),
                    Decoded::More => break,
                    Decoded::End => return Ok((out, buf.len())),
                }
            }
        }
        Err(Error::ClosedInBody)
    }

    #[test]
    fn chunked_bodies_decode_however_they_arrive() {
        let wire =
            b"5\r\nhello\r\n1;ext=\"a;b\"\r\n \r\nA \t;x\r\n0123456789\r\n0\r\nT: v\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, wire.len()] {
            let (data, left) = dechunk(wire, step).expect("a valid chunked body");
            assert_eq!(data, b"hello 0123456789", "step {step}");
            // What follows the body stays in the buffer (it is not ours to read).
            if step == wire.len() {
                assert_eq!(left, 4);
            }
        }
    }

    /// Found reading hyper's decoder (`proto/h1/decode.rs`) beside ours: each accepted by one
    /// and refused by the other before the decoder followed hyper's states.
    #[test]
    fn what_hyper_accepts_is_accepted() {
        for (wire, data) in [
            // Leading zeros: any number of digits while the value fits (was: at most 16).
            (
                &b"00000000000000000003\r\nabc\r\n0\r\n\r\n"[..],
                &b"abc"[..],
            ),
            // An extension of 5,000 bytes: hyper counts 16 KiB per body (was: 4 KiB a line).
            (
                format!("3;{}\r\nabc\r\n0\r\n\r\n", "e".repeat(5000))
                    .leak()
                    .as_bytes(),
                b"abc",
            ),
        ] {
            for step in [1, wire.len()] {
                assert_eq!(dechunk(wire, step).expect("accepted").0, data);
            }
        }
    }

    #[test]
    fn bad_chunk_framing_is_an_error_not_a_guess() {
        let long_ext = format!(
            "5;{}\r\nhello\r\n0\r\n\r\n",
            "x".repeat(MAX_EXTENSIONS as usize)
        );
        let long_trailers = format!("0\r\nT: {}\r\n\r\n", "v".repeat(MAX_TRAILER_BYTES));
        let many_trailers = format!("0\r\n{}\r\n", "T: v\r\n".repeat(MAX_TRAILER_FIELDS + 1));
        for wire in [
            &b"5\r\nhelloX\r\n0\r\n\r\n"[..],
            b"\r\nhello\r\n0\r\n\r\n",
            b"g\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"10000000000000000\r\n",
            // Found reading hyper's decoder (accepted before, refused by hyper): a CR inside
            // the size line or an extension, a form feed as whitespace, a trailer section that
            // is not header fields.
            b"5\r\r\nhello\r\n0\r\n\r\n",
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"5\x0c\r\nhello\r\n0\r\n\r\n",
            b"0\r\nnot a field\r\n\r\n",
            b"0\r\nT: v\rx\r\n\r\n",
            long_ext.as_bytes(),
            long_trailers.as_bytes(),
            many_trailers.as_bytes(),
        ] {
            for step in [1, wire.len()] {
                assert!(
                    dechunk(wire, step).is_err(),
                    "{:?} step {step}",
                    String::from_utf8_lossy(wire)
                );
            }
        }
        // The largest size that fits in 64 bits is a size, not an overflow.
        let mut d = Chunked::default();
        let mut buf = BytesMut::from(&b"ffffffffffffffff\r\nabc"[..]);
        assert_eq!(
            d.decode(&mut buf).unwrap(),
            Decoded::Data(Bytes::from_static(b"abc"))
        );
    }

    /// Stepping over a body (the guard) ends where decoding it (the client) ends, and fails
    /// where decoding fails, however the bytes arrive.
    #[test]
    fn skipping_ends_and_fails_where_decoding_does() {
        let good = &b"5;e=1\r\nhello\r\n3\r\nabc\r\n0\r\nT: v\r\n\r\nNEXT"[..];
        let bad = &b"5\r\nhello\r\n0\r\nnot a field\r\n\r\n"[..];
        for step in [1, 2, 5, good.len()] {
            let mut d = Chunked::default();
            let mut used = 0;
            let mut ended = false;
            for piece in good.chunks(step) {
                let (n, end) = d.skip(piece).expect("a valid body");
                used += n;
                ended = end;
                if ended {
                    break;
                }
            }
            assert!(ended, "step {step}");
            assert_eq!(used, good.len() - 4, "step {step}: NEXT is not the body's");
            let mut d = Chunked::default();
            let failed = bad.chunks(step).any(|piece| d.skip(piece).is_err());
            assert!(failed, "step {step}");
            assert!(dechunk(bad, step).is_err(), "step {step}");
        }
    }
}
