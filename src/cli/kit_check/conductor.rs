//! `conductor_name`: every Ironic conductor of the overlay registers under the name it locks
//! nodes under. Ironic locks a node as `[DEFAULT]host` (conductor/task_manager.py,
//! `Node.reserve(..., CONF.host, ...)`) but registers the conductor as `host:[json_rpc]port`
//! when the transport is JSON-RPC and the port is not 8089 (conductor/base_manager.py,
//! `prepare_host`); the survivors release a dead conductor's locks by its registered name
//! (manager.py `_check_orphan_nodes`), so with two names a node locked by a conductor that dies
//! stays locked for good. The kit's rendering: `[json_rpc]port` 8089 and `[DEFAULT]host` =
//! address plus the port peers dial (the sidecar's JSON-RPC listener). Pure.

use super::model::{Container, Overlay};
use super::Line;

/// Ironic's default `[json_rpc]port`: the one value at which the registered name is the host.
const IRONIC_DEFAULT_PORT: &str = "8089";
/// ironic-image's default `IRONIC_JSON_RPC_PORT` (scripts/ironic-common.sh), which it renders
/// as `[json_rpc]port`.
const IMAGE_DEFAULT_PORT: &str = "6189";

/// What one container gives Ironic: its `[json_rpc]port` and the port its `[DEFAULT]host`
/// carries, if any.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Names {
    pub(super) json_rpc_port: String,
    pub(super) host: Option<String>,
    pub(super) host_port: Option<String>,
}

