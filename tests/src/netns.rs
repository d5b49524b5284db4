//! Network namespaces as hosts and pods, for kernel tests and the sandbox.
//!
//! A node is a namespace; nodes meet on an underlay bridge that lives in a namespace of
//! its own; a pod is a namespace behind a veth into its node, addressed as the CNI `ptp`
//! plugin does it (a /32 and a link-scoped gateway). Nothing here touches the root
//! namespace's links, routes or nftables. Every name is unique to this process, and every
//! namespace is deleted, and every process started in it killed, when its handle drops,
//! including while a failing test unwinds.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use anyhow::{Context, bail};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The prefix of every name this process makes: `n` and its pid, unless it claimed a
/// scope of its own with [`claim_scope`] before making the first.
static SCOPE: OnceLock<String> = OnceLock::new();

fn scope() -> &'static str {
    SCOPE.get_or_init(|| format!("n{:x}", std::process::id() & 0xfffff))
}

/// A short name unique to this process (device names are limited to 15 bytes).
pub fn unique_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tag: String = tag
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(4)
        .collect();
    format!("{}{tag}{n}", scope())
}

/// The scope of names that belongs to a directory: `s` and six hex digits of a hash of its
/// canonical path. A process that owns the directory (and holds a lock on it) names its
/// namespaces and devices in this scope, so that the next owner finds what a killed one
/// left behind by name, and the pid-based scopes of other processes never match it.
pub fn scope_for(dir: &Path) -> String {
    let path = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    // FNV-1a: stable across builds and platforms, unlike the standard library's hasher.
    let hash = path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("s{:06x}", hash & 0xff_ffff)
}

/// Names every later namespace and device of this process in `scope` (see [`scope_for`]).
/// Fails when a name was already made in another scope.
pub fn claim_scope(scope: &str) -> anyhow::Result<()> {
    let claimed = SCOPE.get_or_init(|| scope.to_string());
    if claimed != scope {
        bail!("this process already names its namespaces {claimed}…, not {scope}…");
    }
    Ok(())
}

/// Every network namespace whose name starts with `scope`.
pub fn namespaces_in(scope: &str) -> anyhow::Result<Vec<String>> {
    Ok(run("ip", &["netns", "list"])?
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(scope))
        .map(str::to_string)
        .collect())
}

