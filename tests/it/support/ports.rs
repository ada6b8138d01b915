//! Ports for servers a test starts, taken outside the kernel's ephemeral range and reserved for
//! the whole test process, so that no test ever binds a port somebody else may hold.
//!
//! Binding `127.0.0.1:0` and letting the socket go gives a port that the kernel may hand to the
//! next outgoing connection (any test's, on a loaded machine) before our server binds it again:
//! a test restarting dnsmasq on "its" port failed that way. Here a port is:
//!
//! - below `/proc/sys/net/ipv4/ip_local_port_range` (or above it when the range starts too
//!   low): the kernel never picks it for `connect()` or `bind(:0)`;
//! - claimed by a file named after it, holding this process's id, in a directory every test
//!   process on the machine shares (`$TMPDIR/ironic-proxy-test-ports/`), created exclusively
//!   (`O_EXCL`): two tests, in this worktree or another, never get the same port at the same
//!   time. A claim whose process is gone (no `/proc/<pid>`) is taken over. (Not `flock`: std's
//!   `File::try_lock` is newer than the crate's MSRV, and a lock call of our own is `unsafe`.)
//! - never handed out twice in one process;
//! - free for TCP and UDP on 127.0.0.1 when reserved (a service of the machine may hold it).
//!
//! Each test scans from its own starting point (a hash of its thread's name, which is the test's
//! name under libtest and nextest), so runs of one test take the same ports as long as nothing
//! else holds them.
//!
//! A socket that must be closed and opened again (a backend killed and restarted) should keep its
//! bound socket instead ([`KeptListener`]): a port reserved here is only safe from cooperating
//! tests and the kernel's choices, not from a program that binds ports of its own choosing
//! (hickory's resolver binds random UDP source ports in 1024-65535, for one).

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Lowest port handed out: below it are the well-known and registered services a machine runs.
const FLOOR: u16 = 10_000;

struct Reserved {
    ports: HashSet<u16>,
}

static RESERVED: Mutex<Option<Reserved>> = Mutex::new(None);

/// A port outside the ephemeral range, free on 127.0.0.1 and reserved for this process.
pub(crate) fn reserve() -> u16 {
    let (lo, hi) = candidates();
    let span = u32::from(hi - lo) + 1;
    let mut hasher = DefaultHasher::new();
    std::thread::current()
        .name()
        .unwrap_or("")
        .hash(&mut hasher);
    let start = u32::try_from(hasher.finish() % u64::from(span)).expect("under span");
    let dir = lock_dir();
    let mut guard = RESERVED.lock().expect("port registry");
    let reserved = guard.get_or_insert_with(|| Reserved {
        ports: HashSet::new(),
    });
    for i in 0..span {
        let port = u16::try_from(u32::from(lo) + (start + i) % span).expect("within the range");
        if reserved.ports.contains(&port) {
            continue;
        }
        let claim = dir.join(port.to_string());
        if !take(&claim) {
            continue; // another test process holds it
        }
        // Reserved for this process from now on, used or not: never handed out twice.
        reserved.ports.insert(port);
        // Held by a program outside the scheme (a service, an orphaned server of a killed test)?
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        if TcpListener::bind(addr).is_err() || UdpSocket::bind(addr).is_err() {
            continue;
        }
        return port;
    }
    panic!("no free port in {lo}-{hi} outside the ephemeral range");
}

/// The range ports are taken from: below the ephemeral range, or above it when it starts lower
/// than [`FLOOR`] + 1000.
fn candidates() -> (u16, u16) {
    const RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
    let text = std::fs::read_to_string(RANGE)
        .unwrap_or_else(|e| panic!("cannot read {RANGE} ({e}): test ports need it"));
    let mut it = text.split_whitespace().map(|n| n.parse::<u16>());
    let (Some(Ok(first)), Some(Ok(last))) = (it.next(), it.next()) else {
        panic!("unexpected {RANGE}: {text:?}");
    };
    if first > FLOOR + 1000 {
        (FLOOR, first - 1)
    } else {
        assert!(
            last < u16::MAX - 1000,
            "no room outside the ephemeral range {first}-{last}"
        );
        (last + 1, u16::MAX)
    }
}

/// Claims `path` for this process: created holding our id, or taken over from a process that is
/// gone. A claim being written (empty) belongs to its writer for 10 s.
fn take(path: &Path) -> bool {
    let me = std::process::id().to_string();
    for _ in 0..2 {
        match OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(mut file) => return file.write_all(me.as_bytes()).is_ok(),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let owner = std::fs::read_to_string(path).unwrap_or_default();
                let alive = match owner.trim().parse::<u32>() {
                    Ok(pid) => Path::new(&format!("/proc/{pid}")).exists(),
                    // Being written, or left empty by a process killed in between: the latter
                    // once it is older than any write could take.
                    Err(_) => std::fs::metadata(path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_none_or(|age| age < std::time::Duration::from_secs(10)),
                };
                if alive {
                    return false;
                }
                let _ = std::fs::remove_file(path);
            }
            Err(_) => return false,
        }
    }
    false
}

fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("ironic-proxy-test-ports");
    std::fs::create_dir_all(&dir).expect("create the port lock directory");
    // Shared by every user's tests on the machine.
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
    dir
}

/// A listening socket that can stop listening and listen again without ever letting its port
/// go: [`Self::close`] refuses new connections as a killed server would (RST, "connection
/// refused") while the socket stays bound, [`Self::reopen`] listens again.
///
/// Linux keeps the bind of a socket shut down out of listening if it was bound to an explicit
/// port (`SOCK_BINDPORT_LOCK`), hence the port from [`reserve`] (or a caller's explicit one),
/// never `:0`.
pub(crate) struct KeptListener {
    socket: TcpListener,
}

impl KeptListener {
    /// Binds `addr` (an explicit port) and listens.
    pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        assert_ne!(
            addr.port(),
            0,
            "an explicit port keeps its bind across close()"
        );
        let socket = TcpListener::bind(addr)?;
        Ok(Self { socket })
    }

    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Another handle on the same socket, for a server to accept on (and drop when it stops).
    pub(crate) fn handle(&self) -> TcpListener {
        self.socket.try_clone().expect("dup the listening socket")
    }

    /// Stops listening: connections waiting to be accepted are reset, new ones refused.
    pub(crate) fn close(&self) {
        // A shut-down listener moves to CLOSE (tcp_disconnect) and keeps its local address.
        let _ = socket2::SockRef::from(&self.socket).shutdown(Shutdown::Both);
    }

    /// Listens again on the same socket.
    pub(crate) fn reopen(&self) {
        socket2::SockRef::from(&self.socket)
            .listen(1024)
            .unwrap_or_else(|e| panic!("listen again on {:?}: {e}", self.socket.local_addr()));
    }
}
