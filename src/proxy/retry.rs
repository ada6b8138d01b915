//! Sending a request to an upstream's endpoints, retrying on another one as docs/reference.md
//! says: any request that failed before a byte reached an upstream (connect refused or timed
//! out, TLS failure), and GET, HEAD and OPTIONS also after a reset, a timeout or a 502/503/504
//! answer; never a streamed body, never past `upstream_timeout` counted from the first try.
//!
//! Two parts: [`classify`] turns one try's outcome into "relay this response" or "this failure,
//! retryable or not" (and feeds the endpoint's passive health), and [`send`] spends the budget:
//! tries, endpoints, the deadline and the replayable body.

use super::body::{CutSlot, RequestBody};
use super::pool::{Member, Pool, Slot};
use super::response::ResponseBody;
use super::upstream::{SendError, UpstreamBody};
use super::{cut_error, headers, Gateway, Proxy, ProxyError};
use http::{Request, Response};
use smallvec::SmallVec;
use std::sync::Arc;
use tokio::time::Instant;

/// What one try came to.
enum Outcome {
    /// A response to relay to the client.
    Relay(Response<UpstreamBody>),
    /// A failure; `retry` when another endpoint may be tried (the request has no side effect
    /// yet, or its method is replayable).
    Failed { error: ProxyError, retry: bool },
}

/// Judges one try and records it in the endpoint's passive health. `more`: another try can
/// follow (tries and time left, another endpoint, a replayable body); without it a gateway
/// error from the upstream is relayed as it is, not turned into our 502.
fn classify(
    tried: Result<Result<Response<UpstreamBody>, SendError>, TimedOut>,
    member: &Member,
    replayable_method: bool,
    more: bool,
    header_bytes: usize,
) -> Outcome {
    let endpoint = &member.endpoint;
    let failed = |cause, retry| Outcome::Failed {
        error: ProxyError::BadGateway {
            endpoint: endpoint.label().clone(),
            cause,
        },
        retry,
    };
    match tried {
        Err(_) => {
            member.health.record_passive_failure(Instant::now());
            Outcome::Failed {
                error: ProxyError::GatewayTimeout,
                retry: false,
            }
        }
        Ok(Err(e)) => {
            if e.blames_endpoint() {
                member.health.record_passive_failure(Instant::now());
            }
            let before_send = e.is_connect();
            failed(Gateway::Send(e), before_send || replayable_method)
        }
        // The client's read bound lets a head up to twice header_bytes through; hold the
        // upstream to the same header_bytes as clients.
        Ok(Ok(resp)) if headers::head_len(resp.headers()) > header_bytes => {
            member.health.record_passive_failure(Instant::now());
            failed(Gateway::HeadTooLarge, replayable_method)
        }
        // Relaying a 101 would hand the client a raw tunnel.
        Ok(Ok(resp)) if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
            failed(Gateway::Unsolicited101, false)
        }
        Ok(Ok(resp)) => {
            let status = resp.status().as_u16();
            let gateway_error = matches!(status, 502..=504);
            if gateway_error {
                member.health.record_passive_failure(Instant::now());
            } else {
                member.health.record_passive_success();
            }
            if gateway_error && replayable_method && more {
                failed(Gateway::Answered(status), true)
            } else {
                Outcome::Relay(resp)
            }
        }
    }
}

/// The deadline passed before the upstream answered.
#[derive(Debug)]
pub(super) struct TimedOut;

/// Sends to the picked endpoint of `upstream`, retrying as the module says.
pub(super) async fn send(
    proxy: &Proxy,
    mut parts: http::request::Parts,
    mut body: RequestBody,
    via_proxy: bool,
    cut: &CutSlot,
    upstream: &Pool,
) -> Result<(Response<ResponseBody>, Arc<str>), ProxyError> {
    let limits = &proxy.limits;
    let first_sent = Instant::now();
    let deadline = first_sent + limits.upstream_timeout;
    let replayable_method = headers::is_replayable(&parts.method);
    let mut tried: SmallVec<[Slot; 4]> = SmallVec::new();
    let mut last_err: Option<ProxyError> = None;
    loop {
        let Some((slot, member)) = upstream.pick(&tried, via_proxy) else {
            return Err(last_err.unwrap_or(ProxyError::NoUpstream));
        };
        let role = usize::from(!matches!(slot, Slot::Local));
        tried.push(slot);
        let attempts_left = tried.len() <= upstream.retries as usize;
        // Keep what another try needs only when one can follow: tries are left and another
        // endpoint exists (a sidecar's lone `local` has none, so its requests are never copied).
        let spare = if attempts_left && upstream.has_alternative(&tried, via_proxy) {
            body.try_clone()
        } else {
            None
        };
        let head = if spare.is_some() {
            copy_head(&parts)
        } else {
            let mut taken = Request::new(()).into_parts().0;
            std::mem::swap(&mut taken, &mut parts);
            taken.extensions = http::Extensions::new();
            taken
        };
        let req = Request::from_parts(head, std::mem::replace(&mut body, RequestBody::empty()));
        let endpoint = &member.endpoint;
        let sent = if tried.len() == 1 {
            first_sent
        } else {
            Instant::now()
        };
        // tokio's timer, one per try: a timer kept by the connection saved less than a
        // hand-written part must earn (docs/architecture.md, "Hand-written or library").
        let tried_once = tokio::time::timeout_at(deadline, endpoint.send(req))
            .await
            .map_err(|_| TimedOut);
        match &tried_once {
            Ok(Ok(_)) => proxy.upstream_latency[role].observe(sent.elapsed().as_secs_f64()),
            Ok(Err(e)) => {
                // A client body that broke the send is the client's failure, not the endpoint's.
                if let Some(e) = cut_error(cut, limits.max_body_bytes) {
                    return Err(e);
                }
                proxy.count_peer_tls_failure(e, &upstream.name);
            }
            Err(_) => {}
        }
        let more = spare.is_some() && Instant::now() < deadline;
        match classify(
            tried_once,
            &member,
            replayable_method,
            more,
            limits.header_bytes,
        ) {
            Outcome::Relay(mut resp) => {
                let version = resp.version();
                headers::rewrite_response(resp.headers_mut(), version);
                let (p, b) = resp.into_parts();
                return Ok((
                    Response::from_parts(p, ResponseBody::upstream(b)),
                    endpoint.label().clone(),
                ));
            }
            Outcome::Failed { error, retry } => match spare {
                Some(again) if retry && attempts_left && Instant::now() < deadline => {
                    tracing::info!(upstream = %upstream.name, endpoint = %endpoint.name,
                        error = %crate::error::chain(&error), "retrying on another endpoint");
                    upstream.retried.inc();
                    body = again;
                    last_err = Some(error);
                }
                _ => return Err(error),
            },
        }
    }
}

/// A copy of a request head for one try, keeping the original for the next.
fn copy_head(parts: &http::request::Parts) -> http::request::Parts {
    let mut copy = Request::new(());
    *copy.method_mut() = parts.method.clone();
    *copy.uri_mut() = parts.uri.clone();
    *copy.version_mut() = parts.version;
    *copy.headers_mut() = parts.headers.clone();
    copy.into_parts().0
}
