//! The WireGuard mesh for real: three node namespaces on a bridge underlay, each running
//! `nodus run` with the mesh on (a userspace backend, `wireguard-go` or the embedded
//! boringtun: the machines have no WireGuard module) against the API-server stand-in, and
//! pods made by the reference CNI plugins from the conflist each nodus wrote.

use crate::support::{Cluster, NODUS, free_port, metric, wait_for};
use nodus_mesh::plan::{ANNOTATION_ENDPOINT, ANNOTATION_PEER_ENDPOINTS, ANNOTATION_PUBLIC_KEY};
use nodus_testbed::netns::{self, Netns, Node, Pod, Underlay, unique_name};
use nodus_testbed::probe::{SourceEcho, http_get, tcp_who};
use nodus_testbed::runtime;
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

pub(crate) const API_PORT: u16 = 6443;
const ECHO_PORT: u16 = 8080;
const WG_PORT: u16 = 51820;
/// A server's port on the underlay, which stands for the world outside the cluster.
const OUTSIDE_PORT: u16 = 18080;

fn v4_cidr(i: u8) -> String {
    format!("10.244.{i}.0/24")
}

fn v6_cidr(i: u8) -> String {
    format!("fd00:10:244:{i}::/64")
}

pub(crate) fn node_object(name: &str, i: u8, underlay: &Underlay) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"podCIDR": v4_cidr(i), "podCIDRs": [v4_cidr(i), v6_cidr(i)]},
        "status": {"addresses": [
            {"type": "InternalIP", "address": underlay.v4(i + 1).to_string()},
            {"type": "InternalIP", "address": underlay.v6(u16::from(i) + 1).to_string()},
        ]},
    })
}

/// One node namespace and the nodus running in it.
pub(crate) struct MeshNode {
    pub(crate) node: Node,
    pub(crate) interface: String,
    pub(crate) dir: PathBuf,
    config: PathBuf,
    http: SocketAddr,
    pub(crate) pid: Option<u32>,
    starts: usize,
    /// A program and its arguments that run nodus (`setpriv`, `unshare`), which comes
    /// after them with its own arguments.
    pub(crate) launcher: Vec<String>,
}

impl MeshNode {
    /// `mesh` holds the backend's lines of the `mesh:` section.
    pub(crate) fn new(
        cluster: &Cluster,
        underlay: &Underlay,
        name: &str,
        i: u8,
        mesh: &str,
    ) -> MeshNode {
        let node = Node::new(underlay, name, i + 1).expect("node namespace");
        MeshNode::on(cluster, node, mesh)
    }

