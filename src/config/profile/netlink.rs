//! The first global address of a network interface, as ironic-image's
//! `scripts/ironic-common.sh` reads it for `PROVISIONING_INTERFACE`:
//! `ip -br addr show scope global up dev IFACE | awk '{print $3}' | sed -e 's%/.*%%' | head -n 1`.
//!
//! Read from the kernel over rtnetlink (a link dump for the interface's index and flags, an
//! address dump for its addresses) with rustix's safe socket calls: no `ip` binary in the image,
//! no `unsafe`, no new dependency. The kernel dumps IPv4 addresses before IPv6 ones, as `ip`
//! prints them, so "first" means the same here as there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketType};

/// Why no address was found.
#[derive(Debug, thiserror::Error)]
pub(super) enum AddressError {
    #[error("netlink: {0}")]
    Netlink(#[from] rustix::io::Errno),
    #[error("no such interface")]
    NoInterface,
    #[error("the interface is down")]
    Down,
    #[error("the interface has no global address (yet)")]
    NoAddress,
    #[error("netlink: malformed answer")]
    Malformed,
}

const RTM_GETLINK: u16 = 18;
const RTM_NEWLINK: u16 = 16;
const RTM_GETADDR: u16 = 22;
const RTM_NEWADDR: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const IFLA_IFNAME: u16 = 3;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFF_UP: u32 = 1;
const RT_SCOPE_UNIVERSE: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// The first global-scope address of interface `name`, which must be up.
pub(super) fn first_global_address(name: &str) -> Result<IpAddr, AddressError> {
    // struct ifinfomsg (16 bytes): family, pad, type, index, flags, change.
    let mut index = None;
    dump(RTM_GETLINK, 16, RTM_NEWLINK, |body, attrs| {
        let idx = i32::from_ne_bytes(body[4..8].try_into().ok()?);
        let flags = u32::from_ne_bytes(body[8..12].try_into().ok()?);
        let ifname = attrs.iter().find(|(t, _)| *t == IFLA_IFNAME)?.1;
        let ifname = ifname.split(|b| *b == 0).next()?;
        if ifname == name.as_bytes() {
            index = Some((idx, flags));
        }
        Some(())
    })?;
    let (index, flags) = index.ok_or(AddressError::NoInterface)?;
    if flags & IFF_UP == 0 {
        return Err(AddressError::Down);
    }
    // struct ifaddrmsg (8 bytes): family, prefixlen, flags, scope, index.
    let mut found = None;
    dump(RTM_GETADDR, 8, RTM_NEWADDR, |body, attrs| {
        let idx = i32::from_ne_bytes(body[4..8].try_into().ok()?);
        if found.is_some() || idx != index || body[3] != RT_SCOPE_UNIVERSE {
            return Some(());
        }
        // IPv4: IFA_LOCAL is the interface's own address (IFA_ADDRESS the peer's on
        // point-to-point links); `ip` prints IFA_LOCAL when present. IPv6 has only IFA_ADDRESS.
        let attr = |t| attrs.iter().find(|(at, _)| *at == t).map(|(_, v)| *v);
        found = match body[0] {
            AF_INET => {
                let v: [u8; 4] = attr(IFA_LOCAL).or(attr(IFA_ADDRESS))?.try_into().ok()?;
                Some(IpAddr::V4(Ipv4Addr::from(v)))
            }
            AF_INET6 => {
                let v: [u8; 16] = attr(IFA_ADDRESS)?.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(v)))
            }
            _ => None,
        };
        Some(())
    })?;
    found.ok_or(AddressError::NoAddress)
}

/// Sends a dump request of `kind` and calls `each` with the fixed header (`fixed` bytes) and the
/// attributes of every `answer` message until the kernel says it is done. `each` returning
/// `None` means a message it could not read.
fn dump(
    kind: u16,
    fixed: usize,
    answer: u16,
    mut each: impl FnMut(&[u8], &[(u16, &[u8])]) -> Option<()>,
) -> Result<(), AddressError> {
    // Protocol `None` is NETLINK_ROUTE (0).
    let fd = rustix::net::socket(AddressFamily::NETLINK, SocketType::RAW, None)?;
    let len = 16 + fixed;
    let mut req = Vec::with_capacity(len);
    req.extend_from_slice(&u32::try_from(len).unwrap_or(0).to_ne_bytes());
    req.extend_from_slice(&kind.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // sequence number
    req.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel assigns ours
    req.resize(len, 0); // family AF_UNSPEC: every family
    rustix::net::sendto(
        &fd,
        &req,
        SendFlags::empty(),
        &netlink::SocketAddrNetlink::new(0, 0),
    )?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let (n, _) = rustix::net::recv(&fd, &mut buf[..], RecvFlags::empty())?;
        let mut rest = buf.get(..n).ok_or(AddressError::Malformed)?;
        while rest.len() >= 16 {
            let msg_len =
                u32::from_ne_bytes(rest[0..4].try_into().map_err(|_| AddressError::Malformed)?);
            let msg_len = usize::try_from(msg_len).map_err(|_| AddressError::Malformed)?;
            let msg_type = u16::from_ne_bytes([rest[4], rest[5]]);
            let msg = rest
                .get(..msg_len)
                .filter(|_| msg_len >= 16)
                .ok_or(AddressError::Malformed)?;
            match msg_type {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    let code = msg.get(16..20).ok_or(AddressError::Malformed)?;
                    let code =
                        i32::from_ne_bytes(code.try_into().map_err(|_| AddressError::Malformed)?);
                    return Err(AddressError::Netlink(rustix::io::Errno::from_raw_os_error(
                        -code,
                    )));
                }
                t if t == answer => {
                    let body = msg.get(16..16 + fixed).ok_or(AddressError::Malformed)?;
                    let attrs = attributes(msg.get(16 + fixed..).unwrap_or_default());
                    each(body, &attrs).ok_or(AddressError::Malformed)?;
                }
                _ => {}
            }
            rest = rest.get(align(msg_len)..).unwrap_or_default();
        }
    }
}

/// The `rtattr`s of a message: (type, payload).
fn attributes(mut rest: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while rest.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
        let kind = u16::from_ne_bytes([rest[2], rest[3]]);
        let Some(payload) = rest.get(4..len) else {
            break;
        };
        out.push((kind, payload));
        rest = rest.get(align(len)..).unwrap_or_default();
    }
    out
}

fn align(n: usize) -> usize {
    n.saturating_add(3) & !3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_up_with_no_global_address_and_unknown_names_are_said() {
        // `lo` always exists in a network namespace; its 127.0.0.1 and ::1 are host scope,
        // which ironic-image's `scope global` leaves out as well.
        assert!(matches!(
            first_global_address("lo"),
            Err(AddressError::NoAddress)
        ));
        assert!(matches!(
            first_global_address("no-such-if0"),
            Err(AddressError::NoInterface)
        ));
    }
}
