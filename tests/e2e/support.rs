//! A cluster for one test: a stand-in API server on an ephemeral port, its kubeconfig, and
//! the nodus processes started against it, all stopped when the test ends.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use nodus_testbed::apiserver::{self, ApiServerConfig, ServerHandle, Store};
use nodus_testbed::control_plane::{ControlPlane, ControlPlaneConfig, Relay};
use nodus_testbed::netns::Netns;
use nodus_testbed::probe::http_get;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

pub const NODUS: &str = env!("CARGO_BIN_EXE_nodus");
pub const EXAMPLE: &str = include_str!("../../deploy/examples/cluster.yaml");
pub const WAIT: Duration = Duration::from_secs(30);

pub struct Cluster {
    pub rt: tokio::runtime::Runtime,
    pub store: Store,
    server: Option<ServerHandle>,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    children: Vec<Child>,
}

impl Cluster {
    pub fn new(test: &str, yaml: &str) -> Cluster {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let store = Store::new(ApiServerConfig::default());
        store.load_yaml_str(yaml).expect("fixture loads");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .expect("bind");
        let server = rt
            .block_on(apiserver::serve(store.clone(), listener))
            .expect("serve");
        let dir = std::env::temp_dir().join(format!("nodus-e2e-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let kubeconfig = dir.join("kubeconfig");
        apiserver::write_kubeconfig(&kubeconfig, &server.url()).expect("kubeconfig");
        Cluster {
            addr: server.addr(),
            rt,
            store,
            server: Some(server),
            dir,
            kubeconfig,
            children: Vec::new(),
        }
    }

    /// `nodus <args> --kubeconfig <ours>`, logging to a file in the test's directory.
    pub fn nodus(&self, args: &[&str]) -> Command {
        let mut cmd = nodus_command(&self.kubeconfig, &self.dir, args);
        cmd.env("NODUS_ALLOW_HTTP_API", "true");
        cmd
    }

    pub fn spawn(&mut self, cmd: Command) -> &mut Child {
        spawn_logged(&mut self.children, &self.dir, cmd)
    }

    /// Starts `nodus run` for `node` and returns its HTTP address.
    pub fn run_agent(&mut self, node: &str) -> SocketAddr {
        self.run_agent_with_dns(node).0
    }

    /// Starts `nodus run` for `node` with DNS on an ephemeral port; returns the HTTP and
    /// DNS addresses.
    pub fn run_agent_with_dns(&mut self, node: &str) -> (SocketAddr, SocketAddr) {
        let dns = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        (self.run_agent_with_dns_on(node, dns), dns)
    }

    /// Starts `nodus run` for `node` with DNS on `dns`; returns the HTTP address.
    pub fn run_agent_with_dns_on(&mut self, node: &str, dns: SocketAddr) -> SocketAddr {
        let (args, http) = agent_args(&self.dir, self.children.len(), node, dns);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let cmd = self.nodus(&args);
        self.spawn(cmd);
        http
    }

    /// Also serves the API on `addr` inside namespace `ns`, for nodus processes in it (on
    /// its loopback) or in node namespaces on an underlay (on the underlay's address);
    /// returns a kubeconfig for that address.
    pub fn listen_in(&self, ns: &Netns, addr: SocketAddr) -> PathBuf {
        self.server
            .as_ref()
            .expect("the server runs")
            .listen_in(ns, addr)
            .expect("listening in the namespace");
        let kubeconfig = self.dir.join(format!("kubeconfig-{}", ns.name()));
        apiserver::write_kubeconfig(&kubeconfig, &format!("http://{addr}")).expect("kubeconfig");
        kubeconfig
    }

    /// Waits for a process started with [`Cluster::spawn`] to exit.
    pub fn wait_child(&mut self, pid: u32) -> std::process::ExitStatus {
        let child = self
            .children
            .iter_mut()
            .find(|c| c.id() == pid)
            .expect("a child of this cluster");
        child.wait().expect("wait")
    }

    pub fn restart_server(&mut self) {
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.shutdown());
        }
        let listener = self.rt.block_on(async {
            let deadline = Instant::now() + WAIT;
            loop {
                match tokio::net::TcpListener::bind(self.addr).await {
                    Ok(l) => break l,
                    Err(e) if Instant::now() > deadline => panic!("rebinding {}: {e}", self.addr),
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        self.server = Some(
            self.rt
                .block_on(apiserver::serve(self.store.clone(), listener))
                .expect("serve"),
        );
    }

    pub fn stop_server(&mut self) {
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.shutdown());
        }
    }

    /// Ends every open watch in the middle of an event, as a lost connection does.
    pub fn cut_watches_mid_object(&self) {
        if let Some(server) = &self.server {
            server.cut_watches_mid_object();
        }
    }

    pub fn drop_watches(&self) {
        if let Some(server) = &self.server {
            server.drop_watches();
        }
    }

    pub fn apply(&self, object: serde_json::Value) {
        self.store
            .apply_value(object)
            .expect("store accepts the object");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        stop_and_clean(&mut self.children, &self.dir);
    }
}

/// `nodus <args> --kubeconfig <kubeconfig>`, its state in `dir`.
fn nodus_command(kubeconfig: &Path, dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(NODUS);
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("NODUS_LOG", "info")
        .env("NODUS_STATE_DIR", dir.join("state"))
        .stdin(Stdio::null());
    cmd
}

/// Starts `cmd` with its stderr in `<dir>/nodus-<n>.log`, n counting `children`.
fn spawn_logged<'a>(children: &'a mut Vec<Child>, dir: &Path, mut cmd: Command) -> &'a mut Child {
    let log =
        std::fs::File::create(dir.join(format!("nodus-{}.log", children.len()))).expect("log file");
    let child = cmd.stderr(log).spawn().expect("nodus starts");
    children.push(child);
    children.last_mut().expect("just pushed")
}