    /// The nodus of `node`, a namespace already wired to its network.
    pub(crate) fn on(cluster: &Cluster, node: Node, mesh: &str) -> MeshNode {
        let name = node.name.clone();
        let interface = unique_name("wg");
        let dir = cluster.dir.join(&name);
        std::fs::create_dir_all(&dir).expect("node dir");
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "cluster_cidrs: [10.244.0.0/16, \"fd00:10:244::/56\"]\n\
                 dns:\n  enabled: false\nmesh:\n  enabled: true\n{mesh}  \
                 interface: {interface}\n  key_file: {}\n  cni_conflist: {}\n",
                dir.join("key/wireguard.key").display(),
                dir.join("net.d/10-nodus.conflist").display()
            ),
        )
        .expect("config");
        MeshNode {
            node,
            interface,
            dir,
            config,
            http: SocketAddr::from((Ipv4Addr::LOCALHOST, free_port())),
            pid: None,
            starts: 0,
            launcher: Vec::new(),
        }
    }

    fn conflist(&self) -> PathBuf {
        self.dir.join("net.d/10-nodus.conflist")
    }

    pub(crate) fn log(&self, start: usize) -> PathBuf {
        self.dir.join(format!("nodus-{start}.log"))
    }

    /// Where this node's agent keeps its saved view, across its restarts.
    pub(crate) fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    pub(crate) fn start(&mut self, kubeconfig: &std::path::Path) {
        let log = std::fs::File::create(self.log(self.starts)).expect("log");
        let mut cmd = match self.launcher.split_first() {
            Some((program, args)) => {
                let mut cmd = self.node.ns.command(program);
                cmd.args(args).arg(NODUS);
                cmd
            }
            None => self.node.ns.command(NODUS),
        };
        cmd.args(["run", "--node-name", &self.node.name, "--kubeconfig"])
            .arg(kubeconfig)
            .arg("--config")
            .arg(&self.config)
            .args(["--http-addr", &self.http.to_string()])
            .env("NODUS_LOG", "info")
            .env("NODUS_ALLOW_HTTP_API", "true")
            .env("NODUS_STATE_DIR", self.state_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.pid = Some(self.node.ns.spawn(cmd).expect("nodus starts"));
        self.starts += 1;
    }

    /// DNS on `addr` inside the node, which runs none by default.
    pub(crate) fn serve_dns(&self, addr: SocketAddr) {
        let config = std::fs::read_to_string(&self.config).expect("config");
        let config = config.replace(
            "dns:\n  enabled: false\n",
            &format!("dns:\n  listen: [\"{addr}\"]\n"),
        );
        std::fs::write(&self.config, config).expect("config");
    }

    /// SIGTERM, as a service manager stops it; nodus must exit cleanly on its own path.
    pub(crate) fn stop(&mut self) {
        self.stop_with(libc::SIGTERM);
    }

    /// Stops nodus with `signal`; it must exit cleanly within 2 s (the DaemonSet's grace
    /// period is 5 s). Returns its log.
    fn stop_with(&mut self, signal: libc::c_int) -> String {
        let pid = self.pid.take().expect("running");
        let (status, took) = self
            .node
            .ns
            .stop(pid, signal, Duration::from_secs(2))
            .expect("nodus exits after the signal");
        println!("{}: exit {took:.1?} after signal {signal}", self.node.name);
        assert!(status.success(), "nodus exited with {status}");
        let log = std::fs::read_to_string(self.log(self.starts - 1)).expect("log");
        assert!(
            log.contains("exiting; the dataplane stays in place"),
            "{log}"
        );
        log
    }

    /// `nodus cleanup --yes` with this node's configuration; the table must be gone.
    fn cleanup(&self) -> String {
        let config = self.config.to_string_lossy().to_string();
        let output = self
            .node
            .ns
            .exec(NODUS, &["cleanup", "--yes", "--config", &config])
            .expect("nodus cleanup");
        assert!(
            self.node
                .ns
                .exec("nft", &["list", "table", "inet", "nodus"])
                .is_err(),
            "the table outlived the cleanup"
        );
        output
    }

    /// GET `path` from this nodus's HTTP address, inside its namespace.
    pub(crate) fn get(&self, path: &'static str) -> Option<(u16, String)> {
        let http = self.http;
        self.node
            .ns
            .enter(move || http_get(http, path, Duration::from_secs(2)))
            .ok()?
            .ok()
    }

    pub(crate) fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics")?;
        metric(&body, series)
    }

    pub(crate) fn wait_metric(&self, series: &str, expected: f64) {
        wait_for(
            &format!("{} {series} == {expected}", self.node.name),
            || self.metric(series).filter(|v| *v == expected),
        );
    }

    /// `wg show <dev> <what>` as (public key, value) pairs, sorted by key.
    fn wg_show(&self, what: &str) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = self
            .node
            .ns
            .exec("wg", &["show", &self.interface, what])
            .expect("wg show")
            .lines()
            .filter_map(|l| {
                let mut parts = l.split_whitespace();
                Some((
                    parts.next()?.to_string(),
                    parts.collect::<Vec<_>>().join(" "),
                ))
            })
            .collect();
        pairs.sort();
        pairs
    }

    fn routes(&self) -> String {
        let v4 = self
            .node
            .ns
            .ip(&["route", "show", "dev", &self.interface])
            .expect("routes");
        let v6 = self
            .node
            .ns
            .ip(&["-6", "route", "show", "dev", &self.interface])
            .expect("routes");
        format!("{v4}{v6}")
    }

    fn published_key(&self, cluster: &Cluster) -> Option<String> {
        let node = cluster.store.get("v1", "Node", None, &self.node.name)?;
        node["metadata"]["annotations"][ANNOTATION_PUBLIC_KEY]
            .as_str()
            .map(str::to_string)
    }
}

impl Drop for MeshNode {
    fn drop(&mut self) {
        // The namespace's drop kills wireguard-go; its socket file is host-wide (an
        // embedded device removes its own when nodus exits cleanly).
        let _ = std::fs::remove_file(format!("/var/run/wireguard/{}.sock", self.interface));
    }
}

pub(crate) fn ping(pod: &Pod, to: IpAddr) -> anyhow::Result<String> {
    pod.ns.exec("ping", &["-c1", "-W2", &to.to_string()])
}

fn who(pod: &Pod, to: IpAddr) -> anyhow::Result<String> {
    let addr = SocketAddr::new(to, ECHO_PORT);
    pod.ns
        .enter(move || tcp_who(addr, Duration::from_secs(3)))?
}

/// The conflist's plugins in `dir`, as the init container would have put them.
pub(crate) fn plugins(dir: &std::path::Path) -> PathBuf {
    let reference = nodus_mesh::conflist::REFERENCE_PLUGINS;
    let debian = std::path::Path::new(runtime::CNI_PATH);
    runtime::plugin_dir(dir, std::path::Path::new(NODUS), &reference, debian)
        .expect("the CNI plugins")
}

fn pod_on(node: &MeshNode, name: &str) -> Pod {
    let pod = runtime::add_pod(
        node.node.ns.name(),
        &node.conflist(),
        &unique_name(name),
        &node.dir.join("ipam"),
        &[],
        &plugins(&node.dir),
        None,
    )
    .expect("the CNI plugins create the pod");
    let mut echo = pod.ns.command(NODUS);
    echo.args(["echo", "--name", name, "--port", &ECHO_PORT.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    pod.ns.spawn(echo).expect("echo server");
    // Listening before anyone asks across the mesh: a ping can pass before the server
    // has started, and a connection then is refused.
    for ip in [pod.v4.map(IpAddr::V4), pod.v6.map(IpAddr::V6)]
        .into_iter()
        .flatten()
    {
        wait_for(&format!("{name}'s echo server at {ip}"), || {
            who(&pod, ip).ok().filter(|answer| answer == name)
        });
    }
    pod
}

/// A pod on each node, `pod-1` on node 1 and so on.
pub(crate) fn pod_on_each(nodes: &[MeshNode]) -> Vec<Pod> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| pod_on(node, &format!("pod-{}", i + 1)))
        .collect()
}

