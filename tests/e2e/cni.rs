//! `nodus-cni`, the pod plugin, called as a runtime calls it: the built `nodus` under that
//! name, from a node's namespace, with Debian's `host-local` as its IPAM. Links, addresses,
//! routes and packets are the kernel's; leases are `host-local`'s files.

use crate::mesh::plugins;
use nodus_testbed::netns::{Netns, advertise_router, advertised_routes, require_root};
use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// One node's namespace, its plugin directory and its leases.
struct Node {
    ns: Netns,
    bin: PathBuf,
    leases: PathBuf,
    dir: PathBuf,
}

impl Node {
    fn new() -> Node {
        let ns = Netns::new("cnin").expect("node namespace");
        let dir = std::env::temp_dir().join(format!("nodus-e2e-{}", ns.name()));
        let bin = plugins(&dir);
        Node {
            leases: dir.join("ipam"),
            ns,
            bin,
            dir,
        }
    }

    fn config(&self) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": "nodus",
            "type": "nodus-cni",
            "mtu": 1400,
            "ipam": {
                "type": "host-local",
                "dataDir": self.leases,
                "ranges": [[{ "subnet": "10.77.3.0/24" }], [{ "subnet": "fd00:77:3::/64" }]],
                "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }],
            },
        })
    }

    /// Runs `command` for `container` in namespace `netns`; the exit's success and stdout.
    fn call(&self, command: &str, container: &str, netns: &str, config: &Value) -> (bool, Value) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", self.ns.name()])
            .arg(self.bin.join("nodus-cni"))
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the plugin runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(config.to_string().as_bytes())
            .expect("the configuration is written");
        let output = child.wait_with_output().expect("the plugin ends");
        let reply = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        (output.status.success(), reply)
    }

    fn add(&self, pod: &Netns) -> Value {
        let (ok, result) = self.call("ADD", pod.name(), &netns_path(pod), &self.config());
        assert!(ok, "ADD: {result}");
        result
    }

    fn leased(&self, ip: &str) -> bool {
        self.leases.join("nodus").join(ip).exists()
    }

    /// The addresses `host-local` holds (one file each, beside its own bookkeeping).
    fn leases(&self) -> Vec<String> {
        let entries = std::fs::read_dir(self.leases.join("nodus"))
            .into_iter()
            .flatten();
        entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn netns_path(ns: &Netns) -> String {
    format!("/var/run/netns/{}", ns.name())
}

fn address(result: &Value, i: usize) -> String {
    let text = result["ips"][i]["address"].as_str().expect("an address");
    text.split('/').next().unwrap_or_default().to_string()
}

fn ping(from: &Netns, to: &str) -> bool {
    from.exec("ping", &["-c1", "-W2", to]).is_ok()
}

#[test]
fn the_pod_plugin_links_pods_through_the_node_and_undoes_it() {
    require_root();
    let node = Node::new();
    let (one, two) = (
        Netns::new("cnia").expect("pod"),
        Netns::new("cnib").expect("pod"),
    );
    let sysctl = |path: &str| {
        let value = node.ns.exec("cat", &[path]).expect("a sysctl");
        value.trim().to_string()
    };
    let accept_ra = "/proc/sys/net/ipv6/conf/default/accept_ra";
    assert_eq!(
        sysctl(accept_ra),
        "1",
        "a new namespace takes advertisements"
    );
    // The node's uplink, which takes its IPv6 default route from advertisements (a veth:
    // this kernel has no dummy links).
    node.ns
        .ip(&[
            "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1",
        ])
        .expect("an uplink");
    let first = node.add(&one);
    let second = node.add(&two);
    // The node forwards now, and its uplink still takes router advertisements (2: even
    // forwarding); links made later do not, pods' least of all.
    assert_eq!(sysctl("/proc/sys/net/ipv6/conf/all/forwarding"), "1");
    assert_eq!(sysctl("/proc/sys/net/ipv6/conf/uplink0/accept_ra"), "2");
    assert_eq!(sysctl(accept_ra), "1");
    node.ns
        .ip(&["link", "del", "uplink0"])
        .expect("the uplink removed");

    // The result: the node's end, the pod's end in its namespace, both families.
    let host = first["interfaces"][0]["name"].as_str().expect("host end");
    assert!(host.starts_with("veth") && host.len() == 15, "{first}");
    assert_eq!(first["interfaces"][1]["name"], "eth0");
    assert_eq!(first["interfaces"][1]["sandbox"], netns_path(&one));
    assert_eq!(first["ips"][0]["gateway"], "10.77.3.1");
    assert_eq!(first["ips"][1]["gateway"], "fd00:77:3::1");
    let (one_v4, one_v6) = (address(&first, 0), address(&first, 1));
    let (two_v4, two_v6) = (address(&second, 0), address(&second, 1));
    assert!(
        node.ns
            .ip(&["link", "show", host])
            .is_ok_and(|l| l.contains("mtu 1400"))
    );
    assert_eq!(
        node.ns
            .exec("sysctl", &["-n", "net.ipv4.ip_forward"])
            .expect("sysctl")
            .trim(),
        "1"
    );

    // Both families, both ways, at once (no DAD holds a new IPv6 address), and from pod to
    // pod through the node: the pods share a subnet but no link.
    for (from, to) in [
        (&one, "10.77.3.1"),
        (&one, "fd00:77:3::1"),
        (&node.ns, one_v4.as_str()),
        (&node.ns, one_v6.as_str()),
        (&one, two_v4.as_str()),
        (&one, two_v6.as_str()),
    ] {
        assert!(ping(from, to), "{} to {to}", from.name());
    }
    let path = one.ip(&["route", "get", &two_v4]).expect("route");
    assert!(path.contains("via 10.77.3.1"), "{path}");

    // CHECK passes on what ADD made, and fails once an address is gone.
    let mut check = node.config();
    check["prevResult"] = first.clone();
    let (ok, reply) = node.call("CHECK", one.name(), &netns_path(&one), &check);
    assert!(ok, "CHECK: {reply}");
    one.ip(&["address", "del", &format!("{one_v6}/64"), "dev", "eth0"])
        .expect("address removed");
    let (ok, reply) = node.call("CHECK", one.name(), &netns_path(&one), &check);
    assert!(!ok && reply["code"] == 100, "{reply}");
    assert!(
        reply["msg"].as_str().is_some_and(|m| m.contains(&one_v6)),
        "{reply}"
    );

    // An ADD the link refuses (this namespace has an eth0) gives its addresses back.
    let (ok, reply) = node.call("ADD", "another", &netns_path(&one), &node.config());
    assert!(!ok && reply["code"] == 7, "{reply}");
    assert!(
        reply["msg"].as_str().is_some_and(|m| m.contains("eth0")),
        "{reply}"
    );
    assert!(node.leased(&one_v4) && node.leased(&two_v4));
    assert_eq!(node.leases().len(), 4, "the two pods' alone");
    let (ok, _) = node.call("DEL", "another", &netns_path(&one), &node.config());
    assert!(ok, "DEL of what was never made");
    assert_eq!(node.leases().len(), 4);

    // A DEL whose IPAM plugin fails has removed the link first, and keeps the lease: an
    // address given back while its route stayed would fail the next pod's ADD.
    let mut broken = node.config();
    broken["ipam"]["type"] = "no-such-ipam".into();
    let (ok, reply) = node.call("DEL", one.name(), &netns_path(&one), &broken);
    assert!(!ok, "DEL without its IPAM plugin: {reply}");
    assert!(
        one.ip(&["link", "show", "eth0"]).is_err(),
        "eth0 is gone first"
    );
    assert!(
        node.leased(&one_v4),
        "the lease stays until the IPAM plugin frees it"
    );

    // DEL removes both ends and the leases; again, and without the namespace, it succeeds.
    let (ok, reply) = node.call("DEL", one.name(), &netns_path(&one), &node.config());
    assert!(ok, "DEL: {reply}");
    assert!(
        node.ns.ip(&["link", "show", host]).is_err(),
        "{host} is gone"
    );
    assert!(one.ip(&["link", "show", "eth0"]).is_err(), "eth0 is gone");
    assert!(!node.leased(&one_v4) && !node.leased(&one_v6) && node.leased(&two_v4));
    let (ok, reply) = node.call("DEL", one.name(), &netns_path(&one), &node.config());
    assert!(ok, "DEL again: {reply}");
    let gone = "/var/run/netns/nodus-no-such-namespace";
    let (ok, reply) = node.call("DEL", two.name(), gone, &node.config());
    assert!(ok, "DEL without the namespace: {reply}");
    assert!(!node.leased(&two_v4));
    // The node's end goes too: DEL finds it by the name it has for the container.
    let links = node
        .ns
        .ip(&["-o", "link", "show", "type", "veth"])
        .expect("links");
    assert!(links.trim().is_empty(), "{links}");
}

/// A pod with `CAP_NET_RAW` sends router advertisements to its node: the node's end of
/// its link takes none, with one IPv6 address or none, forwarding or not, and is in the
/// group nodus's table checks sources on. The same advertisement on a link that accepts
/// them does install the routes, so the message itself is a real one.
#[test]
fn a_pod_cannot_route_the_node_through_itself_with_router_advertisements() {
    require_root();
    let node = Node::new();
    let (dual, v4_only) = (
        Netns::new("cnira").expect("pod"),
        Netns::new("cnirb").expect("pod"),
    );
    let mut v4_config = node.config();
    v4_config["ipam"]["ranges"] = json!([[{ "subnet": "10.77.4.0/24" }]]);
    v4_config["ipam"]["routes"] = json!([{ "dst": "0.0.0.0/0" }]);
    let (ok, result) = node.call("ADD", v4_only.name(), &netns_path(&v4_only), &v4_config);
    assert!(ok, "ADD: {result}");
    let v4_end = result["interfaces"][0]["name"]
        .as_str()
        .expect("host end")
        .to_string();
    let result = node.add(&dual);
    let dual_end = result["interfaces"][0]["name"]
        .as_str()
        .expect("host end")
        .to_string();
    for end in [&dual_end, &v4_end] {
        for switch in ["accept_ra", "accept_redirects"] {
            let path = format!("/proc/sys/net/ipv6/conf/{end}/{switch}");
            let value = node.ns.exec("cat", &[&path]).expect("a sysctl");
            assert_eq!(value.trim(), "0", "{path}");
        }
        let link = node.ns.ip(&["-d", "link", "show", end]).expect("the link");
        let group = format!("group {}", nodus_cni::link::POD_LINK_GROUP);
        assert!(link.contains(&group), "{link}");
    }
    for pod in [&dual, &v4_only] {
        advertise_router(pod).expect("the advertisement is sent");
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        advertised_routes(&node.ns).expect("routes"),
        "",
        "no route from a pod's advertisement"
    );

    // The control: with the kernel's default on the link, the same message routes the node.
    let path = format!("/proc/sys/net/ipv6/conf/{dual_end}/accept_ra");
    node.ns
        .exec("sh", &["-c", &format!("echo 2 > {path}")])
        .expect("accept_ra set");
    advertise_router(&dual).expect("the advertisement is sent");
    let routes = (0..30)
        .map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            advertised_routes(&node.ns).expect("routes")
        })
        .find(|routes| routes.contains("2001:db8:77::/64"))
        .unwrap_or_default();
    assert!(
        routes.contains("2001:db8:77::/64") && routes.contains(&dual_end),
        "the advertisement is a real one: {routes}"
    );
}

