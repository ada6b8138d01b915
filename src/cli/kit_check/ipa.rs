//! `ipa.verify`: the agent verifies the API's certificate on every boot the kit's containers
//! prepare. ironic-image renders `ipa-insecure` from `IRONIC_IPA_INSECURE` (default 1) and, with
//! `WEBSERVER_CACERT_FILE` naming a file, hands the CA to the ramdisk (scripts/tls-common.sh
//! `IRONIC_INJECT_IPA`): the `ipa-cacert-bundle` initrd of its iPXE templates and
//! `[agent]api_ca_file`, which Ironic injects into virtual-media ISOs. Both are read by Ironic's
//! container (`runironic`: ironic.conf, the node's iPXE script) and by httpd's (`runhttpd`:
//! `inspector.ipxe`, the script of a host Ironic has no boot file for). Pure.

use super::model::Overlay;
use super::Line;

/// The boot path ironic-image offers no CA for, and what the operator does about it.
const NO_BUNDLE: &str = "a node given Ironic's `pxe` boot interface (GRUB or pxelinux over \
                         TFTP, no iPXE) gets no CA from the boot: give it a ramdisk with the \
                         CA inside (scripts/build-ipa-ramdisk --ca ca-bundle.crt)";

pub(super) fn ipa_verify(o: &Overlay) -> Line {
    let fix = "keep the kit's IRONIC_IPA_INSECURE \"0\" and WEBSERVER_CACERT_FILE (the CA \
               bundle the container mounts) on the ironic and httpd containers \
               (config/k8s/standalone/ironic.yaml)";
    let mut seen = Vec::new();
    for (workload, w) in &o.workloads {
        for (name, c) in &w.containers {
            let runs = |script: &str| c.command.iter().any(|a| a.contains(script));
            if !runs("runironic") && !runs("runhttpd") {
                continue;
            }
            let who = format!("{workload} ({name})");
            match c.env.get("IRONIC_IPA_INSECURE").map(String::as_str) {
                Some("0") => {}
                v => {
                    return Line::fail(
                        "ipa.verify",
                        format!(
                            "{who}: IRONIC_IPA_INSECURE is {}: the agents it boots do not \
                             verify the API's certificate (ipa-insecure=1)",
                            v.map_or_else(
                                || "unset (ironic-image's default: 1)".into(),
                                |v| { format!("{v:?}") }
                            )
                        ),
                        fix,
                    )
                }
            }
            if c.env
                .get("WEBSERVER_CACERT_FILE")
                .is_none_or(String::is_empty)
            {
                return Line::fail(
                    "ipa.verify",
                    format!(
                        "{who}: WEBSERVER_CACERT_FILE is not set: the ramdisks it boots get \
                         no CA, and a stock ramdisk cannot verify the API"
                    ),
                    fix,
                );
            }
            seen.push(who);
        }
    }
    if seen.is_empty() {
        return Line::pass("ipa.verify", "no ironic-image container in the overlay");
    }
    Line::pass(
        "ipa.verify",
        format!(
            "{}: ipa-insecure=0 and the CA bundle for iPXE (ipa-cacert-bundle) and virtual \
             media ([agent]api_ca_file); {NO_BUNDLE}",
            seen.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::kit_check::model::{Container, Workload};

    fn overlay(env: &[(&str, &str)]) -> Overlay {
        let mut o = Overlay::default();
        let mut w = Workload::default();
        for (name, script) in [
            ("ironic", "exec /bin/runironic"),
            ("httpd", "exec /bin/runhttpd"),
        ] {
            w.containers.insert(
                name.into(),
                Container {
                    command: vec!["/bin/bash".into(), "-c".into(), script.into()],
                    env: env
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                    ..Container::default()
                },
            );
        }
        o.workloads.insert("DaemonSet/ironic".into(), w);
        o
    }

    #[test]
    fn the_kits_settings_pass_and_name_the_boot_path_without_a_bundle() {
        let o = overlay(&[
            ("IRONIC_IPA_INSECURE", "0"),
            ("WEBSERVER_CACERT_FILE", "/certs/ca/ironic/tls.crt"),
        ]);
        let line = ipa_verify(&o);
        assert!(line.ok, "{line:?}");
        assert!(line.detail.contains("`pxe` boot interface"), "{line:?}");
    }

    #[test]
    fn insecure_unset_or_one_and_no_ca_file_fail() {
        for env in [
            &[("WEBSERVER_CACERT_FILE", "/c")][..],
            &[
                ("IRONIC_IPA_INSECURE", "1"),
                ("WEBSERVER_CACERT_FILE", "/c"),
            ][..],
            &[("IRONIC_IPA_INSECURE", "0")][..],
        ] {
            let line = ipa_verify(&overlay(env));
            assert!(!line.ok, "{env:?}: {line:?}");
        }
    }
}
