//! `doctor --peers`: the cluster as this conductor's JSON-RPC client sees it. For every peer
//! conductor, one mutual-TLS JSON-RPC call to its sidecar's JSON-RPC listener with this
//! sidecar's own identity; then, through each egress listener, the call Ironic's JSON-RPC client
//! makes to its own `[DEFAULT]host`. One line per peer, with the first cause of a failure:
//! `refused`, `timeout`, `TLS` (handshake, untrusted chain), `SAN` (the peer's certificate does
//! not cover the address dialled), `allow` (the peer's `allow` rules refuse our certificate: 403)
//! or `HTTP` (an answer that is not Ironic's JSON-RPC).
//!
//! Peers are found as Ironic finds them: the conductors its API lists (`GET /v1/conductors` on
//! the local API socket; each `hostname` is a conductor's `[DEFAULT]host`, the host of every
//! JSON-RPC call to it), plus the API upstream's DNS endpoints when a listener has one. The
//! conductors' list is what works under the Ironic standalone operator recipe, whose sidecars
//! run with `IRONIC_PROXY_PEERS=none` (no API upstream peers, so plain `doctor` dials none).
//!
//! The identity presented is the one the running sidecar exported (`export_dir`'s `tls.crt`
//! and `tls.key`, what Ironic's client presents), else a fresh leaf as the other checks use.
//! The call is a JSON-RPC 2.0 request for a method no conductor has: Ironic answers it with
//! the error `-32601` and changes nothing; that answer proves the whole path.

use super::identity::CertInfo;
use super::{net, Report, STEP_TIMEOUT};
use crate::config::{Config, ListenAddr, ListenerConfig, TlsMode, UpstreamAddr};
use crate::identity::Material;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The JSON-RPC id of the doctor's calls, checked in the answer.
const RPC_ID: &str = "ironic-proxy-doctor";
/// A method no conductor serves: Ironic answers `-32601` and does nothing.
const RPC_BODY: &str = "{\"jsonrpc\":\"2.0\",\"method\":\"ironic_proxy_doctor_ping\",\
                        \"params\":{\"context\":{}},\"id\":\"ironic-proxy-doctor\"}";
/// The oldest API version that lists conductors (Ironic's `/v1/conductors`, 1.49).
const API_VERSION: &str = "1.49";
/// Answers larger than this are cut (a conductors' list of hundreds fits).
const MAX_ANSWER: usize = 1 << 20;

pub(super) async fn check(config: &Config, ours: Option<&Material>, report: &mut Report) {
    let Some(rpc) = config
        .listeners
        .iter()
        .find(|l| l.jsonrpc && l.tls == TlsMode::Mutual)
    else {
        return report.fail(
            "peers",
            "no mutual-TLS listener with jsonrpc = true: no JSON-RPC port",
        );
    };
    let ListenAddr::Tcp(listen) = rpc.listen else {
        return report.fail("peers", format!("listener {} is not on TCP", rpc.name));
    };
    let port = listen.port();
    let exported = exported(config);
    let Some(own) = exported.as_ref().or(ours) else {
        return report.fail("peers", "no identity to present");
    };
    let hosts = discover(config, report).await;
    for host in &hosts {
        peer(host, port, own, report).await;
    }
    for l in config.listeners.iter().filter(|l| l.egress.is_some()) {
        let admin = config.admin.as_ref().map(|a| a.listen.as_slice());
        egress(l, &hosts, port, own, admin, report).await;
    }
}

/// The identity the running sidecar exported, when there is one.
fn exported(config: &Config) -> Option<Material> {
    let cfg = config.identity.as_ref()?;
    let dir = &cfg.export.as_ref()?.dir;
    crate::identity::load_files(cfg, &dir.join("tls.crt"), &dir.join("tls.key")).ok()
}

/// The local Ironic API: the upstream of the first listener that is neither JSON-RPC nor egress.
pub(super) fn local_api(config: &Config) -> Option<&UpstreamAddr> {
    config
        .listeners
        .iter()
        .filter(|l| !l.jsonrpc && l.egress.is_none())
        .find_map(|l| l.upstream.local.as_ref())
}