#[test]
fn the_pod_plugin_answers_version_and_refuses_bad_input() {
    require_root();
    let node = Node::new();
    let pod = Netns::new("cnic").expect("pod");
    let (ok, reply) = node.call("VERSION", "", "", &json!({}));
    assert!(ok, "{reply}");
    assert!(
        reply["supportedVersions"]
            .as_array()
            .is_some_and(|v| v.contains(&json!("1.0.0")) && v.contains(&json!("0.4.0"))),
        "{reply}"
    );
    let mut newer = node.config();
    newer["cniVersion"] = "9.9.9".into();
    let mut unknown_ipam = node.config();
    unknown_ipam["ipam"]["type"] = "nodus-no-such-ipam".into();
    for (config, code) in [
        (newer, 1),
        (unknown_ipam, 5),
        (json!("not a configuration"), 7),
    ] {
        let (ok, reply) = node.call("ADD", pod.name(), &netns_path(&pod), &config);
        assert!(!ok && reply["code"] == code, "{config}: {reply}");
    }
    let (ok, reply) = node.call(
        "ADD",
        pod.name(),
        "/var/run/netns/nodus-nothing",
        &node.config(),
    );
    assert!(!ok && reply["code"] == 3, "{reply}");
    // Nothing stays leased or linked.
    assert_eq!(node.leases(), Vec::<String>::new());
    assert!(pod.ip(&["link", "show", "eth0"]).is_err());
    // An older configuration version gets a result of its version.
    let mut old = node.config();
    old["cniVersion"] = "0.4.0".into();
    let (ok, reply) = node.call("ADD", pod.name(), &netns_path(&pod), &old);
    assert!(ok && reply["ips"][0]["version"] == "4", "{reply}");
    assert_eq!(node.leases().len(), 2);
}

