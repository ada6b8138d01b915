//! `ironic-proxy doctor`: checks a running deployment from inside its pod, with the proxy's own
//! configuration and identity, and reports one line per check with a verdict.
//!
//! What it looks at, in order: the live certificate (the one a TLS listener serves right now:
//! its SANs against the configured names and IPs, its time to expiry, its chain to the trust
//! bundle), every trusted CA's validity, the exported files against the live certificate, then
//! per listener its upstream (the local endpoint reachable, the DNS answer, and for every peer
//! found: TCP, a TLS handshake with our client certificate, whether the peer's certificate
//! covers the address dialled, its expiry, the round-trip time of a health request and the
//! clock skew from the peer's `Date`), and finally the admin endpoint's `/readyz`.
//!
//! Everything is done in-process with the proxy's own TLS and DNS code (no shell, no curl), so
//! it runs in a distroless image. It only reads: no file is written, no state is changed.

pub(crate) mod boot_tls;
mod identity;
mod locks;
mod net;
mod peers;
mod upstream;

use crate::config::{Config, Env};
use std::fmt::Write as _;
use std::time::Duration;

/// How long any one network step may take.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(3);

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    /// Works, but not for every client it is meant for (does not fail the report).
    Warn,
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked, as a dotted path: `identity.sans`, `upstream[api].peer[10.0.0.2:6385].tls`.
    pub name: String,
    pub verdict: Verdict,
    /// What was found, in one line.
    pub detail: String,
}

/// Every check, in the order they ran.
#[derive(Debug, Default)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub(crate) fn pass(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(name, Verdict::Pass, detail);
    }

    pub(crate) fn fail(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(name, Verdict::Fail, detail);
    }

    pub(crate) fn warn(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(name, Verdict::Warn, detail);
    }

    fn push(&mut self, name: impl Into<String>, verdict: Verdict, detail: impl Into<String>) {
        // One line per check, whatever a peer put in its answer.
        let detail: String = detail
            .into()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        self.checks.push(Check {
            name: name.into(),
            verdict,
            detail,
        });
    }

    /// True when every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.verdict != Verdict::Fail)
    }

    /// `PASS name: detail` lines and a summary line; a FAIL line ends with its row in
    /// docs/troubleshoot.md, `(see docs/troubleshoot.md#doctor-...)`.
    pub fn text(&self) -> String {
        let mut o = String::new();
        for c in &self.checks {
            let v = match c.verdict {
                Verdict::Pass => "PASS",
                Verdict::Fail => "FAIL",
                Verdict::Warn => "WARN",
            };
            let _ = write!(o, "{v} {}: {}", c.name, c.detail);
            if c.verdict == Verdict::Fail {
                let _ = write!(o, " (see docs/troubleshoot.md#{})", anchor(&c.name));
            }
            o.push('\n');
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.verdict == Verdict::Fail)
            .count();
        let _ = writeln!(o, "{} checks, {} failed", self.checks.len(), failed);
        o
    }

    /// `{"ok": bool, "checks": [{"check", "verdict", "detail"}]}`, one line.
    pub fn json(&self) -> String {
        let mut o = format!("{{\"ok\":{},\"checks\":[", self.passed());
        for (i, c) in self.checks.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            let v = match c.verdict {
                Verdict::Pass => "pass",
                Verdict::Fail => "fail",
                Verdict::Warn => "warn",
            };
            let _ = write!(
                o,
                "{{\"check\":{},\"verdict\":\"{v}\",\"detail\":{}}}",
                json_string(&c.name),
                json_string(&c.detail)
            );
        }
        o.push_str("]}\n");
        o
    }
}

