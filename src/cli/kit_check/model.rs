//! What `kit check` keeps of an overlay: the site ConfigMap's data, the namespaces, every
//! workload's containers (images, ports, literal environment, command), the `images`
//! overrides; and the readers of a container and a port as declared. Shared by the overlay
//! reader (overlay.rs) and the JSON 6902 patches it applies (json6902.rs), below both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use yaml_rust2::Yaml;

/// The site ConfigMap the kit's pods read (config/k8s/common/site.yaml).
pub(super) const SITE_CONFIGMAP: &str = "ironic-proxy-site";

/// A port a container declares.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Port {
    /// `hostPort` when given, else `containerPort`.
    pub(super) number: u16,
    /// `TCP` (the default), `UDP` or `SCTP`.
    pub(super) protocol: String,
    /// Whether `hostPort` was given: the port is claimed on the node even off the host network.
    pub(super) host: bool,
}

/// One container of a pod template.
#[derive(Debug, Default)]
pub(super) struct Container {
    pub(super) image: Option<String>,
    pub(super) ports: BTreeSet<Port>,
    /// `env` entries with a literal `value` (a later entry or patch of one name wins).
    pub(super) env: BTreeMap<String, String>,
    /// `command` followed by `args`, as declared.
    pub(super) command: Vec<String>,
}

/// A pod template of a DaemonSet, Deployment, StatefulSet, Job or CronJob.
#[derive(Debug, Default)]
pub(super) struct Workload {
    pub(super) host_network: bool,
    /// A StatefulSet's `replicas` (its pods are `<name>-0` ... `<name>-<replicas - 1>`).
    pub(super) replicas: Option<u32>,
    /// By name (init containers included: the kit's sidecar is one).
    pub(super) containers: BTreeMap<String, Container>,
    /// The names of `containers` and of `initContainers`, in their order: a JSON 6902 patch
    /// names a container by its index.
    pub(super) order: [Vec<String>; 2],
    /// A patch added containers to a declared workload: where kustomize's merge puts them is
    /// not modelled, so an index cannot be resolved.
    pub(super) order_unknown: bool,
}

/// An `images:` entry of a kustomization.
#[derive(Debug, Default, Clone)]
pub(super) struct ImageOverride {
    pub(super) new_name: Option<String>,
    pub(super) new_tag: Option<String>,
    pub(super) digest: Option<String>,
}

/// What the overlay says, merged.
#[derive(Debug, Default)]
pub(super) struct Overlay {
    /// The files read, in order.
    pub(super) files: Vec<PathBuf>,
    /// Files that did not parse, with the parser's message.
    pub(super) errors: Vec<String>,
    /// Whether the site ConfigMap (or a patch or generator of it) was found.
    pub(super) site_found: bool,
    pub(super) site: BTreeMap<String, String>,
    /// The outermost kustomization's `namespace`, else the objects' own.
    pub(super) namespace: Option<String>,
    /// `Namespace` objects' labels, by name.
    pub(super) namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// By `Kind/name`.
    pub(super) workloads: BTreeMap<String, Workload>,
    /// `images:` entries by the image name they match (without tag or digest), in the order
    /// kustomize applies them: a base's first, so an overlay's entry sees the base's rewrite.
    pub(super) images: Vec<(String, ImageOverride)>,
}

/// A scalar as the text Kubernetes would read (`6385` and `"6385"` alike).
pub(super) fn text(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

pub(super) fn items(y: &Yaml) -> &[Yaml] {
    y.as_vec().map_or(&[], Vec::as_slice)
}

/// A container as declared (a JSON 6902 value): its image and ports.
pub(super) fn container(c: &Yaml) -> Result<Container, String> {
    let image = match &c["image"] {
        Yaml::BadValue => None,
        y => Some(y.as_str().ok_or("`image` must be text")?.to_owned()),
    };
    let ports = items(&c["ports"]).iter().filter_map(port).collect();
    Ok(Container {
        image,
        ports,
        env: env(c).collect(),
        command: command(c),
    })
}

/// A container's `env` entries that have a literal `value`.
pub(super) fn env(c: &Yaml) -> impl Iterator<Item = (String, String)> + '_ {
    items(&c["env"]).iter().filter_map(|e| {
        let name = e["name"].as_str()?;
        Some((name.to_owned(), text(&e["value"])?))
    })
}

/// A container's `command` and `args`, one list.
pub(super) fn command(c: &Yaml) -> Vec<String> {
    items(&c["command"])
        .iter()
        .chain(items(&c["args"]))
        .filter_map(text)
        .collect()
}

/// A declared port, kept as declared: whether it claims the node's port depends on the pod's
/// host network, which a later patch may set, so it is decided when the checks run.
pub(super) fn port(p: &Yaml) -> Option<Port> {
    let host = p["hostPort"].as_i64();
    let number = host.or_else(|| p["containerPort"].as_i64())?;
    Some(Port {
        number: u16::try_from(number).ok()?,
        protocol: p["protocol"].as_str().unwrap_or("TCP").to_owned(),
        host: host.is_some(),
    })
}
