//! What the benchmarks share: a generated cluster served by the API-server stand-in, and a
//! real `nodus run` process against it.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use crate::apiserver::{self, ApiServerConfig, ServerHandle, Store};
use crate::netns::Netns;
use crate::probe::http_get;
use crate::scale::{self, Shape};
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
    /// Ends every watch the stand-in serves; with the history compacted first, the agent's
    /// next watch gets `410 Gone` and relists.
    pub fn drop_watches(&self) {
        if let Some(server) = &self.server {
            server.drop_watches();
        }
    }

    pub fn start_agent(&self, nodus: &Path, node: &str, config: &str) -> anyhow::Result<Agent> {
        let state = self.dir.join("state");
        spawn_agent(
            Command::new(nodus),
            &self.dir,
            &self.kubeconfig,
            None,
            node,
            config,
            &state,
        )
    }

    /// Writes `count` EndpointSlice updates (moving endpoints of services in turn), then
    /// one that adds an endpoint: once nodus counts it, every update before it is in.
    pub fn churn_slices(&self, shape: &Shape, count: usize) -> anyhow::Result<()> {
        for k in 0..count {
            let i = k % shape.services;
            self.store
                .apply_value(scale::slice(i, shape, k / shape.services + 1))?;
        }
        let marker = Shape {
            endpoints_per_service: 1,
            ..*shape
        };
        self.store
            .apply_value(scale::slice(shape.services, &marker, 0))?;
        Ok(())
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
        self.start_in(ns, nodus, node, config, &self.dir.join("state"))
    }

    /// As [`BenchCluster::start_agent_in`], with a state directory of its own: beside
    /// another agent of the same node, it neither takes that one's sockets over nor
    /// restores its view.
    pub fn start_agent_in_alone(
        &self,
        ns: Arc<Netns>,
        nodus: &Path,
        node: &str,
        config: &str,
    ) -> anyhow::Result<Agent> {
        let state = self.dir.join(format!("state-{}", free_port()?));
        self.start_in(ns, nodus, node, config, &state)
    }

    fn start_in(
        &self,
        ns: Arc<Netns>,
        nodus: &Path,
        node: &str,
        config: &str,
        state: &Path,
    ) -> anyhow::Result<Agent> {
        let api = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let kubeconfig = self.listen_in(&ns, api)?;
        let command = in_namespace(&ns, nodus);
        spawn_agent(
            command,
            &self.dir,
            &kubeconfig,
            Some(ns),
            node,
            config,
            state,
        )
    }
}

/// `nodus` run inside `ns`.
fn in_namespace(ns: &Netns, nodus: &Path) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns.name()]).arg(nodus);
    command
}

/// Starts `nodus run` inside `ns` as node `node` with `kubeconfig` and the configuration
/// `config` (YAML), its configuration and log in `dir`, named after its HTTP port.
pub fn start_agent_in_with(
    ns: Arc<Netns>,
    nodus: &Path,
    dir: &Path,
    kubeconfig: &Path,
    node: &str,
    config: &str,
) -> anyhow::Result<Agent> {
    spawn_agent(
        in_namespace(&ns, nodus),
        dir,
        kubeconfig,
        Some(ns),
        node,
        config,
        &dir.join("state"),
    )
}

fn spawn_agent(
    mut command: Command,
    dir: &Path,
    kubeconfig: &Path,
    ns: Option<Arc<Netns>>,
    node: &str,
    config: &str,
    state: &Path,
) -> anyhow::Result<Agent> {
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
    let config_path = dir.join(format!("config-{}.yaml", http.port()));
    std::fs::write(&config_path, config)?;
    let log = dir.join(format!("nodus-{}.log", http.port()));
    let child = command
        .args(["run", "--node-name", node, "--http-addr", &http.to_string()])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--config")
        .arg(&config_path)
        .env("NODUS_LOG", "warn")
        .env("NODUS_ALLOW_HTTP_API", "true")
        .env("NODUS_STATE_DIR", state)
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

/// Kernel memory charged to a memory cgroup of the bench's own while the ruleset is
/// programmed: what a pod's limit would pay for the table. Needs a cgroup v1 memory hierarchy with
/// kmem accounting (this machine's); elsewhere the system's unreclaimable slab is used,
/// which other activity on the machine disturbs.
pub struct KernelMemory {
    /// The cgroup the programming thread joins, when there is one.
    cgroup: Option<PathBuf>,
}

impl KernelMemory {
    /// A cgroup named for `purpose` and this process, under the bench's own.
    pub fn new(purpose: &str) -> KernelMemory {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let cgroup = own
            .lines()
            .find_map(|line| line.split_once(":memory:"))
            .map(|(_, path)| {
                PathBuf::from(format!(
                    "/sys/fs/cgroup/memory{}/nodus-{purpose}-{}",
                    path.trim_end_matches('/'),
                    std::process::id()
                ))
            })
            .filter(|dir| std::fs::create_dir_all(dir).is_ok())
            .filter(|dir| dir.join("memory.kmem.usage_in_bytes").exists());
        KernelMemory { cgroup }
    }

    pub fn method(&self) -> &'static str {
        match self.cgroup {
            Some(_) => "kernel memory charged to a memory cgroup of the bench's own",
            None => "system unreclaimable slab (noisy)",
        }
    }

    /// Moves the calling thread into the cgroup; the bytes counted from now on.
    pub fn join(&self) -> anyhow::Result<()> {
        if let Some(dir) = &self.cgroup {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            std::fs::write(dir.join("tasks"), tid.to_string())
                .with_context(|| format!("joining {}", dir.display()))?;
        }
        Ok(())
    }

    /// Moves process `pid` (and the children it starts later) into the cgroup.
    pub fn add_process(&self, pid: u32) -> anyhow::Result<()> {
        if let Some(dir) = &self.cgroup {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                .with_context(|| format!("moving {pid} into {}", dir.display()))?;
        }
        Ok(())
    }

    pub fn bytes(&self) -> anyhow::Result<u64> {
        match &self.cgroup {
            Some(dir) => Ok(
                std::fs::read_to_string(dir.join("memory.kmem.usage_in_bytes"))?
                    .trim()
                    .parse()?,
            ),
            None => {
                let meminfo = std::fs::read_to_string("/proc/meminfo")?;
                meminfo
                    .lines()
                    .find_map(|l| l.strip_prefix("SUnreclaim:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    .map(|kib| kib * 1024)
                    .context("no SUnreclaim in /proc/meminfo")
            }
        }
    }
}

impl Drop for KernelMemory {
    fn drop(&mut self) {
        // Charges left behind move to the parent; the directory goes once no task is in it.
        if let Some(dir) = &self.cgroup {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