/// The `mesh:` lines that pick the wireguard-go backend.
pub(crate) const WIREGUARD_GO: &str = "  backend: wireguard-go\n";

/// pod-1 reaches pod-2 and pod-3 by ping and TCP, in both families.
pub(crate) fn pod_1_reaches_pods_2_and_3(pods: &[Pod]) {
    for (to, name) in [(&pods[1], "pod-2"), (&pods[2], "pod-3")] {
        for ip in [
            IpAddr::V4(to.v4.expect("v4")),
            IpAddr::V6(to.v6.expect("v6")),
        ] {
            wait_for(&format!("pod-1 pings {name} at {ip}"), || {
                ping(&pods[0], ip).ok()
            });
            assert_eq!(who(&pods[0], ip).expect("TCP across the mesh"), name);
        }
    }
}

/// A `tcpdump` on a node's underlay link of everything but the API server's TCP,
/// neighbour discovery and multicast (the group membership reports of devices still being
/// configured).
struct Capture<'a> {
    node: &'a MeshNode,
    pid: u32,
    file: PathBuf,
}

impl Capture<'_> {
    fn start(node: &MeshNode) -> Capture<'_> {
        let file = node
            .dir
            .join(format!("underlay-{}.txt", unique_name("cap")));
        let mut tcpdump = node.node.ns.command("tcpdump");
        tcpdump
            .args(["-l", "-nn", "-i", "eth0"])
            .arg(format!(
                "not arp and not tcp port {API_PORT} and not multicast \
                 and not (icmp6 and ip6[40] >= 133 and ip6[40] <= 137)"
            ))
            .stdout(std::fs::File::create(&file).expect("capture file"))
            .stderr(Stdio::null());
        let pid = node.node.ns.spawn(tcpdump).expect("tcpdump");
        std::thread::sleep(Duration::from_millis(800));
        Capture { node, pid, file }
    }

    /// Stops the capture: it must hold traffic, all of it UDP between WireGuard ports.
    fn only_wireguard(self) {
        std::thread::sleep(Duration::from_millis(300));
        self.node.node.ns.kill(self.pid).expect("stop tcpdump");
        let captured = std::fs::read_to_string(&self.file).expect("capture");
        let lines: Vec<&str> = captured.lines().collect();
        assert!(lines.len() >= 8, "too little captured:\n{captured}");
        for line in &lines {
            assert!(
                line.contains(&format!(".{WG_PORT} > "))
                    && line.contains(&format!(".{WG_PORT}: UDP")),
                "not WireGuard on the underlay: {line}\n{captured}"
            );
        }
    }
}

/// Starts a three-node cluster whose nodus processes all run the mesh, node N+1 with
/// `backends[N]` (lines of its `mesh:` section), on the underlay 10.`subnet`.0.0/24.
pub(crate) fn three_nodes(
    test: &str,
    subnet: u8,
    backends: [&str; 3],
) -> (Cluster, Underlay, Vec<MeshNode>, PathBuf) {
    netns::require_root();
    let underlay =
        Underlay::new([10, subnet, 0], [0xfd00, u16::from(subnet), 0, 0]).expect("underlay");
    let objects: Vec<_> = (1..=3)
        .map(|i| node_object(&format!("node-{i}"), i, &underlay))
        .collect();
    let cluster = Cluster::new(test, "");
    for object in objects {
        cluster.apply(object);
    }
    let kubeconfig = cluster.listen_in(&underlay.ns, SocketAddr::from((underlay.v4(1), API_PORT)));
    let mut nodes: Vec<MeshNode> = (1..=3)
        .zip(backends)
        .map(|(i, mesh)| MeshNode::new(&cluster, &underlay, &format!("node-{i}"), i, mesh))
        .collect();
    for node in &mut nodes {
        node.start(&kubeconfig);
    }
    for node in &nodes {
        node.wait_metric("nodus_mesh_peers", 2.0);
    }
    (cluster, underlay, nodes, kubeconfig)
}

