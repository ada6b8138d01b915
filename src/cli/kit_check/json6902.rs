//! JSON 6902 patches: a kustomization's `patches` entry with a `target` whose body is a list of
//! operations, or a `patchesJson6902` entry. Applied to what the checks read and nothing else:
//! the site ConfigMap's `data`, a Namespace's labels, a workload's `hostNetwork` and its
//! containers' images and ports.
//!
//! The reduced model cannot hold every operation (ports are kept as a set, so `ports/1` names
//! nothing in it). An operation it cannot apply on a path the checks read is an error, which
//! fails the `site` check: a preflight that silently skipped a patch removing, say, the Pod
//! Security label would pass an overlay that is not what kustomize renders. Operations on paths
//! no check reads (env, resources, probes) are passed over.

use std::collections::BTreeMap;

use yaml_rust2::Yaml;

use super::model::{container, port, text, Container, Overlay, Workload, SITE_CONFIGMAP};

/// Applies `ops` to the object `target` names. `origin` names the patch in errors.
pub(super) fn apply(target: &Yaml, ops: &[Yaml], origin: &str, o: &mut Overlay) {
    for (i, op) in ops.iter().enumerate() {
        if let Err(e) = one(target, op, o) {
            o.errors.push(format!(
                "{origin}: JSON 6902 operation {i} ({} {}): {e}; write it as a strategic \
                 merge patch",
                op["op"].as_str().unwrap_or("?"),
                op["path"].as_str().unwrap_or("?"),
            ));
        }
    }
}

