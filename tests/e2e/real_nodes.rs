//! Real nodes: kubelets with containerd, on a real control plane, make their pods through
//! `nodus-cni`, and nodus is each node's only network component (service proxy, DNS, the
//! WireGuard mesh and NetworkPolicy), installed as a user installs it: the replacement
//! overlay's DaemonSet, from a nodus image each node's containerd imported.
//!
//! The control plane runs on this namespace's loopback; the nodes sit on an underlay (a
//! bridge in a namespace of its own) and reach the API server through a relay on the
//! underlay's `.1`, as kubelets reach a load balancer. The API server reaches the kubelets
//! (`kubectl exec`, `logs`) through its egress selector: an HTTP CONNECT proxy that dials
//! into the underlay, which has a route to each node's pods for the API server's pod and
//! service proxies.

use crate::support::wait_within;
use nodus_testbed::control_plane::{ControlPlane, ControlPlaneConfig, EgressProxy, Relay};
use nodus_testbed::interrupt;
use nodus_testbed::kubelet::{KubeletNode, KubeletNodeConfig, NodeBinaries};
use nodus_testbed::netns::{self, Node, Underlay};
use nodus_testbed::nodus_image::{self, NODUS_IMAGE_NAME, NODUS_IMAGE_TAG};
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

pub(crate) const CLUSTER_DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// How long a node may take to register and turn Ready, and a pod to run: the first start
/// of containerd and the kubelet on a loaded 2-core machine.
const NODE_LIMIT: Duration = Duration::from_secs(180);

/// One real node: its namespace, and containerd with the kubelet, which run nodus's
/// DaemonSet pod and the test's pods.
pub(crate) struct RealNode {
    /// Dropped first: the kubelet and the pods, then the namespace.
    kubelet: Option<KubeletNode>,
    pub(crate) node: Node,
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.kubelet.take();
    }
}

/// One of nodus's overlays (`deploy/overlays/<name>`) as a user installs it: copied, the
/// values its comments say CHANGE changed (the API server's address and the cluster DNS IP
/// where it has them, the pod ranges), and the image set (`kustomize edit set image`) to the
/// one each node imported. Returns the copy's directory.
pub(crate) fn write_overlay(dir: &Path, name: &str, api: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/overlays")
        .join(name);
    let overlay = dir.join(format!("overlay-{name}"));
    std::fs::create_dir_all(&overlay).expect("overlay dir");
    // Kustomize takes no absolute path: the base, relative to the copy.
    let base = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/base")
        .canonicalize()
        .expect("deploy/base");
    let up = "../".repeat(overlay.components().count() - 1);
    let cidrs = nodus_testbed::control_plane::CLUSTER_CIDRS.replace(',', "\", \"");
    let edits = [
        (
            "  - ../../base\n".to_string(),
            format!(
                "  - {up}{}\n",
                base.display().to_string().trim_start_matches('/')
            ),
        ),
        (
            "api_server=https://control-plane.invalid:6443".to_string(),
            format!("api_server={api}"),
        ),
        (
            "dns_cluster_ip=10.96.0.10".to_string(),
            format!("dns_cluster_ip={CLUSTER_DNS}"),
        ),
        (
            "cluster_cidrs: [\"10.244.0.0/16\"]".to_string(),
            format!("cluster_cidrs: [\"{cidrs}\"]"),
        ),
    ];
    for entry in std::fs::read_dir(&source).expect("the overlay") {
        let path = entry.expect("an overlay file").path();
        let mut text = std::fs::read_to_string(&path).expect("overlay file");
        for (from, to) in &edits {
            text = text.replace(from, to);
        }
        if path.file_name().is_some_and(|f| f == "kustomization.yaml") {
            text.push_str(&format!(
                "images:\n  - name: nodus\n    newName: {NODUS_IMAGE_NAME}\n    newTag: {NODUS_IMAGE_TAG}\n"
            ));
        }
        std::fs::write(overlay.join(path.file_name().expect("a file name")), text)
            .expect("overlay file");
    }
    overlay
}