#[test]
fn pods_reach_each_other_across_nodes_through_the_mesh_only() {
    let (cluster, underlay, mut nodes, kubeconfig) = three_nodes("mesh", 201, [WIREGUARD_GO; 3]);
    let pods = pod_on_each(&nodes);
    for (i, pod) in pods.iter().enumerate() {
        let v4 = pod.v4.expect("an IPv4 address");
        let v6 = pod.v6.expect("an IPv6 address");
        assert!(
            v4.to_string().starts_with(&format!("10.244.{}.", i + 1)),
            "{v4}"
        );
        assert!(
            v6.to_string()
                .starts_with(&format!("fd00:10:244:{}:", i + 1)),
            "{v6}"
        );
    }
    let conflist = std::fs::read_to_string(nodes[0].conflist()).expect("conflist");
    assert!(
        conflist.contains("\"mtu\": 1420"),
        "underlay 1500 − 80:\n{conflist}"
    );

    // The underlay of node 2 while pod 1 talks to pods 2 and 3, both families, and node 1
    // to pod 2.
    let capture = Capture::start(&nodes[1]);
    pod_1_reaches_pods_2_and_3(&pods);
    // From the node itself, too: its source is the device's address, which peers accept.
    nodes[0]
        .node
        .ns
        .exec(
            "ping",
            &["-c1", "-W2", &pods[1].v4.expect("v4").to_string()],
        )
        .expect("node 1 reaches pod 2");
    capture.only_wireguard();

    // Egress with the proxy off (nodus beside kube-proxy): a server outside the cluster,
    // on the underlay, which has no route to pods, sees node 1's address in both
    // families. nodus's table holds the masquerade and the pods' source check, and
    // nothing that could meet kube-proxy's traffic.
    for (outside, node_1) in [
        (IpAddr::V4(underlay.v4(1)), IpAddr::V4(underlay.v4(2))),
        (IpAddr::V6(underlay.v6(1)), IpAddr::V6(underlay.v6(2))),
    ] {
        let outside = SocketAddr::new(outside, OUTSIDE_PORT);
        let _server = SourceEcho::start(underlay.ns.name(), outside).expect("outside server");
        let seen = wait_for(&format!("pod-1 reaches {outside}"), || {
            pods[0]
                .ns
                .enter(move || tcp_who(outside, Duration::from_secs(2)))
                .ok()?
                .ok()
        });
        assert_eq!(seen, node_1.to_string(), "the source {outside} saw");
    }
    let table = nodes[0]
        .node
        .ns
        .exec("nft", &["list", "table", "inet", "nodus"])
        .expect("nodus's table");
    let mut objects: Vec<&str> = table
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("chain ") || line.starts_with("set "))
        .collect();
    objects.sort_unstable();
    assert_eq!(
        objects,
        [
            "chain masquerading {",
            "chain nat-postrouting {",
            "chain pod-source-check {",
            "set cluster-cidrs-v4 {",
            "set cluster-cidrs-v6 {",
            "set pod-cidrs-v4 {",
            "set pod-cidrs-v6 {",
            "set pod-forged-sources-v4 {",
            "set pod-forged-sources-v6 {",
            "set pod-router-messages-v6 {",
        ],
        "{table}"
    );

    nodes[0].wait_metric("nodus_mesh_peers_recent_handshake", 2.0);
    assert!(
        nodes[0]
            .metric("nodus_mesh_bytes_total{direction=\"sent\"}")
            .unwrap_or(0.0)
            > 0.0
    );
    // `nodus status` shows the mesh and the egress-only table.
    let screen = nodes[0]
        .node
        .ns
        .exec(
            NODUS,
            &["status", "--http-addr", &nodes[0].http.to_string()],
        )
        .expect("nodus status");
    for line in [
        "mesh       synced     2 peers, 2 recent handshakes, 4 routes",
        "proxy: off; the table holds only the mesh's egress masquerade",
        "PEER                     ENDPOINT",
        &format!("node-2                   {}:{WG_PORT} ", underlay.v4(3)),
    ] {
        assert!(screen.contains(line), "{line:?} in\n{screen}");
    }

    // A restart of nodus on node 1 keeps the sessions: no new handshake, no lost ping.
    let pod2 = pods[1].v4.expect("v4").to_string();
    let handshakes = nodes[0].wg_show("latest-handshakes");
    let key_before = nodes[0].published_key(&cluster).expect("published key");
    let mut pinger = pods[0].ns.command("ping");
    pinger
        .args(["-i", "0.1", "-c", "40", "-W", "1", &pod2])
        .stdout(Stdio::piped());
    let pinger = pinger.spawn().expect("ping");
    std::thread::sleep(Duration::from_millis(500));
    nodes[0].stop();
    nodes[0].start(&kubeconfig);
    nodes[0].wait_metric("nodus_ready", 1.0);
    nodes[0].wait_metric("nodus_mesh_peers", 2.0);
    let output = pinger.wait_with_output().expect("ping ends");
    let summary = String::from_utf8_lossy(&output.stdout);
    assert!(
        summary.contains(" 0% packet loss"),
        "traffic stopped across the restart:\n{summary}"
    );
    assert_eq!(
        nodes[0].wg_show("latest-handshakes"),
        handshakes,
        "a new handshake after restart"
    );
    assert_eq!(
        nodes[0].published_key(&cluster),
        Some(key_before),
        "the key is stable"
    );
    let log = std::fs::read_to_string(nodes[0].log(1)).expect("log");
    assert!(log.contains("adopting the running wireguard-go"), "{log}");
    assert!(
        !log.contains("mesh synced"),
        "the restart changed something:\n{log}"
    );

    // Node 3 leaves the API: its peer and both its routes go in one sync.
    let changes = nodes[0]
        .metric("nodus_mesh_peer_changes_total")
        .expect("metric");
    cluster
        .store
        .delete("v1", "Node", None, "node-3")
        .expect("delete node-3");
    nodes[0].wait_metric("nodus_mesh_peers", 1.0);
    nodes[0].wait_metric("nodus_mesh_routes", 2.0);
    assert_eq!(
        nodes[0].metric("nodus_mesh_peer_changes_total"),
        Some(changes + 1.0)
    );
    let routes = nodes[0].routes();
    assert!(
        !routes.contains("10.244.3.0/24") && !routes.contains("fd00:10:244:3::/64"),
        "{routes}"
    );
    assert!(
        routes.contains("10.244.2.0/24") && routes.contains("fd00:10:244:2::/64"),
        "{routes}"
    );
    assert!(
        ping(&pods[0], IpAddr::V4(pods[2].v4.expect("v4"))).is_err(),
        "node 3 still reachable"
    );
    let log = std::fs::read_to_string(nodes[0].log(1)).expect("log");
    let syncs: Vec<&str> = log.lines().filter(|l| l.contains("mesh synced")).collect();
    assert_eq!(syncs.len(), 1, "{log}");
    assert!(
        syncs[0].contains("peer_changes: 1") && syncs[0].contains("routes_removed: 2"),
        "{log}"
    );

    // Node 2 rotates its key: node 1 replaces the peer and traffic recovers.
    let old_key = nodes[1].published_key(&cluster).expect("key");
    nodes[1].stop();
    std::fs::remove_file(nodes[1].dir.join("key/wireguard.key")).expect("remove key");
    nodes[1].start(&kubeconfig);
    let new_key = wait_for("node-2's new key", || {
        nodes[1].published_key(&cluster).filter(|k| *k != old_key)
    });
    wait_for("node 1 to peer with the new key", || {
        let peers = nodes[0].wg_show("endpoints");
        (peers.len() == 1 && peers[0].0 == new_key).then_some(())
    });
    wait_for("pod-1 to reach pod-2 again", || {
        ping(&pods[0], IpAddr::V4(pods[1].v4.expect("v4"))).ok()
    });
    assert_eq!(
        who(&pods[0], IpAddr::V6(pods[1].v6.expect("v6"))).expect("TCP"),
        "pod-2"
    );

    // `nodus cleanup` removes the table with the device, the mesh alone having made it.
    nodes[0].stop();
    nodes[0].cleanup();
    assert!(
        nodes[0]
            .node
            .ns
            .ip(&["link", "show", &nodes[0].interface])
            .is_err()
    );
}

