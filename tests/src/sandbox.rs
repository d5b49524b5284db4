//! `nodus sandbox`: a small simulated cluster on this machine.
//!
//! The API-server stand-in (or, with `--real-api`, a real control plane built from the
//! Kubernetes modules) serves an example cluster; every Node becomes a network
//! namespace on an underlay bridge running a real `nodus run` with the proxy, DNS and the
//! WireGuard mesh on; every pod named by an EndpointSlice becomes a namespace made by the
//! reference CNI plugins from the conflist its node's nodus wrote (at the EndpointSlice's
//! addresses), running the echo server. Pod traffic between nodes crosses the mesh.
//! Everything is removed on Ctrl-C (or SIGTERM), also during start-up; a start first removes
//! what a killed sandbox left in the same directory. Nothing touches the root namespace's
//! network.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use crate::apiserver::{self, ApiServerConfig, Store};
use crate::control_plane::{ControlPlane, ControlPlaneConfig, Relay};
use crate::netns::{self, Node, Pod, Underlay, unique_name};
use crate::probe::http_get;
use crate::runtime;
use anyhow::{Context, bail};
use clap::Args;
use nodus_view::model::Cidr;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The example cluster, built in so that the sandbox runs from any directory.
const EXAMPLE_CLUSTER: &str = include_str!("../../deploy/examples/cluster.yaml");
/// The replacement overlay's configuration, which every node runs with the sandbox's own
/// facts on top ([`node_config_text`]), and its `kube-dns` Service, which the cluster
/// gets.
const OVERLAY_CONFIG: &str = include_str!("../../deploy/overlays/replace/nodus.yaml");
const OVERLAY_KUBE_DNS: &str = include_str!("../../deploy/overlays/replace/kube-dns.yaml");
/// The underlay the example's Node addresses live on.
const UNDERLAY_V4: [u8; 3] = [172, 30, 0];
const UNDERLAY_V6: [u16; 4] = [0xfd00, 0x172, 0x30, 0];
/// Nodes take underlay addresses from here up; `.1` is the API server.
const FIRST_NODE_INDEX: u8 = 11;
const NODE_HTTP_PORT: u16 = 10256;
const API_PORT_ON_UNDERLAY: u16 = 6443;

#[derive(Args, Debug)]
pub struct SandboxArgs {
    /// YAML file or directory to serve instead of the built-in example cluster.
    #[arg(long)]
    pub load: Option<PathBuf>,
    /// Port of the API server on 127.0.0.1, for kubectl.
    #[arg(long, default_value_t = 6443)]
    pub api_port: u16,
    /// Directory for the kubeconfig and the nodes' logs.
    #[arg(long, default_value = "/tmp/nodus-sandbox")]
    pub dir: PathBuf,
    /// The binary the nodes run `nodus run` with (default: this one), for instance a
    /// previous version, to try an upgrade with `restart NODE BINARY`.
    #[arg(long)]
    pub agent_binary: Option<PathBuf>,
    /// Serve the cluster from a real control plane (etcd, kube-apiserver,
    /// kube-controller-manager, kube-scheduler, built by k8s/build.sh from the modules
    /// k8s/go.mod pins; the first build takes minutes) instead of the API-server stand-in.
    /// Each node's nodus uses deploy/base's ServiceAccount with a token bound to its node.
    #[arg(long)]
    pub real_api: bool,
}

#[derive(Args, Debug)]
pub struct EchoArgs {
    /// The name to answer with.
    #[arg(long)]
    pub name: String,
    /// Ports to serve, TCP and UDP, on every address.
    #[arg(long = "port", required = true)]
    pub ports: Vec<u16>,
}

/// Echo server: every UDP datagram and every TCP message gets the server's name back,
/// on one connection until the client closes its side (long-lived connections); a request
/// that looks like HTTP gets it as one HTTP response, so `curl` works too.
pub async fn echo(args: EchoArgs) -> anyhow::Result<()> {
    let name: &'static str = Box::leak(args.name.into_boxed_str());
    let mut tasks = tokio::task::JoinSet::new();
    for port in args.ports {
        let addr = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding TCP {addr}"))?;
        let udp = tokio::net::UdpSocket::bind(addr)
            .await
            .with_context(|| format!("binding UDP {addr}"))?;
        tasks.spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((_, from)) = udp.recv_from(&mut buf).await {
                let _ = udp.send_to(format!("{name}\n").as_bytes(), from).await;
            }
        });
        tasks.spawn(async move {
            while let Ok((mut stream, _)) = tcp.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    let request = &buf[..n];
                    if [&b"GET "[..], b"HEAD ", b"POST "].iter().any(|m| request.starts_with(m)) {
                        let reply = format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}\n", name.len() + 1);
                        let _ = stream.write_all(reply.as_bytes()).await;
                    } else {
                        let reply = format!("{name}\n");
                        let mut n = n;
                        while n > 0 && stream.write_all(reply.as_bytes()).await.is_ok() {
                            n = stream.read(&mut buf).await.unwrap_or(0);
                        }
                    }
                    let _ = stream.shutdown().await;
                });
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Where the sandbox keeps its state, one sandbox at a time: made private to root, locked
/// while a sandbox runs in it, and naming the sandbox's namespaces and devices
/// ([`netns::scope_for`]), so that a start finds what a killed sandbox left.
struct SandboxDir {
    path: PathBuf,
    scope: String,
    /// Held (flock) until the process ends, however it ends.
    _lock: std::fs::File,
}