/// The arguments of `nodus run` for `node` with DNS on `dns` and a config file of the
/// `index`th process in `dir`; and its HTTP address.
fn agent_args(dir: &Path, index: usize, node: &str, dns: SocketAddr) -> (Vec<String>, SocketAddr) {
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let config = dir.join(format!("config-{index}.yaml"));
    std::fs::write(&config, format!("dns:\n  listen: [\"{dns}\"]\n")).expect("config");
    let args = [
        "run",
        "--node-name",
        node,
        "--http-addr",
        &http.to_string(),
        "--config",
    ]
    .map(str::to_string)
    .into_iter()
    .chain([config.to_string_lossy().into_owned()])
    .collect();
    (args, http)
}

/// A real control plane for one test (`nodus_testbed::control_plane`): `deploy/base`'s
/// ServiceAccount, RBAC and admission policy applied as a user applies them, a fixture
/// loaded, and nodus processes started with the `nodus` ServiceAccount's token bound to
/// their node, reaching the API server through a relay that can cut their connections.
pub struct RealCluster {
    pub plane: ControlPlane,
    pub relay: Relay,
    pub dir: PathBuf,
    children: Vec<Child>,
}

impl RealCluster {
    pub fn new(test: &str, yaml: &str) -> RealCluster {
        let dir = std::env::temp_dir().join(format!("nodus-e2e-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        // A directory of its own, which it removes after it stops.
        let plane_dir = dir.with_extension("control-plane");
        let plane = ControlPlane::start(&plane_dir, &ControlPlaneConfig::default())
            .expect("the control plane starts");
        plane.apply_deploy_base().expect("deploy/base applies");
        plane.apply_yaml(yaml).expect("the fixture applies");
        let relay = Relay::on_loopback(plane.api_addr()).expect("relay");
        RealCluster {
            plane,
            relay,
            dir,
            children: Vec::new(),
        }
    }

    /// `nodus <args>` on `node`, with the token its DaemonSet pod would have, through the
    /// relay.
    pub fn nodus(&self, node: &str, args: &[&str]) -> Command {
        let kubeconfig = self
            .plane
            .nodus_kubeconfig(node, &format!("https://{}", self.relay.addr))
            .expect("a token for nodus");
        nodus_command(&kubeconfig, &self.dir, args)
    }

    /// Starts `nodus run` for `node` with DNS on an ephemeral port; returns the HTTP and
    /// DNS addresses.
    pub fn run_agent_with_dns(&mut self, node: &str) -> (SocketAddr, SocketAddr) {
        let dns = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        let (args, http) = agent_args(&self.dir, self.children.len(), node, dns);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let cmd = self.nodus(node, &args);
        spawn_logged(&mut self.children, &self.dir, cmd);
        (http, dns)
    }

    /// The log of the `index`th nodus process started.
    pub fn log(&self, index: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("nodus-{index}.log"))).unwrap_or_default()
    }

