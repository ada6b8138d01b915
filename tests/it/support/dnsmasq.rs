//! A real DNS server per test: Debian's dnsmasq on 127.0.0.1 and a free port, answering only
//! for one zone from files in a temporary directory (the recipe of docs/e2e.md).
//!
//! - A/AAAA records live in an `--addn-hosts` file: [`Dnsmasq::set_hosts`] rewrites it and sends
//!   SIGHUP, which makes dnsmasq re-read it without a restart.
//! - SRV records (`--srv-host`) are configuration, and SIGHUP does not re-read configuration (not
//!   even a `--conf-dir`; checked with dnsmasq 2.90): [`Dnsmasq::set_srv`] restarts the server on
//!   the same address, so there is a short moment without a server.
//! - The port is reserved for the test process outside the kernel's ephemeral range
//!   ([`super::ports`]): while dnsmasq is down (a restart, [`Dnsmasq::stop`]) no outgoing
//!   connection and no other test can take it. The one program that may still bind it is
//!   hickory's resolver, which picks random UDP source ports in 1024-65535 on 0.0.0.0 for one
//!   query (at most its 2 s timeout): a restart that finds the port taken retries on it for 10 s.
//! - With `--local=/<zone>/` dnsmasq answers NXDOMAIN for unknown names in the zone and an empty
//!   NOERROR for a type a name lacks, as cluster DNS does; names outside the zone get REFUSED.
//!
//! The server is killed when the value is dropped. Needs the `dnsmasq` package
//! (`apt-get install -y dnsmasq`); nothing else, no root (as root, dnsmasq drops to `nobody`,
//! hence the world-readable files).

use super::ports;
use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One SRV record: `_service._proto.name` -> `target:port`.
#[derive(Clone, Debug)]
pub(crate) struct SrvRecord {
    pub name: String,
    pub target: String,
    pub port: u16,
}

pub(crate) struct Dnsmasq {
    dir: tempfile::TempDir,
    addr: SocketAddr,
    zone: String,
    ttl: u32,
    srv: Vec<SrvRecord>,
    child: Option<Child>,
}

impl Dnsmasq {
    /// Starts a server authoritative-like for `zone` (e.g. `metal3.svc`) whose records carry
    /// `ttl` seconds, with no records yet.
    pub(crate) fn start(zone: &str, ttl: u32) -> Self {
        let mut last_error = String::new();
        // A failed start (a port held by something outside the reservation scheme) is retried
        // on a fresh port.
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("temporary directory");
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))
                .expect("make the directory readable for dnsmasq's unprivileged user");
            let mut dns = Self {
                dir,
                addr: SocketAddr::from((Ipv4Addr::LOCALHOST, ports::reserve())),
                zone: zone.to_owned(),
                ttl,
                srv: Vec::new(),
                child: None,
            };
            dns.write_hosts(&[]);
            match dns.launch() {
                Ok(()) => return dns,
                Err(err) => last_error = err,
            }
        }
        panic!("dnsmasq did not start: {last_error}");
    }

    /// Where to send queries.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces every A/AAAA record with `records` (`("127.0.0.10", "ironic.metal3.svc")`, an
    /// IPv6 address for AAAA) and makes a running dnsmasq re-read them.
    pub(crate) fn set_hosts(&mut self, records: &[(&str, &str)]) {
        self.write_hosts(records);
        if self.child.is_some() {
            self.signal("HUP");
        }
    }

    /// Replaces every SRV record; restarts dnsmasq on the same address.
    pub(crate) fn set_srv(&mut self, records: &[SrvRecord]) {
        self.srv = records.to_vec();
        self.restart();
    }

    /// Kills the server: queries go unanswered (ICMP port unreachable) until [`Self::restart`].
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same address, with the current records.
    pub(crate) fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(err) if err.contains("Address already in use") && Instant::now() < deadline => {
                    // Poll interval: a resolver's query socket holds the port for one query.
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(err) => panic!("dnsmasq did not restart on {}: {err}", self.addr),
            }
        }
    }

    /// What dnsmasq logged so far, for failure messages.
    pub(crate) fn log(&self) -> String {
        fs::read_to_string(self.path("dnsmasq.log")).unwrap_or_default()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write_hosts(&self, records: &[(&str, &str)]) {
        let text: String = records
            .iter()
            .map(|(ip, name)| format!("{ip} {name}\n"))
            .collect();
        // Written aside and renamed, so dnsmasq never reads a half-written file.
        write_readable(&self.path("hosts.new"), &text);
        fs::rename(self.path("hosts.new"), self.path("hosts")).expect("replace the hosts file");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("dnsmasq is running");
        let status = Command::new("sh")
            .args(["-c", &format!("kill -{signal} {}", child.id())])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} dnsmasq failed");
    }

    fn launch(&mut self) -> Result<(), String> {
        let log = fs::File::create(self.path("dnsmasq.log")).map_err(|e| e.to_string())?;
        let mut command = Command::new(program());
        command
            .arg("--keep-in-foreground")
            .arg("--conf-file=/dev/null") // not /etc/dnsmasq.conf nor /etc/dnsmasq.d
            .arg("--no-resolv")
            .arg("--no-hosts")
            .arg(format!("--addn-hosts={}", self.path("hosts").display()))
            .arg(format!("--local=/{}/", self.zone))
            .arg(format!("--local-ttl={}", self.ttl))
            .arg(format!("--listen-address={}", self.addr.ip()))
            .arg(format!("--port={}", self.addr.port()))
            .arg("--bind-interfaces")
            .arg(format!("--pid-file={}", self.path("dnsmasq.pid").display()))
            .arg("--log-facility=-")
            .arg("--log-queries");
        for srv in &self.srv {
            command.arg(format!(
                "--srv-host={},{},{}",
                srv.name, srv.target, srv.port
            ));
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                format!("cannot run dnsmasq ({e}); install it with `apt-get install -y dnsmasq`")
            })?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// Polls with a real query until dnsmasq answers, or fails if it exits or takes too long.
    fn wait_ready(&mut self) -> Result<(), String> {
        let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(|e| e.to_string())?;
        let query = probe_query(&format!("ready.{}", self.zone));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0_u8; 512];
        while Instant::now() < deadline {
            let child = self.child.as_mut().expect("launched");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(format!("dnsmasq exited with {status}: {}", self.log()));
            }
            let _ = socket.send_to(&query, self.addr);
            if let Ok((n, _)) = socket.recv_from(&mut buf) {
                if n >= 12 && buf[..2] == query[..2] {
                    return Ok(());
                }
            }
        }
        self.stop();
        Err(format!(
            "dnsmasq did not answer within 10 s: {}",
            self.log()
        ))
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Debian installs dnsmasq in /usr/sbin, which is not on every user's PATH.
fn program() -> &'static str {
    const SBIN: &str = "/usr/sbin/dnsmasq";
    if Path::new(SBIN).exists() {
        SBIN
    } else {
        "dnsmasq"
    }
}

fn write_readable(path: &Path, text: &str) {
    let mut file = fs::File::create(path).expect("create file");
    file.write_all(text.as_bytes()).expect("write file");
    fs::set_permissions(path, fs::Permissions::from_mode(0o644)).expect("chmod file");
}

/// A minimal DNS query (RFC 1035 §4.1) for the A records of `name`.
fn probe_query(name: &str) -> Vec<u8> {
    let mut query = vec![0x5e, 0xad, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        query.push(u8::try_from(label.len()).expect("label of at most 63 bytes"));
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    query
}