/// The peers' hosts: the conductors Ironic lists, and the API upstream's DNS endpoints.
async fn discover(config: &Config, report: &mut Report) -> Vec<String> {
    let mut hosts = BTreeSet::new();
    match local_api(config) {
        None => report.pass("peers.conductors", "no local Ironic API upstream to ask"),
        Some(addr) => match conductors(addr).await {
            Ok((alive, dead)) => {
                let dead = if dead.is_empty() {
                    String::new()
                } else {
                    format!(" (not alive, not dialled: {})", dead.join(", "))
                };
                report.pass(
                    "peers.conductors",
                    format!(
                        "Ironic at {addr} lists {} live conductor(s): {}{dead}",
                        alive.len(),
                        alive.join(", ")
                    ),
                );
                hosts.extend(alive);
            }
            Err(e) => report.fail(
                "peers.conductors",
                format!("GET /v1/conductors on {addr}: {e}"),
            ),
        },
    }
    for l in &config.listeners {
        let Some(target) = &l.upstream.dns else {
            continue;
        };
        match super::upstream::resolve(&config.dns.servers, target).await {
            Ok(found) => {
                let ips: Vec<String> = found.iter().map(|(a, _)| a.ip().to_string()).collect();
                report.pass(
                    format!("peers.dns[{}]", l.name),
                    format!("{target}: {}", ips.join(", ")),
                );
                hosts.extend(ips);
            }
            Err(e) => report.fail(format!("peers.dns[{}]", l.name), format!("{target}: {e}")),
        }
    }
    hosts.into_iter().collect()
}

/// `GET path` on Ironic's API at `addr` (its local socket or address), as JSON.
pub(super) async fn api_get(addr: &UpstreamAddr, path: &str) -> Result<serde_json::Value, String> {
    let req = format!(
        "GET {path} HTTP/1.0\r\nHost: localhost\r\nX-OpenStack-Ironic-API-Version: \
         {API_VERSION}\r\nUser-Agent: ironic-proxy-doctor\r\n\r\n"
    );
    let (status, body) = match addr {
        UpstreamAddr::Unix(path) => {
            let s = tokio::time::timeout(STEP_TIMEOUT, tokio::net::UnixStream::connect(path))
                .await
                .map_err(|_| format!("no answer within {STEP_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())?;
            exchange(s, req.as_bytes()).await?
        }
        UpstreamAddr::Tcp { host, port } => {
            let a = tokio::net::lookup_host((host.as_str(), *port))
                .await
                .map_err(|e| e.to_string())?
                .next()
                .ok_or_else(|| "no address".to_owned())?;
            let (s, _) = net::connect(a).await?;
            exchange(s, req.as_bytes()).await?
        }
    };
    if status != 200 {
        return Err(format!("HTTP {status}: {}", snippet(&body)));
    }
    serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))
}

/// The conductors' hostnames from Ironic's API on `addr`: (alive, not alive).
pub(super) async fn conductors(addr: &UpstreamAddr) -> Result<(Vec<String>, Vec<String>), String> {
    let v = api_get(addr, "/v1/conductors").await?;
    let list = v
        .get("conductors")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| "no \"conductors\" list in the answer".to_owned())?;
    // Only live conductors are in Ironic's hash ring; a dead one is named, not dialled.
    let (mut alive, mut dead) = (Vec::new(), Vec::new());
    for c in list {
        let Some(host) = c.get("hostname").and_then(serde_json::Value::as_str) else {
            continue;
        };
        if c.get("alive").and_then(serde_json::Value::as_bool) == Some(false) {
            dead.push(host.to_owned());
        } else {
            alive.push(host.to_owned());
        }
    }
    Ok((alive, dead))
}

/// Writes `req`, reads the whole answer (the server closes: HTTP/1.0, or `Connection: close`);
/// returns the status and the body.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    req: &[u8],
) -> Result<(u16, Vec<u8>), String> {
    let io = async {
        s.write_all(req).await?;
        s.flush().await?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            match s.read(&mut chunk).await {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                // TLS peers may close without close_notify after a complete answer.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e),
            }
            if buf.len() > MAX_ANSWER {
                break;
            }
        }
        Ok(buf)
    };
    let buf = tokio::time::timeout(STEP_TIMEOUT, io)
        .await
        .map_err(|_| format!("timeout: no answer within {STEP_TIMEOUT:?}"))?
        .map_err(|e| crate::error::chain(&e))?;
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(head)) = resp.parse(&buf) else {
        return Err("no complete HTTP answer".to_owned());
    };
    Ok((resp.code.unwrap_or(0), buf[head..].to_vec()))
}

fn snippet(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(200)])
        .trim()
        .to_owned()
}

/// A JSON-RPC request as Ironic's client sends it: `POST <target>` with a JSON body.
fn rpc_request(target: &str, host: &str, extra: &str) -> String {
    format!(
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: ironic-proxy-doctor\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n\
         {RPC_BODY}",
        RPC_BODY.len()
    )
}

