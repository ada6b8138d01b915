//! The checks of `kit check` on the overlay's objects: host ports, the namespace's Pod Security
//! label, image digests. Pure.

use std::collections::BTreeMap;

use super::model::{ImageOverride, Overlay};
use super::Line;

/// The Pod Security label the namespace needs: the kit's pods use the host network (and
/// dnsmasq NET_ADMIN), which only the `privileged` level admits.
const PSA_ENFORCE: &str = "pod-security.kubernetes.io/enforce";

/// Where the overlay's pods run, as its workloads say: what decides which site facts the
/// checks ask for.
#[derive(Debug, Default)]
pub(super) struct Layout {
    /// Some workload uses the host network (the DaemonSet variants, dnsmasq, a balancer): the
    /// nodes' addresses matter.
    pub(super) host_network: bool,
    /// The pod names of the StatefulSet `ironic` off the host network (statefulset/): Ironic on
    /// the pod network, behind a LoadBalancer, virtual media only.
    pub(super) pods: Option<Vec<String>>,
    /// components/dhcp's dnsmasq is in the overlay.
    pub(super) dnsmasq: bool,
}

/// The StatefulSet of statefulset/ (its name: the pods' names start with it).
const STATEFULSET: &str = "ironic";

pub(super) fn layout(o: &Overlay) -> Layout {
    let pods = o
        .workloads
        .get(&format!("StatefulSet/{STATEFULSET}"))
        .filter(|w| !w.host_network)
        .map(|w| {
            // Kubernetes' default is 1 replica.
            (0..w.replicas.unwrap_or(1))
                .map(|i| format!("{STATEFULSET}-{i}"))
                .collect()
        });
    Layout {
        host_network: o.workloads.values().any(|w| w.host_network),
        pods,
        dnsmasq: o.workloads.contains_key("Deployment/ironic-dnsmasq"),
    }
}

/// `host_ports`: no port claimed on a node's network by two containers.
pub(super) fn host_ports(o: &Overlay) -> Line {
    let mut claims: BTreeMap<(u16, &str), Vec<String>> = BTreeMap::new();
    for (workload, w) in &o.workloads {
        for (name, c) in &w.containers {
            for p in c.ports.iter().filter(|p| p.host || w.host_network) {
                claims
                    .entry((p.number, p.protocol.as_str()))
                    .or_default()
                    .push(format!("{workload} ({name})"));
            }
        }
    }
    let twice: Vec<String> = claims
        .iter()
        .filter(|(_, who)| who.len() > 1)
        .map(|((port, proto), who)| format!("{proto} {port} by {}", who.join(" and ")))
        .collect();
    if twice.is_empty() {
        Line::pass(
            "host_ports",
            format!("{} host port(s), each claimed once", claims.len()),
        )
    } else {
        Line::fail(
            "host_ports",
            format!(
                "{}: on a node running both, the second cannot bind",
                twice.join("; ")
            ),
            "move one of them to a free port (the proxies' IRONIC_PROXY_*_PORT, ironic-image's \
             port variables) in the overlay",
        )
    }
}

/// `namespace.psa`: the namespace's Pod Security label admits the kit's pods. Only host-network
/// pods need `privileged`; the pod-network layout's pods (non-root, no privilege escalation, no
/// capability, the runtime's seccomp profile, Secret, ConfigMap and emptyDir volumes) need
/// nothing the `restricted` level refuses.
pub(super) fn namespace(o: &Overlay, layout: &Layout) -> Line {
    let Some(ns) = &o.namespace else {
        return Line::fail(
            "namespace.psa",
            "the overlay sets no namespace",
            "set `namespace:` in the overlay's kustomization.yaml and add its Namespace",
        );
    };
    let fix = format!(
        "keep the kit's Namespace among the overlay's resources (its `namespace: {ns}` renames \
         it, labels and all) with {PSA_ENFORCE}: privileged (the kit's pods use the host \
         network, dnsmasq NET_ADMIN); add no second Namespace object"
    );
    if !layout.host_network {
        let level = o
            .namespaces
            .get(ns)
            .and_then(|l| l.get(PSA_ENFORCE))
            .map_or("(no label: the cluster's default)", String::as_str);
        return Line::pass(
            "namespace.psa",
            format!(
                "Namespace {ns} {PSA_ENFORCE}: {level}; no workload uses the host network, and \
                 the pod-network layout's pods ask for no privilege"
            ),
        );
    }
    match o.namespaces.get(ns).map(|l| l.get(PSA_ENFORCE)) {
        None => Line::fail(
            "namespace.psa",
            format!("no Namespace {ns} in the overlay"),
            fix,
        ),
        Some(Some(level)) if level == "privileged" => Line::pass(
            "namespace.psa",
            format!("Namespace {ns} has {PSA_ENFORCE}: privileged"),
        ),
        Some(Some(level)) => Line::fail(
            "namespace.psa",
            format!("Namespace {ns} has {PSA_ENFORCE}: {level}: host-network pods are refused"),
            fix,
        ),
        Some(None) => Line::fail(
            "namespace.psa",
            format!(
                "Namespace {ns} has no {PSA_ENFORCE} label: the cluster's default level applies, \
                 which refuses host-network pods unless it is privileged"
            ),
            fix,
        ),
    }
}