impl SandboxDir {
    fn take(path: &Path) -> anyhow::Result<SandboxDir> {
        make_private_dir(path)?;
        let lock_path = path.join("sandbox.lock");
        let mut lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            bail!(
                "another nodus sandbox (pid {}) runs in {}: stop it first, or give this one \
                 another --dir (and --api-port)",
                holder.trim(),
                path.display()
            );
        }
        lock.set_len(0)?;
        write!(lock, "{}", std::process::id())?;
        Ok(SandboxDir {
            scope: netns::scope_for(path),
            path: path.to_path_buf(),
            _lock: lock,
        })
    }

    /// Removes what an earlier sandbox in this directory left because it was killed: its
    /// namespaces and every process still running in them (its nodes' nodus, wireguard-go
    /// and the pods' echo servers), its host-wide files, and the state of the nodes about
    /// to be built (key, conflist and `host-local` leases).
    fn clear_leftovers(&self, node_names: &[String]) -> anyhow::Result<()> {
        let namespaces = netns::remove_scope(&self.scope)?;
        if !namespaces.is_empty() {
            println!(
                "removed {} network namespaces a killed sandbox left in {}",
                namespaces.len(),
                self.path.display()
            );
        }
        self.host_state(node_names).remove();
        for name in node_names {
            remove_if_present(&self.path.join(name))?;
        }
        remove_if_present(&self.path.join("namespaces.json"))
    }

    fn host_state(&self, node_names: &[String]) -> HostState {
        HostState {
            scope: self.scope.clone(),
            leases: node_names
                .iter()
                .map(|n| self.path.join(n).join("ipam"))
                .collect(),
        }
    }
}

/// Creates `path` (mode 0700: it will hold the nodes' WireGuard keys), or makes an
/// existing directory of this user's private; a directory other users share, such as
/// `/tmp` itself, is refused.
fn make_private_dir(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let shown = path.display();
    match std::fs::symlink_metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(path)
                .with_context(|| format!("creating {shown}"))
        }
        Err(error) => Err(error).with_context(|| format!("reading {shown}")),
        Ok(meta) => {
            if !meta.is_dir() {
                bail!(
                    "{shown} is not a directory (a file or a symbolic link): choose another --dir"
                );
            }
            // SAFETY: geteuid has no preconditions and cannot fail.
            let me = unsafe { libc::geteuid() };
            if meta.uid() != me || meta.mode() & 0o1002 != 0 {
                bail!(
                    "{shown} is shared (owner uid {}, mode {:o}): the sandbox keeps private \
                     keys there; choose a directory of its own with --dir",
                    meta.uid(),
                    meta.mode() & 0o7777
                );
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("making {shown} private"))
        }
    }
}

fn remove_if_present(path: &Path) -> anyhow::Result<()> {
    let removed = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match removed {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(error).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// What the sandbox keeps outside its namespaces, removed when it ends however it ends (a
/// killed one's by the next start): the mesh devices' UAPI sockets (wireguard-go dies
/// with its namespace, but the socket directory is host-wide), the pods' resolv.conf
/// files under `/etc/netns`, both named in the sandbox's scope, and the nodes'
/// `host-local` leases, which would hold every pod address at the next start.
struct HostState {
    scope: String,
    leases: Vec<PathBuf>,
}

impl HostState {
    fn remove(&self) {
        for dir in ["/var/run/wireguard", "/etc/netns"] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&self.scope) {
                    let _ = remove_if_present(&entry.path());
                }
            }
        }
        for leases in &self.leases {
            let _ = remove_if_present(leases);
        }
    }
}

impl Drop for HostState {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The programs the sandbox needs, each with the Debian package that has it.
const PREREQUISITES: [(&str, &str); 2] = [("ip", "iproute2"), ("sysctl", "procps")];
/// The programs only its demonstrations run in the pods.
const DEMONSTRATION_TOOLS: [(&str, &str); 3] = [
    ("curl", "curl"),
    ("ping", "iputils-ping"),
    ("dig", "dnsutils"),
];
/// The package with the reference CNI plugins of the conflist the nodes write.
const CNI_PACKAGE: &str = "containernetworking-plugins";

/// Says which programs are missing, with the line that installs them, before anything is
/// built. WireGuard needs nothing: without a kernel module or `wireguard-go`, the nodes
/// use the embedded backend.
fn check_prerequisites() -> anyhow::Result<()> {
    let missing = |tools: &[(&str, &str)]| -> Vec<(String, String)> {
        tools
            .iter()
            .filter(|(program, _)| !on_path(program))
            .map(|(program, package)| (program.to_string(), package.to_string()))
            .collect()
    };
    let mut required = missing(&PREREQUISITES);
    for plugin in runtime::REFERENCE_PLUGINS {
        let path = Path::new(runtime::CNI_PATH).join(plugin);
        if !is_executable(&path) {
            required.push((path.display().to_string(), CNI_PACKAGE.to_string()));
        }
    }
    let install = |missing: &[(String, String)]| {
        let packages: BTreeSet<&str> = missing.iter().map(|(_, p)| p.as_str()).collect();
        let programs: Vec<&str> = missing.iter().map(|(p, _)| p.as_str()).collect();
        format!(
            "{} (apt-get install -y --no-install-recommends {})",
            programs.join(", "),
            packages.into_iter().collect::<Vec<_>>().join(" ")
        )
    };
    if !required.is_empty() {
        bail!("the sandbox needs {}", install(&required));
    }
    let optional = missing(&DEMONSTRATION_TOOLS);
    if !optional.is_empty() {
        println!(
            "warning: the demonstrations that use them will fail without {}",
            install(&optional)
        );
    }
    Ok(())
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| is_executable(&dir.join(program)))
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The signal that asked the sandbox to stop, caught from before the first step: start-up
/// checks it between steps, so that Ctrl-C at any moment tears down what was built.
#[derive(Clone)]
struct Stop(tokio::sync::watch::Receiver<Option<&'static str>>);

/// Start-up ended by a signal.
#[derive(Debug, thiserror::Error)]
#[error("{0} during start-up")]
struct Interrupted(&'static str);

impl Stop {
    fn install(rt: &tokio::runtime::Runtime) -> anyhow::Result<Stop> {
        use tokio::signal::unix::{SignalKind, signal};
        let (mut term, mut int) = rt.block_on(async {
            anyhow::Ok((
                signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
                signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            ))
        })?;
        let (caught, stop) = tokio::sync::watch::channel(None);
        rt.spawn(async move {
            let signal = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            let _ = caught.send(Some(signal));
        });
        Ok(Stop(stop))
    }

    fn signal(&self) -> Option<&'static str> {
        *self.0.borrow()
    }

    /// An [`Interrupted`] error once a signal came.
    fn check(&self) -> anyhow::Result<()> {
        match self.signal() {
            Some(signal) => {
                println!("{signal}: tearing down");
                Err(Interrupted(signal).into())
            }
            None => Ok(()),
        }
    }

    async fn wait(&mut self) -> &'static str {
        match self.0.wait_for(Option::is_some).await {
            Ok(signal) => signal.unwrap_or("signal"),
            // The watching task ended without a signal: only the runtime's end does that.
            Err(_) => std::future::pending().await,
        }
    }

    /// Sleeps for `duration`, then fails if a signal came meanwhile.
    fn sleep(&self, duration: Duration) -> anyhow::Result<()> {
        std::thread::sleep(duration);
        self.check()
    }
}

/// A pod the sandbox made, with its node and a port its echo server answers on.
struct SandboxPod {
    pod: Pod,
    node: String,
    port: Option<u16>,
}

/// A pod as the EndpointSlices describe it.
#[derive(Default)]
struct PodPlan {
    node: String,
    v4: Option<Ipv4Addr>,
    v6: Option<Ipv6Addr>,
    ports: BTreeSet<u16>,
}

fn parse_documents(yaml: &str) -> anyhow::Result<Vec<Value>> {
    let mut docs = Vec::new();
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(yaml).context("parsing the cluster YAML")?;
    for value in documents {
        match value.get("kind").and_then(Value::as_str) {
            None => {}
            Some("List") => docs.extend(value["items"].as_array().cloned().unwrap_or_default()),
            Some(_) => docs.push(value),
        }
    }
    Ok(docs)
}

fn read_cluster(load: Option<&Path>) -> anyhow::Result<Vec<Value>> {
    let Some(path) = load else {
        return parse_documents(EXAMPLE_CLUSTER);
    };
    let mut files = Vec::new();
    if path.is_dir() {
        for entry in
            std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))?
        {
            let file = entry?.path();
            if file.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(file);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        docs.extend(parse_documents(&text).with_context(|| format!("in {}", file.display()))?);
    }
    Ok(docs)
}