/// The embedded backend (boringtun in nodus), beside wireguard-go: node 1 asks for it,
/// node 2 gets it from `auto` (no kernel module, no wireguard-go binary), node 3 runs
/// wireguard-go. Pods cross both kinds of tunnel, and only WireGuard's UDP crosses node
/// 1's underlay. SIGTERM still reaches nodus's own shutdown, which ends within 2 s and
/// takes the embedded device (with its routes and socket) along, while nodus's table
/// stays; the next nodus, with only the DaemonSet's capabilities, creates the device again
/// and traffic resumes after a new handshake. SIGINT too.
#[test]
fn embedded_devices_carry_pods_and_end_with_nodus_on_sigterm() {
    let (_cluster, _underlay, mut nodes, kubeconfig) = three_nodes(
        "mesh-embedded",
        203,
        [
            "  backend: embedded\n",
            "  backend: auto\n  wireguard_go: /nonexistent/wireguard-go\n",
            WIREGUARD_GO,
        ],
    );
    for (node, expected) in nodes.iter().zip([
        "created the embedded WireGuard device",
        "created the embedded WireGuard device",
        "started wireguard-go",
    ]) {
        let log = std::fs::read_to_string(node.log(0)).expect("log");
        assert!(log.contains(expected), "{}: {log}", node.node.name);
    }
    let pods = pod_on_each(&nodes);
    let capture = Capture::start(&nodes[0]);
    pod_1_reaches_pods_2_and_3(&pods);
    capture.only_wireguard();
    // `wg` reads the embedded device over its socket, as nodus's metrics do.
    nodes[0].wait_metric("nodus_mesh_peers_recent_handshake", 2.0);
    assert!(
        nodes[0]
            .metric("nodus_mesh_bytes_total{direction=\"received\"}")
            .unwrap_or(0.0)
            > 0.0
    );
    let handshakes = nodes[0].wg_show("latest-handshakes");
    assert_eq!(handshakes.len(), 2, "{handshakes:?}");
    assert!(handshakes.iter().all(|(_, t)| t != "0"), "{handshakes:?}");

    // SIGTERM: nodus's shutdown runs, and the device goes with the process. A ping at 10
    // per second across the restart shows the outage (printed, not asserted).
    let mut pinger = pods[0].ns.command("ping");
    pinger
        .args(["-i", "0.1", "-c", "60", "-W", "1"])
        .arg(pods[1].v4.expect("v4").to_string())
        .stdout(Stdio::piped());
    let pinger = pinger.spawn().expect("ping");
    std::thread::sleep(Duration::from_millis(500));
    let log = nodes[0].stop_with(libc::SIGTERM);
    assert!(
        log.contains("but for the embedded WireGuard device, which ends with the process"),
        "{log}"
    );
    let interface = nodes[0].interface.clone();
    assert!(nodes[0].node.ns.ip(&["link", "show", &interface]).is_err());
    let socket = format!("/var/run/wireguard/{interface}.sock");
    assert!(!std::path::Path::new(&socket).exists(), "{socket} left");
    nodes[0]
        .node
        .ns
        .exec("nft", &["list", "table", "inet", "nodus"])
        .expect("nodus's table stays");
    // Without the device's routes, node 1 answers that pod 2 is unreachable.
    assert!(ping(&pods[0], IpAddr::V4(pods[1].v4.expect("v4"))).is_err());

    // The next nodus creates the device again: new sessions, traffic back. It runs with
    // only the DaemonSet's capabilities, which cover the TUN, its links and routes.
    nodes[0].launcher = [
        "setpriv",
        "--bounding-set",
        "-all,+net_admin,+net_bind_service",
        "--",
    ]
    .map(String::from)
    .to_vec();
    nodes[0].start(&kubeconfig);
    nodes[0].wait_metric("nodus_mesh_peers", 2.0);
    let pid = nodes[0].pid.expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(
        status.contains("CapEff:\t0000000000001400"),
        "only CAP_NET_ADMIN (12) and CAP_NET_BIND_SERVICE (10):\n{status}"
    );
    pod_1_reaches_pods_2_and_3(&pods);
    let output = pinger.wait_with_output().expect("ping ends");
    let summary = String::from_utf8_lossy(&output.stdout);
    let summary = summary.lines().rev().nth(1).unwrap_or_default();
    println!("ping at 10/s across an embedded restart: {summary}");

    // SIGINT too; then `nodus cleanup` finds only the table and the conflist to remove.
    nodes[0].stop_with(libc::SIGINT);
    assert!(nodes[0].node.ns.ip(&["link", "show", &interface]).is_err());
    println!("{}", nodes[0].cleanup());
    assert!(!nodes[0].conflist().exists());
}