/// Reads a container that runs ironic-image's Ironic (`runironic` in its command).
pub(super) fn names(c: &Container) -> Names {
    let env = |k: &str| c.env.get(k).cloned();
    let image_port = env("IRONIC_JSON_RPC_PORT").unwrap_or_else(|| IMAGE_DEFAULT_PORT.into());
    let json_rpc_port = env("OS_JSON_RPC__PORT").unwrap_or_else(|| image_port.clone());
    // [DEFAULT]host: OS_DEFAULT__HOST wins over the rendered file; ironic-image renders
    // IRONIC_CONDUCTOR_HOST, which the container's env or its command's script may set.
    let host = env("OS_DEFAULT__HOST")
        .or_else(|| env("IRONIC_CONDUCTOR_HOST"))
        .or_else(|| exported(&c.command.join("\n"), "IRONIC_CONDUCTOR_HOST"));
    let host_port = host.as_deref().and_then(|h| {
        let h = h.replace("${IRONIC_JSON_RPC_PORT}", &image_port);
        let h = h.replace("$IRONIC_JSON_RPC_PORT", &image_port);
        let (before, port) = h.rsplit_once(':')?;
        // An IPv6 literal without brackets has no port.
        let bare_v6 = !before.ends_with(']') && !before.ends_with('}') && before.contains(':');
        (!bare_v6 && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
            .then(|| port.to_owned())
    });
    Names {
        json_rpc_port,
        host,
        host_port,
    }
}

/// The value a shell script exports for `var` (`export VAR=...`), quotes removed.
fn exported(script: &str, var: &str) -> Option<String> {
    let at = script.find(&format!("{var}="))?;
    let rest = &script[at + var.len() + 1..];
    let value = match rest.chars().next()? {
        q @ ('"' | '\'') => rest[1..].split(q).next()?,
        _ => rest.split_whitespace().next()?,
    };
    Some(value.to_owned())
}

pub(super) fn conductor_name(o: &Overlay) -> Line {
    let sidecar_port = o
        .site
        .get("IRONIC_PROXY_RPC_PORT")
        .cloned()
        .unwrap_or_else(|| IMAGE_DEFAULT_PORT.into());
    let fix = format!(
        "render Ironic as the kit does: OS_JSON_RPC__PORT \"{IRONIC_DEFAULT_PORT}\" and \
         IRONIC_CONDUCTOR_HOST set to the conductor's address followed by \
         \":{sidecar_port}\", the sidecar's JSON-RPC port (config/k8s/standalone/ironic.yaml's \
         ironic container)"
    );
    let mut seen = Vec::new();
    for (workload, w) in &o.workloads {
        for (name, c) in &w.containers {
            if !c.command.iter().any(|a| a.contains("runironic")) {
                continue;
            }
            let n = names(c);
            let who = format!("{workload} ({name})");
            if n.json_rpc_port != IRONIC_DEFAULT_PORT {
                let host = n.host.as_deref().unwrap_or("<address>");
                return Line::fail(
                    "conductor_name",
                    format!(
                        "{who}: [json_rpc]port {} makes Ironic register the conductor as \
                         {host}:{} while it locks nodes as {host}: the locks of a conductor \
                         that dies are never released",
                        n.json_rpc_port, n.json_rpc_port
                    ),
                    fix,
                );
            }
            match n.host_port {
                Some(p) if p == sidecar_port => seen.push(who),
                Some(p) => {
                    return Line::fail(
                        "conductor_name",
                        format!(
                            "{who}: [DEFAULT]host carries port {p}, the sidecar's JSON-RPC \
                             listener is {sidecar_port}: peers dial a port nobody serves"
                        ),
                        fix,
                    )
                }
                None => {
                    return Line::fail(
                        "conductor_name",
                        format!(
                            "{who}: [DEFAULT]host carries no port, so peers dial \
                             {IRONIC_DEFAULT_PORT}, where no sidecar listens"
                        ),
                        fix,
                    )
                }
            }
        }
    }
    if seen.is_empty() {
        return Line::pass("conductor_name", "no Ironic conductor in the overlay");
    }
    Line::pass(
        "conductor_name",
        format!(
            "{}: registered and locking name <address>:{sidecar_port}, [json_rpc]port \
             {IRONIC_DEFAULT_PORT}",
            seen.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ironic(env: &[(&str, &str)], command: &[&str]) -> Container {
        Container {
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            ..Container::default()
        }
    }

    fn overlay(c: Container) -> Overlay {
        let mut o = Overlay::default();
        let mut w = super::super::model::Workload::default();
        w.containers.insert("ironic".into(), c);
        o.workloads.insert("DaemonSet/ironic".into(), w);
        o
    }

    #[test]
    fn the_kits_rendering_of_0_1_0_fails_naming_both_names() {
        let c = ironic(
            &[
                ("IRONIC_JSON_RPC_PORT", "6189"),
                ("OS_JSON_RPC__PORT", "6189"),
            ],
            &["/bin/runironic"],
        );
        let line = conductor_name(&overlay(c));
        assert!(!line.ok, "{line:?}");
        assert!(line
            .detail
            .contains("register the conductor as <address>:6189"));
        assert!(line.fix.contains("OS_JSON_RPC__PORT \"8089\""));
    }

    #[test]
    fn port_8089_with_the_port_in_the_host_passes() {
        let script = "set -eu\n. /bin/ironic-common.sh\nwait_for_interface_or_ip\nexport \
                      IRONIC_CONDUCTOR_HOST=\"${IRONIC_URL_HOST}:${IRONIC_JSON_RPC_PORT}\"\nexec \
                      /bin/runironic\n";
        let c = ironic(
            &[
                ("IRONIC_JSON_RPC_PORT", "6189"),
                ("OS_JSON_RPC__PORT", "8089"),
            ],
            &["/usr/bin/bash", "-c", script],
        );
        assert_eq!(names(&c).host_port.as_deref(), Some("6189"));
        assert!(conductor_name(&overlay(c)).ok);
        let c = ironic(
            &[
                (
                    "IRONIC_CONDUCTOR_HOST",
                    "$(POD_NAME).ironic.$(POD_NAMESPACE).svc:6189",
                ),
                ("OS_JSON_RPC__PORT", "8089"),
            ],
            &["bash", "-c", "exec /bin/runironic"],
        );
        assert!(conductor_name(&overlay(c)).ok);
    }

    #[test]
    fn port_8089_without_a_port_in_the_host_fails() {
        let c = ironic(&[("OS_JSON_RPC__PORT", "8089")], &["/bin/runironic"]);
        let line = conductor_name(&overlay(c));
        assert!(!line.ok);
        assert!(
            line.detail.contains("no sidecar listens"),
            "{}",
            line.detail
        );
        // An IPv6 literal without brackets carries no port.
        let c = ironic(
            &[
                ("OS_JSON_RPC__PORT", "8089"),
                ("IRONIC_CONDUCTOR_HOST", "fd00:1101::21"),
            ],
            &["/bin/runironic"],
        );
        assert_eq!(names(&c).host_port, None);
        let c = ironic(
            &[
                ("OS_JSON_RPC__PORT", "8089"),
                ("IRONIC_CONDUCTOR_HOST", "[fd00:1101::21]:6189"),
            ],
            &["/bin/runironic"],
        );
        assert_eq!(names(&c).host_port.as_deref(), Some("6189"));
    }
}
