//! The pod source check in the kernel, with real packets: a pod behind a link of the pod
//! link group sends datagrams to its node from its own address and from another one (an
//! address of its own range the node routes elsewhere), in both families, and router
//! advertisements. What is not the pod's own is dropped before the node sees it, and
//! counted; the same link outside the group lets it all through, so the check is what
//! drops it.

use nodus_proxy::apply::Proxy;
use nodus_proxy::plan::{PodDrop, ProxySettings};
use nodus_testbed::netns::{self, Netns};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;
use common::*;

const GROUP: u32 = 0x6e6f_6475;
const NODE_V4: &str = "10.244.1.1";
const NODE_V6: &str = "fd00:244:1::1";
const POD_V4: &str = "10.244.1.5";
const POD_V6: &str = "fd00:244:1::5";
/// On the pod's link, but routed elsewhere by the node: another pod's, say.
const FORGED_V4: &str = "10.244.1.99";
const FORGED_V6: &str = "fd00:244:1::99";

/// A node and a pod on a point-to-point veth, as nodus-cni links them: the node routes
/// the pod's own addresses (only) over the link, and the pod has a second address of
/// each family that is not its own.
fn node_and_pod() -> (Netns, Netns) {
    let node = Netns::new("psnd").expect("node namespace");
    let pod = Netns::new("pspd").expect("pod namespace");
    netns::veth(&node, "vpod0", &pod, "eth0").expect("veth");
    let run = |ns: &Netns, args: &[&str]| {
        ns.ip(args)
            .unwrap_or_else(|error| panic!("ip {args:?}: {error}"));
    };
    run(
        &node,
        &["link", "set", "vpod0", "group", &GROUP.to_string()],
    );
    for (node_ip, pod_ip, forged, len) in [
        (NODE_V4, POD_V4, FORGED_V4, "32"),
        (NODE_V6, POD_V6, FORGED_V6, "128"),
    ] {
        run(
            &node,
            &[
                "addr",
                "add",
                &format!("{node_ip}/{len}"),
                "dev",
                "vpod0",
                "nodad",
            ],
        );
        run(&node, &["route", "add", pod_ip, "dev", "vpod0"]);
        for ip in [pod_ip, forged] {
            run(
                &pod,
                &[
                    "addr",
                    "add",
                    &format!("{ip}/{len}"),
                    "dev",
                    "eth0",
                    "nodad",
                ],
            );
        }
        run(&pod, &["route", "add", node_ip, "dev", "eth0"]);
    }
    // The forged addresses go elsewhere from the node (a blackhole stands for another
    // pod's link), and no reverse-path filter of the kernel's own is in the way.
    run(&node, &["route", "add", "blackhole", "10.244.1.0/24"]);
    run(
        &node,
        &["-6", "route", "add", "blackhole", "fd00:244:1::/64"],
    );
    for conf in ["all", "default", "vpod0"] {
        node.exec(
            "sysctl",
            &["-qw", &format!("net.ipv4.conf.{conf}.rp_filter=0")],
        )
        .expect("rp_filter");
    }
    (node, pod)
}

/// A listener on the node's address of each family that prints the source of every
/// datagram it takes within two seconds.
fn listen(node: &Netns) -> Child {
    const LISTEN: &str = r#"
import select, socket, sys, time
socks = []
for family, addr in ((socket.AF_INET, sys.argv[1]), (socket.AF_INET6, sys.argv[2])):
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind((addr, 9999))
    socks.append(s)
print("ready", flush=True)
end = time.time() + 2
while time.time() < end:
    for s in select.select(socks, [], [], 0.1)[0]:
        print(s.recvfrom(100)[1][0], flush=True)
"#;
    let mut command = node.command("python3");
    command
        .args(["-c", LISTEN, NODE_V4, NODE_V6])
        .stdout(Stdio::piped());
    let mut child = command.spawn().expect("the listener runs");
    let mut ready = String::new();
    let stdout = child.stdout.as_mut().expect("stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut ready)
        .expect("the listener is ready");
    assert_eq!(ready.trim(), "ready");
    child
}

/// Sends one datagram from each of the pod's addresses to the node; what arrived.
fn arrived(node: &Netns, pod: &Netns) -> Vec<String> {
    const SEND: &str = r#"
import socket, sys
for family, source, node in ((socket.AF_INET, sys.argv[1], sys.argv[3]),
                             (socket.AF_INET, sys.argv[2], sys.argv[3]),
                             (socket.AF_INET6, sys.argv[4], sys.argv[6]),
                             (socket.AF_INET6, sys.argv[5], sys.argv[6])):
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind((source, 0))
    s.sendto(b"hello", (node, 9999))
"#;
    let listener = listen(node);
    let mut command: Command = pod.command("python3");
    command.args([
        "-c", SEND, POD_V4, FORGED_V4, NODE_V4, POD_V6, FORGED_V6, NODE_V6,
    ]);
    let status = command.status().expect("the sender runs");
    assert!(status.success(), "the datagrams are sent");
    let output = listener.wait_with_output().expect("the listener ends");
    let mut sources: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    sources.sort();
    sources
}

/// The pod's router advertisement, and a moment for the node to take it.
fn advertise_router(pod: &Netns) {
    netns::advertise_router(pod).expect("the advertisement is sent");
    std::thread::sleep(Duration::from_millis(300));
}

fn advertised_routes(node: &Netns) -> String {
    netns::advertised_routes(node).expect("routes")
}

#[test]
fn what_a_pod_sends_from_another_address_is_dropped_and_counted() {
    netns::require_root();
    let (node, pod) = node_and_pod();
    let config = ProxySettings {
        pod_link_group: Some(GROUP),
        ..ProxySettings::default()
    };
    let mut proxy = node
        .enter(|| Proxy::new(config).expect("proxy"))
        .expect("entering the namespace");
    proxy
        .full_sync(&node_view(&TWO_ENDPOINTS))
        .expect("full sync");

    assert_eq!(
        arrived(&node, &pod),
        [POD_V4, POD_V6],
        "only the pod's own addresses reach the node"
    );
    // Without forwarding the node takes advertisements on the link (accept_ra 1): the
    // table alone keeps this one out.
    advertise_router(&pod);
    assert_eq!(advertised_routes(&node), "");
    let drops = proxy.pod_drops().expect("the counters");
    let count = |kind: PodDrop| {
        drops
            .iter()
            .find(|(drop, _)| *drop == kind)
            .map_or(0, |(_, packets)| *packets)
    };
    assert_eq!(
        count(PodDrop::ForgedSource(nodus_view::model::Family::V4)),
        1,
        "{drops:?}"
    );
    // Besides the datagram, what the pod sends from `::` (its DAD, its MLD reports)
    // has no route back either.
    assert!(
        count(PodDrop::ForgedSource(nodus_view::model::Family::V6)) >= 1,
        "{drops:?}"
    );
    assert!(count(PodDrop::RouterMessage) >= 1, "{drops:?}");

    // The control: out of the group, the link lets the forged sources and the
    // advertisement through.
    node.ip(&["link", "set", "vpod0", "group", "default"])
        .expect("group");
    assert_eq!(arrived(&node, &pod), [POD_V4, FORGED_V4, POD_V6, FORGED_V6]);
    advertise_router(&pod);
    let routes = advertised_routes(&node);
    assert!(
        routes.contains("default via fe80:") && routes.contains("2001:db8:77::/64"),
        "the advertisement is a real one: {routes}"
    );
}
