//! Reads a site overlay the way `kubectl kustomize` would find its parts, without rendering it:
//! every YAML file of the folder, and, through each `kustomization.yaml`, the local
//! `resources` and `components` it builds on (bases first, so an overlay's own files win),
//! the files its `patches` name, its inline patches, its `configMapGenerator` entries for the
//! site ConfigMap and its `images` overrides. Remote resources (URLs) are not fetched.
//!
//! What it keeps is what the preflight checks: the site ConfigMap's data, merged in that order
//! (a patch of `ironic-proxy-site` overrides the base's keys), the namespace and the labels of
//! its `Namespace`, and every workload's pod template (host network, containers, images,
//! ports), a patch of a workload merged into it by kind and name. This is a strategic merge
//! reduced to what is checked: containers by name, ports by number and protocol; a patch that
//! changes a port's number adds the new one beside the old.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

use super::model::{command, env, items, port, text, ImageOverride, Overlay, Port, SITE_CONFIGMAP};

/// The kustomization files kustomize recognises in a folder.
const KUSTOMIZATION: &[&str] = &["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// How deep `resources` may nest: a cycle of folders ends here instead of looping.
const MAX_DEPTH: usize = 16;

/// Reads the overlay in `dir`.
pub(super) fn load(dir: &Path) -> Overlay {
    let mut o = Overlay::default();
    let mut seen = BTreeSet::new();
    folder(dir, 0, &mut o, &mut seen);
    o
}

fn folder(dir: &Path, depth: usize, o: &mut Overlay, seen: &mut BTreeSet<PathBuf>) {
    let Ok(key) = dir.canonicalize() else {
        o.errors.push(format!("{}: no such folder", dir.display()));
        return;
    };
    if depth > MAX_DEPTH || !seen.insert(key) {
        return;
    }
    let kustomization = KUSTOMIZATION
        .iter()
        .map(|k| dir.join(k))
        .find(|p| p.is_file());
    let k = kustomization
        .as_ref()
        .and_then(|p| parse(p, o))
        .and_then(|docs| docs.into_iter().next());
    // The Namespaces this folder brings: its `namespace:` renames them (below).
    let before: BTreeSet<String> = o.namespaces.keys().cloned().collect();
    if let Some(k) = &k {
        for entry in items(&k["resources"]).iter().chain(items(&k["components"])) {
            let Some(rel) = entry.as_str() else { continue };
            if rel.contains("://") || rel.starts_with("github.com/") {
                continue;
            }
            let path = dir.join(rel);
            if path.is_dir() {
                folder(&path, depth + 1, o, seen);
            } else {
                file(&path, o, seen);
            }
        }
    }
    // The folder's own files (resources and patches alike), in name order.
    let mut own: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    own.sort();
    for path in own {
        let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
        if yaml && Some(&path) != kustomization.as_ref() {
            file(&path, o, seen);
        }
    }
    let Some(k) = k else { return };
    for p in items(&k["patches"])
        .iter()
        .chain(items(&k["patchesStrategicMerge"]))
    {
        if !p["target"].is_badvalue() && json6902(p, dir, o) {
            continue;
        }
        match (p["path"].as_str(), p["patch"].as_str(), p.as_str()) {
            (Some(rel), _, _) => file(&dir.join(rel), o, seen),
            (_, Some(inline), _) => inline_docs(inline, dir, o),
            // patchesStrategicMerge: a file name, or the patch itself.
            (_, _, Some(s)) if s.contains('\n') => inline_docs(s, dir, o),
            (_, _, Some(rel)) => file(&dir.join(rel), o, seen),
            _ => {}
        }
    }
    for p in items(&k["patchesJson6902"]) {
        json6902(p, dir, o);
    }
    for g in items(&k["configMapGenerator"]) {
        if g["name"].as_str() == Some(SITE_CONFIGMAP) {
            generator(g, dir, o);
        }
    }
    for i in items(&k["images"]) {
        let Some(name) = i["name"].as_str() else {
            continue;
        };
        o.images.push((
            name.to_owned(),
            ImageOverride {
                new_name: text(&i["newName"]),
                new_tag: text(&i["newTag"]),
                digest: text(&i["digest"]),
            },
        ));
    }
    // The outermost kustomization is read last: its namespace applies to everything.
    if let Some(ns) = k["namespace"].as_str() {
        o.namespace = Some(ns.to_owned());
        rename_namespaces(o, &before, ns);
    }
}

/// kustomize's namespace transformer on the Namespace objects a kustomization with
/// `namespace: ns` brings (those not in `before`): each is renamed to `ns`, its labels kept, as
/// `kubectl kustomize` renders it. Two different ones renamed to one name is kustomize's own
/// error ("namespace transformation produces ID conflict"), kept as an error of the overlay.
fn rename_namespaces(o: &mut Overlay, before: &BTreeSet<String>, ns: &str) {
    let brought: Vec<String> = o
        .namespaces
        .keys()
        .filter(|n| !before.contains(*n) && n.as_str() != ns)
        .cloned()
        .collect();
    // A Namespace already named `ns` beside one renamed to it: two objects of one ID.
    let clash = brought.len() > 1 || (!brought.is_empty() && o.namespaces.contains_key(ns));
    if clash {
        o.errors.push(format!(
            "`namespace: {ns}` renames the Namespaces {} to {ns}: kustomize fails with \
             \"namespace transformation produces ID conflict\"; keep one Namespace object",
            brought.join(", ")
        ));
        return;
    }
    for old in brought {
        if let Some(labels) = o.namespaces.remove(&old) {
            o.namespaces
                .entry(ns.to_owned())
                .or_default()
                .extend(labels);
        }
    }
}

/// A patch entry with a `target`: when its body is a list of operations (JSON 6902), applies
/// them and returns true; a strategic merge body returns false, read as any other patch.
fn json6902(entry: &Yaml, dir: &Path, o: &mut Overlay) -> bool {
    let (body, origin) = match (entry["path"].as_str(), entry["patch"].as_str()) {
        (Some(rel), _) => {
            let path = dir.join(rel);
            match std::fs::read_to_string(&path) {
                Ok(t) => (t, path.display().to_string()),
                Err(e) => {
                    o.errors.push(format!("{}: {e}", path.display()));
                    return true;
                }
            }
        }
        (_, Some(inline)) => (
            inline.to_owned(),
            format!("{}: an inline patch", dir.join(KUSTOMIZATION[0]).display()),
        ),
        _ => return false,
    };
    let docs = match YamlLoader::load_from_str(&body) {
        Ok(d) => d,
        Err(e) => {
            o.errors.push(format!("{origin}: {e}"));
            return true;
        }
    };
    let Some(ops) = docs.first().and_then(Yaml::as_vec) else {
        return false;
    };
    super::json6902::apply(&entry["target"], ops, &origin, o);
    true
}

/// Every document of a YAML file, once.
fn file(path: &Path, o: &mut Overlay, seen: &mut BTreeSet<PathBuf>) {
    let key = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    if !seen.insert(key) {
        return;
    }
    if let Some(docs) = parse(path, o) {
        for d in &docs {
            object(d, o);
        }
    }
}

fn parse(path: &Path, o: &mut Overlay) -> Option<Vec<Yaml>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            o.errors.push(format!("{}: {e}", path.display()));
            return None;
        }
    };
    o.files.push(path.to_owned());
    match YamlLoader::load_from_str(&text) {
        Ok(docs) => Some(docs),
        Err(e) => {
            o.errors.push(format!("{}: {e}", path.display()));
            None
        }
    }
}