/// The pods to create, by name, from every endpoint that names a pod on a sandbox node.
fn plan_pods(docs: &[Value], nodes: &BTreeSet<String>) -> BTreeMap<String, PodPlan> {
    let mut pods: BTreeMap<String, PodPlan> = BTreeMap::new();
    for slice in docs.iter().filter(|d| d["kind"] == "EndpointSlice") {
        let ports: Vec<u16> = slice["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["port"].as_u64().and_then(|p| u16::try_from(p).ok()))
            .collect();
        for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
            let (Some(pod), Some(node)) = (
                endpoint["targetRef"]["name"].as_str(),
                endpoint["nodeName"].as_str(),
            ) else {
                continue;
            };
            if !nodes.contains(node) {
                continue;
            }
            let plan = pods.entry(pod.to_string()).or_default();
            plan.node = node.to_string();
            plan.ports.extend(&ports);
            match endpoint["addresses"][0]
                .as_str()
                .and_then(|a| a.parse::<IpAddr>().ok())
            {
                Some(IpAddr::V4(ip)) => plan.v4 = Some(ip),
                Some(IpAddr::V6(ip)) => plan.v6 = Some(ip),
                None => {}
            }
        }
    }
    pods
}

/// Node readiness and view size, read from the node's own HTTP endpoints.
fn node_status(node: &Node) -> (bool, BTreeMap<String, String>) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, NODE_HTTP_PORT));
    let timeout = Duration::from_secs(2);
    let probe = node.ns.enter(|| {
        let ready = http_get(addr, "/readyz", timeout).is_ok_and(|(code, _)| code == 200);
        let metrics = http_get(addr, "/metrics", timeout)
            .map(|(_, body)| body)
            .unwrap_or_default();
        (ready, metrics)
    });
    let Ok((ready, metrics)) = probe else {
        return (false, BTreeMap::new());
    };
    let mut objects: BTreeMap<String, String> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("nodus_view_objects{kind=\""))
        .filter_map(|l| l.split_once("\"} "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Some(peers) = metrics
        .lines()
        .find_map(|l| l.strip_prefix("nodus_mesh_peers "))
    {
        objects.insert("peer".into(), peers.trim().to_string());
    }
    (ready, objects)
}

/// The first address of the node pod CIDR holding `ip`: the gateway `host-local` gives
/// the pod (and the address of the node's WireGuard device).
fn pod_gateway(docs: &[Value], ip: IpAddr) -> Option<IpAddr> {
    docs.iter()
        .filter(|d| d["kind"] == "Node")
        .flat_map(pod_cidrs)
        .find(|c| c.contains(ip))
        .and_then(Cidr::first_host)
        .map(|c| c.addr)
}

/// The pod CIDRs of the Node `node`.
fn pod_cidrs(node: &Value) -> impl Iterator<Item = Cidr> + '_ {
    let cidrs = node["spec"]["podCIDRs"].as_array().into_iter().flatten();
    cidrs.filter_map(|c| c.as_str()?.parse::<Cidr>().ok())
}

/// The address of node `name`'s WireGuard device: the first of its IPv4 pod CIDR.
fn mesh_address(docs: &[Value], name: &str) -> Option<IpAddr> {
    let node = docs
        .iter()
        .find(|d| d["kind"] == "Node" && d["metadata"]["name"] == name)?;
    pod_cidrs(node)
        .find(|c| c.addr.is_ipv4())
        .and_then(Cidr::first_host)
        .map(|c| c.addr)
}

/// Whether every node reaches every other node's WireGuard address (a TCP connection to
/// its DNS port there): the first packet of each pair starts its key exchange, and the
/// connection stands once it is done.
fn mesh_reached(nodes: &[Node], docs: &[Value]) -> bool {
    let addresses: Vec<Option<IpAddr>> = nodes
        .iter()
        .map(|node| mesh_address(docs, &node.name))
        .collect();
    nodes.iter().enumerate().all(|(i, from)| {
        let others = addresses.iter().enumerate().filter(|(j, _)| *j != i);
        others.filter_map(|(_, to)| *to).all(|to| {
            let dns = SocketAddr::new(to, 53);
            let connect = || std::net::TcpStream::connect_timeout(&dns, Duration::from_secs(1));
            from.ns.enter(|| connect().is_ok()).unwrap_or(false)
        })
    })
}

