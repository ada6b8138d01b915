//! The real `ironic-proxy` binary as a child process, with a config file written into the test's
//! temp dir, ports picked free, readiness polled on the admin `/readyz`, and every stderr line
//! (tracing and access logs) collected for assertions. The child is killed (by its PID) on drop.

use super::{poll_until, run, HttpConn, Output, Response};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ironic-proxy");

/// The binary the proxies of [`Proxy`] run: [`BIN`], or `IRONIC_PROXY_TEST_BIN` when set (to
/// measure a release build with a test, e.g. the wrong-password flood's latency figures).
fn proxy_bin() -> String {
    std::env::var("IRONIC_PROXY_TEST_BIN").unwrap_or_else(|_| BIN.to_owned())
}

/// A listener's `tls` mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tls {
    None,
    Server,
    Mutual,
}

impl Tls {
    fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Server => "server",
            Self::Mutual => "mutual",
        }
    }
}

#[derive(Clone, Debug)]
struct ListenerSpec {
    name: String,
    tls: Tls,
    allow: Vec<String>,
    upstream: String,
    jsonrpc: bool,
}

/// Writes a config and starts the proxy.
#[derive(Clone, Debug)]
pub(crate) struct ProxyBuilder {
    dir: PathBuf,
    identity: Option<(PathBuf, PathBuf, PathBuf)>,
    watch_interval: Option<String>,
    listeners: Vec<ListenerSpec>,
    limits: Vec<(String, String)>,
    json_logs: bool,
}

/// Small limits by default so that no test waits long; tests override what they exercise.
const DEFAULT_LIMITS: &[(&str, &str)] = &[
    ("request_head_timeout", "\"5s\""),
    ("body_timeout", "\"5s\""),
    ("idle_timeout", "\"10s\""),
    ("upstream_timeout", "\"5s\""),
    ("drain_timeout", "\"5s\""),
];

fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

impl ProxyBuilder {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            identity: None,
            watch_interval: None,
            listeners: Vec::new(),
            limits: Vec::new(),
            json_logs: false,
        }
    }

    /// Static identity files: trust bundle, certificate, key.
    pub(crate) fn identity(mut self, trust: &Path, cert: &Path, key: &Path) -> Self {
        self.identity = Some((trust.to_owned(), cert.to_owned(), key.to_owned()));
        self
    }

    pub(crate) fn watch_interval(mut self, d: &str) -> Self {
        self.watch_interval = Some(d.to_owned());
        self
    }

    /// A listener on a free 127.0.0.1 port forwarding to `upstream` (`unix:/path`).
    pub(crate) fn listener(mut self, name: &str, tls: Tls, upstream: &str) -> Self {
        self.listeners.push(ListenerSpec {
            name: name.to_owned(),
            tls,
            allow: Vec::new(),
            upstream: upstream.to_owned(),
            jsonrpc: false,
        });
        self
    }

    /// `allow` rules of the last listener added.
    pub(crate) fn allow(mut self, rules: &[&str]) -> Self {
        let l = self.listeners.last_mut().expect("add a listener first");
        l.allow = rules.iter().map(|r| (*r).to_owned()).collect();
        self
    }

    /// `jsonrpc = true` on the last listener added.
    pub(crate) fn jsonrpc(mut self) -> Self {
        self.listeners
            .last_mut()
            .expect("add a listener first")
            .jsonrpc = true;
        self
    }

    /// A `[limits]` key with a raw TOML value: `.limit("max_connections", "2")`.
    pub(crate) fn limit(mut self, key: &str, toml_value: &str) -> Self {
        self.limits.retain(|(k, _)| k != key);
        self.limits.push((key.to_owned(), toml_value.to_owned()));
        self
    }

    /// A duration limit: `.limit_dur("idle_timeout", "1s")`.
    pub(crate) fn limit_dur(self, key: &str, d: &str) -> Self {
        let v = toml_str(d);
        self.limit(key, &v)
    }

    pub(crate) fn json_logs(mut self) -> Self {
        self.json_logs = true;
        self
    }

    /// The config text with the given ports.
    fn render(&self, admin: u16, ports: &HashMap<String, u16>) -> String {
        let mut o = String::new();
        if let Some((trust, cert, key)) = &self.identity {
            o.push_str("[identity]\n");
            o.push_str(&format!(
                "trust = {}\n",
                toml_str(&trust.display().to_string())
            ));
            o.push_str(&format!(
                "cert = {}\n",
                toml_str(&cert.display().to_string())
            ));
            o.push_str(&format!("key = {}\n", toml_str(&key.display().to_string())));
            if let Some(w) = &self.watch_interval {
                o.push_str(&format!("watch_interval = {}\n", toml_str(w)));
            }
        }
        o.push_str(&format!("\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n"));
        o.push_str("\n[limits]\n");
        let mut limits: Vec<(String, String)> = DEFAULT_LIMITS
            .iter()
            .filter(|(k, _)| !self.limits.iter().any(|(mine, _)| mine == k))
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        limits.extend(self.limits.iter().cloned());
        for (k, v) in &limits {
            o.push_str(&format!("{k} = {v}\n"));
        }
        for l in &self.listeners {
            o.push_str("\n[[listeners]]\n");
            o.push_str(&format!("name = {}\n", toml_str(&l.name)));
            o.push_str(&format!("listen = \"127.0.0.1:{}\"\n", ports[&l.name]));
            o.push_str(&format!("tls = \"{}\"\n", l.tls.as_str()));
            if l.jsonrpc {
                o.push_str("jsonrpc = true\n");
            }
            if !l.allow.is_empty() {
                let rules: Vec<String> = l.allow.iter().map(|r| toml_str(r)).collect();
                o.push_str(&format!("allow = [{}]\n", rules.join(", ")));
            }
            o.push_str(&format!("upstream = {}\n", toml_str(&l.upstream)));
        }
        o
    }

    /// Writes the config (as `proxy.toml`) with fresh ports and returns its path.
    pub(crate) fn write_config(&self) -> (PathBuf, u16, HashMap<String, u16>) {
        let admin = super::free_port();
        let ports: HashMap<String, u16> = self
            .listeners
            .iter()
            .map(|l| (l.name.clone(), super::free_port()))
            .collect();
        let path = self.dir.join("proxy.toml");
        std::fs::write(&path, self.render(admin, &ports)).expect("write config");
        (path, admin, ports)
    }

    /// Starts the proxy and waits only until `/healthz` answers 200 (for proxies that are
    /// expected not to be ready).
    pub(crate) fn start_unready(&self) -> Proxy {
        let (config, admin, ports) = self.write_config();
        let mut proxy = Proxy::spawn(&config, admin, ports, self.json_logs, None);
        let up = poll_until(Duration::from_secs(10), || {
            if proxy.try_exit().is_some() {
                return Some(false);
            }
            proxy
                .admin_get("/healthz")
                .ok()
                .filter(|r| r.status == 200)
                .map(|_| true)
        });
        assert_eq!(up, Some(true), "proxy did not start: {:?}", proxy.logs());
        proxy
    }

    /// Starts the proxy and waits until `/readyz` answers 200 (see [`start_ready`]).
    pub(crate) fn start(&self) -> Proxy {
        start_ready(Duration::from_secs(10), || {
            let (config, admin, ports) = self.write_config();
            Proxy::spawn(&config, admin, ports, self.json_logs, None)
        })
    }
}

