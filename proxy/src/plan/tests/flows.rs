//! Packet flows through the planned ruleset, as kube-proxy's `runPacketFlowTests`: a
//! cluster of many shapes, then for each packet (where it enters, its source, its
//! destination) what the checklist says must become of it. The expectations are written
//! from the checklist, not from the planner; the tracer walks the plan
//! (`trace.rs`), and the kernel tests check the tracer against real packets.

use super::*;

/// This node's planner, whose tracer the flows ask.
struct Flows<'v> {
    planner: Planner<'v>,
}

impl<'v> Flows<'v> {
    fn new(view: &'v View, config: &ProxySettings) -> Flows<'v> {
        Flows {
            planner: Planner::new(view, config),
        }
    }

    fn trace(&self, entry: Entry, source: &str, protocol: &str, destination: &str) -> Trace {
        let destination: std::net::SocketAddr = destination.parse().expect("destination");
        let protocol = match protocol {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            _ => Protocol::Sctp,
        };
        self.planner.trace(Packet {
            entry,
            source: source.parse().expect("source"),
            destination: destination.ip(),
            protocol,
            port: destination.port(),
        })
    }

    /// Each flow: a name (the checklist item), where it enters, the source, protocol and
    /// destination, and the expected [`Trace::summary`]. All are checked, then every
    /// mismatch is reported at once.
    fn check(&self, flows: &[(&str, Entry, &str, &str, &str, &str)]) {
        let wrong: Vec<String> = flows
            .iter()
            .filter_map(|(name, entry, source, protocol, destination, expected)| {
                let trace = self.trace(*entry, source, protocol, destination);
                (trace.summary() != *expected)
                    .then(|| format!("{name}: expected {expected:?}, traced\n{trace}"))
            })
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}

use nodus_view::model::Protocol;

const POD: &str = "10.244.1.9";
const NODE_IP: &str = "192.168.0.10";
const OUTSIDE: &str = "192.0.2.1";

fn typed(name: &str, kind: &str, cluster_ip: &str, node_port: u16, extra: Json) -> Update {
    let mut spec = json!({
        "type": kind, "clusterIP": cluster_ip,
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": node_port}]
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    let status = spec
        .as_object_mut()
        .and_then(|spec| spec.remove("status"))
        .unwrap_or_else(|| json!({}));
    service(name, spec, status)
}

/// Services of every kind the checklist names, their endpoints on this node (node-a, pods
/// in 10.244.1.0/24) and on node-b (10.244.2.0/24).
fn cluster() -> View {
    view([
        this_node(),
        service("web", json!({"clusterIP": "10.96.0.10"}), json!({})),
        http_slice(
            "web",
            &[("10.244.1.5", NODE, true), ("10.244.2.5", "node-b", true)],
        ),
        service("empty", json!({"clusterIP": "10.96.0.20"}), json!({})),
        typed("np", "NodePort", "10.96.0.30", 30080, json!({})),
        http_slice("np", &[("10.244.2.6", "node-b", true)]),
        typed(
            "np-local-elsewhere",
            "NodePort",
            "10.96.0.31",
            30081,
            json!({"externalTrafficPolicy": "Local"}),
        ),
        http_slice("np-local-elsewhere", &[("10.244.2.7", "node-b", true)]),
        typed(
            "np-local",
            "NodePort",
            "10.96.0.32",
            30082,
            json!({"externalTrafficPolicy": "Local"}),
        ),
        http_slice(
            "np-local",
            &[("10.244.1.8", NODE, true), ("10.244.2.8", "node-b", true)],
        ),
        service(
            "ext",
            json!({"clusterIP": "10.96.0.40", "externalIPs": ["203.0.113.50"]}),
            json!({}),
        ),
        http_slice("ext", &[("10.244.2.9", "node-b", true)]),
        typed(
            "lb",
            "LoadBalancer",
            "10.96.0.50",
            30090,
            json!({"loadBalancerSourceRanges": ["192.0.2.0/24"],
                   "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.5"}]}}}),
        ),
        http_slice("lb", &[("10.244.2.10", "node-b", true)]),
        service(
            "itp-local",
            json!({"clusterIP": "10.96.0.60", "internalTrafficPolicy": "Local"}),
            json!({}),
        ),
        http_slice("itp-local", &[("10.244.2.11", "node-b", true)]),
        service("terminating", json!({"clusterIP": "10.96.0.70"}), json!({})),
        http_slice(
            "terminating",
            &[
                ("10.244.2.12", "node-b", true),
                ("10.244.2.13", "node-b", false),
            ],
        ),
        service_cidr("kubernetes", json!(["10.96.0.0/16"])),
    ])
}