/// The first of up to four tries that succeeds, or the last failure. A tunnel to a peer
/// is set up by the first packet: when the peer's own nodus has not added this node yet,
/// the handshake is ignored and WireGuard tries again five seconds later.
fn first_success<T>(mut attempt: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let mut result = attempt();
    for _ in 1..4 {
        if result.is_ok() {
            break;
        }
        result = attempt();
    }
    result
}

/// `ping` and `curl` from a pod on the first node to a pod on every other node, across
/// the WireGuard mesh.
fn demonstrate_mesh(pods: &[SandboxPod]) {
    let Some(from) = pods.first() else { return };
    let mut seen = BTreeSet::from([from.node.as_str()]);
    for to in pods.iter().filter(|p| seen.insert(p.node.as_str())) {
        let Some(ip) = to.pod.v4.map(IpAddr::V4).or(to.pod.v6.map(IpAddr::V6)) else {
            continue;
        };
        let ping = first_success(|| from.pod.ns.exec("ping", &["-c1", "-W2", &ip.to_string()]))
            .map(|out| {
                out.lines()
                    .find_map(|l| l.split("time=").nth(1))
                    .unwrap_or("?")
                    .to_string()
            });
        match ping {
            Ok(time) => println!(
                "ping across the mesh from pod {} ({}) to pod {} ({}) at {ip}: {time}",
                from.pod.name, from.node, to.pod.name, to.node
            ),
            Err(error) => println!(
                "ping across the mesh from pod {} to {ip} failed: {error:#}",
                from.pod.name
            ),
        }
        let Some(port) = to.port else { continue };
        let url = http_url(ip, port);
        let answer = first_success(|| from.pod.ns.exec("curl", &["-s", "-m", "3", &url]))
            .map(|out| out.trim().to_string());
        match answer {
            Ok(answer) => println!(
                "curl across the mesh from pod {}: {url} → {answer}",
                from.pod.name
            ),
            Err(error) => println!(
                "curl across the mesh from pod {}: {url} failed: {error:#}",
                from.pod.name
            ),
        }
    }
}

/// `http://host[:port]/`, the host in brackets for IPv6.
fn http_url(ip: IpAddr, port: u16) -> String {
    let host = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    if port == 80 {
        format!("http://{host}/")
    } else {
        format!("http://{host}:{port}/")
    }
}

