//! What the benchmarks share: a generated cluster served by the API-server stand-in, and a
//! real `nodus run` process against it.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use crate::apiserver::{self, ApiServerConfig, ServerHandle, Store};
use crate::netns::Netns;
use crate::probe::http_get;
use anyhow::{Context, bail};
use serde_json::Value;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A loopback port free for both TCP and UDP, for a child process to bind.
///
/// Ports come from below the kernel's ephemeral range (32768 and up), so no outgoing
/// connection or `bind(0)` can take one between this check and the child's bind; a counter
/// shared by the process, started at an offset from its pid, keeps tests that run at the same
/// time from choosing the same port.
pub fn free_port() -> anyhow::Result<u16> {
    use std::sync::atomic::{AtomicU16, Ordering};
    const FIRST: u16 = 20_000;
    const SPAN: u16 = 12_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let offset = (std::process::id() % u32::from(SPAN / 8)) as u16 * 8;
    for _ in 0..SPAN {
        let port = FIRST + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        let addr = (Ipv4Addr::LOCALHOST, port);
        if std::net::TcpListener::bind(addr).is_ok() && std::net::UdpSocket::bind(addr).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port between {FIRST} and {}", FIRST + SPAN)
}

/// The stand-in, loaded and serving on loopback, with a kubeconfig for it.
pub struct BenchCluster {
    pub store: Store,
    server: Option<ServerHandle>,
    rt: tokio::runtime::Runtime,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
}

impl BenchCluster {
    /// `history` bounds the stand-in's event log: it must hold every write a bench makes
    /// while nodus watches.
    pub fn new(
        history: usize,
        objects: impl IntoIterator<Item = Value>,
    ) -> anyhow::Result<BenchCluster> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let store = Store::new(ApiServerConfig {
            history,
            ..ApiServerConfig::default()
        });
        for object in objects {
            store.apply_value(object)?;
        }
        let listener = rt.block_on(tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))?;
        let server = rt.block_on(apiserver::serve(store.clone(), listener))?;
        let dir = std::env::temp_dir().join(format!(
            "nodus-bench-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = dir.join("kubeconfig");
        apiserver::write_kubeconfig(&kubeconfig, &server.url())?;
        Ok(BenchCluster {
            store,
            server: Some(server),
            rt,
            dir,
            kubeconfig,
        })
    }

    /// Also serves the API on `addr` inside `ns`; returns a kubeconfig for that address.
    pub fn listen_in(&self, ns: &Netns, addr: SocketAddr) -> anyhow::Result<PathBuf> {
        self.server
            .as_ref()
            .context("the server is stopped")?
            .listen_in(ns, addr)?;
        let path = self.dir.join(format!("kubeconfig-{}", ns.name()));
        apiserver::write_kubeconfig(&path, &format!("http://{addr}"))?;
        Ok(path)
    }

    /// Starts `nodus run` as node `node` with the configuration `config` (YAML). Each agent
    /// has its own configuration and log file, named after its HTTP port.
    pub fn start_agent(&self, nodus: &Path, node: &str, config: &str) -> anyhow::Result<Agent> {
        self.start(Command::new(nodus), &self.kubeconfig, None, node, config)
    }

    /// As [`BenchCluster::start_agent`], inside `ns` (which gets its own API listener), so
    /// that the agent may program its kernel state.
    pub fn start_agent_in(
        &self,
        ns: Arc<Netns>,
        nodus: &Path,
        node: &str,
        config: &str,
    ) -> anyhow::Result<Agent> {
        let api = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let kubeconfig = self.listen_in(&ns, api)?;
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns.name()]).arg(nodus);
        self.start(command, &kubeconfig, Some(ns), node, config)
    }

    fn start(
        &self,
        mut command: Command,
        kubeconfig: &Path,
        ns: Option<Arc<Netns>>,
        node: &str,
        config: &str,
    ) -> anyhow::Result<Agent> {
        let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let config_path = self.dir.join(format!("config-{}.yaml", http.port()));
        std::fs::write(&config_path, config)?;
        let log = self.dir.join(format!("nodus-{}.log", http.port()));
        let child = command
            .args(["run", "--node-name", node, "--http-addr", &http.to_string()])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--config")
            .arg(&config_path)
            .env("NODUS_LOG", "warn")
            .env("NODUS_ALLOW_HTTP_API", "true")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {command:?}"))?;
        Ok(Agent {
            child,
            http,
            ns,
            started: Instant::now(),
            log,
        })
    }
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.shutdown());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running `nodus run`, stopped with SIGTERM when dropped.
pub struct Agent {
    child: Child,
    pub http: SocketAddr,
    /// Where `http` is, when not in this process's namespace.
    ns: Option<Arc<Netns>>,
    started: Instant,
    log: PathBuf,
}

impl Agent {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for `/readyz`; returns the time since the process started.
    pub fn wait_ready(&self, limit: Duration) -> anyhow::Result<Duration> {
        loop {
            if self.get("/readyz").is_ok_and(|(code, _)| code == 200) {
                return Ok(self.started.elapsed());
            }
            if self.started.elapsed() > limit {
                bail!(
                    "nodus not ready after {limit:?}; see {}",
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let get = || http_get(self.http, path, Duration::from_secs(5));
        match &self.ns {
            Some(ns) => ns.enter(get)?,
            None => get(),
        }
    }

    /// One series of `/metrics`, e.g. `nodus_view_objects{kind="endpoint"}`.
    pub fn metric(&self, series: &str) -> anyhow::Result<f64> {
        let (_, body) = self.get("/metrics")?;
        body.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no {series} in /metrics"))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: signalling a child we own; at worst it has already exited.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
