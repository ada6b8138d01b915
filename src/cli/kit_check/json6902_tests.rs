//! Tests of json6902.rs, through the overlay reader that applies its patches.

use super::super::overlay::load;
use super::super::overlay::tests::write;

const BASE: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: metal3\n  labels:\n    \
    pod-security.kubernetes.io/enforce: privileged\n    team: infra\n---\n\
    apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ironic-proxy-site\ndata:\n  \
    A: \"1\"\n  B: \"2\"\n---\n\
    apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: ironic\nspec:\n  template:\n    \
    spec:\n      hostNetwork: true\n      containers:\n        - name: ironic\n          \
    image: ironic:1\n        - name: httpd\n          image: httpd:1\n          ports:\n            \
    - containerPort: 6180\n";

/// A base, and an overlay whose `patches` entries carry a `target`: `ops` as the body of
/// one (inline) and of a `patchesJson6902` file.
fn overlay(ops: &str, target: &str) -> super::super::overlay::Overlay {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    write(&base, "kustomization.yaml", "resources:\n  - all.yaml\n");
    write(&base, "all.yaml", BASE);
    let site = tmp.path().join("site");
    let inline = ops.replace('\n', "\n      ");
    write(
        &site,
        "kustomization.yaml",
        &format!(
            "resources:\n  - ../base\npatches:\n  - target: {target}\n    patch: |-\n      \
             {inline}\n"
        ),
    );
    load(&site)
}

#[test]
fn operations_on_what_the_checks_read_are_applied() {
    let o = overlay(
        "- op: remove\n  path: /metadata/labels/pod-security.kubernetes.io~1enforce",
        "{kind: Namespace, name: metal3}",
    );
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    let labels: Vec<&str> = o.namespaces["metal3"].keys().map(String::as_str).collect();
    assert_eq!(labels, ["team"]);

    let o = overlay(
        "- {op: replace, path: /data/A, value: \"10\"}\n- {op: remove, path: /data/B}\n\
         - {op: add, path: /data/C, value: 6385}",
        "{kind: ConfigMap, name: ironic-proxy-site}",
    );
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    let site: Vec<(&str, &str)> = o
        .site
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(site, [("A", "10"), ("C", "6385")]);

    let o = overlay(
        "- {op: replace, path: /spec/template/spec/hostNetwork, value: false}\n\
         - {op: add, path: /spec/template/spec/containers/1/ports/-, value: {containerPort: 6385, hostPort: 6385}}\n\
         - {op: replace, path: /spec/template/spec/containers/0/image, value: ironic:2}\n\
         - {op: add, path: /spec/template/spec/containers/0/env, value: [{name: X, value: y}]}\n\
         - {op: add, path: /spec/template/spec/containers/-, value: {name: dnsmasq, ports: [{containerPort: 67, protocol: UDP}]}}",
        "{kind: DaemonSet, name: ironic}",
    );
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    let w = &o.workloads["DaemonSet/ironic"];
    assert!(!w.host_network);
    assert_eq!(w.containers["ironic"].image.as_deref(), Some("ironic:2"));
    let ports: Vec<(u16, bool)> = w.containers["httpd"]
        .ports
        .iter()
        .map(|p| (p.number, p.host))
        .collect();
    assert_eq!(ports, [(6180, false), (6385, true)]);
    assert_eq!(w.order[0], ["ironic", "httpd", "dnsmasq"]);

    let o = overlay(
        "- {op: remove, path: /spec/template/spec/containers/0}",
        "{kind: DaemonSet, name: ironic}",
    );
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    let names: Vec<&str> = o.workloads["DaemonSet/ironic"]
        .containers
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(names, ["httpd"]);
}

#[test]
fn operations_on_what_no_check_reads_are_passed_over() {
    let o = overlay(
        "- {op: replace, path: /data/A, value: x}\n- {op: move, from: /data/A, path: /data/B}",
        "{kind: ConfigMap, name: other}",
    );
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    assert_eq!(o.site["A"], "1");
    let o = overlay(
        "- {op: add, path: /spec/template/spec/tolerations, value: []}\n\
         - {op: test, path: /spec/template/spec/hostNetwork, value: true}",
        "{kind: DaemonSet, name: ironic}",
    );
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    assert!(o.workloads["DaemonSet/ironic"].host_network);
}

/// What the model cannot apply fails the overlay's reading, naming the patch, instead of
/// passing a rendering that is not kustomize's.
#[test]
fn operations_it_cannot_apply_are_errors_naming_the_operation() {
    let cases = [
        (
            "- {op: remove, path: /spec/template/spec/containers/1/ports/0}",
            "{kind: DaemonSet, name: ironic}",
            "ports are compared as a set",
        ),
        (
            "- {op: remove, path: /data/A}",
            "{kind: ConfigMap, labelSelector: app=ironic}",
            "selector",
        ),
        (
            "- {op: remove, path: /metadata/labels/team}",
            "{kind: Namespace, name: \"metal.*\"}",
            "pattern",
        ),
        (
            "- {op: move, from: /data/A, path: /metadata/annotations/a}",
            "{kind: ConfigMap, name: ironic-proxy-site}",
            "move or copy",
        ),
        (
            "- {op: replace, path: /spec/template/spec/containers/5/image, value: x}",
            "{kind: DaemonSet, name: ironic}",
            "no container 5 (of 2)",
        ),
        (
            "- {op: replace, path: /spec/template/spec, value: {}}",
            "{kind: DaemonSet, name: ironic}",
            "whole pod spec",
        ),
        (
            "- {op: replace, path: /data/A, value: {a: b}}",
            "{kind: ConfigMap, name: ironic-proxy-site}",
            "not text",
        ),
        (
            "- {op: frobnicate, path: /data/A}",
            "{kind: ConfigMap, name: ironic-proxy-site}",
            "unknown op",
        ),
    ];
    for (ops, target, want) in cases {
        let o = overlay(ops, target);
        assert_eq!(o.errors.len(), 1, "{ops}: {:?}", o.errors);
        assert!(
            o.errors[0].contains(want)
                && o.errors[0].contains("an inline patch: JSON 6902 operation 0")
                && o.errors[0].contains("strategic merge patch"),
            "{ops}: {:?}",
            o.errors
        );
    }
}

/// A strategic merge patch that adds a container leaves the order to kustomize: an index
/// after it is not resolved. Through `patchesJson6902` and a file.
#[test]
fn an_index_after_a_merged_in_container_is_not_guessed() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    write(&base, "kustomization.yaml", "resources:\n  - all.yaml\n");
    write(&base, "all.yaml", BASE);
    let site = tmp.path().join("site");
    write(
        &site,
        "kustomization.yaml",
        "resources:\n  - ../base\npatches:\n  - path: add.yaml\npatchesJson6902:\n  - \
         target: {group: apps, version: v1, kind: DaemonSet, name: ironic}\n    path: ops.yaml\n",
    );
    write(
        &site,
        "add.yaml",
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: ironic\nspec:\n  template:\n    \
         spec:\n      containers:\n        - name: extra\n          image: x:1\n",
    );
    write(
        &site,
        "ops.yaml",
        "- {op: replace, path: /spec/template/spec/containers/0/image, value: y:1}\n",
    );
    let o = load(&site);
    assert_eq!(o.errors.len(), 1, "{:?}", o.errors);
    assert!(
        o.errors[0].contains("ops.yaml: JSON 6902 operation 0")
            && o.errors[0].contains("merge order"),
        "{:?}",
        o.errors
    );
}