/// What the answer to the doctor's call says: `Ok(what Ironic said)` for a JSON-RPC 2.0
/// answer with our id, else why not.
fn judge(status: u16, body: &[u8]) -> Result<String, String> {
    let v: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let rpc = v.as_ref().filter(|v| {
        v.get("jsonrpc").and_then(serde_json::Value::as_str) == Some("2.0")
            && v.get("id").and_then(serde_json::Value::as_str) == Some(RPC_ID)
    });
    match (status, rpc) {
        (200, Some(v)) => Ok(match v.pointer("/error/message").and_then(|m| m.as_str()) {
            Some(m) => format!("Ironic answered: {m}"),
            None => "Ironic answered".to_owned(),
        }),
        (s, _) => Err(format!(
            "HTTP: answered {s}, not Ironic's JSON-RPC: {}",
            snippet(body)
        )),
    }
}

/// One peer: TCP, mutual TLS as `host`, the JSON-RPC call; one line.
async fn peer(host: &str, port: u16, own: &Material, report: &mut Report) {
    let ip: Option<IpAddr> = host.parse().ok();
    let name = format!("peers[{host}:{port}]");
    let addr = match ip {
        Some(ip) => SocketAddr::new(ip, port),
        None => match tokio::net::lookup_host((host, port))
            .await
            .ok()
            .and_then(|mut a| a.next())
        {
            Some(a) => a,
            None => return report.fail(name, format!("DNS: {host} does not resolve")),
        },
    };
    let start = std::time::Instant::now();
    let tcp = match net::connect(addr).await {
        Ok((s, _)) => s,
        Err(e) if e.starts_with("no TCP answer") => {
            return report.fail(name, format!("timeout: {e}"))
        }
        Err(e) => return report.fail(name, format!("refused: {e}")),
    };
    let (tls, presented) = match net::handshake(tcp, host, Some(own), own.roots.clone()).await {
        Ok(x) => x,
        Err(e) if e.starts_with("no TLS handshake") => {
            return report.fail(name, format!("timeout: {e}"))
        }
        Err(e) => return report.fail(name, format!("TLS: handshake failed: {e}")),
    };
    let leaf = CertInfo::parse(&presented.chain[0]);
    match (&presented.verified, &leaf) {
        (_, Some(l)) if !l.covers(host) => {
            return report.fail(
                name,
                format!("SAN: the peer's certificate does not cover {host}, the address dialled (it names {})", l.sans()),
            )
        }
        (Err(e), _) => {
            return report.fail(name, format!("TLS: the peer's certificate is not trusted: {e}"))
        }
        _ => {}
    }
    let req = rpc_request("/", &format!("{host}:{port}"), "");
    let (status, body) = match exchange(tls, req.as_bytes()).await {
        Ok(a) => a,
        // A TLS alert after the handshake is the peer refusing our certificate (TLS 1.3 sends
        // it once the client's first flight arrives).
        Err(e) if e.contains("alert") => {
            return report.fail(name, format!("TLS: the peer refused our certificate: {e}"))
        }
        Err(e) => return report.fail(name, e),
    };
    match judge(status, &body) {
        Ok(said) => report.pass(
            name,
            format!(
                "mutual TLS with our certificate, JSON-RPC round trip in {:.1} ms; {said}",
                start.elapsed().as_secs_f64() * 1000.0
            ),
        ),
        // The peer's sidecar verified our certificate and its `allow` rules refused it.
        Err(_) if status == 403 => report.fail(
            name,
            format!(
                "allow: the peer's sidecar refuses our certificate (403): {}",
                snippet(&body)
            ),
        ),
        Err(e) => report.fail(name, e),
    }
}

