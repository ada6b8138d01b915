//! Request and response bodies as the proxy moves them.
//!
//! Request bodies are either buffered (small, known length: replayable on another endpoint) or
//! streamed through [`Limited`], which enforces `max_body_bytes` and `body_timeout` (the whole
//! body, however slowly it trickles) and records why it stopped so the service can answer 413,
//! 408 or 400 instead of a generic 502 that would blame (and eject) a healthy upstream.
//!
//! Response bodies tell the connection of every poll ([`Progress`]: whether the client or the
//! upstream is being waited on) and carry a guard that runs when the response ends, finished or
//! aborted: it closes the in-flight count of the connection and writes the access log.

use crate::proxy::upstream::Lease;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::time::{Instant, Sleep};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
pub type CutSlot = Arc<Mutex<Option<BodyCut>>>;

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

/// Told how a response body is read, so that the connection can tell a client that stopped
/// reading (it stops polling) from an upstream that is slow (polls return pending).
pub trait Progress: Send + Sync + 'static {
    /// The body was polled; `waiting_on_upstream`: it returned pending.
    fn polled(&mut self, waiting_on_upstream: bool);
}

/// Runs once when a response ends, however it ends.
pub trait OnEnd: Send + Sync + 'static {
    /// `bytes` sent to the client; `complete` false if the body was aborted.
    fn on_end(&mut self, bytes: u64, complete: bool);

    /// The first data frame of the response, before it is sent; by default ignored.
    fn on_first_data(&mut self, _data: &[u8]) {}
}

enum Inner {
    Full(Option<Bytes>),
    /// With the upstream connection it comes from, given back to its pool at the end.
    Upstream(Incoming, Option<Lease>),
}

/// What goes to the client.
pub struct ResponseBody {
    inner: Inner,
    bytes: u64,
    done: bool,
    on_end: Option<Box<dyn OnEnd>>,
    /// The connection's in-flight guard: told of every poll, dropped with the body.
    progress: Option<Box<dyn Progress>>,
}

impl ResponseBody {
    pub fn full(b: impl Into<Bytes>) -> Self {
        let b: Bytes = b.into();
        Self {
            inner: Inner::Full((!b.is_empty()).then_some(b)),
            bytes: 0,
            done: false,
            on_end: None,
            progress: None,
        }
    }

    pub fn upstream(b: Incoming, lease: Lease) -> Self {
        Self {
            inner: Inner::Upstream(b, Some(lease)),
            bytes: 0,
            done: false,
            on_end: None,
            progress: None,
        }
    }

    pub fn set_on_end(&mut self, f: Box<dyn OnEnd>) {
        self.on_end = Some(f);
    }

    /// Tells `progress` of every poll and keeps it alive until the response ends.
    pub fn attach(&mut self, progress: impl Progress) {
        self.progress = Some(Box::new(progress));
    }

    fn finish(&mut self, complete: bool) {
        self.done = true;
        if let Inner::Upstream(_, lease) = &mut self.inner {
            // Read to its end: the connection can carry another request. Otherwise dropping
            // the lease closes it.
            if let Some(lease) = lease.take().filter(|_| complete) {
                lease.release();
            }
        }
        if let Some(mut f) = self.on_end.take() {
            f.on_end(self.bytes, complete);
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        let complete = self.done || self.is_end_stream();
        self.finish(complete);
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = match &mut this.inner {
            Inner::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Inner::Upstream(body, _) => Pin::new(body)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(|e| Box::new(e) as BoxError))),
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    if this.bytes == 0 && !d.is_empty() {
                        if let Some(f) = &mut this.on_end {
                            f.on_first_data(d);
                        }
                    }
                    this.bytes += d.len() as u64;
                }
            }
            Poll::Ready(None) => this.finish(true),
            Poll::Ready(Some(Err(_))) => this.finish(false),
            Poll::Pending => {}
        }
        if let Some(p) = &mut this.progress {
            p.polled(polled.is_pending());
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full(b) => b.is_none(),
            Inner::Upstream(b, _) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Inner::Upstream(b, _) => b.size_hint(),
        }
    }
}