#[test]
#[expect(clippy::too_many_lines, reason = "one table of cases")]
fn every_kind_of_service_as_the_checklist_says() {
    use Entry::{Host, Outside, Pod};
    let both = "10.244.1.5:8080, 10.244.2.5:8080";
    let both_masq = "10.244.1.5:8080 masq, 10.244.2.5:8080 masq";
    let view = cluster();
    let flows = Flows::new(&view, &ProxySettings::default());
    flows.check(&[
        (
            "C.21 pod to ClusterIP",
            Pod,
            POD,
            "tcp",
            "10.96.0.10:80",
            both,
        ),
        (
            "D.29 outside to ClusterIP",
            Outside,
            OUTSIDE,
            "tcp",
            "10.96.0.10:80",
            both_masq,
        ),
        (
            "D.29 host to ClusterIP",
            Host,
            NODE_IP,
            "tcp",
            "10.96.0.10:80",
            both_masq,
        ),
        (
            "C.24 undefined port",
            Pod,
            POD,
            "tcp",
            "10.96.0.10:81",
            "REJECT",
        ),
        (
            "C.25 an unallocated address of a ServiceCIDR, from a pod",
            Pod,
            POD,
            "tcp",
            "10.96.0.200:80",
            "DROP",
        ),
        (
            "C.25 from the host",
            Host,
            NODE_IP,
            "tcp",
            "10.96.0.200:80",
            "DROP",
        ),
        (
            "C.25 from outside",
            Outside,
            OUTSIDE,
            "udp",
            "10.96.1.1:53",
            "DROP",
        ),
        (
            "C.25 outside every ServiceCIDR, routed on",
            Pod,
            POD,
            "tcp",
            "10.97.0.1:80",
            "10.97.0.1:80",
        ),
        (
            "J.58 protocol is part of the key",
            Pod,
            POD,
            "udp",
            "10.96.0.10:80",
            "REJECT",
        ),
        (
            "C.23 no endpoints",
            Pod,
            POD,
            "tcp",
            "10.96.0.20:80",
            "REJECT",
        ),
        (
            "B.12 terminating endpoints are not used",
            Pod,
            POD,
            "tcp",
            "10.96.0.70:80",
            "10.244.2.12:8080",
        ),
        (
            "B.19 iTP=Local, none here",
            Pod,
            POD,
            "tcp",
            "10.96.0.60:80",
            "DROP",
        ),
        (
            "D.27 an endpoint to itself",
            Pod,
            "10.244.1.5",
            "tcp",
            "10.96.0.10:80",
            "10.244.1.5:8080 masq, 10.244.2.5:8080",
        ),
        (
            "E.33 D.31 NodePort",
            Outside,
            OUTSIDE,
            "tcp",
            "192.168.0.10:30080",
            "10.244.2.6:8080 masq",
        ),
        (
            "E.34 not on another address",
            Outside,
            OUTSIDE,
            "tcp",
            "203.0.113.1:30080",
            "203.0.113.1:30080",
        ),
        (
            "E.33 a port no service has",
            Outside,
            OUTSIDE,
            "tcp",
            "192.168.0.10:30999",
            "192.168.0.10:30999",
        ),
        (
            "E.37 eTP=Local, none here",
            Outside,
            OUTSIDE,
            "tcp",
            "192.168.0.10:30081",
            "DROP",
        ),
        (
            "F.45 pods short-circuit",
            Pod,
            POD,
            "tcp",
            "192.168.0.10:30081",
            "10.244.2.7:8080",
        ),
        (
            "F.46 the host short-circuits",
            Host,
            NODE_IP,
            "tcp",
            "192.168.0.10:30081",
            "10.244.2.7:8080 masq",
        ),
        (
            "D.32 eTP=Local keeps the source",
            Outside,
            OUTSIDE,
            "tcp",
            "192.168.0.10:30082",
            "10.244.1.8:8080",
        ),
        (
            "F.40 ExternalIP",
            Outside,
            OUTSIDE,
            "tcp",
            "203.0.113.50:80",
            "10.244.2.9:8080 masq",
        ),
        (
            "F.42 inside the source ranges",
            Outside,
            "192.0.2.7",
            "tcp",
            "198.51.100.5:80",
            "10.244.2.10:8080 masq",
        ),
        (
            "F.42 outside them",
            Outside,
            "198.18.0.1",
            "tcp",
            "198.51.100.5:80",
            "DROP",
        ),
        (
            "E.38 ranges do not guard NodePorts",
            Outside,
            "198.18.0.1",
            "tcp",
            "192.168.0.10:30090",
            "10.244.2.10:8080 masq",
        ),
        (
            "not a service",
            Pod,
            POD,
            "tcp",
            "10.244.2.5:8080",
            "10.244.2.5:8080",
        ),
    ]);
}