/// The call Ironic's client makes to its own `[DEFAULT]host` through egress listener `l`.
async fn egress(
    l: &ListenerConfig,
    hosts: &[String],
    port: u16,
    own: &Material,
    admin: Option<&[SocketAddr]>,
    report: &mut Report,
) {
    let name = format!("egress[{}].json-rpc", l.name);
    let Some(e) = &l.egress else { return };
    let ListenAddr::Tcp(listen) = l.listen else {
        return;
    };
    // Our own host: the conductor whose hostname our certificate names.
    let leaf = own
        .certified_key
        .cert
        .first()
        .and_then(|c| CertInfo::parse(c));
    let Some(host) = hosts
        .iter()
        .find(|h| leaf.as_ref().is_some_and(|l| l.covers(h)))
    else {
        return report.fail(
            name,
            "none of the conductors found is named by our certificate: no [DEFAULT]host to call",
        );
    };
    let userpass = match std::fs::read(&e.credentials) {
        Err(err) => return report.fail(name, format!("{}: {err}", e.credentials.display())),
        Ok(b) => match crate::proxy::egress::credentials::plain(&b) {
            Some(p) => p,
            None => {
                return report.fail(
                    name,
                    format!(
                        "{} holds bcrypt hashes: the doctor has no password to call with",
                        e.credentials.display()
                    ),
                )
            }
        },
    };
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(userpass);
    let authority = match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
        _ => format!("{host}:{port}"),
    };
    let req = rpc_request(
        &format!("http://{authority}/"),
        &authority,
        &format!("Proxy-Authorization: Basic {auth}\r\n"),
    );
    let addr = net::dial_addr(listen);
    let tcp = match net::connect(addr).await {
        Ok((s, _)) => s,
        Err(e) => return report.fail(name, format!("refused: the egress at {addr}: {e}")),
    };
    let start = std::time::Instant::now();
    match exchange(tcp, req.as_bytes()).await {
        Err(err) => report.fail(name, err),
        Ok((status, body)) => match judge(status, &body) {
            Ok(said) => report.pass(
                name,
                format!(
                    "POST http://{authority}/ through {addr} (mutual TLS to our own [DEFAULT]host) \
                     in {:.1} ms; {said}",
                    start.elapsed().as_secs_f64() * 1000.0
                ),
            ),
            Err(_) => report.fail(
                name,
                format!(
                    "POST http://{authority}/ through {addr}: HTTP {status} from the egress: {}",
                    snippet(&body)
                ),
            ),
        },
    }
    // `others = "relay"`: a plain request to our own admin listener, which is neither a JSON-RPC
    // port nor a plain port, must be relayed as it would have gone without a proxy.
    let (Some(admin), crate::config::EgressOthers::Relay) = (admin, e.others) else {
        return;
    };
    let name = format!("egress[{}].relay", l.name);
    let host_ip: Option<IpAddr> = host.parse().ok();
    let Some(a) = admin
        .iter()
        .find(|a| a.ip().is_unspecified() || Some(a.ip()) == host_ip)
        .or(admin.first())
    else {
        return;
    };
    let target_host = if a.ip().is_unspecified() {
        authority
            .rsplit_once(':')
            .map_or(authority.as_str(), |(h, _)| h)
            .to_owned()
    } else {
        SocketAddr::new(a.ip(), 0)
            .to_string()
            .trim_end_matches(":0")
            .to_owned()
    };
    let target = format!("{target_host}:{}", a.port());
    let req = format!(
        "GET http://{target}/healthz HTTP/1.1\r\nHost: {target}\r\nUser-Agent: ironic-proxy-doctor\r\n\
         Proxy-Authorization: Basic {auth}\r\nConnection: close\r\n\r\n"
    );
    let tcp = match net::connect(addr).await {
        Ok((s, _)) => s,
        Err(err) => return report.fail(name, format!("refused: the egress at {addr}: {err}")),
    };
    match exchange(tcp, req.as_bytes()).await {
        Err(err) => report.fail(name, err),
        Ok((200, _)) => report.pass(
            name,
            format!("GET http://{target}/healthz through {addr} relayed in plain HTTP: 200"),
        ),
        Ok((status, body)) => report.fail(
            name,
            format!(
                "GET http://{target}/healthz through {addr}: HTTP {status}: {}",
                snippet(&body)
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{judge, rpc_request, RPC_BODY};

    #[test]
    fn only_ironics_json_rpc_answer_with_our_id_passes() {
        // What Ironic 39's server answers to an unknown method (json_rpc/server.py).
        let ironic = br#"{"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method ironic_proxy_doctor_ping was not found"}, "id": "ironic-proxy-doctor"}"#;
        assert_eq!(
            judge(200, ironic).as_deref(),
            Ok("Ironic answered: Method ironic_proxy_doctor_ping was not found")
        );
        let other_id = br#"{"jsonrpc": "2.0", "result": null, "id": "x"}"#;
        assert!(judge(200, other_id).is_err());
        assert_eq!(
            judge(502, b"no upstream").unwrap_err(),
            "HTTP: answered 502, not Ironic's JSON-RPC: no upstream"
        );
        assert!(judge(200, b"peer1").is_err());
    }

    #[test]
    fn the_call_is_framed_as_ironics_client_sends_it() {
        let r = rpc_request("http://[fd00::2]:6189/", "[fd00::2]:6189", "X: y\r\n");
        assert!(r.starts_with("POST http://[fd00::2]:6189/ HTTP/1.1\r\nHost: [fd00::2]:6189\r\n"));
        assert!(r.contains(&format!("Content-Length: {}\r\n", RPC_BODY.len())));
        assert!(r.ends_with(&format!("X: y\r\nConnection: close\r\n\r\n{RPC_BODY}")));
        let v: serde_json::Value = serde_json::from_str(RPC_BODY).expect("the body is JSON");
        assert_eq!(v["jsonrpc"], "2.0");
    }
}