/// The network a cluster's nodes start with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartingNetwork {
    /// nodus alone, from the replacement overlay (`deploy/overlays/replace`).
    Nodus,
    /// As a kubeadm cluster that adopted nodus's pod network first: kubeadm's kube-proxy
    /// (nftables mode) and CoreDNS (`migration/kubeadm-addons.yaml`), and nodus from the
    /// mesh-only overlay as the CNI.
    KubeProxyAndCoreDns,
}

pub(crate) fn pod(
    name: &str,
    node: &str,
    labels: serde_json::Value,
    args: &[&str],
) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "agnhost",
                "image": "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
                "imagePullPolicy": "Never",
                "args": args,
            }],
            "terminationGracePeriodSeconds": 1,
        },
    })
}

/// Two `netexec` servers, `web-1` on node-1 and `web-2` on node-2, behind the Service
/// `web` (port 80, which answers `/hostname` with the pod's name), and a `pause` pod for
/// each `(name, node)` of `clients`. Returns once every one of them is ready.
pub(crate) fn start_web_and_clients(plane: &ControlPlane, clients: &[(&str, &str)]) {
    let web = json!({"app": "web"});
    let mut objects = vec![
        pod(
            "web-1",
            "node-1",
            web.clone(),
            &["netexec", "--http-port=8080"],
        ),
        pod("web-2", "node-2", web, &["netexec", "--http-port=8080"]),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        }),
    ];
    for (name, node) in clients {
        objects.push(pod(name, node, json!({"app": "client"}), &["pause"]));
    }
    plane
        .apply(&objects)
        .expect("the pods and the Service apply");
    let names = clients.iter().map(|(name, _)| *name);
    for name in ["web-1", "web-2"].into_iter().chain(names) {
        wait_field(
            plane,
            &["get", "pod", name],
            "{.status.containerStatuses[0].ready}",
            &format!("{name} running"),
        );
    }
}

/// `jsonpath` of an object, once it is not empty.
fn wait_field(plane: &ControlPlane, args: &[&str], jsonpath: &str, what: &str) -> String {
    let mut full: Vec<&str> = args.to_vec();
    let output = format!("jsonpath={jsonpath}");
    full.extend(["-o", &output]);
    wait_within(what, NODE_LIMIT, || {
        plane
            .kubectl(&full)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    })
}

/// A cluster of real nodes: the control plane, the underlay, and the nodes. Dropped in
/// this order: the nodes (their pods, nodus, their namespaces), then the relay, the control
/// plane, the egress proxy and the underlay.
pub(crate) struct KubeletCluster {
    pub(crate) nodes: Vec<RealNode>,
    _relay: Relay,
    pub(crate) plane: ControlPlane,
    _egress: EgressProxy,
    underlay: Underlay,
    pub(crate) dir: PathBuf,
    /// The API server's address on the underlay, as the nodes reach it.
    pub(crate) api: String,
}