/// Kills every process in each namespace of `scope`, waits for them to end, and deletes
/// the namespaces: what a killed owner of the scope left. Returns the names it removed.
pub fn remove_scope(scope: &str) -> anyhow::Result<Vec<String>> {
    let names = namespaces_in(scope)?;
    let mut killed = Vec::new();
    for name in &names {
        killed.extend(kill_processes_in(name));
        run("ip", &["netns", "del", name])?;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while killed.iter().any(|pid| is_running(*pid)) {
        if Instant::now() > deadline {
            bail!("processes of {scope}… still run 5 s after SIGKILL");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(names)
}

/// SIGKILL to every process in namespace `name`; returns their pids.
fn kill_processes_in(name: &str) -> Vec<i32> {
    let pids: Vec<i32> = run("ip", &["netns", "pids", name])
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    for pid in &pids {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    pids
}

/// Whether process `pid` exists and has not exited: a zombie (an orphan whose reaper has
/// not collected it yet) holds nothing but its pid.
pub fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}

/// Runs a command to completion; a failure carries the command line and its stderr.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Whether this process may create namespaces (kernel tests need root).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Fails the calling test unless it runs as root: a kernel test that skipped itself
/// would pass without testing anything.
pub fn require_root() {
    assert!(is_root(), "kernel tests need root (network namespaces)");
}

/// A named network namespace, deleted on drop.
pub struct Netns {
    name: String,
    children: Mutex<Vec<Child>>,
}

impl Netns {
    pub fn new(tag: &str) -> anyhow::Result<Netns> {
        let name = unique_name(tag);
        if let Err(error) = run("ip", &["netns", "add", &name]) {
            // A signal may end `ip` after the namespace exists (Ctrl-C reaches the whole
            // process group): nothing else would remove it.
            let _ = run("ip", &["netns", "del", &name]);
            return Err(error);
        }
        let ns = Netns {
            name,
            children: Mutex::new(Vec::new()),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <ns> …`
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// A command that runs inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `program args…` inside the namespace to completion.
    pub fn exec(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut full = vec!["netns", "exec", &self.name, program];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// The resolv.conf that programs run through [`Netns::command`] and [`Netns::exec`] see:
    /// `ip netns exec` mounts `/etc/netns/<name>/resolv.conf` over `/etc/resolv.conf`.
    /// Removed with the namespace.
    pub fn set_resolv_conf(&self, text: &str) -> anyhow::Result<()> {
        let dir = Path::new("/etc/netns").join(&self.name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("resolv.conf"), text)?;
        Ok(())
    }

    pub fn sysctl(&self, key: &str, value: &str) -> anyhow::Result<()> {
        self.exec("sysctl", &["-qw", &format!("{key}={value}")])
            .map(drop)
    }

    /// Starts a long-running process in the namespace; it is killed when the namespace drops.
    pub fn spawn(&self, mut command: Command) -> anyhow::Result<u32> {
        let child = command
            .spawn()
            .with_context(|| format!("starting a process in {}", self.name))?;
        let pid = child.id();
        self.children
            .lock()
            .map_err(|_| anyhow::anyhow!("child list poisoned"))?
            .push(child);
        Ok(pid)
    }

    /// Kills and reaps one process started with [`Netns::spawn`].
    pub fn kill(&self, pid: u32) -> anyhow::Result<()> {
        let mut children = self
            .children
            .lock()
            .map_err(|_| anyhow::anyhow!("child list poisoned"))?;
        if let Some(i) = children.iter().position(|c| c.id() == pid) {
            let mut child = children.swap_remove(i);
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }

    /// Stops one process started with [`Netns::spawn`] with SIGTERM, as a service manager
    /// would, and returns how it exited.
    pub fn terminate(&self, pid: u32) -> anyhow::Result<std::process::ExitStatus> {
        self.stop(pid, libc::SIGTERM, Duration::from_secs(60))
            .map(|(status, _)| status)
    }

    /// Sends `signal` to one process started with [`Netns::spawn`] and waits for it to
    /// exit; returns how it exited and how long that took. A process still running after
    /// `within` is killed, and that is an error.
    pub fn stop(
        &self,
        pid: u32,
        signal: libc::c_int,
        within: Duration,
    ) -> anyhow::Result<(std::process::ExitStatus, Duration)> {
        let mut children = self
            .children
            .lock()
            .map_err(|_| anyhow::anyhow!("child list poisoned"))?;
        let i = children
            .iter()
            .position(|c| c.id() == pid)
            .with_context(|| format!("no process {pid} in {}", self.name))?;
        let mut child = children.swap_remove(i);
        let sent = Instant::now();
        // SAFETY: signalling a child we own and have not reaped.
        unsafe { libc::kill(pid as i32, signal) };
        loop {
            let waited = child
                .try_wait()
                .with_context(|| format!("waiting for {pid} in {}", self.name))?;
            if let Some(status) = waited {
                return Ok((status, sent.elapsed()));
            }
            if sent.elapsed() > within {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "process {pid} in {} still ran {within:?} after signal {signal}; killed",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs `f` on a thread that has entered the namespace. Sockets created there stay in
    /// the namespace, so this is how a listener or client is bound inside it.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        enter(&self.name, f)
    }
}

/// [`Netns::enter`] for a namespace known by its name (`ip netns`), such as one of the
/// sandbox's, which another process owns.
pub fn enter<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    let path = format!("/var/run/netns/{name}");
    let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns on a valid namespace fd affects only this thread, which
                // ends when `f` returns.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                if rc != 0 {
                    bail!("entering {}: {}", path, std::io::Error::last_os_error());
                }
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("thread in {name} panicked"))?
    })
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Ok(children) = self.children.get_mut() {
            for child in children.iter_mut() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Daemons that detached from our children (wireguard-go forks itself) live on in
        // the namespace; they are ours too, since nothing else runs in it.
        kill_processes_in(&self.name);
        let _ = run("ip", &["netns", "del", &self.name]);
        let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(&self.name));
    }
}

/// Connects two namespaces with a veth pair named `a_if` / `b_if` and brings both up.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> anyhow::Result<()> {
    let tmp = unique_name("v");
    a.ip(&["link", "add", a_if, "type", "veth", "peer", "name", &tmp])?;
    a.ip(&["link", "set", &tmp, "netns", b.name()])?;
    b.ip(&["link", "set", &tmp, "name", b_if])?;
    a.ip(&["link", "set", a_if, "up"])?;
    b.ip(&["link", "set", b_if, "up"])?;
    Ok(())
}

/// A layer-2 segment between nodes: a bridge in a namespace of its own. Its own address
/// on the segment is `prefix.1` (IPv4) and `fd00:<tag>::1` (IPv6).
pub struct Underlay {
    pub ns: Netns,
    bridge: String,
    pub v4_prefix: [u8; 3],
    pub v6_prefix: [u16; 4],
}

impl Underlay {
    pub fn new(v4_prefix: [u8; 3], v6_prefix: [u16; 4]) -> anyhow::Result<Underlay> {
        let ns = Netns::new("ul")?;
        let bridge = "br0".to_string();
        ns.ip(&["link", "add", &bridge, "type", "bridge"])?;
        ns.ip(&["link", "set", &bridge, "up"])?;
        let underlay = Underlay {
            ns,
            bridge,
            v4_prefix,
            v6_prefix,
        };
        underlay.ns.ip(&[
            "addr",
            "add",
            &format!("{}/24", underlay.v4(1)),
            "dev",
            &underlay.bridge,
        ])?;
        underlay.ns.ip(&[
            "addr",
            "add",
            &format!("{}/64", underlay.v6(1)),
            "dev",
            &underlay.bridge,
            "nodad",
        ])?;
        Ok(underlay)
    }

    pub fn v4(&self, host: u8) -> Ipv4Addr {
        let [a, b, c] = self.v4_prefix;
        Ipv4Addr::new(a, b, c, host)
    }

    pub fn v6(&self, host: u16) -> Ipv6Addr {
        let [a, b, c, d] = self.v6_prefix;
        Ipv6Addr::new(a, b, c, d, 0, 0, 0, host)
    }

    /// Plugs `host` into the segment as `eth0` with address number `index`.
    pub fn attach(&self, host: &Netns, index: u8) -> anyhow::Result<()> {
        let port = unique_name("p");
        veth(&self.ns, &port, host, "eth0")?;
        self.ns
            .ip(&["link", "set", &port, "master", &self.bridge])?;
        host.ip(&[
            "addr",
            "add",
            &format!("{}/24", self.v4(index)),
            "dev",
            "eth0",
        ])?;
        host.ip(&[
            "addr",
            "add",
            &format!("{}/64", self.v6(u16::from(index))),
            "dev",
            "eth0",
            "nodad",
        ])?;
        Ok(())
    }
}

/// A node: a namespace on the underlay that forwards packets.
pub struct Node {
    pub ns: Netns,
    pub name: String,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

impl Node {
    pub fn new(underlay: &Underlay, name: &str, index: u8) -> anyhow::Result<Node> {
        let ns = Netns::new(name)?;
        // No duplicate address detection on the node's devices (the underlay's, and the
        // host ends of pod veths, which CNI plugins move here): while it runs, about 2 s,
        // their IPv6 addresses are tentative and the first packets to a new pod are lost.
        ns.sysctl("net.ipv6.conf.default.accept_dad", "0")?;
        underlay.attach(&ns, index)?;
        ns.sysctl("net.ipv4.ip_forward", "1")?;
        ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        Ok(Node {
            ns,
            name: name.to_string(),
            v4: underlay.v4(index),
            v6: underlay.v6(u16::from(index)),
        })
    }
}

/// A pod: a namespace behind a veth into its node, with a /32 (and /128) address.
pub struct Pod {
    pub ns: Netns,
    pub name: String,
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
}

/// The node-side gateway every pod uses, as `ptp` sets it up: link-local, so one address
/// serves every pod veth on the node.
pub const POD_GATEWAY_V4: &str = "169.254.1.1";
pub const POD_GATEWAY_V6: &str = "fe80::1";

impl Pod {
    pub fn new(
        node: &Node,
        name: &str,
        v4: Option<Ipv4Addr>,
        v6: Option<Ipv6Addr>,
    ) -> anyhow::Result<Pod> {
        let ns = Netns::new(name)?;
        let host_if = unique_name("h");
        veth(&node.ns, &host_if, &ns, "eth0")?;
        node.ns.ip(&[
            "addr",
            "add",
            &format!("{POD_GATEWAY_V4}/32"),
            "dev",
            &host_if,
        ])?;
        node.ns.ip(&[
            "addr",
            "add",
            &format!("{POD_GATEWAY_V6}/64"),
            "dev",
            &host_if,
            "nodad",
        ])?;
        // Answer ARP for the gateway on behalf of the node.
        node.ns
            .sysctl(&format!("net.ipv4.conf.{host_if}.proxy_arp"), "1")?;
        if let Some(ip) = v4 {
            ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
            ns.ip(&[
                "route",
                "add",
                POD_GATEWAY_V4,
                "dev",
                "eth0",
                "scope",
                "link",
            ])?;
            ns.ip(&[
                "route",
                "add",
                "default",
                "via",
                POD_GATEWAY_V4,
                "dev",
                "eth0",
            ])?;
            node.ns
                .ip(&["route", "add", &format!("{ip}/32"), "dev", &host_if])?;
        }
        if let Some(ip) = v6 {
            ns.ip(&["addr", "add", &format!("{ip}/128"), "dev", "eth0", "nodad"])?;
            ns.ip(&[
                "-6",
                "route",
                "add",
                "default",
                "via",
                POD_GATEWAY_V6,
                "dev",
                "eth0",
            ])?;
            node.ns
                .ip(&["-6", "route", "add", &format!("{ip}/128"), "dev", &host_if])?;
        }
        Ok(Pod {
            ns,
            name: name.to_string(),
            v4,
            v6,
        })
    }
}

/// Sends, from `pod`'s `eth0`, the router advertisement of CVE-2020-10749: a default
/// router of high preference, and `2001:db8:77::/64` on its link (autonomous), both with
/// long lifetimes, from the link-local address once it is usable. The kernel fills in
/// the ICMPv6 checksum of a raw socket.
pub fn advertise_router(pod: &Netns) -> anyhow::Result<()> {
    const SEND: &str = r#"
import socket, struct
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
index = socket.if_nametoindex('eth0')
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, index)
ra = struct.pack('!BBHBBHII', 134, 0, 0, 64, 0x08, 1800, 0, 0)
pio = struct.pack('!BBBBIII', 3, 4, 64, 0xc0, 86400, 14400, 0)
pio += socket.inet_pton(socket.AF_INET6, '2001:db8:77::')
s.sendto(ra + pio, ('ff02::1', 0, 0, index))
"#;
    let usable = (0..50).any(|_| {
        let addresses = pod
            .ip(&["-6", "address", "show", "dev", "eth0", "scope", "link"])
            .unwrap_or_default();
        let usable = addresses.contains("fe80") && !addresses.contains("tentative");
        if !usable {
            std::thread::sleep(Duration::from_millis(100));
        }
        usable
    });
    anyhow::ensure!(
        usable,
        "{}'s eth0 has no usable link-local address",
        pod.name()
    );
    pod.exec("python3", &["-c", SEND]).map(drop)
}

/// The routes of `node` that a router advertisement made: a default route (`proto ra`)
/// and the prefix [`advertise_router`] sends (`proto kernel`), one a line.
pub fn advertised_routes(node: &Netns) -> anyhow::Result<String> {
    let routes = node.ip(&["-6", "route", "show"])?;
    Ok(routes
        .lines()
        .filter(|line| line.contains("proto ra") || line.contains("2001:db8:77::"))
        .collect::<Vec<_>>()
        .join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(name: &str) -> bool {
        run("ip", &["netns", "list"]).is_ok_and(|list| {
            list.lines()
                .any(|l| l.split_whitespace().next() == Some(name))
        })
    }

    #[test]
    fn namespaces_are_removed_even_when_a_test_panics() {
        require_root();
        let mut name = String::new();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let underlay = Underlay::new([10, 199, 0], [0xfd00, 0x199, 0, 0]).expect("underlay");
            let node = Node::new(&underlay, "cleanup", 2).expect("node");
            name = node.ns.name().to_string();
            assert!(listed(&name));
            let reply = node
                .ns
                .exec("ping", &["-c1", "-W2", &underlay.v4(1).to_string()]);
            assert!(reply.is_ok(), "the node reaches the underlay: {reply:?}");
            panic!("a failing test");
        }));
        assert!(result.is_err());
        assert!(
            !name.is_empty() && !listed(&name),
            "{name} survived the panic"
        );
    }

    #[test]
    fn unique_names_fit_a_device_name() {
        let a = unique_name("node");
        let b = unique_name("node");
        assert_ne!(a, b);
        assert!(a.len() <= 15, "{a}");
    }
}
