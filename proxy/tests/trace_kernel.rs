//! The packet tracer against the kernel: the same plan programmed into a node namespace,
//! real TCP from a pod, from the host and from outside, and for every connection the
//! kernel's outcome (which endpoint answered and the source it saw, a refusal, or
//! silence) must be one the tracer predicted for that packet.

#![allow(
    clippy::too_many_lines,
    reason = "a test or bench reads as one story, top to bottom"
)]

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use nodus_proxy::apply::Proxy;
use nodus_proxy::plan::{Entry, Packet, Planner, ProxySettings};
use nodus_testbed::netns::{self, Netns};
use nodus_view::model::Protocol;
use serde_json::json;

mod common;
use common::*;

/// A namespace behind `node` at `address`, its gateway `gateway` on the node's side of a
/// veth named `device`. Pods (`prefix` 32) share one gateway address and are reached by a
/// host route each, as many CNI plugins do; with 24, the node routes the whole /24.
fn attach(
    node: &Netns,
    device: &str,
    tag: &str,
    address: &str,
    gateway: &str,
    prefix: &str,
) -> Netns {
    let ns = Netns::new(tag).expect("namespace");
    netns::veth(node, device, &ns, "eth0").expect("veth");
    node.ip(&["addr", "add", &format!("{gateway}/{prefix}"), "dev", device])
        .expect("gateway address");
    ns.ip(&["addr", "add", &format!("{address}/{prefix}"), "dev", "eth0"])
        .expect("address");
    if prefix == "32" {
        node.ip(&["route", "add", &format!("{address}/32"), "dev", device])
            .expect("route to the pod");
        ns.ip(&["route", "add", gateway, "dev", "eth0"])
            .expect("route to the gateway");
    }
    ns.ip(&["route", "add", "default", "via", gateway])
        .expect("default route");
    ns
}

/// A node (10.0.0.1 on `eth0`) and the machine beside it (10.0.0.2), which is the node's
/// default route; the node forwards.
fn node_and_neighbour(node_tag: &str, neighbour_tag: &str) -> (Netns, Netns) {
    let node = Netns::new(node_tag).expect("node");
    let neighbour = Netns::new(neighbour_tag).expect("neighbour");
    netns::veth(&node, "eth0", &neighbour, "eth0").expect("veth");
    node.ip(&["addr", "add", "10.0.0.1/24", "dev", "eth0"])
        .expect("node address");
    neighbour
        .ip(&["addr", "add", "10.0.0.2/24", "dev", "eth0"])
        .expect("neighbour address");
    node.ip(&["route", "add", "default", "via", "10.0.0.2"])
        .expect("node's default route");
    node.sysctl("net.ipv4.ip_forward", "1").expect("forwarding");
    (node, neighbour)
}

/// Answers every connection on `port` with its own address and the peer's.
fn greeter(ns: &Netns, address: &str, port: u16) {
    let own = format!("{address}:{port}");
    let listener = ns
        .enter(|| TcpListener::bind(("0.0.0.0", port)).expect("listener"))
        .expect("entering the endpoint");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let peer = stream.peer_addr().map(|peer| peer.ip().to_string());
            let _ = stream.write_all(format!("{own} {}", peer.unwrap_or_default()).as_bytes());
        }
    });
}

/// What the kernel did with one connection, in [`nodus_proxy::plan::Trace::summary`]'s
/// words: the endpoint that answered (with ` masq` when it saw another source than
/// `source`), `REJECT` or `DROP`.
fn observe(client: &Netns, source: IpAddr, destination: SocketAddr) -> String {
    client
        .enter(
            || match TcpStream::connect_timeout(&destination, Duration::from_secs(2)) {
                Ok(mut stream) => {
                    stream
                        .set_read_timeout(Some(Duration::from_secs(3)))
                        .expect("timeout");
                    let mut text = String::new();
                    stream.read_to_string(&mut text).expect("greeting");
                    let (endpoint, peer) = text.split_once(' ').expect("endpoint and peer");
                    if peer == source.to_string() {
                        endpoint.to_string()
                    } else {
                        format!("{endpoint} masq")
                    }
                }
                Err(error) if error.kind() == ErrorKind::ConnectionRefused => "REJECT".into(),
                Err(error) if error.kind() == ErrorKind::TimedOut => "DROP".into(),
                Err(error) => panic!("{destination}: {error}"),
            },
        )
        .expect("entering the client")
}

