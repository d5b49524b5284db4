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
