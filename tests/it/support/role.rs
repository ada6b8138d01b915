//! `ironic-proxy run` started with any arguments and environment (a built-in profile, the dev
//! default), its stderr collected, and its readiness read from its admin listener.

use crate::support::{poll_until, HttpConn};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ironic-proxy");

/// Variables a profile reads that the test's own environment must not leak in.
pub(crate) const PROFILE_VARS: &[&str] = &[
    "IRONIC_PROXY_CONFIG",
    "IRONIC_PROXY_PROFILE",
    "IRONIC_PROXY_IDENTITY",
    "IRONIC_PROXY_CERT_DIR",
    "IRONIC_PROXY_TRUST",
    "IRONIC_PROXY_ISSUER_DIR",
    "IRONIC_PROXY_EXPORT_DIR",
    "IRONIC_PROXY_API_SOCKET",
    "IRONIC_PROXY_RPC_SOCKET",
    "IRONIC_PROXY_PEERS",
    "IRONIC_PROXY_FALLBACK",
    "IRONIC_PROXY_DNS_SERVERS",
    "IRONIC_PROXY_DNS_NAMES",
    "IRONIC_PROXY_API_VIPS",
    "IRONIC_PROXY_SERVICE",
    "IRONIC_PROXY_CLUSTER_DOMAIN",
    "IRONIC_PROXY_ADMIN_LISTEN",
    "IRONIC_PROXY_BIND",
    "IRONIC_PROXY_API_PORT",
    "IRONIC_PROXY_RPC_PORT",
    "IRONIC_PROXY_PEER_API_PORT",
    "IRONIC_PROXY_HTPASSWD",
    "IRONIC_PROXY_AUTH_REALM",
    "IRONIC_PROXY_TLS_MIN_VERSION",
    "IRONIC_PROXY_TLS_CIPHER_SUITES",
    "IRONIC_PROXY_TLS_GROUPS",
    "IRONIC_SSL_PROTOCOL",
    "IRONIC_TLS_12_CIPHERS",
    "IRONIC_TLS_13_CIPHERS",
    "IRONIC_TLS_CURVES",
    "IRONIC_IP",
    "PROVISIONING_IP",
    "PROVISIONING_INTERFACE",
    "IRONIC_PROXY_NETWORKING_RPC_SOCKET",
    "IRONIC_PROXY_NETWORKING_RPC_PORT",
    "IRONIC_PROXY_IPXE_TLS_PORT",
    "IRONIC_PROXY_VMEDIA_TLS_PORT",
    "IRONIC_PROXY_HTTPD_PORT",
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IPS",
];

/// A running `ironic-proxy` process; killed (by its PID) when dropped.
pub(crate) struct Role {
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
    /// Collects stderr into `logs`; ends when the process's stderr closes.
    reader: Option<std::thread::JoinHandle<()>>,
    pub admin: SocketAddr,
}

impl Role {
    /// Starts `ironic-proxy ARGS` with `env` on top of a cleaned environment; `admin` is where
    /// its admin listener will be.
    pub(crate) fn spawn(args: &[&str], env: &[(&str, String)], admin: SocketAddr) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for k in PROFILE_VARS {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn ironic-proxy");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("logs").push(line);
            }
        });
        Self {
            child,
            logs,
            reader: Some(reader),
            admin,
        }
    }

    /// Waits for `/readyz` 200; panics with the logs on exit or timeout.
    pub(crate) fn wait_ready(&mut self, timeout: Duration) {
        let ready = poll_until(timeout, || {
            if let Ok(Some(status)) = self.child.try_wait() {
                // Its last log lines: the reader ends at the end of the exited process's stderr.
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                panic!("exited with {status}:\n{}", self.logs().join("\n"));
            }
            HttpConn::tcp(self.admin)
                .and_then(|mut c| c.get("/readyz"))
                .ok()
                .filter(|r| r.status == 200)
        });
        assert!(ready.is_some(), "not ready:\n{}", self.logs().join("\n"));
    }

    pub(crate) fn logs(&self) -> Vec<String> {
        self.logs.lock().expect("logs").clone()
    }

    /// Waits for a log line containing `needle`.
    pub(crate) fn wait_log(&self, needle: &str, timeout: Duration) -> Option<String> {
        poll_until(timeout, || {
            self.logs().into_iter().find(|l| l.contains(needle))
        })
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
