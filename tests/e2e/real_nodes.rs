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
use nodus_testbed::kubelet::{KubeletNode, KubeletNodeConfig, NodeBinaries};
use nodus_testbed::netns::{self, Node, Underlay};
use nodus_testbed::nodus_image::{self, NODUS_IMAGE_NAME, NODUS_IMAGE_TAG};
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

const API_PORT: u16 = 6443;
const CLUSTER_DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// How long a node may take to register and turn Ready, and a pod to run: the first start
/// of containerd and the kubelet on a loaded 2-core machine.
const NODE_LIMIT: Duration = Duration::from_secs(180);

/// One real node: its namespace, and containerd with the kubelet, which run nodus's
/// DaemonSet pod and the test's pods.
struct RealNode {
    /// Dropped first: the kubelet and the pods, then the namespace.
    kubelet: Option<KubeletNode>,
    node: Node,
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.kubelet.take();
    }
}

/// The replacement overlay (`deploy/overlays/replace`) as a user installs it: copied, its
/// two values and its pod ranges changed where its comments say CHANGE, and the image set
/// (`kustomize edit set image`) to the one each node imported. Returns the copy's directory.
fn write_overlay(dir: &Path, api: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/overlays/replace");
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base");
    let overlay = dir.join("overlay");
    std::fs::create_dir_all(&overlay).expect("overlay dir");
    let read = |file: &str| std::fs::read_to_string(source.join(file)).expect("overlay file");
    let edit = |text: String, from: &str, to: &str| {
        assert!(text.contains(from), "the overlay has {from:?}");
        text.replace(from, to)
    };
    let mut kustomization = read("kustomization.yaml");
    // Kustomize takes no absolute path: the base, relative to the copy.
    let base = base.canonicalize().expect("deploy/base");
    let up = "../".repeat(overlay.components().count() - 1);
    kustomization = edit(
        kustomization,
        "  - ../../base\n",
        &format!(
            "  - {up}{}\n",
            base.display().to_string().trim_start_matches('/')
        ),
    );
    kustomization = edit(
        kustomization,
        "api_server=https://control-plane.invalid:6443",
        &format!("api_server={api}"),
    );
    kustomization = edit(
        kustomization,
        "dns_cluster_ip=10.96.0.10",
        &format!("dns_cluster_ip={CLUSTER_DNS}"),
    );
    kustomization.push_str(&format!(
        "images:\n  - name: nodus\n    newName: {NODUS_IMAGE_NAME}\n    newTag: {NODUS_IMAGE_TAG}\n"
    ));
    let cidrs = nodus_testbed::control_plane::CLUSTER_CIDRS.replace(',', "\", \"");
    let config = edit(
        read("nodus.yaml"),
        "cluster_cidrs: [\"10.244.0.0/16\"]",
        &format!("cluster_cidrs: [\"{cidrs}\"]"),
    );
    std::fs::write(overlay.join("kustomization.yaml"), kustomization).expect("kustomization");
    std::fs::write(overlay.join("nodus.yaml"), config).expect("nodus.yaml");
    std::fs::write(overlay.join("kube-dns.yaml"), read("kube-dns.yaml")).expect("kube-dns");
    overlay
}

fn pod(name: &str, node: &str, labels: serde_json::Value, args: &[&str]) -> serde_json::Value {
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
struct KubeletCluster {
    nodes: Vec<RealNode>,
    _relay: Relay,
    plane: ControlPlane,
    _egress: EgressProxy,
    underlay: Underlay,
    dir: PathBuf,
}

impl KubeletCluster {
    /// `count` nodes (`node-1`, …) on the underlay 10.`subnet`.0.0/24, each Ready.
    fn start(tag: &str, subnet: u8, count: u8) -> KubeletCluster {
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
            SocketAddr::from((underlay.v4(1), API_PORT)),
            plane.api_addr(),
        )
        .expect("relay");
        let api = format!("https://{}:{API_PORT}", underlay.v4(1));
        // nodus as its DaemonSet from the image each node imports before its kubelet starts.
        binaries
            .images
            .push(nodus_image::make_archive(&dir).expect("the nodus image"));
        let overlay = write_overlay(&dir, &api);
        plane
            .kubectl(&["apply", "-k", &overlay.to_string_lossy()])
            .expect("the replacement overlay applies");
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
        };
        let rollout = cluster.plane.kubectl(&[
            "rollout",
            "status",
            "daemonset/nodus",
            "-n",
            "kube-system",
            &format!("--timeout={}s", NODE_LIMIT.as_secs()),
        ]);
        if let Err(error) = rollout {
            panic!(
                "nodus's DaemonSet rolls out: {error:#}\n{}",
                cluster.nodus_logs()
            );
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
        cluster
    }
}

