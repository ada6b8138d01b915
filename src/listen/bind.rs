//! Binding a listener's address: TCP (with `SO_REUSEPORT` and socket steering for
//! `limits.handover`) or a unix socket.

use super::{Bound, ListenError};
use crate::config::ListenAddr;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpSocket, UnixListener};

/// Binds a listener address. A stale unix socket file left by an earlier process is replaced.
/// With `handover`, a TCP address is bound as [`bind_tcp`] binds it.
pub(crate) async fn bind(
    name: &str,
    addr: &ListenAddr,
    handover: bool,
) -> Result<Bound, ListenError> {
    let err = |source| ListenError::Bind {
        name: name.to_owned(),
        addr: addr.to_string(),
        source,
    };
    match addr {
        ListenAddr::Tcp(sa) => bind_tcp(*sa, handover).map(Bound::Tcp).map_err(err),
        ListenAddr::Unix(path) => {
            use std::os::unix::fs::FileTypeExt;
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = std::fs::remove_file(path);
            }
            UnixListener::bind(path)
                .map(|l| Bound::Unix(l, path.clone()))
                .map_err(err)
        }
    }
}

/// The accept queue's length, as `TcpListener::bind` asks for it.
const BACKLOG: u32 = 1024;

/// Binds and listens on a TCP address (`SO_REUSEADDR`, as `TcpListener::bind`).
///
/// `handover`: a restart without a refused connection. The socket also gets `SO_REUSEPORT`, so
/// that the next process (same user) can bind the same address while this one still serves, and
/// a classic BPF program on the address's socket group that sends every new connection to the
/// group's second socket: the newest, while an old and a new process both listen (the kernel
/// appends a socket to its group at `listen` and moves the last one into a closed one's place;
/// an index past the group's end falls back to the kernel's hash, so a lone socket gets all).
/// From the new process's `listen` on, nothing enters the old one's accept queue, which it
/// empties and serves as it stops (the module's shutdown), so no connection is reset or refused.
/// Without it, a second process on the address fails with "address in use".
pub(crate) fn bind_tcp(sa: SocketAddr, handover: bool) -> std::io::Result<TcpListener> {
    let socket = if sa.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    if handover {
        socket.set_reuseport(true)?;
    }
    socket.bind(sa)?;
    let listener = socket.listen(BACKLOG)?;
    if handover {
        steer_to_newest(&listener)?;
    }
    Ok(listener)
}

/// Attaches the program `return 1` to the listener's `SO_REUSEPORT` group (see [`bind_tcp`]).
/// One of the crate's unsafe functions (listed at `unsafe_code` in Cargo.toml): neither rustix
/// nor tokio sets this option.
#[allow(unsafe_code)]
fn steer_to_newest(listener: &TcpListener) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut program = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: 1,
    }];
    let fprog = libc::sock_fprog {
        len: 1,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `program`, one valid instruction, and both outlive the call; the
    // kernel copies the program and keeps no pointer to either; the descriptor is the
    // listener's, open for the whole call.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            std::ptr::from_ref(&fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