impl KubeletCluster {
    /// `count` nodes (`node-1`, …) on the underlay 10.`subnet`.0.0/24, each Ready, with
    /// `network`'s DaemonSets rolled out.
    pub(crate) fn start(
        tag: &str,
        subnet: u8,
        count: u8,
        network: StartingNetwork,
    ) -> KubeletCluster {
        netns::require_root();
        let mut binaries =
            NodeBinaries::get().expect("kubelet, containerd and the images are built");
        let dir: PathBuf =
            std::env::temp_dir().join(format!("nodus-e2e-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let underlay =
            Underlay::new([10, subnet, 0], [0xfd00, u16::from(subnet), 0, 0]).expect("underlay");
        let egress =
            EgressProxy::start(&dir.join("egress.sock"), underlay.ns.name()).expect("egress proxy");
        let plane = ControlPlane::start(
            &dir.join("control-plane"),
            &ControlPlaneConfig {
                advertise: IpAddr::V4(underlay.v4(1)),
                cluster_egress: Some(egress.socket.clone()),
                kubelets: true,
                ..ControlPlaneConfig::default()
            },
        )
        .expect("the control plane starts");
        let relay = Relay::in_namespace(
            &underlay.ns,
            // The API server's own port, which the `kubernetes` Service's endpoint names with
            // the advertised address: pods reach the API server through it too.
            SocketAddr::from((underlay.v4(1), plane.api_addr().port())),
            plane.api_addr(),
        )
        .expect("relay");
        let api = format!("https://{}:{}", underlay.v4(1), plane.api_addr().port());
        // nodus as its DaemonSet from the image each node imports before its kubelet starts.
        binaries
            .images
            .push(nodus_image::make_archive(&dir).expect("the nodus image"));
        let overlay = match network {
            StartingNetwork::Nodus => "replace",
            StartingNetwork::KubeProxyAndCoreDns => {
                plane
                    .apply_yaml(&kubeadm_addons(&plane, &api))
                    .expect("kube-proxy and CoreDNS apply");
                "mesh-only"
            }
        };
        let overlay = write_overlay(&dir, overlay, &api);
        plane
            .kubectl(&["apply", "-k", &overlay.to_string_lossy()])
            .expect("nodus's overlay applies");
        let nodes = (1..=count)
            .map(|i| start_node(&plane, &underlay, &dir, &binaries, &api, i))
            .collect();
        let cluster = KubeletCluster {
            nodes,
            _relay: relay,
            plane,
            _egress: egress,
            underlay,
            dir,
            api,
        };
        cluster.rolled_out("daemonset/nodus");
        if network == StartingNetwork::KubeProxyAndCoreDns {
            cluster.rolled_out("daemonset/kube-proxy");
        }
        for node in &cluster.nodes {
            let name = &node.node.name;
            wait_within(&format!("{name} Ready"), NODE_LIMIT, || {
                let status = cluster
                    .plane
                    .kubectl(&[
                        "get",
                        "node",
                        name,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                    ])
                    .ok()?;
                (status.trim() == "True").then_some(())
            });
            // The API server's pod and service proxies dial pods from the underlay (its
            // egress): a route to each node's pods, as a cluster's hosts have.
            let cidr = wait_field(
                &cluster.plane,
                &["get", "node", name],
                "{.spec.podCIDR}",
                "podCIDR",
            );
            cluster
                .underlay
                .ns
                .ip(&["route", "add", &cidr, "via", &node.node.v4.to_string()])
                .expect("a route to the node's pods");
        }
        if network == StartingNetwork::KubeProxyAndCoreDns {
            // On the pod network, which the Nodes' readiness waited for.
            cluster.rolled_out("deployment/coredns");
        }
        cluster
    }

    /// Waits until `workload` (in kube-system) has rolled out.
    pub(crate) fn rolled_out(&self, workload: &str) {
        let rollout = self.plane.kubectl(&[
            "rollout",
            "status",
            workload,
            "-n",
            "kube-system",
            &format!("--timeout={}s", NODE_LIMIT.as_secs()),
        ]);
        if let Err(error) = rollout {
            panic!("{workload} rolls out: {error:#}\n{}", self.network_logs());
        }
    }
}

/// `migration/kubeadm-addons.yaml` with this cluster's values.
fn kubeadm_addons(plane: &ControlPlane, api: &str) -> String {
    let version: serde_json::Value = serde_json::from_str(
        &plane
            .kubectl(&["version", "-o", "json"])
            .expect("the server's version"),
    )
    .expect("kubectl version's JSON");
    let version = version["serverVersion"]["gitVersion"]
        .as_str()
        .expect("the server's gitVersion");
    let coredns_mod = Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/coredns/go.mod");
    let coredns = std::fs::read_to_string(&coredns_mod)
        .expect("k8s/coredns/go.mod")
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("github.com/coredns/coredns ")
                .map(|rest| {
                    rest.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string()
                })
        })
        .expect("CoreDNS's version in k8s/coredns/go.mod");
    include_str!("migration/kubeadm-addons.yaml")
        .replace("@API_SERVER@", api)
        .replace(
            "@CLUSTER_CIDRS@",
            nodus_testbed::control_plane::CLUSTER_CIDRS,
        )
        .replace("@DNS_IP@", &CLUSTER_DNS.to_string())
        .replace(
            "@KUBE_PROXY_IMAGE@",
            &format!("registry.k8s.io/kube-proxy:{version}"),
        )
        .replace(
            "@COREDNS_IMAGE@",
            &format!("registry.k8s.io/coredns/coredns:{coredns}"),
        )
}