#[test]
fn a_forbidden_patch_names_the_missing_permission_and_is_retried() {
    netns::require_root();
    let underlay = Underlay::new([10, 202, 0], [0xfd00, 0x202, 0, 0]).expect("underlay");
    let cluster = Cluster::new("mesh-rbac", "");
    cluster.apply(node_object("node-1", 1, &underlay));
    cluster.store.forbid("patch", "nodes", true);
    let kubeconfig = cluster.listen_in(&underlay.ns, SocketAddr::from((underlay.v4(1), API_PORT)));
    let mut node = MeshNode::new(&cluster, &underlay, "node-1", 1, WIREGUARD_GO);
    node.start(&kubeconfig);
    wait_for("the RBAC error in the log", || {
        let log = std::fs::read_to_string(node.log(0)).ok()?;
        log.contains("nodus needs RBAC permission to `patch` `nodes`")
            .then_some(log)
    });
    assert_eq!(node.published_key(&cluster), None);
    cluster.store.forbid("patch", "nodes", false);
    let key = wait_for("the key published after the retry", || {
        node.published_key(&cluster)
    });
    assert_eq!(key.len(), 44);
    let patches = cluster.store.patches();
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(patches[0].content_type, "application/merge-patch+json");
    assert_eq!(patches[0].field_manager.as_deref(), Some("nodus"));
    let mode = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).expect("exists").permissions().mode() & 0o777
    };
    assert_eq!(mode(&node.dir.join("key/wireguard.key")), 0o600);
    assert_eq!(mode(&node.dir.join("key")), 0o700);
}

