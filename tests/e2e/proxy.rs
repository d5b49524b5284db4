//! `nodus proxy render`: the planned ruleset of the example cluster, checked by the kernel.

use crate::support::{Cluster, EXAMPLE};
use nodus_testbed::netns::Netns;

#[test]
fn render_prints_a_ruleset_the_kernel_accepts() {
    let cluster = Cluster::new("render", EXAMPLE);
    let output = cluster
        .nodus(&["proxy", "render", "--node-name", "node-1"])
        .output()
        .expect("nodus proxy render runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.starts_with("table inet nodus {"), "{text}");
    for expected in [
        "10.96.0.20",
        "fd00:96::20",
        "30080",
        "10.244.1.10",
        "numgen random mod 3",
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
    assert!(
        !text.contains("10.244.2.30"),
        "headless endpoints are not proxied:\n{text}"
    );

    let file = cluster.dir.join("ruleset.nft");
    std::fs::write(&file, text.as_bytes()).expect("write ruleset");
    let ns = Netns::new("rend").expect("netns");
    let loaded = ns.exec("nft", &["-f", &file.to_string_lossy()]);
    assert!(
        loaded.is_ok(),
        "nft -f refused the rendered ruleset: {loaded:?}"
    );
    let listed = ns
        .exec("nft", &["list", "table", "inet", "nodus"])
        .expect("nft list");
    assert!(listed.contains("10.96.0.20"), "{listed}");
}

#[test]
fn cleanup_removes_the_table_and_asks_first() {
    let cluster = Cluster::new("cleanup", EXAMPLE);
    let output = cluster
        .nodus(&["proxy", "render", "--node-name", "node-2"])
        .output()
        .expect("render");
    let file = cluster.dir.join("ruleset.nft");
    std::fs::write(&file, &output.stdout).expect("write ruleset");
    let ns = Netns::new("clean").expect("netns");
    ns.exec("nft", &["-f", &file.to_string_lossy()])
        .expect("load");

    // The mesh's device (a veth stands in: this kernel has no WireGuard module) with a
    // route, and its conflist, named by the configuration.
    let device = nodus_testbed::netns::unique_name("wg");
    let peer = nodus_testbed::netns::unique_name("wp");
    ns.ip(&[
        "link", "add", &device, "type", "veth", "peer", "name", &peer,
    ])
    .expect("device");
    ns.ip(&["link", "set", &device, "up"]).expect("up");
    ns.ip(&["route", "add", "10.244.9.0/24", "dev", &device])
        .expect("route");
    let conflist = cluster.dir.join("10-nodus.conflist");
    std::fs::write(&conflist, "{}").expect("conflist");
    let config = cluster.dir.join("cleanup.yaml");
    std::fs::write(
        &config,
        format!(
            "mesh:\n  interface: {device}\n  cni_conflist: {}\n",
            conflist.display()
        ),
    )
    .expect("config");
    let config = config.to_string_lossy().to_string();

    let asked = ns.exec(crate::support::NODUS, &["cleanup", "--config", &config]);
    assert!(
        asked.is_err(),
        "without --yes and without a terminal nothing is removed"
    );
    assert!(ns.exec("nft", &["list", "table", "inet", "nodus"]).is_ok());

    assert!(conflist.exists(), "nothing removed without --yes");
    let removed = ns
        .exec(
            crate::support::NODUS,
            &["cleanup", "--yes", "--config", &config],
        )
        .expect("cleanup");
    assert!(removed.contains("removed table inet nodus"), "{removed}");
    assert!(removed.contains("removed WireGuard device"), "{removed}");
    assert!(ns.exec("nft", &["list", "table", "inet", "nodus"]).is_err());
    assert!(
        ns.ip(&["link", "show", &device]).is_err(),
        "the device is gone"
    );
    let routes = ns.ip(&["route", "show"]).expect("routes");
    assert!(!routes.contains("10.244.9.0/24"), "{routes}");
    assert!(!conflist.exists(), "the conflist is gone");
    let again = ns
        .exec(crate::support::NODUS, &["cleanup", "--yes"])
        .expect("cleanup");
    assert!(again.contains("nothing to remove"), "{again}");
}

/// `nodus proxy trace` follows a packet through node-1's planned ruleset: from the API
/// server's view, and from the view a running agent saved, with the API server gone.
#[test]
fn trace_follows_a_packet_from_the_api_and_from_a_saved_view() {
    let mut cluster = Cluster::new("trace", EXAMPLE);
    let trace = |cluster: &Cluster, args: &[&str]| {
        let mut full = vec!["proxy", "trace", "--node-name", "node-1"];
        full.extend_from_slice(args);
        let output = cluster
            .nodus(&full)
            .output()
            .expect("nodus proxy trace runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let spread = "summary: 10.244.1.10:8080, 10.244.2.10:8080, 10.244.3.10:8080\n";
    let from_pod = trace(&cluster, &["10.96.0.20:80", "--from", "10.244.1.7"]);
    assert!(from_pod.contains("from a pod on this node"), "{from_pod}");
    assert!(from_pod.ends_with(spread), "{from_pod}");
    let from_outside = trace(&cluster, &["172.30.0.11:30080", "--from", "192.0.2.1"]);
    assert!(
        from_outside.ends_with(
            "summary: 10.244.1.10:8080 masq, 10.244.2.10:8080 masq, 10.244.3.10:8080 masq\n"
        ),
        "{from_outside}"
    );
    let undefined_port = trace(&cluster, &["10.96.0.20:81"]);
    assert!(
        undefined_port.contains("from this host"),
        "{undefined_port}"
    );
    assert!(
        undefined_port.ends_with("summary: REJECT\n"),
        "{undefined_port}"
    );
    let unallocated = trace(&cluster, &["10.96.0.99:80", "--from", "10.244.1.7"]);
    assert!(
        unallocated.ends_with("summary: DROP\n"),
        "C.25, an address of the ServiceCIDR that no service holds: {unallocated}"
    );

    let http = cluster.run_agent("node-1");
    crate::support::wait_ready(http);
    let state = cluster.dir.join("state");
    crate::support::wait_for("the saved view", || {
        state.join("view-node-1").exists().then_some(())
    });
    cluster.stop_server();
    let saved = trace(
        &cluster,
        &[
            "10.96.0.20:80",
            "--from",
            "10.244.1.7",
            "--saved-view",
            &state.to_string_lossy(),
        ],
    );
    assert!(saved.ends_with(spread), "{saved}");
    let state_text = state.to_string_lossy();
    let saved = trace(
        &cluster,
        &[
            "10.96.0.99:80",
            "--from",
            "10.244.1.7",
            "--saved-view",
            &state_text,
        ],
    );
    assert!(saved.ends_with("summary: DROP\n"), "{saved}");
    let state = state.to_string_lossy();
    let output = cluster
        .nodus(&[
            "proxy",
            "trace",
            "--node-name",
            "node-9",
            "10.96.0.20:80",
            "--saved-view",
            &state,
        ])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no usable saved view"), "{stderr}");
}

/// `nodus cleanup --kube-proxy` removes what kube-proxy left on the node instead of
/// nodus's own: its nftables tables and its iptables chains with the jumps to them; the
/// kubelet's chain, another program's rule and nodus's table stay, and a second run
/// finds nothing.
#[test]
fn cleanup_removes_kube_proxys_leftovers_when_asked() {
    let ns = Netns::new("clkp").expect("netns");
    ns.exec("nft", &["add", "table", "inet", "nodus"])
        .expect("nodus's table");
    for table in ["ip", "ip6"] {
        ns.exec("nft", &["add", "table", table, "kube-proxy"])
            .expect("kube-proxy's table");
    }
    let iptables = |args: &[&str]| ns.exec("iptables", args).expect("iptables");
    for chain in [
        "KUBE-SERVICES",
        "KUBE-POSTROUTING",
        "KUBE-SVC-XYZ",
        "KUBE-SEP-ABC",
    ] {
        iptables(&["-t", "nat", "-N", chain]);
    }
    iptables(&["-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"]);
    iptables(&["-t", "nat", "-A", "POSTROUTING", "-j", "KUBE-POSTROUTING"]);
    iptables(&[
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-s",
        "10.0.0.0/8",
        "-j",
        "MASQUERADE",
    ]);
    iptables(&[
        "-t",
        "nat",
        "-A",
        "KUBE-SERVICES",
        "-d",
        "10.96.0.1",
        "-j",
        "KUBE-SVC-XYZ",
    ]);
    iptables(&["-t", "nat", "-A", "KUBE-SVC-XYZ", "-j", "KUBE-SEP-ABC"]);
    iptables(&["-t", "filter", "-N", "KUBE-FIREWALL"]);
    iptables(&["-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL"]);
    let asked = ns.exec(crate::support::NODUS, &["cleanup", "--kube-proxy"]);
    assert!(asked.is_err(), "nothing without --yes off a terminal");
    assert!(
        ns.exec("nft", &["list", "table", "ip", "kube-proxy"])
            .is_ok()
    );
    let removed = ns
        .exec(crate::support::NODUS, &["cleanup", "--yes", "--kube-proxy"])
        .expect("cleanup");
    assert!(
        removed.contains("removed table ip kube-proxy and table ip6 kube-proxy"),
        "{removed}"
    );
    assert!(
        removed.contains("removed 4 kube-proxy chains with iptables"),
        "{removed}"
    );
    assert!(
        ns.exec("nft", &["list", "table", "ip", "kube-proxy"])
            .is_err()
    );
    let nat = iptables(&["-t", "nat", "-S"]);
    assert!(!nat.contains("KUBE-"), "{nat}");
    assert!(
        nat.contains("-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE"),
        "{nat}"
    );
    let filter = iptables(&["-t", "filter", "-S"]);
    assert!(
        filter.contains("-A INPUT -j KUBE-FIREWALL"),
        "the kubelet's stays: {filter}"
    );
    assert!(
        ns.exec("nft", &["list", "table", "inet", "nodus"]).is_ok(),
        "nodus's stays"
    );

    let again = ns
        .exec(crate::support::NODUS, &["cleanup", "--yes", "--kube-proxy"])
        .expect("cleanup again");
    assert!(again.contains("no kube-proxy nftables tables"), "{again}");
    assert!(
        again.contains("no kube-proxy chains in iptables"),
        "{again}"
    );
}
