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

/// A directory of its own under the temporary directory, removed when dropped.
struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    fn new(name: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `nodus cleanup --kube-proxy` and `--foreign` remove what kube-proxy and flannel left
/// on the node instead of nodus's own, after listing it: their nftables tables, their
/// iptables chains with the jumps to them, their devices and flannel's CNI
/// configuration. The kubelet's chain, another program's rule and device and file, and
/// nodus's table and conflist stay, and a second run finds nothing.
#[test]
fn cleanup_removes_kube_proxys_and_flannels_leftovers_when_asked() {
    let ns = Netns::new("clfo").expect("netns");
    ns.exec("nft", &["add", "table", "inet", "nodus"])
        .expect("nodus's table");
    for table in ["ip", "ip6"] {
        for owner in ["kube-proxy", "flannel"] {
            ns.exec("nft", &["add", "table", table, owner])
                .expect("a foreign table");
        }
    }
    let iptables = |args: &[&str]| ns.exec("iptables", args).expect("iptables");
    for chain in [
        "KUBE-SERVICES",
        "KUBE-POSTROUTING",
        "KUBE-SVC-XYZ",
        "KUBE-SEP-ABC",
        "FLANNEL-POSTRTG",
    ] {
        iptables(&["-t", "nat", "-N", chain]);
    }
    iptables(&["-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"]);
    iptables(&["-t", "nat", "-A", "POSTROUTING", "-j", "KUBE-POSTROUTING"]);
    iptables(&["-t", "nat", "-A", "POSTROUTING", "-j", "FLANNEL-POSTRTG"]);
    let masquerade = ["-s", "10.0.0.0/8", "-j", "MASQUERADE"];
    iptables(&[&["-t", "nat", "-A", "POSTROUTING"][..], &masquerade].concat());
    let to_svc = ["-d", "10.96.0.1", "-j", "KUBE-SVC-XYZ"];
    iptables(&[&["-t", "nat", "-A", "KUBE-SERVICES"][..], &to_svc].concat());
    iptables(&["-t", "nat", "-A", "KUBE-SVC-XYZ", "-j", "KUBE-SEP-ABC"]);
    iptables(&["-t", "filter", "-N", "KUBE-FIREWALL"]);
    iptables(&["-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL"]);
    iptables(&["-t", "filter", "-N", "FLANNEL-FWD"]);
    iptables(&["-t", "filter", "-A", "FORWARD", "-j", "FLANNEL-FWD"]);
    // Flannel's VXLAN device and its bridge plugin's bridge; kube-proxy's IPVS dummy (a
    // bridge here: this kernel has no dummy devices); another program's bridge.
    let ip = |args: &[&str]| ns.ip(args).expect("ip link");
    ip(&[
        "link",
        "add",
        "flannel.1",
        "type",
        "vxlan",
        "id",
        "1",
        "dstport",
        "8472",
    ]);
    for bridge in ["cni0", "kube-ipvs0", "docker0"] {
        ip(&["link", "add", bridge, "type", "bridge"]);
    }
    let cni = ScratchDir::new(&format!("nodus-e2e-cni-{}", ns.name()));
    for file in ["10-flannel.conflist", "00-nodus.conflist", "99-other.conf"] {
        std::fs::write(cni.0.join(file), "{}").expect("a CNI file");
    }
    let config = cni.0.join("nodus.yaml");
    let conflist = cni.0.join("00-nodus.conflist");
    let yaml = format!("mesh:\n  cni_conflist: {}\n", conflist.display());
    std::fs::write(&config, yaml).expect("config");
    let config = config.to_string_lossy().into_owned();
    let cleanup = |args: &[&str]| {
        let mut command = ns.command(crate::support::NODUS);
        command.args(["cleanup", "--config", &config]).args(args);
        command.output().expect("nodus cleanup runs")
    };
    let links = || ns.ip(&["-br", "link"]).expect("links");

    // Off a terminal without --yes: listed, then refused.
    let asked = cleanup(&["--foreign"]);
    assert!(
        !asked.status.success(),
        "nothing without --yes off a terminal"
    );
    let listed = String::from_utf8_lossy(&asked.stdout);
    for line in [
        "kube-proxy and flannel left on this host:",
        "  table ip kube-proxy",
        "  table ip6 flannel",
        "  iptables: 6 chains (filter/FLANNEL-FWD, nat/FLANNEL-POSTRTG, nat/KUBE-POSTROUTING, nat/KUBE-SEP-ABC, nat/KUBE-SERVICES, …)",
        "  link flannel.1",
        "  link cni0",
        "  link kube-ipvs0",
    ] {
        assert!(listed.contains(line), "{line:?} in:\n{listed}");
    }
    assert!(listed.contains("10-flannel.conflist"), "{listed}");
    assert!(links().contains("cni0"), "nothing removed");

    // kube-proxy's alone.
    let removed = cleanup(&["--yes", "--kube-proxy"]);
    let said = String::from_utf8_lossy(&removed.stdout);
    assert!(removed.status.success(), "{removed:?}");
    for line in [
        "removed table ip kube-proxy",
        "removed table ip6 kube-proxy",
        "removed iptables: 4 chains",
        "removed link kube-ipvs0",
    ] {
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    assert!(!said.contains("flannel"), "{said}");
    assert!(links().contains("flannel.1"), "{}", links());

    // Then flannel's.
    let removed = cleanup(&["--yes", "--foreign"]);
    let said = String::from_utf8_lossy(&removed.stdout);
    assert!(removed.status.success(), "{removed:?}");
    for line in [
        "removed table ip flannel",
        "removed iptables: 2 chains (filter/FLANNEL-FWD, nat/FLANNEL-POSTRTG)",
        "removed link flannel.1",
        "removed link cni0",
    ] {
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    let left = links();
    assert!(
        !left.contains("flannel.1") && !left.contains("cni0") && left.contains("docker0"),
        "{left}"
    );
    let files: Vec<String> = std::fs::read_dir(&cni.0)
        .expect("CNI directory")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.contains("conf"))
        .collect();
    assert!(
        !files.contains(&"10-flannel.conflist".to_string()),
        "{files:?}"
    );
    assert!(
        files.contains(&"00-nodus.conflist".to_string()),
        "{files:?}"
    );
    assert!(files.contains(&"99-other.conf".to_string()), "{files:?}");
    let nat = iptables(&["-t", "nat", "-S"]);
    assert!(!nat.contains("KUBE-") && !nat.contains("FLANNEL-"), "{nat}");
    assert!(
        nat.contains("-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE"),
        "{nat}"
    );
    let filter = iptables(&["-t", "filter", "-S"]);
    assert!(
        filter.contains("-A INPUT -j KUBE-FIREWALL") && !filter.contains("FLANNEL-"),
        "the kubelet's stays: {filter}"
    );
    assert!(
        ns.exec("nft", &["list", "table", "inet", "nodus"]).is_ok(),
        "nodus's stays"
    );
    assert!(ns.exec("nft", &["list", "table", "ip", "flannel"]).is_err());

    let again = cleanup(&["--yes", "--foreign"]);
    let said = String::from_utf8_lossy(&again.stdout);
    assert!(
        said.contains("nothing of kube-proxy and flannel on this host"),
        "{said}"
    );
}
