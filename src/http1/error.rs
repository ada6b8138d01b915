//! What can be wrong with an HTTP/1.1 message: one variant per fault, so a caller can tell a
//! bad head from bad chunk framing or a peer that went away. The messages are the ones logs
//! and tests have always shown.

use std::io;

/// A fault in an HTTP/1.1 message, or its stream ending before the message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Error {
    // The head.
    #[error("too many response headers")]
    TooManyHeaders,
    #[error("malformed response head")]
    MalformedHead,
    #[error("invalid response status")]
    InvalidStatus,
    #[error("invalid response header name")]
    InvalidHeaderName,
    #[error("invalid response header value")]
    InvalidHeaderValue,
    #[error("response head too large")]
    HeadTooLarge,
    #[error("malformed request head")]
    MalformedRequestHead,

    // The body's framing.
    #[error("Transfer-Encoding in an HTTP/1.0 response")]
    TransferEncodingInHttp10,
    #[error("Transfer-Encoding in an HTTP/1.0 request")]
    TransferEncodingInHttp10Request,
    #[error("Transfer-Encoding other than chunked")]
    NotChunked,
    #[error("Content-Length too large")]
    LengthTooLarge,
    #[error("invalid Content-Length")]
    InvalidLength,
    #[error("conflicting Content-Length")]
    ConflictingLength,

    // Chunked transfer coding.
    #[error("chunk size overflows 64 bits")]
    ChunkSizeOverflow,
    #[error("chunk size line without a digit")]
    ChunkSizeWithoutDigit,
    #[error("invalid chunk size")]
    InvalidChunkSize,
    #[error("bare LF in a chunk extension")]
    BareLfInExtension,
    #[error("chunk extensions too long")]
    ExtensionsTooLong,
    #[error("chunk size line without LF")]
    ChunkSizeLineWithoutLf,
    #[error("chunk data not followed by CRLF")]
    ChunkDataWithoutCrlf,
    #[error("chunked body end without LF")]
    ChunkedEndWithoutLf,
    #[error("trailer field without LF")]
    TrailerFieldWithoutLf,
    #[error("too many trailer fields")]
    TooManyTrailerFields,
    #[error("trailer section too long")]
    TrailerTooLong,
    #[error("invalid trailer field name")]
    InvalidTrailerName,
    #[error("invalid trailer field value")]
    InvalidTrailerValue,
    #[error("malformed trailer section")]
    MalformedTrailer,

    // The stream ending early.
    #[error("the upstream closed the connection before answering")]
    ClosedBeforeAnswer,
    #[error("the upstream closed the connection in the middle of the body")]
    ClosedInBody,
}

impl Error {
    /// True for a stream that ended before its message did; every other fault is in the bytes.
    pub(crate) fn is_early_end(self) -> bool {
        matches!(self, Self::ClosedBeforeAnswer | Self::ClosedInBody)
    }
}

/// The connection code speaks `io::Error`; the typed error stays inside it
/// (`get_ref().downcast_ref::<Error>()`), with the kind that says what happened.
impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = if e.is_early_end() {
            io::ErrorKind::UnexpectedEof
        } else {
            io::ErrorKind::InvalidData
        };
        Self::new(kind, e)
    }
}