/// What the proxy demonstration asks: the ClusterIPs (every family) of the cluster's first
/// NodePort service, and its NodePort on the last node. Taken from the loaded cluster, so
/// that a cluster without the example's services is not asked for them (each would wait
/// for curl's timeout).
fn proxy_targets(docs: &[Value], nodes: &[Node]) -> Vec<String> {
    let Some(spec) = docs
        .iter()
        .filter(|d| d["kind"] == "Service")
        .map(|d| &d["spec"])
        .find(|spec| spec["ports"][0]["nodePort"].is_u64())
    else {
        return Vec::new();
    };
    let port = |key: &str| {
        spec["ports"][0][key]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
    };
    let ips: Vec<IpAddr> = spec["clusterIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(std::iter::once(&spec["clusterIP"]))
        .filter_map(|ip| ip.as_str().and_then(|ip| ip.parse().ok()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut targets: Vec<String> = port("port")
        .map(|port| ips.iter().map(|ip| http_url(*ip, port)).collect())
        .unwrap_or_default();
    if let (Some(node_port), Some(other)) = (port("nodePort"), nodes.last()) {
        targets.push(http_url(IpAddr::V4(other.v4), node_port));
    }
    targets
}

/// `curl` from a pod to a ClusterIP and to a NodePort on another node.
fn demonstrate_proxy(pod: &Pod, targets: &[String]) {
    for url in targets {
        let answer = pod
            .ns
            .exec("curl", &["-s", "-m", "3", url])
            .map(|out| out.trim().to_string());
        match answer {
            Ok(answer) => println!("curl from pod {}: {url} → {answer}", pod.name),
            Err(error) => println!("curl from pod {}: {url} failed: {error:#}", pod.name),
        }
    }
}

/// `dig` from a pod to its node's DNS, through the pod's gateway.
fn demonstrate_dns(pod: &Pod, gateway: IpAddr, cluster_dns: Option<IpAddr>) {
    for (name, qtype) in [
        ("web.default.svc.cluster.local", "A"),
        ("_pg._tcp.db.shop.svc.cluster.local", "SRV"),
    ] {
        match dig(pod, gateway, name, qtype) {
            Ok(answer) => println!("dig from pod {}: {name} {qtype} → {answer}", pod.name),
            Err(error) => println!(
                "dig from pod {}: {name} {qtype} failed: {error:#}",
                pod.name
            ),
        }
    }
    // kubelet's `clusterDNS`: the kube-dns ClusterIP, which the proxy sends to this node's
    // own DNS (`dns.serve_cluster_dns_ip`).
    if let Some(cluster_dns) = cluster_dns {
        let name = "web.default.svc.cluster.local";
        match dig(pod, cluster_dns, name, "A") {
            Ok(answer) => println!(
                "dig from pod {} via the kube-dns ClusterIP {cluster_dns}: {name} A → {answer}",
                pod.name
            ),
            Err(error) => println!(
                "dig from pod {} via the kube-dns ClusterIP {cluster_dns} failed: {error:#}",
                pod.name
            ),
        }
    }
}

/// `dig +short` from a pod, the answer's records on one line.
fn dig(pod: &Pod, server: IpAddr, name: &str, qtype: &str) -> anyhow::Result<String> {
    let out = pod.ns.exec(
        "dig",
        &[
            &format!("@{server}"),
            "+short",
            "+time=2",
            "+tries=1",
            name,
            qtype,
        ],
    )?;
    Ok(out.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The resolv.conf kubelet would give a pod of namespace `default`, for `ip netns exec` in
/// the pod's namespace (which mounts `/etc/netns/<ns>/resolv.conf` over `/etc/resolv.conf`);
/// named in the sandbox's scope, so removed with its [`HostState`].
fn write_pod_resolv_conf(pod: &Pod, cluster_dns: IpAddr) -> anyhow::Result<()> {
    let dir = Path::new("/etc/netns").join(pod.ns.name());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("resolv.conf");
    std::fs::write(
        &path,
        format!(
            "nameserver {cluster_dns}\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
        ),
    )
    .with_context(|| format!("writing {}", path.display()))
}

/// `curl http://web/` from a pod, as an application would: the short name through the
/// search path (ndots:5), asked of the kube-dns ClusterIP, answered by the node's nodus,
/// and the connection through the proxy.
fn demonstrate_curl_by_name(pod: &Pod) {
    let url = "http://web/";
    match pod.ns.exec("curl", &["-s", "-m", "3", url]) {
        Ok(answer) => println!(
            "curl by name from pod {}: {url} → {}",
            pod.name,
            answer.trim()
        ),
        Err(error) => println!(
            "curl by name from pod {}: {url} failed: {error:#}",
            pod.name
        ),
    }
}

/// The ClusterIP of kube-system/kube-dns, if the cluster has that Service.
fn cluster_dns_ip(docs: &[Value]) -> Option<IpAddr> {
    docs.iter()
        .find(|d| is_kube_dns(d))
        .and_then(|d| d["spec"]["clusterIP"].as_str())
        .and_then(|ip| ip.parse().ok())
}

/// A node's `nodus run`: its process and the arguments a restart repeats.
struct Agent {
    pid: u32,
    args: Vec<String>,
    log: PathBuf,
}

impl Agent {
    /// Starts `binary` with the agent's arguments in the node's namespace, its output
    /// appended to the node's log.
    fn start(node: &Node, binary: &Path, args: Vec<String>, log: PathBuf) -> anyhow::Result<Agent> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut cmd = node.ns.command(&binary.to_string_lossy());
        // The sandbox's API stand-in speaks plain HTTP, on the underlay only. An
        // environment variable rather than the flag: `restart NODE BINARY` may start an
        // older nodus that has no such flag.
        cmd.args(&args)
            .env("NODUS_ALLOW_HTTP_API", "true")
            .stdout(file.try_clone()?)
            .stderr(file);
        let pid = node.ns.spawn(cmd)?;
        Ok(Agent { pid, args, log })
    }
}

/// A node's configuration: the replacement overlay's (`deploy/overlays/replace/nodus.yaml`)
/// with what differs in the sandbox on top: both families' pod ranges; the cluster DNS IP
/// answered by each node itself (no nodus pods back `kube-dns` here); no lame duck (no
/// load balancer or next pod waits on a sandbox node, and Ctrl-C should not); the mesh's
/// device (names are host-wide for wireguard-go), key and conflist, the isolation gate's
/// socket and the saved view, in the node's directory; Services' ExternalIPs honoured in
/// the documentation ranges (RFC 5737's TEST-NETs), which the sandbox's examples use; and
/// NetworkPolicies named in `/metrics` (one operator sees them all there).
pub fn node_config_text(node_dir: &Path, interface: &str) -> anyhow::Result<String> {
    let mut config: Value =
        serde_saphyr::from_str(OVERLAY_CONFIG).context("reading the overlay's nodus.yaml")?;
    let path = |relative: &str| Value::from(node_dir.join(relative).to_string_lossy());
    config["cluster_cidrs"] = json!(["10.244.0.0/16", "fd00:244::/32"]);
    config["lameduck_seconds"] = 0.into();
    config["dns"]["serve_cluster_dns_ip"] = true.into();
    config["mesh"]["interface"] = interface.into();
    config["mesh"]["key_file"] = path("key/wireguard.key");
    config["mesh"]["cni_conflist"] = path("net.d/10-nodus.conflist");
    config["mesh"]["cni_bin_dir"] = path("cni-bin");
    config["policy"]["cni_socket"] = path("cni.sock");
    config["state_dir"] = path("state");
    config["proxy"]["external_ips"] = json!(["192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"]);
    config["policy"]["metrics_names"] = true.into();
    Ok(serde_json::to_string_pretty(&config)?)
}

/// The overlay's `kube-dns` Service in place of the cluster's own, at the cluster's
/// cluster DNS IP when it has one (the overlay's kustomization sets it so).
fn with_overlay_kube_dns(docs: &mut Vec<Value>) -> anyhow::Result<()> {
    let mut kube_dns: Value =
        serde_saphyr::from_str(OVERLAY_KUBE_DNS).context("reading the overlay's kube-dns.yaml")?;
    if let Some(ip) = cluster_dns_ip(docs) {
        kube_dns["spec"]["clusterIP"] = ip.to_string().into();
    }
    docs.retain(|d| !is_kube_dns(d));
    docs.push(kube_dns);
    Ok(())
}

fn is_kube_dns(doc: &Value) -> bool {
    doc["kind"] == "Service"
        && doc["metadata"]["namespace"] == "kube-system"
        && doc["metadata"]["name"] == "kube-dns"
}

/// `restart NODE [BINARY]`, read from stdin: stops the node's nodus with SIGTERM, as a
/// DaemonSet rollout does, and starts BINARY (by default the one it ran) with the same
/// arguments. Returns the line to print.
fn restart(
    line: &str,
    nodes: &[Node],
    agents: &mut [Agent],
    default_binary: &Path,
) -> anyhow::Result<String> {
    let mut words = line.split_whitespace();
    let (Some("restart"), Some(name)) = (words.next(), words.next()) else {
        bail!("unknown command {line:?}; try `restart NODE [BINARY]`");
    };
    let binary = words.next().map_or(default_binary, Path::new);
    let i = nodes
        .iter()
        .position(|n| n.name == name)
        .with_context(|| format!("no node {name}"))?;
    let agent = &mut agents[i];
    let stopping = Instant::now();
    let status = nodes[i].ns.terminate(agent.pid)?;
    let stopped_in = stopping.elapsed();
    let args = std::mem::take(&mut agent.args);
    *agent = Agent::start(&nodes[i], binary, args, agent.log.clone())?;
    Ok(format!(
        "restarted {name}: {status} after SIGTERM in {stopped_in:.1?}; now pid {} running {}",
        agent.pid,
        binary.display()
    ))
}

/// Lines typed on stdin, read on their own thread; the channel closes at end of input.
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// `namespaces.json` in the sandbox directory: the network namespace of the underlay, of
/// every node and of every pod, for `ip netns exec` (and for the tests that drive
/// traffic through the sandbox).
fn write_namespaces(
    dir: &Path,
    underlay: &Underlay,
    nodes: &[Node],
    pods: &[SandboxPod],
    mesh_interfaces: &[String],
) -> anyhow::Result<()> {
    let names = |entries: Vec<(&str, &str)>| {
        entries
            .into_iter()
            .map(|(name, ns)| (name.to_string(), json!(ns)))
            .collect::<serde_json::Map<_, _>>()
    };
    let map = json!({
        "underlay": underlay.ns.name(),
        "nodes": names(nodes.iter().map(|n| (n.name.as_str(), n.ns.name())).collect()),
        "pods": names(pods.iter().map(|p| (p.pod.name.as_str(), p.pod.ns.name())).collect()),
        "meshInterfaces": names(nodes.iter().map(|n| n.name.as_str()).zip(mesh_interfaces.iter().map(String::as_str)).collect()),
    });
    let path = dir.join("namespaces.json");
    std::fs::write(&path, serde_json::to_string_pretty(&map)?)
        .with_context(|| format!("writing {}", path.display()))
}

pub fn sandbox(args: SandboxArgs) -> anyhow::Result<()> {
    if !netns::is_root() {
        bail!("the sandbox creates network namespaces: run it as root");
    }
    check_prerequisites()?;
    let docs = read_cluster(args.load.as_deref())?;
    let dir = SandboxDir::take(&args.dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // From here on a signal tears down what was built instead of ending the process.
    let stop = Stop::install(&rt)?;
    netns::claim_scope(&dir.scope)?;
    let served = serve(&args, &dir, docs, &rt, stop.clone());
    // Each step removes what it built, but a signal can end a program between its effect
    // and its report (`ip netns add` killed once the namespace exists): sweep the scope.
    if let Err(error) = netns::remove_scope(&dir.scope) {
        eprintln!("warning: removing what is left of the sandbox: {error:#}");
    }
    match served {
        Err(error) if error.downcast_ref::<Interrupted>().is_some() => Ok(()),
        // A step may fail because the signal ended one of its programs first (Ctrl-C
        // reaches the whole process group).
        Err(error) => match stop.signal() {
            Some(signal) => {
                println!("{signal}: torn down (start-up ended with: {error:#})");
                Ok(())
            }
            None => Err(error),
        },
        Ok(()) => Ok(()),
    }
}

/// Builds the sandbox in `dir` and serves it until a signal; everything built is removed
/// when this returns, also on an error.
fn serve(
    args: &SandboxArgs,
    dir: &SandboxDir,
    mut docs: Vec<Value>,
    rt: &tokio::runtime::Runtime,
    mut stop: Stop,
) -> anyhow::Result<()> {
    let mut node_names: Vec<String> = docs
        .iter()
        .filter(|d| d["kind"] == "Node")
        .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    node_names.sort();
    dir.clear_leftovers(&node_names)?;
    let host_state = dir.host_state(&node_names);
    let underlay = Underlay::new(UNDERLAY_V4, UNDERLAY_V6)?;
    // Each Node object gets the underlay address its namespace really has.
    for doc in docs.iter_mut().filter(|d| d["kind"] == "Node") {
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let index =
            FIRST_NODE_INDEX + node_names.iter().position(|n| *n == name).unwrap_or(0) as u8;
        doc["status"]["addresses"] = json!([
            {"type": "InternalIP", "address": underlay.v4(index).to_string()},
            {"type": "InternalIP", "address": underlay.v6(u16::from(index)).to_string()},
            {"type": "Hostname", "address": name},
        ]);
    }

    with_overlay_kube_dns(&mut docs)?;
    let user_kubeconfig = dir.path.join("kubeconfig");
    let api = if args.real_api {
        stop.check()?;
        SandboxApi::real(args, dir, &underlay, &docs, &user_kubeconfig)?
    } else {
        SandboxApi::stand_in(args, dir, &underlay, &docs, &user_kubeconfig, rt)?
    };

    let exe = std::env::current_exe().context("finding the nodus binary")?;
    let agent_binary = args.agent_binary.as_deref().unwrap_or(&exe);
    let (nodes, mut agents, interfaces) =
        start_nodes(dir, &underlay, &node_names, &api, agent_binary, &stop)?;
    let pods = make_pods(dir, &docs, &nodes, &exe, &stop)?;

    write_namespaces(&dir.path, &underlay, &nodes, &pods, &interfaces)?;

    let statuses = wait_until_settled(&nodes, &docs, &stop)?;
    print_summary(&api, dir, &docs, &nodes, &statuses, &pods);
    demonstrate(&docs, &nodes, &pods, &stop)?;
    if !statuses.iter().all(|(ready, _)| *ready) {
        println!("warning: not every node became ready; see the logs");
    }
    println!(
        "\ntry:\n  export KUBECONFIG={}\n  kubectl get nodes,services,endpointslices -A\n  nodus view --kubeconfig {} | jq '.services[].name'\n\n\
         Type `restart NODE [BINARY]` to restart a node's nodus (with another binary: an upgrade).\n\
         Ctrl-C to tear everything down.",
        user_kubeconfig.display(),
        user_kubeconfig.display()
    );
    let signal = serve_commands(rt, &mut stop, &nodes, &mut agents, agent_binary);
    println!("{signal}: tearing down");
    drop((pods, nodes, underlay, host_state));
    api.shutdown(rt);
    Ok(())
}

/// Every Node of the cluster as a namespace on the underlay running `nodus run` with its
/// own configuration and CNI plugins; their agents, and their WireGuard devices' names.
fn start_nodes(
    dir: &SandboxDir,
    underlay: &Underlay,
    node_names: &[String],
    api: &SandboxApi,
    agent_binary: &Path,
    stop: &Stop,
) -> anyhow::Result<(Vec<Node>, Vec<Agent>, Vec<String>)> {
    let api_server = api.on_underlay();
    let mut nodes = Vec::new();
    let mut agents = Vec::new();
    let mut interfaces = Vec::new();
    for (i, name) in node_names.iter().enumerate() {
        stop.check()?;
        let node = Node::new(underlay, name, FIRST_NODE_INDEX + i as u8)?;
        // Like a real node, a default route (to the underlay's host): traffic to a
        // ClusterIP without endpoints must reach the forward hook to be rejected.
        node.ns.ip(&[
            "route",
            "add",
            "default",
            "via",
            &underlay.v4(1).to_string(),
        ])?;
        node.ns.ip(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &underlay.v6(1).to_string(),
        ])?;
        let node_dir = dir.path.join(name);
        let interface = unique_name("wg");
        let node_config = node_dir.join("config.yaml");
        std::fs::create_dir_all(&node_dir)?;
        std::fs::write(&node_config, node_config_text(&node_dir, &interface)?)?;
        // The DaemonSet's init container: the image's plugins into the node's CNI bin
        // directory, from which the pods below are made.
        let cni_bin = node_dir.join("cni-bin");
        let installed = std::process::Command::new(agent_binary)
            .args(["install-cni", "--from", runtime::CNI_PATH, "--to"])
            .arg(&cni_bin)
            .stdout(std::process::Stdio::null())
            .status()
            .with_context(|| format!("running {} install-cni", agent_binary.display()))?;
        anyhow::ensure!(installed.success(), "install-cni for {name}: {installed}");
        interfaces.push(interface);
        // A new log; the agent's restarts append to it.
        let log = dir.path.join(format!("{name}.log"));
        std::fs::File::create(&log)?;
        let agent_args = vec![
            "run".to_string(),
            "--node-name".to_string(),
            name.clone(),
            "--kubeconfig".to_string(),
            api.node_kubeconfig(dir, name)?
                .to_string_lossy()
                .into_owned(),
            "--api-server".to_string(),
            api_server.clone(),
            "--config".to_string(),
            node_config.to_string_lossy().into_owned(),
            "--http-addr".to_string(),
            format!("127.0.0.1:{NODE_HTTP_PORT}"),
        ];
        agents.push(Agent::start(&node, agent_binary, agent_args, log)?);
        nodes.push(node);
    }
    Ok((nodes, agents, interfaces))
}

/// Every pod an EndpointSlice names, made by the reference CNI plugins from the conflist
/// its node's nodus wrote, at the slice's addresses, running the echo server.
fn make_pods(
    dir: &SandboxDir,
    docs: &[Value],
    nodes: &[Node],
    exe: &Path,
    stop: &Stop,
) -> anyhow::Result<Vec<SandboxPod>> {
    let known: BTreeSet<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let mut pods = Vec::new();
    for (name, plan) in plan_pods(docs, &known) {
        stop.check()?;
        let Some(node) = nodes.iter().find(|n| n.name == plan.node) else {
            continue;
        };
        let node_dir = dir.path.join(&node.name);
        let conflist = node_dir.join("net.d/10-nodus.conflist");
        // The conflist appears once the node's nodus has the view and its mesh is set up.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !conflist.exists() && Instant::now() < deadline {
            stop.sleep(Duration::from_millis(100))?;
        }
        let ips: Vec<IpAddr> = [plan.v4.map(IpAddr::V4), plan.v6.map(IpAddr::V6)]
            .into_iter()
            .flatten()
            .collect();
        let cni_bin = node_dir.join("cni-bin");
        let pod = runtime::add_pod(
            node.ns.name(),
            &conflist,
            &name,
            &node_dir.join("ipam"),
            &ips,
            &cni_bin,
            None,
        )
        .with_context(|| format!("creating pod {name} with the CNI plugins"))?;
        let mut cmd = pod.ns.command(&exe.to_string_lossy());
        cmd.args(["echo", "--name", &name]);
        for port in &plan.ports {
            cmd.args(["--port", &port.to_string()]);
        }
        pod.ns.spawn(cmd)?;
        pods.push(SandboxPod {
            pod,
            node: plan.node,
            port: plan.ports.first().copied(),
        });
    }

    Ok(pods)
}

/// Waits (a minute at most) until every node is ready, has a WireGuard peer for every
/// other node, and every pair's key exchange is done, so that the demonstrations do not
/// race it; each node's readiness and objects.
fn wait_until_settled(
    nodes: &[Node],
    docs: &[Value],
    stop: &Stop,
) -> anyhow::Result<Vec<(bool, BTreeMap<String, String>)>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let statuses = loop {
        let statuses: Vec<_> = nodes.iter().map(node_status).collect();
        // Ready, a WireGuard peer for every other node, and every pair's key exchange
        // done, so that the demonstrations below do not race it.
        let peers = (nodes.len() - 1).to_string();
        let settled = statuses
            .iter()
            .all(|(ready, objects)| *ready && objects.get("peer") == Some(&peers))
            && mesh_reached(nodes, docs);
        if settled || Instant::now() > deadline {
            break statuses;
        }
        stop.sleep(Duration::from_millis(200))?;
    };
    Ok(statuses)
}

/// What runs where, and where the logs and configurations are.
fn print_summary(
    api: &SandboxApi,
    dir: &SandboxDir,
    docs: &[Value],
    nodes: &[Node],
    statuses: &[(bool, BTreeMap<String, String>)],
    pods: &[SandboxPod],
) {
    println!(
        "nodus sandbox: {} {} ({} objects)",
        api.kind(),
        api.url(),
        docs.len()
    );
    println!(
        "{:<10} {:<6} {:>9} {:>15} {:>10} {:>6}",
        "NODE", "READY", "SERVICES", "ENDPOINTSLICES", "ENDPOINTS", "NODES"
    );
    for (node, (ready, objects)) in nodes.iter().zip(statuses) {
        let get = |k: &str| objects.get(k).map_or("-", String::as_str).to_string();
        println!(
            "{:<10} {:<6} {:>9} {:>15} {:>10} {:>6}",
            node.name,
            ready,
            get("service"),
            get("endpointslice"),
            get("endpoint"),
            get("node")
        );
    }
    println!(
        "pods: {}",
        pods.iter()
            .map(|p| p.pod.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("logs: {}/<node>.log", dir.path.display());
    println!(
        "each node runs deploy/overlays/replace's configuration ({}/<node>/config.yaml: its \
         own paths and both families on top), api_server set, the overlay's kube-dns \
         Service, and the CNI plugins installed in <node>/cni-bin",
        dir.path.display()
    );
}

/// DNS, the proxy and curl by name from a dual-stack pod (so that both families of a
/// dual-stack service can be shown), then the mesh between pods.
fn demonstrate(
    docs: &[Value],
    nodes: &[Node],
    pods: &[SandboxPod],
    stop: &Stop,
) -> anyhow::Result<()> {
    if let Some(pod) = pods
        .iter()
        .map(|p| &p.pod)
        .find(|p| p.v4.is_some() && p.v6.is_some())
        .or(pods.first().map(|p| &p.pod))
    {
        if let Some(gateway) = pod.v4.and_then(|ip| pod_gateway(docs, IpAddr::V4(ip))) {
            demonstrate_dns(pod, gateway, cluster_dns_ip(docs));
        }
        stop.check()?;
        demonstrate_proxy(pod, &proxy_targets(docs, nodes));
        stop.check()?;
        if let Some(cluster_dns) = cluster_dns_ip(docs) {
            write_pod_resolv_conf(pod, cluster_dns)?;
            demonstrate_curl_by_name(pod);
        }
    }
    stop.check()?;
    demonstrate_mesh(pods);
    Ok(())
}

/// Serves the commands typed (`restart NODE [BINARY]`) until a signal, which it returns.
fn serve_commands(
    rt: &tokio::runtime::Runtime,
    stop: &mut Stop,
    nodes: &[Node],
    agents: &mut [Agent],
    agent_binary: &Path,
) -> &'static str {
    let mut commands = stdin_lines();
    loop {
        let line = rt.block_on(async {
            tokio::select! {
                signal = stop.wait() => Err(signal),
                Some(line) = commands.recv() => Ok(line),
            }
        });
        match line {
            Err(signal) => break signal,
            Ok(line) if line.trim().is_empty() => {}
            Ok(line) => match restart(&line, nodes, agents, agent_binary) {
                Ok(report) => println!("{report}"),
                Err(error) => println!("error: {error:#}"),
            },
        }
    }
}

/// The API server the sandbox's nodes and its user talk to.
enum SandboxApi {
    /// The stand-in, and where it listens on the underlay.
    StandIn(apiserver::ServerHandle, SocketAddr),
    /// The relay carries the nodes' connections from the underlay to the API server on
    /// loopback.
    Real(ControlPlane, Relay),
}

impl SandboxApi {
    /// The stand-in, loaded with `docs`, on 127.0.0.1 (`--api-port`) and on the underlay.
    fn stand_in(
        args: &SandboxArgs,
        dir: &SandboxDir,
        underlay: &Underlay,
        docs: &[Value],
        user_kubeconfig: &Path,
        rt: &tokio::runtime::Runtime,
    ) -> anyhow::Result<SandboxApi> {
        let store = Store::new(ApiServerConfig::default());
        for doc in docs {
            store.apply_value(doc.clone())?;
        }
        let local = rt
            .block_on(tokio::net::TcpListener::bind((
                Ipv4Addr::LOCALHOST,
                args.api_port,
            )))
            .with_context(|| format!("binding 127.0.0.1:{}", args.api_port))?;
        let server = rt.block_on(apiserver::serve(store, local))?;
        let on_underlay = SocketAddr::from((underlay.v4(1), API_PORT_ON_UNDERLAY));
        server.listen_in(&underlay.ns, on_underlay)?;
        apiserver::write_kubeconfig(user_kubeconfig, &server.url())?;
        // As in a pod of the overlay's DaemonSet: the in-cluster address is the
        // `kubernetes` Service's cluster IP, which nothing has programmed on a new node, so
        // `api_server` (the overlay's NODUS_API_SERVER) names the API's own address.
        apiserver::write_kubeconfig(&dir.path.join("node-kubeconfig"), "https://10.96.0.1:443")?;
        Ok(SandboxApi::StandIn(server, on_underlay))
    }

    /// A real control plane in `<dir>/control-plane`, advertised at the underlay's `.1`
    /// (where the relay listens, on the same port), with `deploy/base` applied, then `docs`.
    fn real(
        args: &SandboxArgs,
        dir: &SandboxDir,
        underlay: &Underlay,
        docs: &[Value],
        user_kubeconfig: &Path,
    ) -> anyhow::Result<SandboxApi> {
        let config = ControlPlaneConfig {
            advertise: IpAddr::V4(underlay.v4(1)),
            api_port: Some(args.api_port),
            ..ControlPlaneConfig::default()
        };
        let plane = ControlPlane::start(&dir.path.join("control-plane"), &config)?;
        plane.apply_deploy_base()?;
        plane.apply(docs)?;
        std::fs::copy(&plane.admin_kubeconfig, user_kubeconfig)
            .with_context(|| format!("writing {}", user_kubeconfig.display()))?;
        let relay = Relay::in_namespace(
            &underlay.ns,
            SocketAddr::from((underlay.v4(1), plane.api_port)),
            plane.api_addr(),
        )?;
        Ok(SandboxApi::Real(plane, relay))
    }

    /// What the nodes' `api_server` names: the API on the underlay's `.1`.
    fn on_underlay(&self) -> String {
        match self {
            SandboxApi::StandIn(_, on_underlay) => format!("http://{on_underlay}"),
            SandboxApi::Real(_, relay) => format!("https://{}", relay.addr),
        }
    }

    /// The kubeconfig a node's nodus runs with, naming the in-cluster address as a pod's
    /// does (`api_server` overrides it): the stand-in's, shared; a token of `deploy/base`'s
    /// ServiceAccount bound to the node, from the real API server.
    fn node_kubeconfig(&self, dir: &SandboxDir, node: &str) -> anyhow::Result<PathBuf> {
        match self {
            SandboxApi::StandIn(..) => Ok(dir.path.join("node-kubeconfig")),
            SandboxApi::Real(plane, _) => plane.nodus_kubeconfig(node, "https://10.96.0.1:443"),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            SandboxApi::StandIn(..) => "API server stand-in",
            SandboxApi::Real(..) => "real control plane, API server",
        }
    }

    fn url(&self) -> String {
        match self {
            SandboxApi::StandIn(server, _) => server.url(),
            SandboxApi::Real(plane, _) => plane.url(),
        }
    }

    fn shutdown(self, rt: &tokio::runtime::Runtime) {
        match self {
            SandboxApi::StandIn(server, _) => rt.block_on(server.shutdown()),
            SandboxApi::Real(plane, relay) => drop((relay, plane)),
        }
    }
}