/// A running proxy process (started by [`ProxyBuilder`], or from a config the test wrote).
pub(crate) struct Proxy {
    child: Child,
    /// Named in messages, when a test runs several.
    name: Option<String>,
    pub config: PathBuf,
    pub admin: SocketAddr,
    ports: HashMap<String, u16>,
    logs: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    exit: Option<ExitStatus>,
}

impl Proxy {
    /// Starts `ironic-proxy run` on `config` (JSON logs if `json`) without waiting for anything;
    /// its admin listener is on `127.0.0.1:admin`, its listeners' ports are `ports`.
    pub(crate) fn spawn(
        config: &Path,
        admin: u16,
        ports: HashMap<String, u16>,
        json: bool,
        name: Option<&str>,
    ) -> Self {
        Self::spawn_env(config, admin, ports, json, name, &[])
    }

    /// [`Proxy::spawn`] with `env` added to its environment.
    pub(crate) fn spawn_env(
        config: &Path,
        admin: u16,
        ports: HashMap<String, u16>,
        json: bool,
        name: Option<&str>,
        env: &[(&str, &str)],
    ) -> Self {
        let mut cmd = Command::new(proxy_bin());
        if json {
            cmd.args(["--log-format", "json"]);
        }
        cmd.arg("run")
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .env_remove("IRONIC_PROXY_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .envs(env.iter().copied());
        let mut child = cmd.spawn().expect("spawn ironic-proxy");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                match line {
                    Ok(l) => sink.lock().expect("logs").push(l),
                    Err(_) => break,
                }
            }
        });
        Self {
            child,
            name: name.map(str::to_owned),
            config: config.to_owned(),
            admin: SocketAddr::from(([127, 0, 0, 1], admin)),
            ports,
            logs,
            reader: Some(reader),
            exit: None,
        }
    }

    /// Waits until `/readyz` answers 200; else returns why (exit or timeout) and the logs.
    pub(crate) fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit() {
                // Its last log lines: the reader ends at the end of the exited process's stderr.
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return Err(format!("exited with {status}\n{}", self.logs().join("\n")));
            }
            if self.admin_get("/readyz").is_ok_and(|r| r.status == 200) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("timeout\n{}", self.logs().join("\n")));
            }
            // Poll interval: nothing announces readiness but /readyz itself.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The listener's address.
    pub(crate) fn addr(&self, listener: &str) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port(listener)))
    }

    pub(crate) fn port(&self, listener: &str) -> u16 {
        *self
            .ports
            .get(listener)
            .unwrap_or_else(|| panic!("no listener {listener}"))
    }

    /// `https://127.0.0.1:<port><path>` (or `http://` for `none` listeners: pass `scheme`).
    pub(crate) fn url(&self, listener: &str, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port(listener))
    }

    pub(crate) fn http_url(&self, listener: &str, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port(listener))
    }

    /// GET on the admin listener.
    pub(crate) fn admin_get(&self, path: &str) -> std::io::Result<Response> {
        let mut c = HttpConn::tcp(self.admin)?;
        c.send(
            format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes(),
        )?;
        c.read_response()
    }

    /// The `/metrics` text.
    pub(crate) fn metrics(&self) -> String {
        let r = self.admin_get("/metrics").expect("GET /metrics");
        assert_eq!(r.status, 200, "/metrics status");
        r.text()
    }

    /// One metric (summed over series matching `labels`); 0 when absent.
    pub(crate) fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        super::metric(&self.metrics(), name, labels).unwrap_or(0.0)
    }

    /// Polls until `metric(name, labels)` satisfies `pred`; returns the value, or panics naming
    /// the proxy, the metric and its last value.
    pub(crate) fn wait_metric(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        timeout: Duration,
        pred: impl Fn(f64) -> bool,
    ) -> f64 {
        poll_until(timeout, || {
            let v = self.metric(name, labels);
            pred(v).then_some(v)
        })
        .unwrap_or_else(|| {
            panic!(
                "{}: {name}{labels:?} never satisfied the condition within {timeout:?} (now {})\n{}",
                self.name.as_deref().unwrap_or("proxy"),
                self.metric(name, labels),
                self.metrics()
            )
        })
    }

    /// Every stderr line so far.
    pub(crate) fn logs(&self) -> Vec<String> {
        self.logs.lock().expect("logs").clone()
    }

    /// Waits until a log line satisfies `pred`; returns it.
    pub(crate) fn wait_log(
        &self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<String> {
        poll_until(timeout, || self.logs().into_iter().find(|l| pred(l)))
    }

    /// Access-log lines (target `access`).
    pub(crate) fn access_logs(&self) -> Vec<String> {
        self.logs()
            .into_iter()
            .filter(|l| l.contains(" access:") || l.contains("\"target\":\"access\""))
            .collect()
    }

    /// Waits until there are at least `n` access-log lines; returns them all.
    pub(crate) fn wait_access_logs(&self, n: usize, timeout: Duration) -> Vec<String> {
        poll_until(timeout, || {
            let l = self.access_logs();
            (l.len() >= n).then_some(l)
        })
        .unwrap_or_else(|| panic!("expected {n} access-log lines: {:#?}", self.logs()))
    }

    /// Sends a signal (`TERM`, `HUP`, ...) to the proxy's PID.
    pub(crate) fn signal(&self, sig: &str) {
        let out = run(
            Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(self.pid().to_string()),
            b"",
        );
        assert!(out.ok(), "kill -{sig} {}: {}", self.pid(), out.stderr);
    }

    fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Waits up to `timeout` for the process to exit by itself (and its last log lines).
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_exit() {
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            // Poll interval: a child's exit can only be polled (try_wait) without blocking.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the process (SIGKILL to this child's PID only) unless it has exited.
    pub(crate) fn kill(&mut self) {
        if self.try_exit().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// ` NAME` when the proxy has a name, for messages.
    fn named(&self) -> String {
        self.name
            .as_ref()
            .map_or(String::new(), |n| format!(" {n}"))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- ironic-proxy{} logs (pid {}) ---\n{}",
                self.named(),
                self.child.id(),
                self.logs().join("\n")
            );
        }
    }
}

