//! The effective configuration as TOML, for `ironic-proxy check`: every default filled in,
//! every variable expanded. The file holds no secret values (keys are referenced by path and
//! never read here), so nothing needs masking; key *contents* are never printed.

use super::{Config, IdentitySource, TlsMode};
use std::fmt::Write as _;
use std::time::Duration;

fn d(v: Duration) -> String {
    format!("\"{}\"", humantime::format_duration(v))
}

/// A TOML basic string that reads back as `s`. Every string of the file is interpolated when it
/// is read and the rendered values are already expanded, so `$` is written `$$`; control
/// characters become `\uXXXX` (Rust's `{:?}` writes `\u{1b}`, which TOML rejects).
fn q(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '$' => o.push_str("$$"),
            c if c.is_control() => {
                let _ = write!(o, "\\u{:04X}", u32::from(c));
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn list<T: ToString>(items: &[T]) -> String {
    let v: Vec<String> = items.iter().map(|i| q(&i.to_string())).collect();
    format!("[{}]", v.join(", "))
}

impl Config {
    /// The effective configuration in the file's own syntax.
    pub fn render(&self) -> String {
        let mut o = String::new();
        if let Some(id) = &self.identity {
            let _ = writeln!(
                o,
                "[identity]\ntrust = {}",
                q(&id.trust.display().to_string())
            );
            match &id.source {
                IdentitySource::Files { cert, key } => {
                    let _ = writeln!(o, "cert = {}", q(&cert.display().to_string()));
                    let _ = writeln!(o, "key = {}", q(&key.display().to_string()));
                }
                IdentitySource::Issuer(i) => {
                    let _ = writeln!(
                        o,
                        "issuer_cert = {}",
                        q(&i.issuer_cert.display().to_string())
                    );
                    let _ = writeln!(o, "issuer_key = {}", q(&i.issuer_key.display().to_string()));
                    let _ = writeln!(o, "dns_names = {}", list(&i.dns_names));
                    let _ = writeln!(o, "ip_addresses = {}", list(&i.ip_addresses));
                    let _ = writeln!(o, "validity = {}", d(i.validity));
                    let _ = writeln!(o, "renew_before = {}", d(i.renew_before));
                }
            }
            if let Some(e) = &id.export {
                let _ = writeln!(o, "export_dir = {}", q(&e.dir.display().to_string()));
                let _ = writeln!(o, "export_mode = \"{:04o}\"", e.mode);
                if let Some(g) = e.group {
                    let _ = writeln!(o, "export_group = {g}");
                }
            }
            let _ = writeln!(o, "watch_interval = {}\n", d(id.watch_interval));
        }
        if let Some(a) = &self.admin {
            let _ = writeln!(o, "[admin]\nlisten = {}", list(&a.listen));
            if let Some(t) = &a.bearer_token_file {
                let _ = writeln!(o, "bearer_token_file = {}", q(&t.display().to_string()));
            }
            let _ = writeln!(o);
        }
        let _ = writeln!(
            o,
            "[dns]\nservers = {}  # empty: system resolver\nrefresh = {}\nhold_on_empty = {}\n",
            list(&self.dns.servers),
            d(self.dns.refresh),
            d(self.dns.hold_on_empty)
        );
        let l = &self.limits;
        let _ = writeln!(
            o,
            "[limits]\nmax_connections = {}\nheader_bytes = {}\nrequest_head_timeout = {}\n\
             body_timeout = {}\nidle_timeout = {}\nupstream_timeout = {}\nmax_body_bytes = {}\n\
             drain_timeout = {}\nidle_trim = {}  # 0s: never\n\
             upstream_connections = {}  # per endpoint; 0: no bound\n\
             handover = {}  # a new process takes the listeners over\n",
            l.max_connections,
            l.header_bytes,
            d(l.request_head_timeout),
            d(l.body_timeout),
            d(l.idle_timeout),
            d(l.upstream_timeout),
            l.max_body_bytes,
            d(l.drain_timeout),
            d(l.idle_trim),
            l.upstream_connections,
            l.handover
        );
        let _ = writeln!(o, "{}", self.tls.render());
        for lc in &self.listeners {
            let tls = match lc.tls {
                TlsMode::None => "none",
                TlsMode::Server => "server",
                TlsMode::Mutual => "mutual",
                TlsMode::Optional => "optional",
            };
            let _ = writeln!(
                o,
                "[[listeners]]\nname = {}\nlisten = {}\ntls = \"{tls}\"\nhttp2 = {}\nallow = {}",
                q(&lc.name),
                q(&lc.listen.to_string()),
                lc.http2,
                list(&lc.allow)
            );
            if lc.jsonrpc {
                let _ = writeln!(o, "jsonrpc = true");
            }
            if let Some(e) = &lc.egress {
                let join = |ports: &[u16]| {
                    let v: Vec<String> = ports.iter().map(ToString::to_string).collect();
                    v.join(", ")
                };
                let _ = writeln!(
                    o,
                    "[listeners.egress]\ncredentials = {}\ntargets = {}\nports = [{}]\n\
                     plain_ports = [{}]\nothers = \"{}\"",
                    q(&e.credentials.display().to_string()),
                    list(&e.targets),
                    join(&e.ports),
                    join(&e.plain_ports),
                    e.others.as_str()
                );
                continue;
            }
            let u = &lc.upstream;
            let _ = writeln!(o, "[listeners.upstream]");
            if let Some(local) = &u.local {
                let _ = writeln!(o, "local = {}", q(&local.to_string()));
            }
            if let Some(dns) = &u.dns {
                let _ = writeln!(o, "dns = {}", q(&dns.to_string()));
            }
            upstream_policy(&mut o, u);
            if let Some(a) = &lc.auth {
                let _ = writeln!(o, "{}", a.render(&q));
            }
            for r in &lc.routes {
                render_route(&mut o, r);
            }
        }
        o
    }
}

/// One `[[listeners.routes]]` with its upstream, every default filled in.
fn render_route(o: &mut String, r: &super::RouteConfig) {
    let methods: Vec<&str> = r.methods.iter().map(http::Method::as_str).collect();
    let _ = writeln!(o, "[[listeners.routes]]\npaths = {}", list(&r.paths));
    if methods.is_empty() {
        let _ = writeln!(o, "# methods: any");
    } else {
        let _ = writeln!(o, "methods = {}", list(&methods));
    }
    let _ = writeln!(
        o,
        "plaintext = {}\n[listeners.routes.upstream]",
        r.plaintext
    );
    let u = &r.upstream;
    if let Some(local) = &u.local {
        let _ = writeln!(o, "local = {}", q(&local.to_string()));
    }
    if let Some(dns) = &u.dns {
        let _ = writeln!(o, "dns = {}", q(&dns.to_string()));
    }
    if r.find.is_some() {
        let _ = writeln!(o, "find = \"newest\"\nfind_timeout = {}", d(r.find_timeout));
    }
    upstream_policy(o, u);
}

/// What a listener's and a route's upstream share after their addresses: fallback peers, TLS,
/// balancing, retries and health checks, every default filled in.
fn upstream_policy(o: &mut String, u: &super::UpstreamConfig) {
    if !u.fallback.is_empty() {
        let _ = writeln!(o, "fallback = {}", list(&u.fallback));
    }
    let balance = match u.balance {
        crate::balance::Policy::LeastRequest => "least_request",
        crate::balance::Policy::RoundRobin => "round_robin",
    };
    let h = &u.health;
    let _ = writeln!(
        o,
        "tls = {}\nbalance = \"{balance}\"\nretries = {}\nhealth = {{ path = {}, interval = {}, \
         timeout = {}, unhealthy_after = {}, healthy_after = {} }}\n",
        u.tls,
        u.retries,
        q(&h.path),
        d(h.interval),
        d(h.timeout),
        h.unhealthy_after,
        h.healthy_after
    );
}