/// The anchor of a check's row in docs/troubleshoot.md ("Doctor FAIL lines"): `doctor-` and the
/// name without its bracketed parts (listener, peer address, index), `.` and `_` as `-`, and
/// `-each` for a name that ends in one (a line per item, kept apart from the bare name: `peers`
/// and `peers[ADDR]` are two checks): `upstream[api].peer[10.0.0.2:6385].tls` is
/// `doctor-upstream-peer-tls`, `peers[10.0.0.2:6189]` `doctor-peers-each`.
pub(crate) fn anchor(name: &str) -> String {
    let mut out = String::from("doctor-");
    let mut depth = 0usize;
    for c in name.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            '.' | '_' if depth == 0 => out.push('-'),
            c if depth == 0 => out.push(c),
            _ => {}
        }
    }
    if name.ends_with(']') {
        out.push_str("-each");
    }
    out
}

/// A JSON string literal (RFC 8259 §7).
fn json_string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", u32::from(c));
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// What to check beyond the pod itself.
pub struct Options<'a> {
    /// `--peers`: a JSON-RPC call to every peer conductor and through every egress.
    pub peers: bool,
    /// The environment the configuration came from, to name the variable behind an address.
    pub env: &'a dyn Env,
}

/// Runs every check for `config`.
pub async fn run(config: &Config, options: &Options<'_>) -> Report {
    let mut report = Report::default();
    let ours = identity::check(config, &mut report).await;
    for f in crate::config::scale_out(config, options.env) {
        let name = format!("scale.{}", f.check);
        if f.ok {
            report.pass(name, f.detail);
        } else {
            report.fail(name, f.detail);
        }
    }
    let gap = boot_tls::ipxe_gap(&config.tls);
    for l in config.listeners.iter().filter(|l| boot_tls::is_boot_tls(l)) {
        let name = format!("listener[{}].ipxe_tls", l.name);
        match &gap {
            Some(why) => report.warn(name, format!("iPXE cannot connect: {why}")),
            None => report.pass(name, "TLS 1.2 with ECDHE AES-GCM and iPXE's groups offered"),
        }
    }
    for lc in &config.listeners {
        upstream::check(config, lc, ours.as_ref(), &mut report).await;
    }
    if options.peers {
        peers::check(config, ours.as_ref(), &mut report).await;
        locks::check(config, &mut report).await;
    }
    match &config.admin {
        Some(a) => net::check_admin(a.listen[0], &mut report).await,
        None => report.pass("admin", "no [admin] configured"),
    }
    report
}

#[cfg(test)]
mod tests {
    use super::{json_string, Report};

    #[test]
    fn report_lines_and_json() {
        let mut r = Report::default();
        r.pass("a", "fine");
        r.fail("b", "broken\nacross \"lines\"");
        assert!(!r.passed());
        assert_eq!(
            r.text(),
            "PASS a: fine\nFAIL b: broken across \"lines\" (see docs/troubleshoot.md#doctor-b)\n\
             2 checks, 1 failed\n"
        );
        assert_eq!(
            r.json(),
            "{\"ok\":false,\"checks\":[{\"check\":\"a\",\"verdict\":\"pass\",\"detail\":\"fine\"},\
             {\"check\":\"b\",\"verdict\":\"fail\",\"detail\":\"broken across \\\"lines\\\"\"}]}\n"
        );
        assert_eq!(json_string("\u{1}\\"), "\"\\u0001\\\\\"");
    }

    #[test]
    fn anchors_drop_listeners_addresses_and_indexes() {
        for (name, anchor) in [
            ("identity", "doctor-identity"),
            ("scale.egress_targets", "doctor-scale-egress-targets"),
            ("trust[2]", "doctor-trust-each"),
            (
                "upstream[api].peer[[fd00::2]:6385].tls",
                "doctor-upstream-peer-tls",
            ),
            ("listener[ipxe-tls].ipxe_tls", "doctor-listener-ipxe-tls"),
            ("peers", "doctor-peers"),
            ("peers.dns[api]", "doctor-peers-dns-each"),
            ("peers[10.0.0.2:6189]", "doctor-peers-each"),
            ("egress[json-rpc-egress].json-rpc", "doctor-egress-json-rpc"),
        ] {
            assert_eq!(super::anchor(name), anchor, "{name}");
        }
    }
}