fn inline_docs(text: &str, dir: &Path, o: &mut Overlay) {
    match YamlLoader::load_from_str(text) {
        Ok(docs) => docs.iter().for_each(|d| object(d, o)),
        Err(e) => o.errors.push(format!(
            "{}: an inline patch: {e}",
            dir.join(KUSTOMIZATION[0]).display()
        )),
    }
}

/// A `configMapGenerator` entry for the site ConfigMap: `literals` (`KEY=VALUE`) and `envs`
/// files (the same, one a line); `behavior: replace` drops the base's keys first.
fn generator(g: &Yaml, dir: &Path, o: &mut Overlay) {
    o.site_found = true;
    if g["behavior"].as_str() == Some("replace") {
        o.site.clear();
    }
    let mut lines: Vec<String> = items(&g["literals"]).iter().filter_map(text).collect();
    for env in items(&g["envs"]).iter().chain(std::iter::once(&g["env"])) {
        let Some(rel) = env.as_str() else { continue };
        match std::fs::read_to_string(dir.join(rel)) {
            Ok(t) => lines.extend(t.lines().map(str::to_owned)),
            Err(e) => o.errors.push(format!("{}: {e}", dir.join(rel).display())),
        }
    }
    for line in lines {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            o.site.insert(k.trim().to_owned(), v.trim().to_owned());
        }
    }
}