    pub fn apply(&self, object: serde_json::Value) {
        self.plane
            .apply(&[object])
            .expect("the API server accepts the object");
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        stop_and_clean(&mut self.children, &self.dir);
    }
}

/// Kills a test's nodus processes, and removes its directory unless the test failed.
fn stop_and_clean(children: &mut [Child], dir: &Path) {
    for child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
    if std::thread::panicking() {
        eprintln!("logs kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

pub fn free_port() -> u16 {
    nodus_testbed::bench::free_port().expect("free port")
}

/// Polls `check` until it returns `Some`, or panics after [`WAIT`] naming `what`.
pub fn wait_for<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    wait_within(what, WAIT, check)
}

/// [`wait_for`] with a bound of its own.
pub fn wait_within<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn get(http: SocketAddr, path: &str) -> Option<(u16, String)> {
    http_get(http, path, Duration::from_secs(2)).ok()
}

/// A metric's value from a Prometheus text body.
pub fn metric(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
}

pub fn wait_ready(http: SocketAddr) {
    wait_for("/readyz to answer 200", || {
        get(http, "/readyz").filter(|(code, _)| *code == 200)
    });
}

/// [`wait_ready`] for an agent inside `ns`, whose HTTP address is on the namespace's
/// loopback.
pub fn wait_ready_in(ns: &Netns, http: SocketAddr) {
    wait_for("readiness inside the namespace", || {
        ns.enter(|| http_get(http, "/readyz", Duration::from_secs(2)))
            .ok()
            .and_then(Result::ok)
            .filter(|(code, _)| *code == 200)
    });
}

pub fn wait_metric(http: SocketAddr, series: &str, expected: f64) {
    wait_for(&format!("{series} == {expected}"), || {
        get(http, "/metrics")
            .and_then(|(_, body)| metric(&body, series))
            .filter(|v| *v == expected)
    });
}

/// Reads JSON lines from a child's stdout on a thread, so that reads can time out.
pub struct Lines(Receiver<String>);

impl Lines {
    pub fn new(stdout: ChildStdout) -> Lines {
        Lines(line_reader(stdout))
    }

    /// The next line whose `kind`/`namespace`/`name` match.
    pub fn next_for(&self, kind: &str, name: &str) -> serde_json::Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .0
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no line for {kind} {name}"));
            let line: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            let full = match line["namespace"].as_str() {
                Some(ns) => format!("{ns}/{}", line["name"].as_str().unwrap_or_default()),
                None => line["name"].as_str().unwrap_or_default().to_string(),
            };
            if line["kind"] == kind && full == name {
                return line;
            }
        }
    }
}

/// The lines left in `lines`, until its child's output closes (or stays quiet for 2 s).
pub fn collect_lines(lines: &Receiver<String>) -> String {
    let mut printed = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(2)) {
        printed.push(line);
    }
    printed.join("\n")
}

/// The lines a child prints on `stdout`, read on their own thread, so that waiting for
/// one can time out.
pub fn line_reader(stdout: ChildStdout) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// A child process killed when the test ends, even when it fails.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `nodus sandbox` running a cluster (the built-in example, or `load`), up until dropped,
/// when it gets SIGINT and tears everything down.
pub struct Sandbox {
    child: Child,
    /// Its stdin, for commands (`restart`), and the lines it prints after starting.
    commands: ChildStdin,
    lines: Receiver<String>,
    pub dir: PathBuf,
    /// Whether the directory is this handle's, removed when it drops.
    owns_dir: bool,
    /// What it printed up to its "Ctrl-C" line.
    pub printed: String,
    /// `namespaces.json`: `underlay`, `nodes.<name>`, `pods.<name>`, and
    /// `meshInterfaces.<node>`.
    pub namespaces: serde_json::Value,
}

/// `nodus sandbox --dir dir` on a free API port, its stdin and stdout piped, in a process
/// group of its own (as a shell's job is, so that a test can signal the group as Ctrl-C
/// does).
pub fn spawn_sandbox(dir: &Path, load: Option<&str>, extra: &[&OsStr]) -> Child {
    nodus_testbed::netns::require_root();
    let mut command = Command::new(NODUS);
    command
        .args(["sandbox", "--api-port", &free_port().to_string()])
        .arg("--dir")
        .arg(dir);
    if let Some(yaml) = load {
        let file = dir.with_extension("yaml");
        std::fs::write(&file, yaml).expect("cluster file");
        command.arg("--load").arg(file);
    }
    command
        .args(extra)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.with_extension("stderr")).expect("stderr file"))
        .spawn()
        .expect("sandbox starts")
}