#[test]
fn a_trace_names_every_rule_it_matched() {
    let view = cluster();
    let flows = Flows::new(&view, &ProxySettings::default());
    let trace = flows.trace(Entry::Outside, "198.18.0.1", "tcp", "198.51.100.5:80");
    let text = trace.to_string();
    for expected in [
        "tcp 198.18.0.1 -> 198.51.100.5:80 from outside the node",
        "prerouting  filter-prerouting",
        "ct state new jump firewall-check",
        "198.51.100.5 . tcp . 80 : goto firewall-",
        "ip saddr != { 192.0.2.0-192.0.2.255 } drop",
        "=> dropped in firewall-",
        "summary: DROP",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    let spread = flows.trace(Entry::Pod, POD, "tcp", "10.96.0.10:80");
    assert_eq!(spread.paths.len(), 2);
    let text = spread.to_string();
    assert!(text.contains("path 2 of 2:"), "{text}");
    assert!(text.contains("dnat to 10.244.2.5:8080 (2 of 2)"), "{text}");
    assert!(
        text.contains("routed on to 10.244.2.5:8080, source kept"),
        "{text}"
    );
}

#[test]
fn options_and_special_services_change_the_flows() {
    use Entry::Pod;
    let view = cluster();
    let all = Flows::new(
        &view,
        &ProxySettings {
            masquerade_all: true,
            ..ProxySettings::default()
        },
    );
    all.check(&[(
        "D.28 masquerade all",
        Pod,
        POD,
        "tcp",
        "10.96.0.30:80",
        "10.244.2.6:8080 masq",
    )]);

    let view = super::view([
        this_node(),
        service(
            "kube-dns",
            json!({"clusterIP": "10.96.0.10",
                   "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
            json!({}),
        ),
        service(
            "sticky",
            json!({"clusterIP": "10.96.0.80", "sessionAffinity": "ClientIP"}),
            json!({}),
        ),
        http_slice("sticky", &two_endpoints()),
        service(
            "dual",
            json!({"clusterIPs": ["10.96.0.90", "fd00:96::90"], "ipFamilyPolicy": "RequireDualStack"}),
            json!({}),
        ),
        slice(
            "dual",
            "dual-v6",
            "IPv6",
            &[("fd00:244:2::5", "node-b", true)],
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
        ),
    ]);
    let config = local_dns_config();
    Flows::new(&view, &config).check(&[
        (
            "local DNS",
            Pod,
            POD,
            "udp",
            "10.96.0.10:53",
            "192.168.0.10:5353",
        ),
        (
            "G.48 affinity",
            Pod,
            POD,
            "tcp",
            "10.96.0.80:80",
            "10.244.1.5:8080, 10.244.2.9:8080",
        ),
        (
            "J.57 IPv6",
            Pod,
            "fd00:244:1::9",
            "tcp",
            "[fd00:96::90]:80",
            "[fd00:244:2::5]:8080",
        ),
        (
            "J.57 IPv4 without endpoints",
            Pod,
            POD,
            "tcp",
            "10.96.0.90:80",
            "REJECT",
        ),
    ]);
}

/// D.29 by interface: pods are told by the interface their packets come in through, so a
/// pod whose address lies outside the pod ranges is still a pod, and the host is not.
#[test]
fn the_local_traffic_detector_by_interface() {
    use Entry::{Host, Pod};
    let view = cluster();
    for detector in [
        LocalDetector::InterfaceNamePrefix("veth".into()),
        LocalDetector::BridgeInterface("cni0".into()),
    ] {
        let config = ProxySettings {
            local_detector: detector.clone(),
            ..ProxySettings::default()
        };
        let flows = Flows::new(&view, &config);
        flows.check(&[
            (
                "D.29 a pod outside the pod ranges",
                Pod,
                "10.50.0.9",
                "tcp",
                "10.96.0.30:80",
                "10.244.2.6:8080",
            ),
            (
                "D.29 the host",
                Host,
                NODE_IP,
                "tcp",
                "10.96.0.30:80",
                "10.244.2.6:8080 masq",
            ),
            (
                "F.45 pods short-circuit",
                Pod,
                "10.50.0.9",
                "tcp",
                "192.168.0.10:30081",
                "10.244.2.7:8080",
            ),
        ]);
        let expected = match &detector {
            LocalDetector::InterfaceNamePrefix(_) => {
                "iifname != \"veth*\" jump mark-for-masquerade"
            }
            _ => "iifname != \"cni0\" jump mark-for-masquerade",
        };
        let services = skeleton_rules(&view, &config, "services");
        assert!(
            services.iter().any(|rule| rule.ends_with(expected)),
            "{services:?}"
        );
    }
    // By CIDR, the same pod is not one, and is masqueraded.
    Flows::new(&view, &ProxySettings::default()).check(&[(
        "D.29 by CIDR",
        Pod,
        "10.50.0.9",
        "tcp",
        "10.96.0.30:80",
        "10.244.2.6:8080 masq",
    )]);
}

/// E.35: with localhost NodePorts, this host reaches a NodePort on 127.0.0.1, masqueraded
/// so that the reply finds its way back; other machines reach nothing in 127.0.0.0/8.
#[test]
fn localhost_node_ports_are_for_this_host_only() {
    use Entry::{Host, Outside};
    let view = cluster();
    Flows::new(&view, &ProxySettings::default()).check(&[(
        "E.35 off",
        Host,
        "127.0.0.1",
        "tcp",
        "127.0.0.1:30080",
        "127.0.0.1:30080",
    )]);
    let config = ProxySettings {
        localhost_node_ports: true,
        ..ProxySettings::default()
    };
    Flows::new(&view, &config).check(&[
        (
            "E.35 on",
            Host,
            "127.0.0.1",
            "tcp",
            "127.0.0.1:30080",
            "10.244.2.6:8080 masq",
        ),
        (
            "E.35 eTP=Local short-circuits",
            Host,
            "127.0.0.1",
            "tcp",
            "127.0.0.1:30081",
            "10.244.2.7:8080 masq",
        ),
        (
            "CVE-2020-8558",
            Outside,
            OUTSIDE,
            "tcp",
            "127.0.0.1:30080",
            "DROP",
        ),
        (
            "E.34 the node's address still",
            Outside,
            OUTSIDE,
            "tcp",
            "192.168.0.10:30080",
            "10.244.2.6:8080 masq",
        ),
    ]);
}
