//! The proxy with real packets: `nodus sandbox --real-api` runs a two-node cluster served
//! by a real control plane, in network namespaces, each node running `nodus run` with the
//! proxy on, and pods running the echo server, which answers with its pod name. Clients in
//! pod namespaces (or on the underlay, outside the cluster) connect with `curl` and check
//! where they landed.

use crate::support::{Sandbox, WAIT, wait_for};
use nodus_testbed::netns;
use nodus_testbed::probe::{SourceEcho, tcp_who};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub(crate) fn node(name: &str, index: u8) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
           "spec": {"podCIDRs": [format!("10.244.{index}.0/24"), format!("fd00:244:{index}::/64")]},
           "status": {"addresses": []}})
}

pub(crate) fn service(name: &str, spec: Value) -> Value {
    let mut base = json!({"type": "ClusterIP",
                          "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]});
    if let (Some(base), Some(spec)) = (base.as_object_mut(), spec.as_object()) {
        base.extend(spec.clone());
    }
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "default"}, "spec": base})
}

fn with_status(mut service: Value, status: Value) -> Value {
    service["status"] = status;
    service
}

/// An EndpointSlice of ready pods, `(pod, node, ip)`, all of one family (the first's).
pub(crate) fn slice(service: &str, pods: &[(&str, &str, &str)]) -> Value {
    let family = match pods.first() {
        Some((_, _, ip)) if ip.contains(':') => "IPv6",
        _ => "IPv4",
    };
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|(pod, node, ip)| {
            json!({"addresses": [ip], "conditions": {"ready": true, "serving": true},
                   "nodeName": node, "targetRef": {"kind": "Pod", "name": pod}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{service}-{}", family.to_lowercase()),
                        "namespace": "default",
                        "labels": {"kubernetes.io/service-name": service}},
           "addressType": family, "endpoints": endpoints,
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

fn udp_slice(pods: &[(&str, &str, &str)]) -> Value {
    let mut slice = slice("udp", pods);
    slice["ports"] = json!([{"name": "dns", "port": 8080, "protocol": "UDP"}]);
    slice
}

/// One datagram to `service` from source port 40000 of namespace `ns`: the answering
/// pod's name. A fixed source port keeps the flow (and its conntrack entry) the same.
pub(crate) fn udp_ask(ns: &str, service: &str) -> String {
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('', 40000))\n\
         s.settimeout(2)\n\
         s.sendto(b'who', ('{service}', 53))\n\
         print(s.recvfrom(100)[0].decode().strip())\n"
    );
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c", &script])
        .output()
        .expect("python3 runs");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

pub(crate) const A1: (&str, &str, &str) = ("a-1", "node-a", "10.244.1.11");
const A2: (&str, &str, &str) = ("a-2", "node-a", "10.244.1.12");
pub(crate) const B1: (&str, &str, &str) = ("b-1", "node-b", "10.244.2.11");
const B2: (&str, &str, &str) = ("b-2", "node-b", "10.244.2.12");
// The same pods' IPv6 addresses, in their nodes' IPv6 pod CIDRs.
const A1_V6: (&str, &str, &str) = ("a-1", "node-a", "fd00:244:1::11");
const A2_V6: (&str, &str, &str) = ("a-2", "node-a", "fd00:244:1::12");
const B1_V6: (&str, &str, &str) = ("b-1", "node-b", "fd00:244:2::11");
const B2_V6: (&str, &str, &str) = ("b-2", "node-b", "fd00:244:2::12");

fn cluster() -> String {
    let docs = [
        node("node-a", 1),
        node("node-b", 2),
        service("spread", json!({"clusterIP": "10.96.1.1"})),
        slice("spread", &[A1, A2, B1, B2]),
        service(
            "sticky",
            json!({"clusterIP": "10.96.1.2", "sessionAffinity": "ClientIP",
                   "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}}),
        ),
        slice("sticky", &[A1, A2, B1, B2]),
        service("self", json!({"clusterIP": "10.96.1.3"})),
        slice("self", &[A1]),
        service(
            "local",
            json!({"clusterIP": "10.96.1.4", "type": "NodePort", "externalTrafficPolicy": "Local",
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                              "nodePort": 30090, "protocol": "TCP"}]}),
        ),
        slice("local", &[B1]),
        with_status(
            service(
                "ranged",
                json!({"clusterIP": "10.96.1.5", "type": "LoadBalancer",
                       "loadBalancerSourceRanges": ["172.30.0.1/32"],
                       "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                                  "nodePort": 30091, "protocol": "TCP"}]}),
            ),
            json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.50"}]}}),
        ),
        slice("ranged", &[A1]),
        service(
            "empty",
            json!({"clusterIP": "10.96.1.6", "clusterIPs": ["10.96.1.6", "fd00:96::106"],
                   "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack"}),
        ),
        service(
            "udp",
            json!({"clusterIP": "10.96.1.7",
                   "ports": [{"name": "dns", "port": 53, "targetPort": 8080, "protocol": "UDP"}]}),
        ),
        udp_slice(&[A1]),
        service(
            "six",
            json!({"clusterIP": "fd00:96::101", "clusterIPs": ["fd00:96::101"],
                   "ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack"}),
        ),
        slice("six", &[A1_V6, A2_V6, B1_V6, B2_V6]),
        service(
            "dual",
            json!({"type": "NodePort", "clusterIP": "10.96.1.8",
                   "clusterIPs": ["10.96.1.8", "fd00:96::108"],
                   "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                              "nodePort": 30092, "protocol": "TCP"}]}),
        ),
        slice("dual", &[A1, B1]),
        slice("dual", &[A1_V6, B1_V6]),
    ];
    docs.iter().map(|doc| format!("---\n{doc}\n")).collect()
}

/// Routes `destination` from namespace `ns` through `gateway`.
pub(crate) fn route_via(ns: &str, destination: &str, gateway: &str) {
    let route = ["-n", ns, "route", "add", destination, "via", gateway];
    netns::run("ip", &route).unwrap_or_else(|e| panic!("a route to {destination}: {e}"));
}

/// `curl` from namespace `ns`: the answering pod's name, or curl's exit code.
pub(crate) fn curl(ns: &str, url: &str, extra: &[&str]) -> Result<String, i32> {
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-s", "-m", "2"])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl runs");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        Err(output.status.code().unwrap_or(-1))
    }
}

/// Answers to `count` new connections, every one of which must succeed.
fn spread(ns: &str, url: &str, count: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..count {
        let answer = curl(ns, url, &[])
            .unwrap_or_else(|code| panic!("{url} from {ns}: curl exit {code} after {seen:?}"));
        *seen.entry(answer).or_default() += 1;
    }
    seen
}

const CURL_TIMEOUT: i32 = 28;
const CURL_REFUSED: i32 = 7;

#[test]
fn services_deliver_real_connections_where_kube_proxy_would() {
    let sandbox = Sandbox::start_with("proxy-packets", Some(&cluster()), &["--real-api".as_ref()]);
    let pod = |name: &str| sandbox.ns("pods", name);
    let underlay = sandbox.namespaces["underlay"]
        .as_str()
        .expect("underlay namespace")
        .to_string();
    let (node_a, node_b) = ("172.30.0.11", "172.30.0.12");
    // The sandbox numbers node N's underlay addresses alike in both families (::b is 11).
    let node_b_v6 = "fd00:172:30::c";

    // C.21: new connections spread over local and remote endpoints.
    let seen = spread(&pod("a-2"), "http://10.96.1.1/", 40);
    for endpoint in ["a-1", "a-2", "b-1", "b-2"] {
        assert!(
            seen.contains_key(endpoint),
            "{endpoint} never chosen: {seen:?}"
        );
    }

    // J.57: an IPv6-only service spreads over local and remote endpoints.
    let seen = spread(&pod("a-2"), "http://[fd00:96::101]/", 40);
    for endpoint in ["a-1", "a-2", "b-1", "b-2"] {
        assert!(
            seen.contains_key(endpoint),
            "{endpoint} never chosen over IPv6: {seen:?}"
        );
    }

    // J.57: a dual-stack service answers on both ClusterIPs, each family from its own
    // EndpointSlice, and on its NodePort at the node's IPv4 and IPv6 underlay addresses.
    let client = pod("a-2");
    for (from, url) in [
        (&client, "http://10.96.1.8/".to_string()),
        (&client, "http://[fd00:96::108]/".to_string()),
        (&underlay, format!("http://{node_b}:30092/")),
        (&underlay, format!("http://[{node_b_v6}]:30092/")),
    ] {
        let seen = spread(from, &url, 20);
        assert_eq!(
            seen.keys().collect::<Vec<_>>(),
            ["a-1", "b-1"],
            "{url} from {from}"
        );
    }

    // G.48: with ClientIP affinity, 20 connections land on one endpoint.
    let seen = spread(&pod("a-2"), "http://10.96.1.2/", 20);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen.keys().all(|k| k.len() == 3), "{seen:?}");

    // D.27: hairpin, a pod reaching itself through its service.
    assert_eq!(
        curl(&pod("a-1"), "http://10.96.1.3/", &[]).as_deref(),
        Ok("a-1")
    );

    // C.23: no endpoints: refused (an ICMP error), not left to time out, in both families.
    for url in ["http://10.96.1.6/", "http://[fd00:96::106]/"] {
        assert_eq!(curl(&pod("a-2"), url, &[]), Err(CURL_REFUSED), "{url}");
    }

    // E.37, F.45: external Local policy: delivered on the node with the endpoint,
    // dropped (not refused) on the other; a pod still reaches it through node-a.
    assert_eq!(
        curl(&underlay, &format!("http://{node_b}:30090/"), &[]).as_deref(),
        Ok("b-1")
    );
    assert_eq!(
        curl(&underlay, &format!("http://{node_a}:30090/"), &[]),
        Err(CURL_TIMEOUT)
    );
    assert_eq!(
        curl(&pod("a-2"), &format!("http://{node_a}:30090/"), &[]).as_deref(),
        Ok("b-1")
    );

    // F.42: source ranges on the LB IP: 172.30.0.1 is allowed, 172.30.0.2 is not.
    route_via(&underlay, "192.0.2.50/32", node_a);
    netns::run(
        "ip",
        &[
            "-n",
            &underlay,
            "addr",
            "add",
            "172.30.0.2/24",
            "dev",
            "br0",
        ],
    )
    .expect("second underlay address");
    assert_eq!(
        curl(
            &underlay,
            "http://192.0.2.50/",
            &["--interface", "172.30.0.1"]
        )
        .as_deref(),
        Ok("a-1")
    );
    assert_eq!(
        curl(
            &underlay,
            "http://192.0.2.50/",
            &["--interface", "172.30.0.2"]
        ),
        Err(CURL_TIMEOUT)
    );

    // I.53: a UDP flow moves to the new endpoint once the old one leaves the service,
    // although the old pod still answers and the client keeps the flow alive.
    assert_eq!(udp_ask(&pod("a-2"), "10.96.1.7"), "a-1");
    let file = sandbox.dir.join("udp-slice.json");
    std::fs::write(&file, udp_slice(&[B1]).to_string()).expect("slice file");
    netns::run(
        "kubectl",
        &[
            "--kubeconfig",
            &sandbox.dir.join("kubeconfig").to_string_lossy(),
            "apply",
            "--validate=false",
            "-f",
            &file.to_string_lossy(),
        ],
    )
    .expect("kubectl apply");
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = udp_ask(&pod("a-2"), "10.96.1.7");
        if answer == "b-1" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the UDP flow stayed on its old endpoint: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // Egress (the mesh is on in the sandbox): a pod reaches an address outside the
    // cluster, which sees the node's address, not the pod's (it has no route back to pods).
    let outside = SocketAddr::from(([172, 30, 0, 1], 18080));
    let _server = SourceEcho::start(&underlay, outside).expect("outside server");
    let seen = wait_for("pod traffic to outside the cluster", || {
        netns::enter(&pod("a-2"), || tcp_who(outside, Duration::from_secs(2)))
            .ok()?
            .ok()
    });
    assert_eq!(seen, node_a, "the source the outside saw");

    // K.62: an outside `nft flush table` on node-a is repaired by the periodic check.
    netns::run(
        "ip",
        &[
            "netns",
            "exec",
            &sandbox.ns("nodes", "node-a"),
            "nft",
            "flush",
            "table",
            "inet",
            "nodus",
        ],
    )
    .expect("nft flush");
    let deadline = Instant::now() + WAIT;
    loop {
        if curl(&pod("a-2"), "http://10.96.1.3/", &[]).as_deref() == Ok("a-1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the flushed table was not repaired"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
