//! `ironic.locks`: no node is reserved by a conductor that is not alive. Ironic releases a dead
//! conductor's reservations by the name the conductor registered (conductor/manager.py
//! `_check_orphan_nodes`, `reserved_by_any_of` the offline conductors' hostnames) and reserves
//! nodes under `[DEFAULT]host` (conductor/task_manager.py); when the two differ (a
//! `[json_rpc]port` other than 8089 with a `[DEFAULT]host` without it), a node locked by a
//! conductor that died stays locked for good and refuses every action. One line: PASS with the
//! counts, or FAIL naming each such node, its holder and the way out.

use super::peers::{api_get, conductors, local_api};
use super::Report;
use crate::config::Config;
use std::collections::BTreeSet;

/// Nodes asked for per page (Ironic's default `[api]max_limit` is 1000).
const PAGE: usize = 1000;
/// Pages read at most: a bound on a broken `marker` loop (a million nodes).
const MAX_PAGES: usize = 1000;

pub(super) async fn check(config: &Config, report: &mut Report) {
    let Some(addr) = local_api(config) else {
        return report.pass("ironic.locks", "no local Ironic API upstream to ask");
    };
    let (alive, dead) = match conductors(addr).await {
        Ok(c) => c,
        Err(e) => return report.fail("ironic.locks", format!("GET /v1/conductors on {addr}: {e}")),
    };
    let nodes = match reserved(addr).await {
        Ok(n) => n,
        Err(e) => return report.fail("ironic.locks", format!("GET /v1/nodes on {addr}: {e}")),
    };
    let (count, held) = nodes;
    let verdict = judge(&alive, &dead, &held);
    match verdict {
        Ok(live) => report.pass(
            "ironic.locks",
            format!(
                "{count} node(s), {} reserved, each by a live conductor{live}",
                held.len()
            ),
        ),
        Err(stranded) => report.fail(
            "ironic.locks",
            format!(
                "{}: reserved by a conductor that is not alive; Ironic releases a dead \
                 conductor's locks only under the name it registered, so these stay locked. If \
                 the holder registered under another name (its address with :PORT), the kit's \
                 conductor name fix is missing; once the holder is confirmed dead, clear each \
                 lock in Ironic's database (UPDATE nodes SET reservation = NULL WHERE uuid = \
                 '<uuid>' AND reservation = '<holder>'), see docs/troubleshoot.md",
                stranded.join("; ")
            ),
        ),
    }
}

/// Every node's (uuid, name, reservation) where reserved, and how many nodes there are.
async fn reserved(
    addr: &crate::config::UpstreamAddr,
) -> Result<(usize, Vec<(String, String, String)>), String> {
    let (mut count, mut held, mut marker) = (0, Vec::new(), String::new());
    for _ in 0..MAX_PAGES {
        let mut path = format!("/v1/nodes?fields=uuid,name,reservation&limit={PAGE}");
        if !marker.is_empty() {
            path.push_str(&format!("&marker={marker}"));
        }
        let v = api_get(addr, &path).await?;
        let page = v
            .get("nodes")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| "no \"nodes\" list in the answer".to_owned())?;
        let field = |n: &serde_json::Value, k: &str| {
            n.get(k)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        for n in page {
            count += 1;
            let r = field(n, "reservation");
            if !r.is_empty() {
                held.push((field(n, "uuid"), field(n, "name"), r));
            }
        }
        match page.last().map(|n| field(n, "uuid")) {
            Some(last) if page.len() >= PAGE && !last.is_empty() => marker = last,
            _ => return Ok((count, held)),
        }
    }
    Err(format!("more than {} nodes", PAGE * MAX_PAGES))
}

/// Ok(", holders: ...") when every reservation is a live conductor's, else Err(one text per
/// stranded node). A holder missing from the list (its row deleted) counts as not alive.
fn judge(
    alive: &[String],
    dead: &[String],
    held: &[(String, String, String)],
) -> Result<String, Vec<String>> {
    let live: BTreeSet<&str> = alive.iter().map(String::as_str).collect();
    let stranded: Vec<String> = held
        .iter()
        .filter(|(_, _, holder)| !live.contains(holder.as_str()))
        .map(|(uuid, name, holder)| {
            let state = if dead.iter().any(|d| d == holder) {
                "registered, not alive"
            } else {
                "no conductor of that name is registered"
            };
            let name = if name.is_empty() {
                String::new()
            } else {
                format!(" ({name})")
            };
            format!("node {uuid}{name} reserved by {holder} ({state})")
        })
        .collect();
    if !stranded.is_empty() {
        return Err(stranded);
    }
    let holders: BTreeSet<&str> = held.iter().map(|(_, _, h)| h.as_str()).collect();
    Ok(if holders.is_empty() {
        String::new()
    } else {
        format!(": {}", holders.into_iter().collect::<Vec<_>>().join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::judge;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn a_node_held_under_a_name_no_live_conductor_has_is_stranded() {
        let alive = s(&["10.0.0.2:6189", "10.0.0.3:6189"]);
        let dead = s(&["10.0.0.1:6189"]);
        let held = vec![
            ("u1".into(), "host-a".into(), "10.0.0.2:6189".into()),
            // Before the fix: locked as [DEFAULT]host, registered as host:port.
            ("u2".into(), String::new(), "10.0.0.1".into()),
            ("u3".into(), "host-c".into(), "10.0.0.1:6189".into()),
        ];
        let err = judge(&alive, &dead, &held).expect_err("stranded");
        assert_eq!(
            err,
            vec![
                "node u2 reserved by 10.0.0.1 (no conductor of that name is registered)",
                "node u3 (host-c) reserved by 10.0.0.1:6189 (registered, not alive)",
            ]
        );
        assert_eq!(
            judge(&alive, &dead, &held[..1]),
            Ok(": 10.0.0.2:6189".to_owned())
        );
        assert_eq!(judge(&alive, &dead, &[]), Ok(String::new()));
    }
}