/// Nodes that lie: one claims a range around two real nodes' pod CIDRs, one a range outside
/// the cluster's (8.0.0.0/7, half the Internet), each with a valid key. Both are newer than
/// the real nodes. No node installs a route or a peer for them, and pods keep talking.
#[test]
fn a_rogue_node_claiming_others_ranges_changes_no_route_and_traffic_flows() {
    let (cluster, underlay, nodes, _kubeconfig) = three_nodes(
        "mesh-rogue",
        207,
        [WIREGUARD_GO, WIREGUARD_GO, WIREGUARD_GO],
    );
    let pods = pod_on_each(&nodes);
    pod_1_reaches_pods_2_and_3(&pods);
    let routes: Vec<String> = nodes.iter().map(MeshNode::routes).collect();

    // The API server stamps creation times to the second: the rogues come a second later.
    std::thread::sleep(Duration::from_millis(1100));
    for (name, i, claimed) in [
        (
            "a-rogue-around",
            8,
            json!(["10.244.2.0/23", "fd00:10:244::/56"]),
        ),
        ("a-rogue-outside", 9, json!(["8.0.0.0/7"])),
    ] {
        let key = nodus_mesh::key::KeyPair::generate().expect("key");
        let mut object = node_object(name, i, &underlay);
        object["spec"] = json!({"podCIDRs": claimed});
        object["metadata"]["annotations"] = json!({ANNOTATION_PUBLIC_KEY: key.public.to_base64()});
        cluster.apply(object);
    }
    for node in &nodes {
        wait_for(&format!("{} to refuse both rogues", node.node.name), || {
            let log = std::fs::read_to_string(node.log(0)).ok()?;
            let refused = log
                .lines()
                .filter(|l| l.contains("what it claims is refused"))
                .filter(|l| l.contains("a-rogue-around") || l.contains("a-rogue-outside"))
                .count();
            (refused >= 2).then_some(())
        });
    }
    for (node, before) in nodes.iter().zip(&routes) {
        assert_eq!(&node.routes(), before, "{}", node.node.name);
        assert_eq!(
            node.metric("nodus_mesh_peers"),
            Some(2.0),
            "{}",
            node.node.name
        );
    }
    pod_1_reaches_pods_2_and_3(&pods);

    // node-2, an established peer, adds node-3's address to its own (as a compromised
    // node may, with its kubelet's credentials). Made in the same second and first by
    // name, it would win a tie of age; but node-3's claim is established and node-2's is
    // new, so node-1 keeps node-3 and leaves node-2 out until it drops the address.
    let addresses = |extra: Option<&str>| {
        let mut object = cluster
            .store
            .get("v1", "Node", None, "node-2")
            .expect("node-2");
        let mut listed = object["status"]["addresses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        listed.extend(extra.map(|ip| json!({"type": "ExternalIP", "address": ip})));
        object["status"]["addresses"] = listed.into();
        object
    };
    let original = addresses(None);
    cluster.apply(addresses(Some(&underlay.v4(4).to_string())));
    wait_for(
        "node-1 to refuse node-2's claim on node-3's address",
        || {
            let log = std::fs::read_to_string(nodes[0].log(0)).ok()?;
            log.lines()
                .any(|l| l.contains("what it claims is refused") && l.contains("node-2"))
                .then_some(())
        },
    );
    // The refusal is logged when the plan is made, before the device is synced and the
    // gauge set: wait for the gauge rather than read it once.
    nodes[0].wait_metric("nodus_mesh_peers", 1.0);
    for ip in [
        IpAddr::V4(pods[2].v4.expect("v4")),
        IpAddr::V6(pods[2].v6.expect("v6")),
    ] {
        ping(&pods[0], ip).expect("pod-1 still pings pod-3");
        assert_eq!(who(&pods[0], ip).expect("TCP to pod-3"), "pod-3");
    }
    cluster.apply(original);
    nodes[0].wait_metric("nodus_mesh_peers", 2.0);
    pod_1_reaches_pods_2_and_3(&pods);
}

/// A node on a private LAN (`192.168.{lan}.0/24`) behind a router namespace, at address
/// `router` of the underlay, that masquerades the LAN's traffic onto it and, as home routers
/// do, drops what comes in unasked. The Node's InternalIP is the private address.
fn behind_nat(underlay: &Underlay, name: &str, router: u8, lan: u8) -> (Netns, Node) {
    let router_ns = Netns::new("nat").expect("router namespace");
    underlay
        .attach(&router_ns, router)
        .expect("router on the underlay");
    let host = Netns::new(name).expect("node namespace");
    host.sysctl("net.ipv6.conf.default.accept_dad", "0")
        .expect("sysctl");
    netns::veth(&router_ns, "lan0", &host, "eth0").expect("LAN");
    router_ns
        .ip(&["addr", "add", &format!("192.168.{lan}.1/24"), "dev", "lan0"])
        .expect("router LAN address");
    router_ns
        .sysctl("net.ipv4.ip_forward", "1")
        .expect("sysctl");
    router_ns
        .exec(
            "nft",
            &[&format!(
                "add table ip nat; \
                 add chain ip nat post {{ type nat hook postrouting priority 100; }}; \
                 add rule ip nat post oifname eth0 ip saddr 192.168.{lan}.0/24 masquerade; \
                 add table inet firewall; \
                 add chain inet firewall input {{ type filter hook input priority 0; policy drop; }}; \
                 add rule inet firewall input ct state established,related accept"
            )],
        )
        .expect("the router masquerades the LAN");
    let private = Ipv4Addr::new(192, 168, lan, 2);
    host.ip(&["addr", "add", &format!("{private}/24"), "dev", "eth0"])
        .expect("node address");
    host.ip(&[
        "route",
        "add",
        "default",
        "via",
        &format!("192.168.{lan}.1"),
    ])
    .expect("node default route");
    host.sysctl("net.ipv4.ip_forward", "1").expect("sysctl");
    host.sysctl("net.ipv6.conf.all.forwarding", "1")
        .expect("sysctl");
    let node = Node {
        ns: host,
        name: name.into(),
        v4: private,
        v6: format!("fd00:{lan}::2").parse().expect("v6"),
    };
    (router_ns, node)
}

/// Nodes behind NATs that the others cannot reach first: nodes 3 and 4 each sit on a
/// private LAN behind a router of their own ([`behind_nat`]). Their keepalives open their
/// NATs, nodes 1 and 2 learn the routers' addresses from their packets, keep them across
/// their polls and report them (`nodus.dev/wireguard-peer-endpoints`); nodes 3 and 4, with
/// `mesh.endpoint: learned`, publish what is reported and so reach each other through both
/// NATs. Pods are reached both ways, between the NATed nodes too.
#[test]
fn nodes_behind_nats_learn_their_address_and_their_pods_are_reached_both_ways() {
    netns::require_root();
    let underlay = Underlay::new([10, 204, 0], [0xfd00, 204, 0, 0]).expect("underlay");
    let (router_3, behind_3) = behind_nat(&underlay, "node-3", 10, 204);
    let (router_4, behind_4) = behind_nat(&underlay, "node-4", 11, 205);

    let cluster = Cluster::new("mesh-nat", "");
    for i in 1..=2 {
        cluster.apply(node_object(&format!("node-{i}"), i, &underlay));
    }
    for (i, node) in [(3, &behind_3), (4, &behind_4)] {
        cluster.apply(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.name},
            "spec": {"podCIDR": v4_cidr(i), "podCIDRs": [v4_cidr(i)]},
            "status": {"addresses": [{"type": "InternalIP", "address": node.v4.to_string()}]},
        }));
    }
    let kubeconfig = cluster.listen_in(&underlay.ns, SocketAddr::from((underlay.v4(1), API_PORT)));
    let mut nodes: Vec<MeshNode> = (1..=2)
        .map(|i| MeshNode::new(&cluster, &underlay, &format!("node-{i}"), i, WIREGUARD_GO))
        .collect();
    let learned = format!("{WIREGUARD_GO}  endpoint: learned\n");
    nodes.push(MeshNode::on(&cluster, behind_3, &learned));
    nodes.push(MeshNode::on(&cluster, behind_4, &learned));
    for node in &mut nodes {
        node.start(&kubeconfig);
    }
    for node in &nodes {
        node.wait_metric("nodus_mesh_peers", 3.0);
    }
    let pods = pod_on_each(&nodes);
    let v4 = |pod: &Pod| IpAddr::V4(pod.v4.expect("v4"));
    let (pod_1, pod_3, pod_4) = (v4(&pods[0]), v4(&pods[2]), v4(&pods[3]));
    wait_for("pod-1 pings pod-3 behind the NAT", || {
        ping(&pods[0], pod_3).ok()
    });
    assert_eq!(
        who(&pods[0], pod_3).expect("TCP to the NATed node"),
        "pod-3"
    );
    assert_eq!(
        who(&pods[2], pod_1).expect("TCP from the NATed node"),
        "pod-1"
    );

    // Node 1 reaches node 3 at the router's address, which it learned, not at the private
    // one node 3 first published; its polls (every 10 s) keep it.
    let key_3 = nodes[2].published_key(&cluster).expect("node 3's key");
    let router_3_address = underlay.v4(10).to_string();
    let endpoint_of_3 = |on: &MeshNode| {
        on.wg_show("endpoints")
            .into_iter()
            .find(|(key, _)| *key == key_3)
            .map(|(_, endpoint)| endpoint)
            .unwrap_or_default()
    };
    for _ in 0..12 {
        let endpoint = endpoint_of_3(&nodes[0]);
        assert!(
            endpoint.starts_with(&format!("{router_3_address}:")),
            "node 1 sends to node 3 at {endpoint}, not through the NAT"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(who(&pods[0], pod_3).expect("TCP after a poll"), "pod-3");

    // Nodes 1 and 2 report where the NATed nodes' packets come from; nodes 3 and 4 publish
    // it (only a report can have told them), and the reports then stop: a settled mesh's
    // reports are empty. Either hub may be the one that reported, or both.
    let annotation = |node: &str, name: &str| {
        let object = cluster.store.get("v1", "Node", None, node)?;
        object["metadata"]["annotations"][name]
            .as_str()
            .map(str::to_string)
    };
    let publishes_router = |node: &str, router: String| {
        wait_for(
            &format!("{node} publishes the address its peers see"),
            || {
                annotation(node, ANNOTATION_ENDPOINT)
                    .filter(|endpoint| endpoint.starts_with(&format!("{router}:")))
            },
        )
    };
    let published_3 = publishes_router("node-3", router_3_address.clone());
    publishes_router("node-4", underlay.v4(11).to_string());
    wait_for(
        "nodes 1 and 2 report nothing once nodes 3 and 4 publish",
        || {
            ["node-1", "node-2"]
                .iter()
                .all(|hub| {
                    annotation(hub, ANNOTATION_PEER_ENDPOINTS)
                        .unwrap_or_default()
                        .is_empty()
                })
                .then_some(())
        },
    );
    // Through both NATs: each NATed node sends to the other's mapping, which opens its
    // own router for the other's packets.
    wait_for("pod-3 pings pod-4 behind the other NAT", || {
        ping(&pods[2], pod_4).ok()
    });
    assert_eq!(who(&pods[2], pod_4).expect("TCP across both NATs"), "pod-4");
    assert_eq!(
        who(&pods[3], pod_3).expect("TCP back across both NATs"),
        "pod-3"
    );
    assert_eq!(endpoint_of_3(&nodes[3]), published_3);

    // Keepalives are set on every peer.
    let keepalives = nodes[2].wg_show("persistent-keepalive");
    assert!(
        keepalives.len() == 3 && keepalives.iter().all(|(_, every)| every == "25"),
        "{keepalives:?}"
    );
    for node in &mut nodes {
        node.stop();
    }
    drop((router_3, router_4));
}