#[test]
fn the_tracer_predicts_what_the_kernel_does() {
    netns::require_root();
    // node-a: 10.0.0.1 towards the outside client (10.0.0.2), pods 10.244.1.0/24 behind
    // it; node-b's pods (10.244.2.0/24) stand behind a link of their own.
    let (node, outside) = node_and_neighbour("trnd", "trout");
    for range in ["10.96.0.0/16", "192.0.2.0/24", "198.51.100.0/24"] {
        outside
            .ip(&["route", "add", range, "via", "10.0.0.1"])
            .expect("route to the node");
    }
    let pod = attach(&node, "pa0", "trpa", "10.244.1.9", "10.244.1.1", "32");
    let endpoint = attach(&node, "pb0", "trpb", "10.244.1.5", "10.244.1.1", "32");
    let remote = attach(&node, "far0", "trfar", "10.244.2.5", "10.244.2.1", "24");
    for port in [8080, 8081] {
        greeter(&endpoint, "10.244.1.5", port);
        greeter(&remote, "10.244.2.5", port);
    }

    let here = ("10.244.1.5", NODE);
    let there = ("10.244.2.5", "node-b");
    let mut view = node_view(&[here]);
    let typed = |kind: &str, cluster_ip: &str, node_port: u16, extra: serde_json::Value| {
        let mut spec = json!({
            "type": kind, "clusterIP": cluster_ip,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": node_port}]
        });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        spec
    };
    let applied = view.apply([
        service(
            "spread",
            http(json!({"clusterIP": "10.96.0.21"})),
            json!({}),
        ),
        slice("spread", "IPv4", &[here, there], 8080),
        service(
            "np-remote",
            typed("NodePort", "10.96.0.22", 30180, json!({})),
            json!({}),
        ),
        slice("np-remote", "IPv4", &[there], 8080),
        service(
            "np-local",
            typed(
                "NodePort",
                "10.96.0.23",
                30181,
                json!({"externalTrafficPolicy": "Local"}),
            ),
            json!({}),
        ),
        slice("np-local", "IPv4", &[there], 8080),
        service(
            "ext-local",
            http(
                json!({"clusterIP": "10.96.0.24", "externalIPs": ["192.0.2.50"],
                        "externalTrafficPolicy": "Local"}),
            ),
            json!({}),
        ),
        slice("ext-local", "IPv4", &[there], 8080),
        service(
            "lb-open",
            typed(
                "LoadBalancer",
                "10.96.0.25",
                30182,
                json!({"loadBalancerSourceRanges": ["10.0.0.0/30"]}),
            ),
            json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.5"}]}}),
        ),
        slice("lb-open", "IPv4", &[here], 8080),
        service(
            "lb-closed",
            typed(
                "LoadBalancer",
                "10.96.0.26",
                30183,
                json!({"loadBalancerSourceRanges": ["172.16.0.0/12"]}),
            ),
            json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.6"}]}}),
        ),
        slice("lb-closed", "IPv4", &[here], 8080),
        service(
            "itp-local",
            http(json!({"clusterIP": "10.96.0.27", "internalTrafficPolicy": "Local"})),
            json!({}),
        ),
        slice("itp-local", "IPv4", &[there], 8080),
        // Two ports, whose rules share one dispatch chain (and one local chain, reached
        // from the external IP under the Local policy).
        service(
            "two-ports",
            json!({"clusterIP": "10.96.0.28", "externalIPs": ["192.0.2.51"],
                   "externalTrafficPolicy": "Local",
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP"},
                             {"name": "alt", "port": 81, "protocol": "TCP"}]}),
            json!({}),
        ),
        slice_with_ports(
            "two-ports",
            "IPv4",
            &[here, there],
            json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                   {"name": "alt", "port": 8081, "protocol": "TCP"}]),
        ),
    ]);
    assert!(applied.invalid.is_empty(), "{:?}", applied.invalid);
    let config = ProxySettings::default();
    let mut proxy = node
        .enter(|| Proxy::new(config.clone()).expect("proxy"))
        .expect("entering the node");
    let report = proxy.full_sync(&view).expect("full sync");
    assert!(report.refused.is_empty(), "{report:?}");

    let planner = Planner::new(&view, &config);

    let flows: [(Entry, &Netns, &str, &str); 20] = [
        (Entry::Pod, &pod, "10.244.1.9", "10.96.0.10:80"),
        (Entry::Outside, &outside, "10.0.0.2", "10.96.0.10:80"),
        (Entry::Host, &node, "10.0.0.1", "10.96.0.10:80"),
        (Entry::Pod, &pod, "10.244.1.9", "10.96.0.21:80"),
        (Entry::Pod, &pod, "10.244.1.9", "10.96.0.12:80"),
        (Entry::Pod, &pod, "10.244.1.9", "10.96.0.10:81"),
        (Entry::Outside, &outside, "10.0.0.2", "10.0.0.1:30180"),
        (Entry::Outside, &outside, "10.0.0.2", "10.0.0.1:30181"),
        (Entry::Pod, &pod, "10.244.1.9", "10.0.0.1:30181"),
        (Entry::Host, &node, "10.0.0.1", "10.0.0.1:30181"),
        (Entry::Outside, &outside, "10.0.0.2", "192.0.2.50:80"),
        (Entry::Host, &node, "10.0.0.1", "192.0.2.50:80"),
        (Entry::Outside, &outside, "10.0.0.2", "198.51.100.5:80"),
        (Entry::Outside, &outside, "10.0.0.2", "198.51.100.6:80"),
        (Entry::Pod, &pod, "10.244.1.9", "10.96.0.27:80"),
        (Entry::Pod, &pod, "10.244.1.9", "10.96.0.28:80"),
        (Entry::Pod, &pod, "10.244.1.9", "10.96.0.28:81"),
        (Entry::Pod, &pod, "10.244.1.9", "10.96.0.28:82"),
        (Entry::Outside, &outside, "10.0.0.2", "192.0.2.51:81"),
        // The endpoint to itself (hairpin).
        (Entry::Pod, &endpoint, "10.244.1.5", "10.96.0.10:80"),
    ];
    let mut wrong = Vec::new();
    let mut outcomes = BTreeSet::new();
    for (entry, client, source, destination) in flows {
        let source: IpAddr = source.parse().expect("source");
        let destination: SocketAddr = destination.parse().expect("destination");
        let trace = planner.trace(Packet {
            entry,
            source,
            destination: destination.ip(),
            protocol: Protocol::Tcp,
            port: destination.port(),
        });
        let predicted = trace.summary();
        let predicted_set: BTreeSet<&str> = predicted.split(", ").collect();
        // A random choice is seen one connection at a time.
        let tries = if trace.paths.len() > 1 { 6 } else { 1 };
        for _ in 0..tries {
            let observed = observe(client, source, destination);
            if !predicted_set.contains(observed.as_str()) {
                wrong.push(format!(
                    "the kernel said {observed:?}; the tracer:\n{trace}"
                ));
            }
            outcomes.insert(observed);
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The flows cover every kind of outcome, so the agreement means something.
    for kind in [
        "REJECT",
        "DROP",
        "10.244.1.5:8080 masq",
        "10.244.2.5:8080",
        "10.244.2.5:8080 masq",
        // The second port of a shared chain, through its local chain (no random pick).
        "10.244.1.5:8081",
    ] {
        assert!(
            outcomes.contains(kind),
            "no flow ended {kind:?}: {outcomes:?}"
        );
    }
}

/// C.25: an address of a ServiceCIDR that no service holds is dropped on the node instead
/// of being routed on. Here the node's default route leads to a machine that answers on
/// 10.96.0.200, as a real gateway might forward it anywhere; a ServiceCIDR arriving,
/// changing and going is a partial sync that rewrites only the skeleton.
#[test]
fn unallocated_service_addresses_are_dropped_while_a_service_cidr_holds_them() {
    netns::require_root();
    let (node, gateway) = node_and_neighbour("trcnd", "trcgw");
    gateway
        .ip(&["addr", "add", "10.96.0.200/32", "dev", "lo"])
        .expect("the unallocated address, out there");
    gateway
        .ip(&["route", "add", "10.244.0.0/16", "via", "10.0.0.1"])
        .expect("route back to the pods");
    let pod = attach(&node, "pa0", "trcpa", "10.244.1.9", "10.244.1.1", "32");
    let endpoint = attach(&node, "pb0", "trcpb", "10.244.1.5", "10.244.1.1", "32");
    greeter(&endpoint, "10.244.1.5", 8080);
    greeter(&gateway, "10.96.0.200", 80);

    let mut view = node_view(&[("10.244.1.5", NODE)]);
    let config = ProxySettings::default();
    let mut proxy = node
        .enter(|| Proxy::new(config.clone()).expect("proxy"))
        .expect("entering the node");
    proxy.full_sync(&view).expect("full sync");
    let source: IpAddr = "10.244.1.9".parse().expect("source");
    let outcome = |view: &nodus_view::View, destination: &str| {
        let destination: SocketAddr = destination.parse().expect("destination");
        let traced = Planner::new(view, &config)
            .trace(Packet {
                entry: Entry::Pod,
                source,
                destination: destination.ip(),
                protocol: Protocol::Tcp,
                port: destination.port(),
            })
            .summary();
        let observed = observe(&pod, source, destination);
        assert_eq!(observed, traced, "{destination}: the kernel and the tracer");
        observed
    };
    assert_eq!(outcome(&view, "10.96.0.200:80"), "10.96.0.200:80");

    let service_cidr = |cidrs: serde_json::Value| {
        nodus_view::Update::ServiceCidr(
            serde_json::from_value(json!({"metadata": {"name": "kubernetes"},
                                          "spec": {"cidrs": cidrs}}))
            .expect("service cidr"),
        )
    };
    let mut sync = |view: &mut nodus_view::View, update| {
        let applied = view.apply([update]);
        assert!(applied.changes.service_cidrs, "{applied:?}");
        let report = proxy.sync(view, &applied.changes).expect("sync");
        assert_eq!(report.kind, nodus_proxy::apply::SyncKind::Partial);
    };
    sync(
        &mut view,
        service_cidr(json!(["10.96.0.0/16", "fd00:96::/112"])),
    );
    assert_eq!(outcome(&view, "10.96.0.200:80"), "DROP");
    // Allocated addresses answer as before: an endpoint, or a refusal of a port.
    assert_eq!(outcome(&view, "10.96.0.10:80"), "10.244.1.5:8080");
    assert_eq!(outcome(&view, "10.96.0.10:81"), "REJECT");
    assert_eq!(outcome(&view, "10.96.0.12:80"), "REJECT");

    // The range shrinks past the address, then goes: it is routed on again.
    sync(&mut view, service_cidr(json!(["10.96.0.0/25"])));
    assert_eq!(outcome(&view, "10.96.0.200:80"), "10.96.0.200:80");
    sync(&mut view, service_cidr(json!(["10.96.0.0/24"])));
    assert_eq!(outcome(&view, "10.96.0.200:80"), "DROP");
    sync(
        &mut view,
        nodus_view::Update::Deleted {
            kind: nodus_view::Kind::ServiceCidr,
            namespace: String::new(),
            name: "kubernetes".into(),
        },
    );
    assert_eq!(outcome(&view, "10.96.0.200:80"), "10.96.0.200:80");
}
