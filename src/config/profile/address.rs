//! The address ironic-image gives Ironic as `[DEFAULT]host` (`IRONIC_URL_HOST`, the host of
//! every JSON-RPC call to this conductor), from the same variables and with the same precedence
//! as `wait_for_interface_or_ip` in ironic-image's `scripts/ironic-common.sh`: `IRONIC_IP`, else
//! `PROVISIONING_IP`, else the first global address of the up interface
//! `PROVISIONING_INTERFACE`. A prefix length (`172.22.0.3/24`) is stripped as its `ipcalc`
//! does; IPv6 is accepted in any spelling (ironic-image brackets it only in URLs). The sidecar
//! profiles add it to the certificate's IP SANs, so the conductor's own host is always covered.
//! `PROVISIONING_MACS` (ironic-image's detection of the interface from MACs) is not read.

use std::net::IpAddr;

use super::{Env, ProfileError};

/// The address, or `None` when none of the three variables is set.
pub(super) fn ironic_ip(env: &dyn Env) -> Result<Option<IpAddr>, ProfileError> {
    let var = |name: &'static str| {
        env.var(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .map(|v| (name, v))
    };
    if let Some((name, v)) = var("IRONIC_IP").or_else(|| var("PROVISIONING_IP")) {
        let host = v.split_once('/').map_or(v.as_str(), |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        return host.parse().map(Some).map_err(|_| ProfileError::Address {
            var: name,
            value: v.clone(),
            reason: "not an IP address".into(),
        });
    }
    let Some((name, iface)) = var("PROVISIONING_INTERFACE") else {
        return Ok(None);
    };
    super::netlink::first_global_address(&iface)
        .map(Some)
        .map_err(|e| ProfileError::Address {
            var: name,
            value: iface,
            reason: e.to_string(),
        })
}