/// Spawns a proxy with `spawn` until it is ready within `timeout`. A port taken between picking
/// and binding (a small race with other processes) is retried with new ports, three times; any
/// other failure panics with the config and the logs.
pub(crate) fn start_ready<P: AsMut<Proxy>>(timeout: Duration, mut spawn: impl FnMut() -> P) -> P {
    let mut last = String::new();
    let mut named = String::new();
    for _ in 0..3 {
        let mut p = spawn();
        let proxy = p.as_mut();
        named = proxy.named();
        match proxy.wait_ready(timeout) {
            Ok(()) => return p,
            Err(logs) if logs.contains("Address already in use") => last = logs,
            Err(logs) => panic!(
                "proxy{named} did not become ready\n--- config ---\n{}\n--- logs ---\n{logs}",
                std::fs::read_to_string(&proxy.config).unwrap_or_default()
            ),
        }
    }
    panic!("proxy{named} could not bind its ports three times:\n{last}");
}

impl AsMut<Self> for Proxy {
    fn as_mut(&mut self) -> &mut Self {
        self
    }
}

/// Runs `ironic-proxy <args>` to completion (for `check` and start-up failures); fails the
/// test if it is still running after 10 seconds.
pub(crate) fn command(args: &[&str], env: &[(&str, &str)], unset: &[&str]) -> Output {
    let mut cmd = Command::new(proxy_bin());
    cmd.args(args).env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    for k in unset {
        cmd.env_remove(k);
    }
    super::run_timeout(&mut cmd, b"", Duration::from_secs(10))
}