impl KubeletCluster {
    /// The last lines of the logs of the network's pods (nodus's, and kube-proxy's and
    /// CoreDNS's where they run), for a failure's message.
    fn network_logs(&self) -> String {
        ["app.kubernetes.io/name=nodus", "k8s-app"]
            .iter()
            .map(|selector| {
                self.plane
                    .kubectl(&[
                        "logs",
                        "-n",
                        "kube-system",
                        "-l",
                        selector,
                        "--all-containers",
                        "--prefix",
                        "--tail=30",
                    ])
                    .unwrap_or_else(|error| format!("no logs of {selector}: {error:#}"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for KubeletCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.network_logs());
        }
        self.nodes.clear();
        if std::thread::panicking() {
            eprintln!("logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Node `node-<i>` at the underlay's `.1<i>` in zone `zone-<i>`, with its kubelet: nodus's
/// DaemonSet then runs on it.
fn start_node(
    plane: &ControlPlane,
    underlay: &Underlay,
    dir: &Path,
    binaries: &NodeBinaries,
    api: &str,
    i: u8,
) -> RealNode {
    let name = format!("node-{i}");
    let node = Node::new(underlay, &name, 10 + i).expect("node namespace");
    node.ns
        .ip(&[
            "route",
            "add",
            "default",
            "via",
            &underlay.v4(1).to_string(),
        ])
        .expect("default route");
    let node_dir = dir.join(&name);
    let credentials = plane
        .kubelet_credentials(&name, IpAddr::V4(node.v4), api)
        .expect("kubelet credentials");
    let kubelet = KubeletNode::start(
        &KubeletNodeConfig {
            name: &name,
            netns: node.ns.name(),
            ip: IpAddr::V4(node.v4),
            dir: &node_dir.join("kubelet"),
            credentials: &credentials,
            cni_conf_dir: &node_dir.join("net.d"),
            cni_bin_dir: &node_dir.join("cni-bin"),
            cluster_dns: IpAddr::V4(CLUSTER_DNS),
            // A zone of its own: the topology and traffic distribution specs need them.
            zone: &format!("zone-{i}"),
        },
        binaries,
    )
    .unwrap_or_else(|error| panic!("{name}'s kubelet starts: {error:#}"));
    RealNode {
        kubelet: Some(kubelet),
        node,
    }
}

#[test]
fn two_kubelets_run_pods_through_nodus_cni_and_nodus_carries_their_traffic() {
    let cluster = KubeletCluster::start("real-nodes", 78, 2, StartingNetwork::Nodus);
    let plane = &cluster.plane;

    // Two servers, one on each node, behind a Service; a client on node-1.
    start_web_and_clients(plane, &[("client", "node-1")]);
    let mut ips = Vec::new();
    for (name, node) in [
        ("web-1", "node-1"),
        ("web-2", "node-2"),
        ("client", "node-1"),
    ] {
        let ip = wait_field(plane, &["get", "pod", name], "{.status.podIP}", "pod IP");
        let cidr = wait_field(plane, &["get", "node", node], "{.spec.podCIDR}", "podCIDR");
        let ip: Ipv4Addr = ip.parse().expect("an IPv4 pod address");
        let network: nodus_view::model::Cidr = cidr.parse().expect("a CIDR");
        assert!(
            network.contains(IpAddr::V4(ip)),
            "{name} at {ip}: nodus-cni gives addresses from {node}'s {cidr}"
        );
        ips.push(ip);
    }

    // Through the API server's egress and the kubelet's exec: from the client on node-1,
    // the pod on node-2 across the mesh, and the Service by name (DNS, then the proxy).
    let fetch = |url: String| -> Option<String> {
        match plane.kubectl(&["exec", "client", "--", "curl", "-sS", "-m", "5", &url]) {
            Ok(body) => Some(body.trim().to_string()),
            Err(error) => {
                eprintln!("curl {url} in client: {error:#}");
                None
            }
        }
    };
    let across = wait_within("web-2 across the mesh", Duration::from_secs(60), || {
        fetch(format!("http://{}:8080/hostname", ips[1]))
    });
    assert_eq!(across, "web-2");
    let mut seen = std::collections::BTreeSet::new();
    wait_within(
        "both pods behind the Service by name",
        Duration::from_secs(60),
        || {
            seen.insert(fetch(
                "http://web.default.svc.cluster.local/hostname".into(),
            )?);
            (seen.len() == 2).then_some(())
        },
    );
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["web-1", "web-2"],
        "the Service's endpoints on both nodes answer through nodus's proxy"
    );
    let logs = plane
        .kubectl(&["logs", "web-2"])
        .expect("kubectl logs through the egress");
    assert!(logs.contains("/hostname"), "{logs}");

    agent_gone_keeps_the_node_ready(&cluster, 1);

    // The upstream suite's own judgement, on the same cluster: its smoke specs.
    let report = cluster.dir.join("e2e");
    let status = run_upstream(&cluster, &smoke_focus(), "", &report);
    let log = std::fs::read_to_string(report.join("e2e.log")).unwrap_or_default();
    let ran = log.lines().rev().find(|l| l.contains("Ran ")).unwrap_or("");
    assert!(status.success(), "e2e.test {status}: {ran}\n{log}");
    assert!(
        ran.contains(&format!("Ran {} of", SMOKE_SPECS.len())),
        "{ran}"
    );
}

/// Node `index`'s agent stops answering at its isolation gate (its socket moved away, as
/// when it crashes or is OOM-killed): containerd asks nodus-cni's `STATUS` for the kubelet
/// every few seconds, and it goes on passing, since the agent answered on this boot, so
/// the node stays Ready and keeps its pods. The control: with that memory gone too (as
/// after a reboot) the node turns NotReady, so `STATUS` really is asked; both back, it is
/// Ready again.
fn agent_gone_keeps_the_node_ready(cluster: &KubeletCluster, index: usize) {
    let node = &cluster.nodes[index];
    let name = format!("node-{}", index + 1);
    let conflist = cluster.dir.join(&name).join("net.d/00-nodus.conflist");
    let text = std::fs::read_to_string(&conflist).expect("nodus's conflist");
    let version =
        serde_json::from_str::<serde_json::Value>(&text).expect("JSON")["cniVersion"].clone();
    assert_eq!(version, "1.1.0", "STATUS is asked: {text}");
    let kubelet = node.kubelet.as_ref().expect("the node runs");
    let run = |args: &[&str]| {
        kubelet
            .exec(args[0], &args[1..])
            .unwrap_or_else(|error| panic!("{args:?} on {name}: {error:#}"));
    };
    let ready = || {
        cluster
            .plane
            .kubectl(&[
                "get",
                "node",
                &name,
                "-o",
                r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
            ])
            .unwrap_or_default()
    };
    let socket = "/run/nodus/cni.sock";
    let answered = format!("{socket}.answered");
    run(&["test", "-e", &answered]);
    run(&["mv", socket, "/run/nodus/away.sock"]);
    // containerd's poll is every 5 s and the kubelet's status every 10 s: 40 s covers both
    // several times over.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while std::time::Instant::now() < deadline {
        assert_eq!(ready(), "True", "{name} stays Ready without its agent");
        std::thread::sleep(Duration::from_secs(2));
    }
    run(&["mv", &answered, "/run/nodus/away.answered"]);
    wait_within(
        "the node NotReady once STATUS fails",
        Duration::from_secs(90),
        || (ready() == "False").then_some(()),
    );
    run(&["mv", "/run/nodus/away.sock", socket]);
    run(&["mv", "/run/nodus/away.answered", &answered]);
    wait_within("the node Ready again", Duration::from_secs(90), || {
        (ready() == "True").then_some(())
    });
}

/// Ten upstream `[sig-network]` specs that need nothing this machine lacks, one or more
/// for each of nodus's jobs (the service proxy, DNS, the pod network, NetworkPolicy) and
/// for the API server's paths to pods: run by the suite after its own checks, and by
/// `k8s/conformance.sh smoke`.
const SMOKE_SPECS: [&str; 10] = [
    r"Services should serve a basic endpoint from pods \[Conformance\]",
    r"Services should serve multiport endpoints from pods \[Conformance\]",
    r"Services should find a service from listing all namespaces \[Conformance\]",
    r"Services should be able to change the type from ExternalName to ClusterIP \[Conformance\]",
    r"Networking Granular Checks: Pods should function for intra-pod communication: http",
    r"Networking Granular Checks: Pods should function for node-pod communication: udp",
    r"DNS should provide DNS for the cluster \[Conformance\]",
    r"DNS should provide DNS for pods for Subdomain \[Conformance\]",
    r"Proxy version v1 A set of valid responses are returned for both pod and service Proxy \[Conformance\]",
    r"Netpol NetworkPolicy between server and client should enforce policy to allow ingress traffic from pods in all namespaces",
];

/// [`SMOKE_SPECS`] as ginkgo's focus.
fn smoke_focus() -> String {
    format!(r"\[sig-network\] ({})", SMOKE_SPECS.join("|"))
}

/// Runs `e2e.test` (built from the same Kubernetes module) against `cluster` with ginkgo's
/// `focus` and `skip`, its JUnit report written to `report`.
fn run_upstream(
    cluster: &KubeletCluster,
    focus: &str,
    skip: &str,
    report: &Path,
) -> std::process::ExitStatus {
    std::fs::create_dir_all(report).expect("report dir");
    let bin = nodus_testbed::control_plane::binaries().expect("the Kubernetes binaries");
    let mut e2e = std::process::Command::new(bin.join("e2e.test"));
    e2e.args([
        "--provider=skeleton",
        "--disable-log-dump=true",
        "--ginkgo.timeout=6h",
        "--ginkgo.no-color",
        "--ginkgo.v",
    ])
    .arg(format!(
        "--kubeconfig={}",
        cluster.plane.admin_kubeconfig.display()
    ))
    .arg(format!("--num-nodes={}", cluster.nodes.len()))
    .arg(format!("--kubectl-path={}", bin.join("kubectl").display()))
    .arg(format!("--report-dir={}", report.display()))
    .arg(format!("--ginkgo.focus={focus}"))
    .arg(format!("--ginkgo.skip={skip}"))
    .env("KUBERNETES_CONFORMANCE_TEST", "y")
    .current_dir(report)
    .stdout(std::fs::File::create(report.join("e2e.log")).expect("log"))
    .stderr(Stdio::inherit());
    interrupt::run(&mut e2e).expect("e2e.test runs")
}

/// The upstream e2e suites against a cluster of real nodes (two, or `NODUS_E2E_NODES`)
/// with nodus as its only network component, for `k8s/conformance.sh`, which names the
/// specs (`NODUS_E2E_FOCUS`, `NODUS_E2E_SKIP`: ginkgo's regular expressions; no focus: the
/// smoke specs) and the report's directory (`NODUS_E2E_REPORT_DIR`). Hours long, so not in
/// the suite.
#[test]
#[ignore = "hours long: k8s/conformance.sh runs it"]
fn upstream_e2e_suite() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let report = PathBuf::from(var("NODUS_E2E_REPORT_DIR"));
    assert!(
        report.is_absolute(),
        "NODUS_E2E_REPORT_DIR names the report's directory"
    );
    let focus = match var("NODUS_E2E_FOCUS") {
        focus if focus.is_empty() => smoke_focus(),
        focus => focus,
    };
    // A Ctrl-C stops e2e.test (which removes its namespaces), then the cluster is removed.
    interrupt::catch().expect("signal handlers");
    // Three nodes (three zones) for the traffic distribution specs.
    let nodes = match var("NODUS_E2E_NODES") {
        count if count.is_empty() => 2,
        count => count.parse().expect("NODUS_E2E_NODES is a number of nodes"),
    };
    let cluster = KubeletCluster::start("upstream", 79, nodes, StartingNetwork::Nodus);
    let status = run_upstream(&cluster, &focus, &var("NODUS_E2E_SKIP"), &report);
    assert!(
        status.success(),
        "e2e.test: {status} (report in {})",
        report.display()
    );
}
