//! The install guide's migration, followed step by step on real nodes
//! (`docs/install.md`, "Replacing kube-proxy and CoreDNS in a running cluster"): a cluster as
//! kubeadm leaves it, with kubeadm's kube-proxy (nftables mode) and CoreDNS, and nodus's
//! mesh-only overlay as its pod network, moves to the replacement overlay. Traffic to a
//! Service by its name is checked from a pod on each node after every step.

use crate::real_nodes::{KubeletCluster, StartingNetwork, start_web_and_clients, write_overlay};
use crate::support::wait_within;
use std::collections::BTreeSet;
use std::time::Duration;

/// How long a step may take to show in the traffic (a rollout, a DNS answer's TTL).
const STEP_LIMIT: Duration = Duration::from_secs(90);

#[test]
fn kube_proxy_and_coredns_give_way_to_nodus_as_the_install_guide_says() {
    let cluster = KubeletCluster::start("migration", 77, 2, StartingNetwork::KubeProxyAndCoreDns);
    let plane = &cluster.plane;
    start_web_and_clients(plane, &[("client-1", "node-1"), ("client-2", "node-2")]);
    // The Service by its name from both nodes, both endpoints answering: DNS, then the
    // service proxy, then the pod network.
    let serves = |step: &str| {
        for client in ["client-1", "client-2"] {
            let mut seen = BTreeSet::new();
            wait_within(
                &format!("{step}: web by name from {client}"),
                STEP_LIMIT,
                || {
                    let url = "http://web.default.svc.cluster.local/hostname";
                    let args = ["exec", client, "--", "curl", "-sS", "-m", "3", url];
                    match plane.kubectl(&args) {
                        Ok(body) => {
                            seen.insert(body.trim().to_string());
                        }
                        Err(error) => eprintln!("{step}: curl in {client}: {error:#}"),
                    }
                    (seen.len() == 2).then_some(())
                },
            );
        }
    };
    // The names (`pod/…`) of the kube-system pods that `filters` select.
    let system_pods = |filters: &[&str]| {
        let mut args = vec!["get", "pods", "-n", "kube-system", "-o", "name"];
        args.extend(filters);
        plane.kubectl(&args).ok()
    };
    // The nftables tables in a node's network namespace.
    let tables = |node: usize| -> String {
        let ns = &cluster.nodes[node].node.ns;
        String::from_utf8_lossy(
            &ns.command("nft")
                .args(["list", "tables"])
                .output()
                .expect("nft runs")
                .stdout,
        )
        .into_owned()
    };
    serves("kube-proxy and CoreDNS");
    for node in 0..cluster.nodes.len() {
        assert!(
            tables(node).contains("table ip kube-proxy"),
            "{}",
            tables(node)
        );
    }

    // Step 2: kube-proxy's DaemonSet and ConfigMap deleted. Its rules stay in the kernel
    // and carry the traffic, frozen, until nodus's take over; its port (10256, nodus's too)
    // is free once its pods are gone.
    plane
        .kubectl(&["-n", "kube-system", "delete", "daemonset", "kube-proxy"])
        .expect("kube-proxy's DaemonSet is deleted");
    plane
        .kubectl(&["-n", "kube-system", "delete", "configmap", "kube-proxy"])
        .expect("kube-proxy's ConfigMap is deleted");
    wait_within("kube-proxy's pods gone", STEP_LIMIT, || {
        system_pods(&["-l", "k8s-app=kube-proxy"])?
            .trim()
            .is_empty()
            .then_some(())
    });
    serves("kube-proxy's DaemonSet deleted, its rules left");

    // Steps 1 and 3: the replacement overlay, its values changed, applied; its pods back
    // the kube-dns Service beside CoreDNS's.
    let overlay = write_overlay(&cluster.dir, "replace", &cluster.api);
    plane
        .kubectl(&["apply", "-k", &overlay.to_string_lossy()])
        .expect("the replacement overlay applies");
    cluster.rolled_out("daemonset/nodus");
    let dns_endpoints = || {
        plane
            .kubectl(&[
                "get",
                "endpointslices",
                "-n",
                "kube-system",
                "-l",
                "kubernetes.io/service-name=kube-dns",
                "-o",
                "jsonpath={.items[*].endpoints[*].addresses[0]}",
            ])
            .unwrap_or_default()
    };
    for node in &cluster.nodes {
        let address = node.node.v4.to_string();
        wait_within(
            &format!("{}'s nodus backs kube-dns", node.node.name),
            STEP_LIMIT,
            || {
                dns_endpoints()
                    .split_whitespace()
                    .any(|a| a == address)
                    .then_some(())
            },
        );
    }
    serves("nodus beside kube-proxy's rules and CoreDNS");

    // Step 4: kube-proxy's rules removed by each node's nodus pod; nodus's own stay.
    for (i, node) in cluster.nodes.iter().enumerate() {
        let name = &node.node.name;
        let node_field = format!("spec.nodeName={name}");
        // One pod: the rollout's old pod may still be listed, terminating, after it
        // handed its sockets over.
        let nodus_pod = wait_within(&format!("one nodus pod on {name}"), STEP_LIMIT, || {
            let pods = system_pods(&[
                "-l",
                "app.kubernetes.io/name=nodus",
                "--field-selector",
                &node_field,
            ])?;
            (pods.trim().lines().count() == 1).then_some(pods)
        });
        let cleaned = plane
            .kubectl(&[
                "-n",
                "kube-system",
                "exec",
                nodus_pod.trim(),
                "-c",
                "nodus",
                "--",
                "/nodus",
                "cleanup",
                "--yes",
                "--kube-proxy",
            ])
            .unwrap_or_else(|error| panic!("nodus cleanup --kube-proxy on {name}: {error:#}"));
        eprintln!("cleanup on {name}: {cleaned}");
        let left = tables(i);
        assert!(!left.contains("kube-proxy"), "{name} still has {left}");
        assert!(
            left.contains("nodus"),
            "{name}: nodus's own table stays: {left}"
        );
    }
    serves("kube-proxy's rules removed");

    // Step 5: CoreDNS scaled to none, resolution checked, then deleted.
    plane
        .kubectl(&[
            "-n",
            "kube-system",
            "scale",
            "deployment",
            "coredns",
            "--replicas=0",
        ])
        .expect("CoreDNS scales to none");
    // nodus's pods carry the label too.
    wait_within("CoreDNS's pods gone", STEP_LIMIT, || {
        system_pods(&["-l", "k8s-app=kube-dns"])?
            .lines()
            .all(|p| p.contains("nodus"))
            .then_some(())
    });
    serves("CoreDNS scaled to none");
    plane
        .kubectl(&["-n", "kube-system", "delete", "deployment", "coredns"])
        .expect("CoreDNS's Deployment is deleted");
    serves("nodus alone");
}
