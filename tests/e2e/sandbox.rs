//! `nodus sandbox`: the README's first command, brought up, queried and torn down for real.

use crate::support::{NODUS, Sandbox};
use nodus_testbed::netns;
use serde_json::Value;
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
    let pid_prefix = format!("n{:x}", sandbox.pid() & 0xfffff);
    let list = netns::run("ip", &["netns", "list"]).expect("ip netns list");
    assert!(
        !list.lines().any(|l| l.starts_with(&pid_prefix)),
        "the sandbox left namespaces behind:\n{list}"
    );
}