impl Sandbox {
    pub fn start(test: &str, load: Option<&str>) -> Sandbox {
        Sandbox::start_with(test, load, &[])
    }

    /// With more `nodus sandbox` arguments, such as `--agent-binary`, in a directory of
    /// its own.
    pub fn start_with(test: &str, load: Option<&str>, extra: &[&OsStr]) -> Sandbox {
        let dir = std::env::temp_dir().join(format!("nodus-e2e-{test}-{}", std::process::id()));
        let mut sandbox = Sandbox::start_in(&dir, load, extra);
        sandbox.owns_dir = true;
        sandbox
    }

    /// In `dir`, which outlives the sandbox (the next one may start in it).
    pub fn start_in(dir: &Path, load: Option<&str>, extra: &[&OsStr]) -> Sandbox {
        let mut child = spawn_sandbox(dir, load, extra);
        let commands = child.stdin.take().expect("stdin");
        let rx = line_reader(child.stdout.take().expect("stdout"));
        let mut printed = Vec::new();
        while !printed.iter().any(|l: &String| l.starts_with("Ctrl-C")) {
            // Start-up prints nothing until the nodes are up (about 0.5 s here alone, longer
            // beside the other sandboxes of the suite; its own waits give up after 60 s).
            match rx.recv_timeout(WAIT * 5) {
                Ok(line) => printed.push(line),
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let stderr = std::fs::read_to_string(dir.with_extension("stderr"));
                    let logs: Vec<String> = ["node-1", "node-2", "node-3"]
                        .iter()
                        .map(|node| {
                            let log = std::fs::read_to_string(dir.join(format!("{node}.log")))
                                .unwrap_or_default();
                            let tail: Vec<&str> = log.lines().rev().take(15).collect();
                            format!(
                                "--- {node}.log (last lines, newest first):\n{}",
                                tail.join("\n")
                            )
                        })
                        .collect();
                    panic!(
                        "the sandbox did not come up:\n{}\n--- stderr:\n{}\n{}",
                        printed.join("\n"),
                        stderr.unwrap_or_default(),
                        logs.join("\n")
                    );
                }
            }
        }
        let namespaces = std::fs::read_to_string(dir.join("namespaces.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        Sandbox {
            child,
            commands,
            lines: rx,
            dir: dir.to_path_buf(),
            owns_dir: false,
            printed: printed.join("\n"),
            namespaces,
        }
    }

    /// The namespace of a node or pod (`kind` is `nodes` or `pods`).
    pub fn ns(&self, kind: &str, name: &str) -> String {
        self.namespaces[kind][name]
            .as_str()
            .unwrap_or_else(|| panic!("no {kind} {name} in {}", self.namespaces))
            .to_string()
    }

    /// Stops the sandbox with SIGINT, as Ctrl-C does, and returns its exit status.
    pub fn interrupt(&mut self) -> std::process::ExitStatus {
        // SAFETY: signalling a child we own.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait().expect("sandbox exits")
    }

    /// Ends the sandbox with SIGKILL: it can remove nothing.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The lines it printed after its "Ctrl-C" line, once it has exited.
    pub fn printed_at_exit(&self) -> String {
        collect_lines(&self.lines)
    }

    /// Restarts `node`'s nodus as a rollout does (SIGTERM, then the same command line),
    /// with `binary`; returns the sandbox's report of it.
    pub fn restart_agent(&mut self, node: &str, binary: &Path) -> String {
        writeln!(self.commands, "restart {node} {}", binary.display()).expect("sandbox stdin");
        let report = self
            .lines
            .recv_timeout(WAIT)
            .expect("the sandbox reports the restart");
        assert!(
            report.starts_with(&format!("restarted {node}:")),
            "{report}"
        );
        report
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.interrupt();
        }
        if self.owns_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
            let _ = std::fs::remove_file(self.dir.with_extension("yaml"));
            let _ = std::fs::remove_file(self.dir.with_extension("stderr"));
        }
    }
}
