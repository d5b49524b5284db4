//! `nodus sandbox`: the README's first command, brought up, queried and torn down for real.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use crate::support::{NODUS, Sandbox, collect_lines, line_reader, spawn_sandbox, wait_for};
use nodus_testbed::netns;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn sandbox_serves_the_example_cluster_until_interrupted_then_removes_everything() {
    let mut sandbox = Sandbox::start("sandbox", None);
    let dir = sandbox.dir.clone();
    let printed = sandbox.printed.clone();
    for node in ["node-1", "node-2", "node-3"] {
        let row = printed
            .lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("{node} missing:\n{printed}"));
        let columns: Vec<&str> = row.split_whitespace().collect();
        // Every Node: the mesh watches them all.
        assert_eq!(columns[1..], ["true", "5", "4", "10", "3"], "{row}");
    }
    assert!(
        printed.contains("web-1") && printed.contains("db-1"),
        "{printed}"
    );
    // A pod asks its node's DNS through its gateway.
    assert!(
        printed.contains("web.default.svc.cluster.local A → 10.96.0.20"),
        "{printed}"
    );
    // An application's view: `curl http://web/` resolves the short name through the
    // search path, at the kube-dns ClusterIP, and connects through the proxy.
    let by_name = printed
        .lines()
        .find(|l| l.starts_with("curl by name from pod"))
        .unwrap_or_else(|| panic!("no curl by name:\n{printed}"));
    assert!(
        by_name
            .rsplit("→ ")
            .next()
            .unwrap_or_default()
            .starts_with("web-"),
        "{by_name}"
    );
    // And through the kube-dns ClusterIP, as kubelet's clusterDNS makes pods do: the
    // proxy sends it to the node's own DNS (dns.serve_cluster_dns_ip).
    assert!(
        printed.contains(
            "via the kube-dns ClusterIP 10.96.0.10: web.default.svc.cluster.local A → 10.96.0.20"
        ),
        "{printed}"
    );
    // The proxy on each node: a ClusterIP in both families, and a NodePort of another node.
    for url in [
        "http://10.96.0.20/",
        "http://[fd00:96::20]/",
        "http://172.30.0.13:30080/",
    ] {
        let line = printed
            .lines()
            .find(|l| l.starts_with("curl from pod") && l.contains(url))
            .unwrap_or_else(|| panic!("no curl to {url}:\n{printed}"));
        let answer = line.rsplit("→ ").next().unwrap_or_default();
        assert!(answer.starts_with("web-"), "{line}");
    }

    // Pods on other nodes, across the WireGuard mesh: ping, and curl to their echo servers.
    for (node, pod) in [("node-2", "api-2"), ("node-3", "db-1")] {
        assert!(
            printed
                .lines()
                .any(|l| l.starts_with("ping across the mesh")
                    && l.contains(&format!("to pod {pod} ({node})"))
                    && l.ends_with(" ms")),
            "no ping to {pod}:\n{printed}"
        );
        assert!(
            printed
                .lines()
                .any(|l| l.starts_with("curl across the mesh") && l.ends_with(&format!("→ {pod}"))),
            "no curl to {pod}:\n{printed}"
        );
    }

    // Each node runs the replacement overlay's configuration: every key of the overlay's
    // file as it is but the sandbox's own facts, the API reached through `api_server`
    // (the node's kubeconfig names the `kubernetes` Service's cluster IP, as a pod's
    // in-cluster configuration does), the overlay's kube-dns Service, and the plugins
    // installed into the node's CNI directory as the DaemonSet's init container does.
    let overlay: Value =
        serde_saphyr::from_str(include_str!("../../deploy/overlays/replace/nodus.yaml"))
            .expect("the overlay's nodus.yaml");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("node-1/config.yaml")).expect("node-1's config"),
    )
    .expect("node-1's config is JSON");
    let sandbox_keys = ["cluster_cidrs", "lameduck_seconds", "state_dir"];
    for (key, value) in overlay.as_object().expect("a mapping") {
        match (key.as_str(), value.as_object()) {
            (key, _) if sandbox_keys.contains(&key) => {}
            (_, Some(section)) => {
                for (inner, value) in section {
                    assert_eq!(&config[key][inner], value, "{key}.{inner}");
                }
            }
            _ => assert_eq!(&config[key], value, "{key}"),
        }
    }
    assert_eq!(config["policy"]["enabled"], true);
    let node_kubeconfig =
        std::fs::read_to_string(dir.join("node-kubeconfig")).expect("the nodes' kubeconfig");
    assert!(
        node_kubeconfig.contains("https://10.96.0.1:443"),
        "{node_kubeconfig}"
    );
    for plugin in nodus_mesh::conflist::PLUGINS {
        let path = dir.join("node-2/cni-bin").join(plugin);
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode());
        assert!(mode.is_ok_and(|m| m & 0o111 != 0), "{}", path.display());
    }
    let kube_dns = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .args([
            "get",
            "service",
            "-n",
            "kube-system",
            "kube-dns",
            "-o",
            "json",
        ])
        .output()
        .expect("kubectl runs");
    let kube_dns: Value = serde_json::from_slice(&kube_dns.stdout).expect("kube-dns JSON");
    assert_eq!(kube_dns["metadata"]["labels"]["k8s-app"], "kube-dns");
    assert_eq!(kube_dns["spec"]["selector"]["k8s-app"], "kube-dns");
    assert_eq!(kube_dns["spec"]["clusterIP"], "10.96.0.10");

    // `nodus view` against the sandbox's API server shows the example cluster.
    let view = Command::new(NODUS)
        .args(["view", "--node-name", "node-3", "--kubeconfig"])
        .arg(dir.join("kubeconfig"))
        .output()
        .expect("nodus view runs");
    let view: Value = serde_json::from_slice(&view.stdout).expect("view JSON");
    assert_eq!(view["counts"]["services"], 5);
    assert_eq!(view["nodeZone"], "zone-b");
    let nodes: Vec<&str> = view["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["addresses"][0]["address"].as_str())
        .collect();
    assert_eq!(
        nodes,
        ["172.30.0.11", "172.30.0.12", "172.30.0.13"],
        "addresses the namespaces really have"
    );

    let status = sandbox.interrupt();
    assert!(status.success(), "{status}");
    let left = netns::namespaces_in(&netns::scope_for(&dir)).expect("ip netns list");
    assert!(
        left.is_empty(),
        "the sandbox left namespaces behind: {left:?}"
    );
}