/// What an operation's target is, as the checks read it.
enum Object {
    Site,
    Namespace(String),
    /// `Kind/name` and the pointer of its pod spec.
    Workload(String, &'static str),
    /// A kind no check reads.
    Other,
}

fn object(target: &Yaml) -> Result<Object, String> {
    let kind = target["kind"].as_str();
    let name = target["name"].as_str();
    let selector =
        !target["labelSelector"].is_badvalue() || !target["annotationSelector"].is_badvalue();
    let pod_spec = match kind {
        Some("DaemonSet" | "Deployment" | "StatefulSet" | "Job") => Some("/spec/template/spec"),
        Some("CronJob") => Some("/spec/jobTemplate/spec/template/spec"),
        _ => None,
    };
    let read = matches!(kind, Some("ConfigMap" | "Namespace")) || pod_spec.is_some();
    let Some(kind) = kind.filter(|_| read) else {
        return Ok(Object::Other);
    };
    // A regular expression or a selector could match objects the checks read: not resolved.
    let Some(name) = name.filter(|n| !selector && is_plain_name(n)) else {
        return Err(format!(
            "its target ({kind}) is chosen by a selector or a pattern, which kit check does \
             not resolve"
        ));
    };
    Ok(match (kind, pod_spec) {
        ("ConfigMap", _) if name == SITE_CONFIGMAP => Object::Site,
        ("ConfigMap", _) => Object::Other,
        ("Namespace", _) => Object::Namespace(name.to_owned()),
        (_, Some(spec)) => Object::Workload(format!("{kind}/{name}"), spec),
        _ => Object::Other,
    })
}

/// A DNS name as Kubernetes allows it: kustomize reads anything else as a regular expression.
fn is_plain_name(n: &str) -> bool {
    !n.is_empty()
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// A JSON pointer's tokens (RFC 6901: `~1` is `/`, `~0` is `~`).
fn tokens(pointer: &str) -> Result<Vec<String>, String> {
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err("a path must start with /".into());
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// Whether `path` is `prefix` or below it, or above it (replacing a parent replaces it too).
fn touches(path: &[String], prefix: &[&str]) -> bool {
    path.iter().zip(prefix).all(|(a, b)| a == b)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Replace,
    Remove,
}

fn one(target: &Yaml, raw: &Yaml, o: &mut Overlay) -> Result<(), String> {
    let name = raw["op"].as_str().ok_or("no `op`")?;
    let path = tokens(raw["path"].as_str().ok_or("no `path`")?)?;
    let from = raw["from"].as_str().map(tokens).transpose()?;
    let object = match object(target) {
        Ok(Object::Other) => return Ok(()),
        r => r,
    };
    // The paths the checks read; an unresolved target of a kind they read: every path.
    let read: Vec<Vec<&str>> = match &object {
        Ok(Object::Site) => vec![vec!["data"], vec!["metadata", "name"]],
        Ok(Object::Namespace(_)) => vec![vec!["metadata", "labels"], vec!["metadata", "name"]],
        Ok(Object::Workload(_, spec)) => {
            vec![spec.split('/').skip(1).collect(), vec!["metadata", "name"]]
        }
        Ok(Object::Other) | Err(_) => vec![vec![]],
    };
    let touched = |p: &[String]| read.iter().any(|prefix| touches(p, prefix));
    let op = match name {
        "test" => return Ok(()),
        "add" => Op::Add,
        "replace" => Op::Replace,
        "remove" => Op::Remove,
        "move" | "copy" => {
            if touched(&path) || from.as_deref().is_some_and(touched) {
                return Err("a move or copy onto or from a path the checks read".into());
            }
            return Ok(());
        }
        other => return Err(format!("unknown op `{other}`")),
    };
    if !touched(&path) {
        return Ok(());
    }
    let object = object?;
    let value = &raw["value"];
    if op != Op::Remove && value.is_badvalue() {
        return Err("no `value`".into());
    }
    let path: Vec<&str> = path.iter().map(String::as_str).collect();
    match object {
        Object::Site => {
            o.site_found = true;
            map_op(&mut o.site, &path, &["data"], op, value)
        }
        Object::Namespace(name) => {
            let labels = o.namespaces.entry(name).or_default();
            map_op(labels, &path, &["metadata", "labels"], op, value)
        }
        Object::Workload(key, spec) => {
            let depth = spec.matches('/').count();
            match path.get(depth..) {
                Some(rest) if !rest.is_empty() => {
                    workload(o.workloads.entry(key).or_default(), rest, op, value)
                }
                _ => Err("it replaces the whole pod spec or the object's name".into()),
            }
        }
        Object::Other => Ok(()),
    }
}

/// An operation on a mapping of text (`data`, `labels`) at `at`, or on one of its keys.
fn map_op(
    map: &mut BTreeMap<String, String>,
    path: &[&str],
    at: &[&str],
    op: Op,
    value: &Yaml,
) -> Result<(), String> {
    let Some(rest) = path.strip_prefix(at) else {
        return Err("it renames the object".into());
    };
    match (rest, op) {
        ([], Op::Remove) => map.clear(),
        ([], _) => {
            let h = value.as_hash().ok_or("the value must be a mapping")?;
            map.clear();
            for (k, v) in h {
                let (Some(k), Some(v)) = (k.as_str(), text(v)) else {
                    return Err("the mapping holds a value that is not text".into());
                };
                map.insert(k.to_owned(), v);
            }
        }
        ([key], Op::Remove) => {
            map.remove(*key);
        }
        ([key], _) => {
            let v = text(value).ok_or("the value is not text")?;
            map.insert((*key).to_owned(), v);
        }
        _ => return Err("a path below a text value".into()),
    }
    Ok(())
}

/// An operation below a workload's pod spec (`rest` is not empty).
fn workload(w: &mut Workload, rest: &[&str], op: Op, value: &Yaml) -> Result<(), String> {
    let list = match rest {
        ["hostNetwork"] => {
            w.host_network =
                op != Op::Remove && value.as_bool().ok_or("`hostNetwork` must be a boolean")?;
            return Ok(());
        }
        ["containers", ..] => 0,
        ["initContainers", ..] => 1,
        _ => return Ok(()),
    };
    let named = |c: &Yaml| -> Result<(String, Container), String> {
        let name = c["name"].as_str().ok_or("a container without a name")?;
        Ok((name.to_owned(), container(c)?))
    };
    match (&rest[1..], op) {
        // The whole list.
        ([], _) => {
            for name in std::mem::take(&mut w.order[list]) {
                w.containers.remove(&name);
            }
            if op != Op::Remove {
                let items = value.as_vec().ok_or("a container list must be a list")?;
                for c in items {
                    let (name, c) = named(c)?;
                    w.order[list].push(name.clone());
                    w.containers.insert(name, c);
                }
            }
            Ok(())
        }
        (["-"], Op::Add) => {
            let (name, c) = named(value)?;
            w.order[list].push(name.clone());
            w.containers.insert(name, c);
            Ok(())
        }
        ([index, below @ ..], _) => {
            if w.order_unknown {
                return Err(
                    "a strategic merge patch added containers before it, so which one \
                            an index names depends on kustomize's merge order"
                        .into(),
                );
            }
            let i: usize = index
                .parse()
                .map_err(|_| format!("`{index}` is not a container index"))?;
            let len = w.order[list].len();
            if below.is_empty() && op == Op::Add && i <= len {
                let (name, c) = named(value)?;
                w.order[list].insert(i, name.clone());
                w.containers.insert(name, c);
                return Ok(());
            }
            let name = w.order[list]
                .get(i)
                .cloned()
                .ok_or_else(|| format!("there is no container {i} (of {len})"))?;
            match (below, op) {
                ([], _) => {
                    w.order[list].remove(i);
                    w.containers.remove(&name);
                    if op == Op::Replace {
                        let (new, c) = named(value)?;
                        w.order[list].insert(i, new.clone());
                        w.containers.insert(new, c);
                    }
                }
                (["image"], Op::Remove) => w.containers.entry(name).or_default().image = None,
                (["image"], _) => {
                    let image = value.as_str().ok_or("`image` must be text")?;
                    w.containers.entry(name).or_default().image = Some(image.to_owned());
                }
                (["ports"], _) => {
                    let c = w.containers.entry(name).or_default();
                    c.ports.clear();
                    if op != Op::Remove {
                        for p in value.as_vec().ok_or("`ports` must be a list")? {
                            c.ports.extend(port(p));
                        }
                    }
                }
                (["ports", "-"], Op::Add) => {
                    w.containers
                        .entry(name)
                        .or_default()
                        .ports
                        .extend(port(value));
                }
                (["ports", ..], _) => {
                    return Err(
                        "ports are compared as a set: an index into them names nothing".into(),
                    )
                }
                (["name"], _) => return Err("it renames a container".into()),
                _ => {}
            }
            Ok(())
        }
    }
}
