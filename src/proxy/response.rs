//! Response bodies as the proxy moves them to the client.
//!
//! They tell the connection of every poll ([`Progress`]: whether the client or the upstream is
//! being waited on), read the upstream's body ([`UpstreamBody`], which gives its connection back
//! to the pool when read to the end), and carry a guard that runs when the response ends, finished or aborted: it
//! closes the in-flight count of the connection and writes the access log.

use super::body::BoxError;
use super::upstream::UpstreamBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

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
    /// Read from the upstream connection, which it gives back to its pool at the end.
    Upstream(UpstreamBody),
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

    pub fn upstream(b: UpstreamBody) -> Self {
        Self {
            inner: Inner::Upstream(b),
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
            Inner::Upstream(body) => Pin::new(body).poll_frame(cx),
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
            Inner::Upstream(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Inner::Upstream(b) => b.size_hint(),
        }
    }
}
