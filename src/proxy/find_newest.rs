//! `find = "newest"`: a GET or HEAD asked of every endpoint of a route at once, the newest copy
//! served.
//!
//! Why: Ironic writes a node's boot files (`pxelinux.cfg/<mac>`, `grub.cfg-01-<mac>`, ...) only
//! into the `[deploy]http_root` of the conductor that owns the node, so exactly one instance has
//! them, and after a takeover the old owner's copy may linger. The rules:
//!
//! - Every endpoint [`Pool::find_members`] gives (`local` first, then the healthy peers) is asked,
//!   at most [`MAX_CONCURRENT`] at a time, each within `find_timeout` (connect and response head).
//!   Every answer is awaited: a newer copy may come last.
//! - 2xx: has it. 404 or 410: has not. Anything else, a timeout, a refused or broken connection:
//!   failed (and counted against the endpoint's health). An endpoint left out because its health
//!   checks fail counts as failed too: it may be the owner.
//! - The 2xx with the newest `Last-Modified` wins (none counts as oldest); on a tie the endpoint
//!   asked first, so `local`. All "has not": 404. None has it and one failed: 502 (the owner may be
//!   the one that failed; a 404 then would make iPXE fall back to its default script silently).
//!   No endpoint: 503. The proxy never adds `Retry-After` (iPXE would retry forever) and drops one
//!   from a relayed answer.
//! - The chosen body is streamed, never buffered; the other answers' connections go back to their
//!   pools when their bodies are small and read within a second, and are closed otherwise.
//! - Conditional fields (`If-*`) are not sent: each endpoint would judge them against its own
//!   copy, and a 304 from an old copy must not beat a 200 from a new one.
//! - Loop safety: fan-out requests carry our `Via` like every forwarded request; a proxy that
//!   receives one asks its `local` endpoint only (`find_members`).

use super::body::RequestBody;
use super::headers;
use super::pool::{Member, Pool};
use super::response::ResponseBody;
use super::upstream::UpstreamBody;
use super::ProxyError;
use crate::metrics::{FindLabels, Metrics};
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{header, Request, Response, StatusCode};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// Endpoints asked at the same time.
pub(crate) const MAX_CONCURRENT: usize = 16;

/// A losing answer's body is read (to keep its connection) only up to this size and time.
const DRAIN_BYTES: u64 = 64 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// Counters by outcome, resolved once.
struct Outcomes {
    found: Counter,
    not_found: Counter,
    failed: Counter,
    no_endpoint: Counter,
}

/// One find route's upstream.
pub struct Finder {
    pool: Arc<Pool>,
    timeout: Duration,
    outcomes: Outcomes,
}

enum Answer {
    Found {
        resp: Response<UpstreamBody>,
        modified: Option<SystemTime>,
    },
    Missing,
    Failed(String),
}

impl Finder {
    pub fn new(pool: Arc<Pool>, timeout: Duration, listener: &str, metrics: &Metrics) -> Self {
        let counter = |outcome| {
            metrics
                .finds
                .get_or_create(&FindLabels {
                    listener: listener.to_owned(),
                    outcome,
                })
                .clone()
        };
        Self {
            pool,
            timeout,
            outcomes: Outcomes {
                found: counter("found"),
                not_found: counter("not_found"),
                failed: counter("failed"),
                no_endpoint: counter("no_endpoint"),
            },
        }
    }

    /// Asks every endpoint for `parts` (a GET or HEAD whose headers are already rewritten for
    /// the upstream) and answers with the newest copy.
    pub async fn find(
        &self,
        mut parts: http::request::Parts,
        via_proxy: bool,
    ) -> Result<(Response<ResponseBody>, Arc<str>), ProxyError> {
        let (members, unavailable) = self.pool.find_members(via_proxy);
        if members.is_empty() {
            self.outcomes.no_endpoint.inc();
            return Err(if via_proxy {
                ProxyError::Loop
            } else {
                ProxyError::NoUpstream
            });
        }
        for name in [
            header::IF_MODIFIED_SINCE,
            header::IF_NONE_MATCH,
            header::IF_MATCH,
            header::IF_UNMODIFIED_SINCE,
            header::IF_RANGE,
        ] {
            parts.headers.remove(name);
        }
        let mut answers: Vec<Option<Answer>> = (0..members.len()).map(|_| None).collect();
        let mut waiting = members.iter().enumerate();
        let mut running = FuturesUnordered::new();
        loop {
            while running.len() < MAX_CONCURRENT {
                let Some((i, (_, member))) = waiting.next() else {
                    break;
                };
                running.push(self.ask(i, member.clone(), &parts));
            }
            let Some((i, answer)) = running.next().await else {
                break;
            };
            answers[i] = Some(answer);
        }
        self.choose(&members, answers, unavailable)
    }