/// CNI 1.1 as a runtime speaks it, with the reference plugins built from their modules
/// (Debian 12's read 1.0.0 at most, so the mesh's conflist stays 1.0.0 with them) and the
/// reference client, cnitool:
/// - the conflist is 1.1.0 when every chained plugin reads it;
/// - STATUS fails with code 50 while nothing answers at the isolation gate, passes once
///   the agent's socket takes connections, and goes on passing when the agent is gone
///   until the node reboots;
/// - GC keeps the attachments the runtime still holds and removes what lost DELs left:
///   links (with the pod's end, addresses and routes) and `host-local` leases, whose own
///   GC does nothing. cnitool's GC holds no attachment valid: everything goes.
#[test]
fn status_and_gc_of_cni_1_1_with_the_reference_plugins_and_cnitool() {
    use nodus_mesh::conflist::{REFERENCE_PLUGINS, STATUS_AND_GC_VERSION, chain_version, conflist};
    require_root();
    let reference = nodus_testbed::control_plane::reference_cni_plugins().expect("plugins");
    let node = Netns::new("c11n").expect("node namespace");
    let dir = std::env::temp_dir().join(format!("nodus-e2e-{}", node.name()));
    let _cleanup = RemoveDir(dir.clone());
    let debian = plugins(&dir.join("debian"));
    assert_eq!(
        chain_version(&debian),
        "1.0.0",
        "Debian's plugins read 1.0.0"
    );
    let bin = nodus_testbed::runtime::plugin_dir(
        &dir,
        std::path::Path::new(crate::support::NODUS),
        &REFERENCE_PLUGINS,
        &reference,
    )
    .expect("plugin directory");
    assert_eq!(chain_version(&bin), STATUS_AND_GC_VERSION);

    // The mesh's conflist, with a network name and a lease directory of this test's own.
    let socket = dir.join("cni.sock");
    let cidr = "10.77.4.0/24".parse().expect("cidr");
    let mut list: Value = serde_json::from_str(&conflist(
        &[cidr],
        1400,
        Some(&socket),
        STATUS_AND_GC_VERSION,
    ))
    .expect("conflist");
    let network = format!("nodus-{}", node.name());
    list["name"] = network.clone().into();
    list["plugins"][0]["ipam"]["dataDir"] = dir.join("ipam").to_string_lossy().into();
    let net_d = dir.join("net.d");
    std::fs::create_dir_all(&net_d).expect("net.d");
    std::fs::write(net_d.join("10-nodus.conflist"), list.to_string()).expect("conflist");
    let cnitool = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", node.name()])
            .arg(reference.join("cnitool"))
            .args(args)
            .env("NETCONFPATH", &net_d)
            .env("CNI_PATH", &bin)
            .env_remove("CNI_ARGS")
            .output()
            .expect("cnitool runs")
    };

    let pods = [
        Netns::new("c11a").expect("pod"),
        Netns::new("c11b").expect("pod"),
    ];
    let status = cnitool(&["status", &network, &netns_path(&pods[0])]);
    let said = String::from_utf8_lossy(&status.stderr).into_owned()
        + &String::from_utf8_lossy(&status.stdout);
    assert!(!status.status.success(), "no agent yet: {said}");
    assert!(said.contains("does not answer"), "{said}");
    let agent = std::os::unix::net::UnixListener::bind(&socket).expect("the agent's socket");
    let status = cnitool(&["status", &network, &netns_path(&pods[0])]);
    assert!(status.status.success(), "{status:?}");
    // The agent gone after it answered once (a crash, a restart): STATUS still passes, so
    // the node stays Ready and keeps its pods; after a reboot (`/run` emptied) it fails.
    drop(agent);
    std::fs::remove_file(&socket).expect("the socket gone with its agent");
    let status = cnitool(&["status", &network, &netns_path(&pods[0])]);
    assert!(
        status.status.success(),
        "after the agent answered once: {status:?}"
    );
    let answered = nodus_cni::gate::answered_marker(&socket);
    std::fs::remove_file(&answered).expect("the agent's answer remembered");
    let status = cnitool(&["status", &network, &netns_path(&pods[0])]);
    assert!(!status.status.success(), "after a reboot: {status:?}");

    for pod in &pods {
        let added = cnitool(&["add", &network, &netns_path(pod)]);
        assert!(added.status.success(), "{added:?}");
    }
    let leases = || -> Vec<String> {
        let entries = std::fs::read_dir(dir.join("ipam").join(&network)).into_iter();
        let mut leases: Vec<String> = entries
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
            .collect();
        leases.sort();
        leases
    };
    // Each pod's attachment, as the node's end of its link names it.
    let attachments = || -> Vec<(String, String)> {
        let links = node.exec("ip", &["-o", "link", "show"]).expect("links");
        let mut found: Vec<(String, String)> = links
            .lines()
            .filter_map(|line| {
                let alias = line.split(" alias nodus-cni ").nth(1)?;
                let rest = alias.trim().strip_prefix(network.as_str())?;
                let (id, ifname) = rest.trim_start().split_once(' ')?;
                Some((id.to_string(), ifname.to_string()))
            })
            .collect();
        found.sort();
        found
    };
    assert_eq!(leases().len(), 2);
    let held = attachments();
    assert_eq!(held.len(), 2, "one link per pod: {held:?}");

    // The runtime holds the first pod only (the second's DEL was lost): GC, as libcni
    // sends it to the pod plugin, removes the second's link and lease.
    let (kept, _) = &held[0];
    let mut config = list["plugins"][0].clone();
    config["cniVersion"] = STATUS_AND_GC_VERSION.into();
    config["name"] = network.clone().into();
    config["cni.dev/valid-attachments"] = json!([{"containerID": kept, "ifname": "eth0"}]);
    let mut gc = Command::new("ip")
        .args(["netns", "exec", node.name()])
        .arg(bin.join("nodus-cni"))
        .env("CNI_COMMAND", "GC")
        .env("CNI_PATH", &bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("GC runs");
    gc.stdin
        .take()
        .expect("stdin")
        .write_all(config.to_string().as_bytes())
        .expect("config");
    let output = gc.wait_with_output().expect("GC ends");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(attachments(), held[..1], "the held attachment's link stays");
    assert_eq!(leases().len(), 1, "the lost pod's lease is given back");

    // A link nodus-cni made for another network (its alias names that network) is not
    // this network's to collect.
    node.ip(&[
        "link",
        "add",
        "othernet0",
        "type",
        "veth",
        "peer",
        "name",
        "othernet1",
    ])
    .expect("another network's link");
    node.ip(&[
        "link",
        "set",
        "othernet0",
        "alias",
        "nodus-cni other-net c1 eth0",
    ])
    .expect("its alias");
    let collected = cnitool(&["gc", &network, &netns_path(&pods[0])]);
    assert!(collected.status.success(), "{collected:?}");
    assert_eq!(attachments(), [], "nothing held: every link goes");
    assert!(
        node.exec("ip", &["link", "show", "othernet0"]).is_ok(),
        "another network's link stays"
    );
    assert_eq!(leases(), Vec::<String>::new());
}

/// Removes a directory when dropped, even after a failed assertion.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
