//! Request bodies as the proxy moves them (responses: [`super::response`]).
//!
//! They are either buffered (small, known length: replayable on another endpoint) or
//! streamed through [`Limited`], which enforces `max_body_bytes` and `body_timeout` (the whole
//! body, however slowly it trickles) and records why it stopped so the service can answer 413,
//! 408 or 400 instead of a generic 502 that would blame (and eject) a healthy upstream.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::time::{Instant, Sleep};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a streamed request body was cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyCut {
    #[error("request body exceeded max_body_bytes")]
    TooLarge,
    #[error("request body exceeded body_timeout")]
    Timeout,
    /// The client sent a malformed body (bad chunk framing) or went away in the middle of it.
    #[error("request body malformed or cut off by the client")]
    Client,
}

/// Shared slot where a [`Limited`] body records why it stopped.
pub(crate) type CutSlot = Arc<Mutex<Option<BodyCut>>>;

pin_project_lite::pin_project! {
    /// An incoming body bounded in size and total time.
    pub struct Limited {
        #[pin]
        inner: Incoming,
        #[pin]
        deadline: Sleep,
        remaining: u64,
        cut: CutSlot,
    }
}

impl Limited {
    pub fn new(inner: Incoming, max: u64, deadline: Instant, cut: CutSlot) -> Self {
        Self {
            inner,
            deadline: tokio::time::sleep_until(deadline),
            remaining: max,
            cut,
        }
    }
}

fn record(cut: &CutSlot, why: BodyCut) -> BoxError {
    if let Ok(mut slot) = cut.lock() {
        slot.get_or_insert(why);
    }
    Box::new(why)
}

impl Body for Limited {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > *this.remaining {
                        return Poll::Ready(Some(Err(record(this.cut, BodyCut::TooLarge))));
                    }
                    *this.remaining -= n;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // The client's fault, whatever the upstream connection reports next.
                if let Ok(mut slot) = this.cut.lock() {
                    slot.get_or_insert(BodyCut::Client);
                }
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if this.deadline.poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(record(this.cut, BodyCut::Timeout))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What goes to the upstream.
pub enum RequestBody {
    Full(Option<Bytes>),
    /// What was already read (if anything), then the rest of the incoming body.
    Stream(Option<Bytes>, Pin<Box<Limited>>),
}

impl RequestBody {
    pub fn empty() -> Self {
        Self::Full(None)
    }

    /// The bytes of the body already in memory (all of a buffered body, the part of a streamed
    /// one read before streaming began).
    pub fn prefix(&self) -> &[u8] {
        match self {
            Self::Full(b) | Self::Stream(b, _) => b.as_deref().unwrap_or_default(),
        }
    }

    /// Whether [`Self::try_clone`] can copy it (the body is buffered).
    pub fn is_replayable(&self) -> bool {
        matches!(self, Self::Full(_))
    }

    /// A copy for another try, when the body is buffered.
    pub fn try_clone(&self) -> Option<Self> {
        match self {
            Self::Full(b) => Some(Self::Full(b.clone())),
            Self::Stream(..) => None,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Full(b) | Self::Stream(b @ Some(_), _) => {
                Poll::Ready(b.take().map(|b| Ok(Frame::data(b))))
            }
            Self::Stream(None, s) => s.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full(b) => b.is_none(),
            Self::Stream(prefix, s) => prefix.is_none() && s.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Stream(prefix, s) => {
                let read = prefix.as_ref().map_or(0, |b| b.len() as u64);
                let inner = s.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + read);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + read);
                }
                hint
            }
        }
    }
}