/// Removes, when a test ends however it ends, what sandboxes in `dir` may have left: the
/// directory and every namespace (and process) in its scope.
struct SandboxLeftovers {
    dir: PathBuf,
    scope: String,
}

impl Drop for SandboxLeftovers {
    fn drop(&mut self) {
        let _ = netns::remove_scope(&self.scope);
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("stderr"));
    }
}

fn assert_every_node_ready(sandbox: &Sandbox) {
    for node in ["node-1", "node-2", "node-3"] {
        let row = sandbox
            .printed
            .lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("{node} missing:\n{}", sandbox.printed));
        assert_eq!(row.split_whitespace().nth(1), Some("true"), "{row}");
    }
    assert!(
        !sandbox.printed.contains("failed"),
        "a demonstration failed:\n{}",
        sandbox.printed
    );
}

fn processes_in(namespaces: &[String]) -> Vec<i32> {
    namespaces
        .iter()
        .flat_map(|ns| {
            netns::run("ip", &["netns", "pids", ns])
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// The README's first command, run again and again in one directory, as a user does: each
/// start works however the one before ended (Ctrl-C while it starts, Ctrl-C once it is up,
/// SIGKILL), and nothing is left once the last one is interrupted.
#[test]
fn the_sandbox_starts_again_however_the_last_one_ended() {
    let dir = std::env::temp_dir().join(format!("nodus-e2e-again-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("sandbox dir");
    let scope = netns::scope_for(&dir);
    let _leftovers = SandboxLeftovers {
        dir: dir.clone(),
        scope: scope.clone(),
    };
    let in_scope = || netns::namespaces_in(&scope).expect("ip netns list");

    // 1. Ctrl-C while the nodes are being built, to the whole process group as a terminal
    //    sends it: the nodes' nodus and any `ip` or CNI plugin running get it too.
    let mut child = spawn_sandbox(&dir, None, &[]);
    let lines = line_reader(child.stdout.take().expect("stdout"));
    wait_for("the first node's nodus to start", || {
        dir.join("node-1.log").exists().then_some(())
    });
    // SAFETY: signalling the process group of a child we own.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
    let status = child.wait().expect("the sandbox exits");
    let printed = collect_lines(&lines);
    assert!(status.success(), "{status}:\n{printed}");
    assert!(printed.contains("SIGINT"), "{printed}");
    assert!(
        !printed.contains("Ctrl-C to tear"),
        "it was up already:\n{printed}"
    );
    assert_eq!(
        in_scope(),
        Vec::<String>::new(),
        "left by Ctrl-C during start-up"
    );

    // 2. Up, then Ctrl-C (the report: the next start found every pod address
    //    still leased). The teardown releases the leases.
    let mut sandbox = Sandbox::start_in(&dir, None, &[]);
    assert_every_node_ready(&sandbox);
    let mode = std::fs::metadata(&dir)
        .expect("sandbox dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "it holds the nodes' private keys");
    assert!(sandbox.interrupt().success());
    assert!(sandbox.printed_at_exit().contains("SIGINT: tearing down"));
    assert_eq!(in_scope(), Vec::<String>::new(), "left by Ctrl-C once up");
    assert!(!dir.join("node-1/ipam").exists(), "host-local leases kept");
    drop(sandbox);

    // 3. Up, then SIGKILL: its namespaces and processes stay behind, and its leases.
    let mut sandbox = Sandbox::start_in(&dir, None, &[]);
    assert_every_node_ready(&sandbox);
    let mut killed = in_scope();
    let processes = processes_in(&killed);
    sandbox.kill();
    drop(sandbox);
    let mut left = in_scope();
    killed.sort();
    left.sort();
    assert_eq!(left, killed, "SIGKILL leaves everything");
    assert!(
        !processes.is_empty(),
        "nodus and the echo servers run in them"
    );
    assert!(dir.join("node-1/ipam").exists());

    // 4. Up again: the start removed what the killed one left (its namespaces' names are
    //    taken again, so `ip netns add` would fail otherwise) and stopped its processes.
    let mut sandbox = Sandbox::start_in(&dir, None, &[]);
    assert_every_node_ready(&sandbox);
    assert!(
        sandbox
            .printed
            .contains("network namespaces a killed sandbox left"),
        "{}",
        sandbox.printed
    );
    let alive: Vec<&i32> = processes
        .iter()
        .filter(|pid| netns::is_running(**pid))
        .collect();
    assert!(
        alive.is_empty(),
        "the killed sandbox's processes {alive:?} still run"
    );
    assert!(sandbox.interrupt().success());
    assert_eq!(in_scope(), Vec::<String>::new(), "left at the end");
    let sockets: Vec<String> = std::fs::read_dir("/var/run/wireguard")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&scope))
        .collect();
    assert!(sockets.is_empty(), "mesh sockets left: {sockets:?}");
}

#[test]
fn a_directory_other_users_share_is_refused() {
    let output = Command::new(NODUS)
        .args(["sandbox", "--dir", "/tmp"])
        .output()
        .expect("nodus sandbox runs");
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("/tmp is shared"), "{error}");
}

/// The control-plane processes (programs of `k8s/build.sh`'s directory) whose command
/// line names `dir`. (The nodes' nodus name it too, in their kubeconfig's path.)
fn control_plane_in(dir: &std::path::Path) -> Vec<String> {
    let bin = nodus_testbed::control_plane::binaries().expect("the control plane's binaries");
    let (needle, bin) = (
        dir.to_string_lossy().into_owned(),
        bin.to_string_lossy().into_owned(),
    );
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().parse::<i32>().is_ok())
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.starts_with(&bin) && cmdline.contains(&needle))
        .collect()
}

/// `nodus sandbox --real-api`: the example cluster served by a real control plane; kubectl
/// shows what a user sees; Ctrl-C stops the control plane with the rest; a SIGKILL takes it
/// along too (its processes die with the sandbox), and the next start begins afresh in the
/// same directory (the killed one's etcd data is not reused).
#[test]
fn the_sandbox_on_a_real_control_plane_starts_again_after_ctrl_c_and_after_a_kill() {
    let dir = std::env::temp_dir().join(format!("nodus-e2e-sandbox-real-{}", std::process::id()));
    let control_plane = dir.join("control-plane");
    let real: [&std::ffi::OsStr; 1] = ["--real-api".as_ref()];
    // What the killed sandbox leaves, removed even when an assertion fails.
    let _leftovers = SandboxLeftovers {
        dir: dir.clone(),
        scope: netns::scope_for(&dir),
    };

    let mut sandbox = Sandbox::start_in(&dir, None, &real);
    assert!(
        sandbox
            .printed
            .contains("real control plane, API server https://127.0.0.1:"),
        "{}",
        sandbox.printed
    );
    assert_every_node_ready(&sandbox);
    // etcd, the API server, the controller manager and the scheduler.
    assert_eq!(
        control_plane_in(&control_plane).len(),
        4,
        "{:?}",
        control_plane_in(&control_plane)
    );
    let nodes = netns::run(
        "kubectl",
        &[
            "--kubeconfig",
            &dir.join("kubeconfig").to_string_lossy(),
            "get",
            "nodes",
        ],
    )
    .expect("kubectl get nodes");
    assert!(
        nodes.starts_with("NAME") && nodes.contains("STATUS") && nodes.contains("ROLES"),
        "{nodes}"
    );
    assert!(sandbox.interrupt().success());
    assert_eq!(
        control_plane_in(&control_plane),
        Vec::<String>::new(),
        "left by Ctrl-C"
    );
    drop(sandbox);

    let mut sandbox = Sandbox::start_in(&dir, None, &real);
    assert_every_node_ready(&sandbox);
    assert_eq!(control_plane_in(&control_plane).len(), 4);
    sandbox.kill();
    drop(sandbox);
    wait_for("the control plane to die with the killed sandbox", || {
        control_plane_in(&control_plane).is_empty().then_some(())
    });

    let mut sandbox = Sandbox::start_in(&dir, None, &real);
    assert_every_node_ready(&sandbox);
    assert!(sandbox.interrupt().success());
}