impl KubeletCluster {
    /// The last lines of every nodus pod's log, for a failure's message.
    fn nodus_logs(&self) -> String {
        self.plane
            .kubectl(&[
                "logs",
                "-n",
                "kube-system",
                "-l",
                "app.kubernetes.io/name=nodus",
                "--all-containers",
                "--prefix",
                "--tail=40",
            ])
            .unwrap_or_else(|error| format!("no nodus logs: {error:#}"))
    }
}

impl Drop for KubeletCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.nodus_logs());
        }
        self.nodes.clear();
        if std::thread::panicking() {
            eprintln!("logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Node `node-<i>` at the underlay's `.1<i>`, with its kubelet: nodus's DaemonSet then
/// runs on it.
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
    let cluster = KubeletCluster::start("real-nodes", 78, 2);
    let plane = &cluster.plane;

    // Two servers, one on each node, behind a Service; a client on node-1.
    let web = json!({"app": "web"});
    plane
        .apply(&[
            pod(
                "web-1",
                "node-1",
                web.clone(),
                &["netexec", "--http-port=8080"],
            ),
            pod("web-2", "node-2", web, &["netexec", "--http-port=8080"]),
            pod("client", "node-1", json!({"app": "client"}), &["pause"]),
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"},
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
            }),
        ])
        .expect("the pods and the Service apply");
    let mut ips = Vec::new();
    for (name, node) in [
        ("web-1", "node-1"),
        ("web-2", "node-2"),
        ("client", "node-1"),
    ] {
        wait_field(
            plane,
            &["get", "pod", name],
            "{.status.containerStatuses[0].ready}",
            &format!("{name} running"),
        );
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

    // The upstream suite's own judgement, on the same cluster: its smoke specs.
    let report = cluster.dir.join("e2e");
    let status = run_upstream(&cluster, SMOKE_FOCUS, "", &report);
    let log = std::fs::read_to_string(report.join("e2e.log")).unwrap_or_default();
    let ran = log.lines().rev().find(|l| l.contains("Ran ")).unwrap_or("");
    assert!(status.success(), "e2e.test {status}: {ran}\n{log}");
    assert!(ran.contains("Ran 5 of"), "{ran}");
}

/// A handful of the upstream `[sig-network]` Conformance specs, which need nothing this
/// machine lacks: run by the suite after its own checks, and by `k8s/conformance.sh smoke`.
const SMOKE_FOCUS: &str = r"\[sig-network\] (Services should serve a basic endpoint from pods|Services should serve multiport endpoints from pods|Services should find a service from listing all namespaces|Networking Granular Checks: Pods should function for intra-pod communication: http|Networking Granular Checks: Pods should function for node-pod communication: udp).*\[Conformance\]";

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
    std::process::Command::new(bin.join("e2e.test"))
        .args([
            "--provider=skeleton",
            "--num-nodes=2",
            "--disable-log-dump=true",
            "--ginkgo.timeout=6h",
            "--ginkgo.no-color",
            "--ginkgo.v",
        ])
        .arg(format!(
            "--kubeconfig={}",
            cluster.plane.admin_kubeconfig.display()
        ))
        .arg(format!("--kubectl-path={}", bin.join("kubectl").display()))
        .arg(format!("--report-dir={}", report.display()))
        .arg(format!("--ginkgo.focus={focus}"))
        .arg(format!("--ginkgo.skip={skip}"))
        .env("KUBERNETES_CONFORMANCE_TEST", "y")
        .current_dir(report)
        .stdout(std::fs::File::create(report.join("e2e.log")).expect("log"))
        .stderr(Stdio::inherit())
        .status()
        .expect("e2e.test runs")
}

/// The upstream e2e suites against a cluster of two real nodes with nodus as its only
/// network component, for `k8s/conformance.sh`, which names the specs
/// (`NODUS_E2E_FOCUS`, `NODUS_E2E_SKIP`: ginkgo's regular expressions; no focus: the
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
        focus if focus.is_empty() => SMOKE_FOCUS.to_string(),
        focus => focus,
    };
    let cluster = KubeletCluster::start("upstream", 79, 2);
    let status = run_upstream(&cluster, &focus, &var("NODUS_E2E_SKIP"), &report);
    assert!(
        status.success(),
        "e2e.test: {status} (report in {})",
        report.display()
    );
}