/// `images.digest`: every container's image, after the overlays' `images` overrides, is named
/// by digest.
pub(super) fn digests(o: &Overlay) -> Line {
    let mut all = Vec::new();
    for (workload, w) in &o.workloads {
        for (name, c) in &w.containers {
            if let Some(image) = &c.image {
                all.push((format!("{workload} ({name})"), resolve(image, &o.images)));
            }
        }
    }
    if all.is_empty() {
        return Line::fail(
            "images.digest",
            "no container found in the overlay",
            "list the kit's folder under `resources:` in the overlay's kustomization.yaml",
        );
    }
    let bad: Vec<String> = all
        .iter()
        .filter(|(_, image)| !has_digest(image))
        .map(|(who, image)| format!("{image} in {who}"))
        .collect();
    if bad.is_empty() {
        Line::pass(
            "images.digest",
            format!("{} image(s), each by digest", all.len()),
        )
    } else {
        Line::fail(
            "images.digest",
            format!("{} not pinned by digest", bad.join(", ")),
            "give each image its digest in the overlay (`images:` entry with `digest: \
             sha256:...`, the release's digests)",
        )
    }
}

/// `name@sha256:<64 hex digits>`.
fn has_digest(image: &str) -> bool {
    image
        .split_once("@sha256:")
        .is_some_and(|(_, hex)| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// An image reference after kustomize's `images` transformers, applied in order (a base's
/// first): an entry whose `name` is the image's current name (without tag or digest) gives its
/// new name and tag, or a digest, which replaces the tag (kustomize writes `name@digest`).
fn resolve(image: &str, overrides: &[(String, ImageOverride)]) -> String {
    let (rest, mut digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d.to_owned())),
        None => (image, None),
    };
    // A `:` after the last `/` starts the tag (`registry:5000/x` has a port, no tag).
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (mut name, mut tag) = match rest[slash..].rfind(':') {
        Some(i) => (
            rest[..slash + i].to_owned(),
            Some(rest[slash + i + 1..].to_owned()),
        ),
        None => (rest.to_owned(), None),
    };
    for (matched, o) in overrides {
        if *matched != name {
            continue;
        }
        if let Some(n) = &o.new_name {
            name.clone_from(n);
        }
        if let Some(d) = &o.digest {
            digest = Some(d.clone());
            tag = None;
        } else if let Some(t) = &o.new_tag {
            tag = Some(t.clone());
            digest = None;
        }
    }
    let mut out = name;
    if let Some(t) = tag {
        out = format!("{out}:{t}");
    }
    if let Some(d) = digest {
        out = format!("{out}@{d}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_resolve_as_kustomize_rewrites_them() {
        let d = format!("sha256:{}", "a".repeat(64));
        let entry =
            |name: &str, new_name: Option<&str>, tag: Option<&str>, digest: Option<&str>| {
                (
                    name.to_owned(),
                    ImageOverride {
                        new_name: new_name.map(str::to_owned),
                        new_tag: tag.map(str::to_owned),
                        digest: digest.map(str::to_owned),
                    },
                )
            };
        // The kit's base, then an operator's overlay.
        let o = [
            entry("quay.io/metal3-io/ironic", None, Some("main"), None),
            entry("ironic-proxy", Some("ironic-proxy"), Some("0.1.0"), None),
            entry("quay.io/metal3-io/ironic", None, None, Some(&d)),
            entry(
                "ironic-proxy",
                Some("registry.example:5000/ironic-proxy"),
                Some("0.2.0"),
                None,
            ),
        ];
        let ironic = resolve("quay.io/metal3-io/ironic:main", &o);
        assert_eq!(ironic, format!("quay.io/metal3-io/ironic@{d}"));
        assert!(has_digest(&ironic));
        let proxy = resolve("ironic-proxy", &o);
        assert_eq!(proxy, "registry.example:5000/ironic-proxy:0.2.0");
        assert!(!has_digest(&proxy));
        // Renamed by the base: the overlay's entry for the old name no longer matches.
        let renamed = [
            entry("app", Some("mirror/app"), None, None),
            entry("app", None, None, Some(&d)),
        ];
        assert_eq!(resolve("app:1", &renamed), "mirror/app:1");
        assert_eq!(resolve("localhost:5000/x:1", &o), "localhost:5000/x:1");
        assert!(!has_digest("x@sha256:abc"));
    }
}
