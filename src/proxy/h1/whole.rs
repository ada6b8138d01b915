//! A whole response read from bytes as the upstream client reads it (informational heads
//! skipped, the head parsed, the body framed and decoded, then the end of the stream): the
//! single entry point of the differential fuzz target (`fuzz/fuzz_targets/h1_differential.rs`),
//! which holds it against hyper's client on the same bytes.

use super::{parse_head, response_framing, BodyKind, Chunked, Decoded};
use bytes::BytesMut;
use http::{HeaderMap, Method, StatusCode, Version};
use std::io;

/// What the client made of a response.
#[derive(Debug, PartialEq, Eq)]
pub struct WholeResponse {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// Whether the connection would carry another request.
    pub keep_alive: bool,
}

/// Reads `wire` (everything the upstream sent before closing) as the response to `method`.
pub fn read_whole_response(method: &Method, wire: &[u8]) -> io::Result<WholeResponse> {
    let eof = || io::Error::new(io::ErrorKind::UnexpectedEof, "the upstream closed early");
    let mut buf = BytesMut::from(wire);
    let head = loop {
        let head = parse_head(&mut buf)?.ok_or_else(eof)?;
        if !head.status.is_informational() || head.status == StatusCode::SWITCHING_PROTOCOLS {
            break head;
        }
    };
    let framing = response_framing(method, &head)?;
    let body = match framing.body {
        BodyKind::Empty => Vec::new(),
        BodyKind::Length(n) => {
            let n = usize::try_from(n).map_err(|_| eof())?;
            buf.get(..n).ok_or_else(eof)?.to_vec()
        }
        BodyKind::Close => buf.to_vec(),
        BodyKind::Chunked => {
            let mut chunked = Chunked::default();
            let mut body = Vec::new();
            loop {
                match chunked.decode(&mut buf)? {
                    Decoded::Data(data) => body.extend_from_slice(&data),
                    Decoded::End => break body,
                    Decoded::More => return Err(eof()),
                }
            }
        }
    };
    Ok(WholeResponse {
        status: head.status,
        version: head.version,
        headers: head.headers,
        body,
        keep_alive: framing.keep_alive,
    })
}