    fn ask(
        &self,
        i: usize,
        member: Arc<Member>,
        parts: &http::request::Parts,
    ) -> impl std::future::Future<Output = (usize, Answer)> + Send + 'static {
        let mut req = Request::new(RequestBody::empty());
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = parts.uri.clone();
        *req.headers_mut() = parts.headers.clone();
        let timeout = self.timeout;
        async move {
            let endpoint = &member.endpoint;
            let answer = match tokio::time::timeout(timeout, endpoint.send(req)).await {
                Err(_) => {
                    member.health.record_passive_failure(Instant::now());
                    Answer::Failed(format!("{}: no answer within {timeout:?}", endpoint.name))
                }
                Ok(Err(e)) => {
                    if e.blames_endpoint() {
                        member.health.record_passive_failure(Instant::now());
                    }
                    Answer::Failed(format!("{}: {}", endpoint.name, crate::error::chain(&e)))
                }
                Ok(Ok(resp)) => {
                    let status = resp.status();
                    if status.is_success() {
                        member.health.record_passive_success();
                        let modified = resp
                            .headers()
                            .get(header::LAST_MODIFIED)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| httpdate::parse_http_date(v).ok());
                        Answer::Found { resp, modified }
                    } else if status == StatusCode::NOT_FOUND || status == StatusCode::GONE {
                        member.health.record_passive_success();
                        discard(resp);
                        Answer::Missing
                    } else {
                        if status.is_server_error() {
                            member.health.record_passive_failure(Instant::now());
                        }
                        discard(resp);
                        Answer::Failed(format!("{}: answered {status}", endpoint.name))
                    }
                }
            };
            (i, answer)
        }
    }

    fn choose(
        &self,
        members: &[(super::pool::Slot, Arc<Member>)],
        answers: Vec<Option<Answer>>,
        unavailable: usize,
    ) -> Result<(Response<ResponseBody>, Arc<str>), ProxyError> {
        let mut best: Option<(usize, Option<SystemTime>)> = None;
        let mut failures = Vec::new();
        for (i, a) in answers.iter().enumerate() {
            match a {
                Some(Answer::Found { modified, .. }) => {
                    if best.is_none_or(|(_, b)| *modified > b) {
                        best = Some((i, *modified));
                    }
                }
                Some(Answer::Failed(why)) => failures.push(why.as_str()),
                Some(Answer::Missing) | None => {}
            }
        }
        let Some((winner, _)) = best else {
            if failures.is_empty() && unavailable == 0 {
                self.outcomes.not_found.inc();
                return Err(ProxyError::NotFound);
            }
            self.outcomes.failed.inc();
            return Err(ProxyError::BadGateway {
                endpoint: "find".into(),
                cause: super::Gateway::Find {
                    failed: failures.len(),
                    unavailable,
                    detail: failures.join("; "),
                },
            });
        };
        let mut chosen = None;
        for (i, a) in answers.into_iter().enumerate() {
            if let Some(Answer::Found { resp, .. }) = a {
                if i == winner {
                    chosen = Some(resp);
                } else {
                    discard(resp);
                }
            }
        }
        let resp = chosen.ok_or(ProxyError::NoUpstream)?;
        self.outcomes.found.inc();
        let version = resp.version();
        let (mut p, body) = resp.into_parts();
        headers::rewrite_response(&mut p.headers, version);
        p.headers.remove(header::RETRY_AFTER);
        Ok((
            Response::from_parts(p, ResponseBody::upstream(body)),
            members[winner].1.endpoint.label().clone(),
        ))
    }
}

/// An answer that is not served: its connection goes back to the pool when its body is empty,
/// or small and read within [`DRAIN_TIME`]; it is closed otherwise.
fn discard(resp: Response<UpstreamBody>) {
    use http_body::Body as _;
    let body = resp.into_body();
    if body.is_end_stream() {
        return; // dropped at its end: the connection goes back
    }
    if body.size_hint().upper().is_some_and(|n| n <= DRAIN_BYTES) {
        tokio::spawn(async move {
            // Read to its end in time, the body gives the connection back; otherwise it is
            // dropped with the body, closed.
            let _ = tokio::time::timeout(DRAIN_TIME, http_body_util::BodyExt::collect(body)).await;
        });
    }
}