/// One Kubernetes object (or a patch of one): what the checks read from it.
fn object(d: &Yaml, o: &mut Overlay) {
    let (Some(kind), Some(name)) = (d["kind"].as_str(), d["metadata"]["name"].as_str()) else {
        return;
    };
    if let Some(ns) = d["metadata"]["namespace"].as_str() {
        o.namespace.get_or_insert_with(|| ns.to_owned());
    }
    match kind {
        "ConfigMap" if name == SITE_CONFIGMAP => {
            o.site_found = true;
            if let Some(data) = d["data"].as_hash() {
                for (k, v) in data {
                    let Some(k) = k.as_str() else { continue };
                    match text(v) {
                        Some(v) => {
                            o.site.insert(k.to_owned(), v);
                        }
                        // A strategic merge patch deletes a key it sets to null.
                        None if v.is_null() => {
                            o.site.remove(k);
                        }
                        None => {}
                    }
                }
            }
        }
        "Namespace" => {
            let labels = o.namespaces.entry(name.to_owned()).or_default();
            if let Some(h) = d["metadata"]["labels"].as_hash() {
                for (k, v) in h {
                    let Some(k) = k.as_str() else { continue };
                    match text(v) {
                        Some(v) => {
                            labels.insert(k.to_owned(), v);
                        }
                        // A strategic merge patch deletes a key it sets to null.
                        None if v.is_null() => {
                            labels.remove(k);
                        }
                        None => {}
                    }
                }
            }
        }
        "DaemonSet" | "Deployment" | "StatefulSet" | "Job" => {
            let key = format!("{kind}/{name}");
            workload(&d["spec"]["template"]["spec"], &key, o);
            undeclared_ports(&d["spec"]["template"]["metadata"], &key, o);
            if let Some(n) = d["spec"]["replicas"].as_i64() {
                if let (Some(w), Ok(n)) = (o.workloads.get_mut(&key), u32::try_from(n)) {
                    w.replicas = Some(n);
                }
            }
        }
        "CronJob" => workload(
            &d["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            &format!("{kind}/{name}"),
            o,
        ),
        _ => {}
    }
}

/// The pod template annotation naming ports a container binds without declaring them.
pub(super) const HOST_PORTS_ANNOTATION: &str = "ironic-proxy.metal3.io/host-ports";

/// Ports named by [`HOST_PORTS_ANNOTATION`] (`CONTAINER: PORT/PROTOCOL ...`): a host-network
/// DaemonSet that surges during a rollout (the balancer's handover) declares none, since
/// declared ports of a host-network pod are host ports, and the scheduler would keep the new
/// pod off a node whose old pod holds them.
fn undeclared_ports(meta: &Yaml, key: &str, o: &mut Overlay) {
    let Some(value) = meta["annotations"][HOST_PORTS_ANNOTATION].as_str() else {
        return;
    };
    let Some(w) = o.workloads.get_mut(key) else {
        return;
    };
    let Some((container, ports)) = value.split_once(':') else {
        return;
    };
    let c = w.containers.entry(container.trim().to_owned()).or_default();
    for p in ports.split_whitespace() {
        let (number, protocol) = p.split_once('/').unwrap_or((p, "TCP"));
        if let Ok(number) = number.parse() {
            c.ports.insert(Port {
                number,
                protocol: protocol.to_owned(),
                host: false,
            });
        }
    }
}

fn workload(spec: &Yaml, key: &str, o: &mut Overlay) {
    let declared = o.workloads.contains_key(key);
    let w = o.workloads.entry(key.to_owned()).or_default();
    if let Some(host) = spec["hostNetwork"].as_bool() {
        w.host_network = host;
    }
    for (list, field) in ["containers", "initContainers"].into_iter().enumerate() {
        for c in items(&spec[field]) {
            let Some(name) = c["name"].as_str() else {
                continue;
            };
            if !w.containers.contains_key(name) {
                w.order_unknown |= declared;
                w.order[list].push(name.to_owned());
            }
            let entry = w.containers.entry(name.to_owned()).or_default();
            if let Some(image) = c["image"].as_str() {
                entry.image = Some(image.to_owned());
            }
            entry
                .ports
                .extend(items(&c["ports"]).iter().filter_map(port));
            entry.env.extend(env(c));
            if !c["command"].is_badvalue() {
                entry.command = command(c);
            }
        }
    }
}

#[cfg(test)]
#[path = "overlay_tests.rs"]
pub(super) mod tests;

// JSON 6902 patches are tested as the overlay reader applies them: a child of this module, so
// that json6902.rs, below the reader, imports nothing of it.
#[cfg(test)]
#[path = "json6902_tests.rs"]
mod json6902_tests;
