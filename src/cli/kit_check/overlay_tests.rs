//! Tests of [`super`] (overlay.rs).

use super::*;

/// Writes `text` to `dir/name`, making its folders (also for json6902's tests).
pub(super) fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A base with the site ConfigMap and a host-network DaemonSet; an overlay that patches both
/// three ways (a patch file, an inline patch, a generator) and retags the image.
#[test]
fn an_overlay_merges_over_its_base_in_kustomize_order() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    write(
        &base,
        "kustomization.yaml",
        "resources:\n  - site.yaml\n  - ds.yaml\nimages:\n  - name: app\n    newTag: main\n",
    );
    write(
        &base,
        "site.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ironic-proxy-site\ndata:\n  \
         A: \"base\"\n  B: \"base\"\n  C: 6385\n",
    );
    write(
        &base,
        "ds.yaml",
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: ironic\nspec:\n  template:\n    \
         spec:\n      hostNetwork: true\n      initContainers:\n        - name: proxy\n          \
         image: app\n          ports:\n            - containerPort: 6385\n      \
         containers:\n        - name: dnsmasq\n          image: app\n          ports:\n            \
         - {containerPort: 67, protocol: UDP}\n",
    );
    let site = tmp.path().join("site");
    write(
        &site,
        "kustomization.yaml",
        "namespace: metal3\nresources:\n  - ../base\n  - https://example.com/remote.yaml\n\
         patches:\n  - path: patches/site.yaml\n  - patch: |-\n      apiVersion: apps/v1\n      \
         kind: DaemonSet\n      metadata:\n        name: ironic\n      spec:\n        \
         template:\n          spec:\n            containers:\n              - name: dnsmasq\n                \
         ports:\n                  - {containerPort: 69, protocol: UDP}\n\
         configMapGenerator:\n  - name: ironic-proxy-site\n    behavior: merge\n    \
         literals:\n      - C=6388\n    envs:\n      - site.env\n\
         images:\n  - name: app\n    digest: sha256:00\n",
    );
    write(
        &site,
        "patches/site.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ironic-proxy-site\ndata:\n  A: \"site\"\n  B: null\n",
    );
    write(&site, "site.env", "# a comment\nD = from-env\n");

    let o = load(&site);
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    assert!(o.site_found);
    let site: Vec<(&str, &str)> = o
        .site
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(site, [("A", "site"), ("C", "6388"), ("D", "from-env")]);
    assert_eq!(o.namespace.as_deref(), Some("metal3"));
    let w = &o.workloads["DaemonSet/ironic"];
    assert!(w.host_network);
    let ports: Vec<(u16, &str)> = w.containers["dnsmasq"]
        .ports
        .iter()
        .map(|p| (p.number, p.protocol.as_str()))
        .collect();
    assert_eq!(ports, [(67, "UDP"), (69, "UDP")]);
    assert_eq!(w.containers["proxy"].ports.len(), 1);
    // The base's entry, then the overlay's.
    let images: Vec<(&str, Option<&str>, Option<&str>)> = o
        .images
        .iter()
        .map(|(n, i)| (n.as_str(), i.new_tag.as_deref(), i.digest.as_deref()))
        .collect();
    assert_eq!(
        images,
        [
            ("app", Some("main"), None),
            ("app", None, Some("sha256:00"))
        ]
    );
}

#[test]
fn a_file_that_does_not_parse_is_named_and_a_cycle_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    write(&a, "kustomization.yaml", "resources:\n  - ../b\n");
    write(&b, "kustomization.yaml", "resources:\n  - ../a\n");
    write(&b, "broken.yaml", "data: [unclosed\n");
    let o = load(&a);
    assert!(!o.site_found);
    assert_eq!(o.errors.len(), 1, "{:?}", o.errors);
    assert!(o.errors[0].contains("broken.yaml"), "{:?}", o.errors);
    let missing = load(&tmp.path().join("nope"));
    assert!(
        missing.errors[0].ends_with("nope: no such folder"),
        "{:?}",
        missing.errors
    );
}

/// kustomize's namespace transformer renames the kit's Namespace: an overlay with
/// `namespace: baremetal-operator-system` on a base whose Namespace is `metal3` has one
/// Namespace, `baremetal-operator-system`, with the base's labels (what `kubectl kustomize`
/// renders); a second Namespace of that name in the overlay is kustomize's ID conflict.
#[test]
fn the_overlay_namespace_renames_the_kits_namespace() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    write(
        &base,
        "kustomization.yaml",
        "resources:\n  - namespace.yaml\n",
    );
    write(
        &base,
        "namespace.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: metal3\n  labels:\n    \
         pod-security.kubernetes.io/enforce: privileged\n",
    );
    let site = tmp.path().join("site");
    write(
        &site,
        "kustomization.yaml",
        "namespace: baremetal-operator-system\nresources:\n  - ../base\n",
    );
    let o = load(&site);
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    assert_eq!(o.namespace.as_deref(), Some("baremetal-operator-system"));
    assert_eq!(
        o.namespaces.keys().collect::<Vec<_>>(),
        ["baremetal-operator-system"]
    );
    assert_eq!(
        o.namespaces["baremetal-operator-system"]
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("privileged")
    );
    // Adding the Namespace by its new name, as an older `kit check` suggested: two objects.
    write(
        &site,
        "ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: baremetal-operator-system\n",
    );
    let o = load(&site);
    assert!(
        o.errors.iter().any(|e| e.contains("ID conflict")),
        "{:?}",
        o.errors
    );
}
