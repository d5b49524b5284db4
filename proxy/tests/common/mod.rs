//! What the kernel tests share: a small view of one node with a handful of services, and
//! helpers to read the table back.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use nodus_testbed::fixtures;
use nodus_testbed::netns::{self, Netns};
use nodus_view::{Update, View};
use serde_json::{Value as Json, json};
use std::collections::{BTreeMap, BTreeSet};

pub const NODE: &str = "node-a";

/// Kernel tests fail, rather than pass silently, without the root they need.
pub fn list_table(ns: &Netns) -> String {
    ns.exec("nft", &["list", "table", "inet", "nodus"])
        .expect("nft list table inet nodus")
}

pub fn service(name: &str, spec: Json, status: Json) -> Update {
    let service = fixtures::with_status(fixtures::service("default", name, spec), status);
    Update::Service(serde_json::from_value(service).expect("test service"))
}

pub fn slice(service: &str, family: &str, endpoints: &[(&str, &str)], port: u16) -> Update {
    slice_with_ports(service, family, endpoints, fixtures::http(port))
}

/// A slice of `service` whose endpoints serve `ports` (as a slice lists them).
pub fn slice_with_ports(
    service: &str,
    family: &str,
    endpoints: &[(&str, &str)],
    ports: Json,
) -> Update {
    let endpoints = endpoints
        .iter()
        .map(|(ip, node)| fixtures::endpoint(ip, node, Json::Null))
        .collect();
    let name = format!("{service}-{family}");
    let slice = fixtures::slice("default", &name, service, family, endpoints, ports);
    Update::EndpointSlice(serde_json::from_value(slice).expect("test slice"))
}

pub fn http(extra: Json) -> Json {
    fixtures::merged(json!({"ports": fixtures::http(80)}), extra)
}

/// This node is 10.0.0.1 / fd00::1 with pods in 10.244.1.0/24; `web_endpoints` serve
/// `default/web` (ClusterIP 10.96.0.10) on port 8080.
pub fn node_view(web_endpoints: &[(&str, &str)]) -> View {
    let mut view = View::new(NODE);
    let report = view.apply([
        Update::Node(
            serde_json::from_value(json!({
                "metadata": {"name": NODE},
                "spec": {"podCIDRs": ["10.244.1.0/24", "fd00:244:1::/64"]},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                                         {"type": "InternalIP", "address": "fd00::1"}]}
            }))
            .expect("test node"),
        ),
        service("web", http(json!({"clusterIP": "10.96.0.10"})), json!({})),
        slice("web", "IPv4", web_endpoints, 8080),
        service(
            "nodeport",
            http(json!({
                "type": "NodePort", "clusterIP": "10.96.0.11",
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]
            })),
            json!({}),
        ),
        slice("nodeport", "IPv4", &[("10.0.0.1", NODE)], 8080),
        service("empty", http(json!({"clusterIP": "10.96.0.12"})), json!({})),
        service(
            "dual",
            http(json!({
                "clusterIPs": ["10.96.0.13", "fd00:96::13"],
                "sessionAffinity": "ClientIP"
            })),
            json!({}),
        ),
        slice("dual", "IPv4", &[("10.244.1.7", NODE)], 8080),
        slice("dual", "IPv6", &[("fd00:244:1::7", NODE)], 8080),
        service(
            "lb",
            http(json!({
                "type": "LoadBalancer", "clusterIP": "10.96.0.14",
                "externalTrafficPolicy": "Local",
                "loadBalancerSourceRanges": ["10.0.0.0/8", "192.168.0.0/16"],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30081}]
            })),
            json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}),
        ),
        slice("lb", "IPv4", &[("10.244.1.8", NODE)], 8080),
    ]);
    assert!(report.invalid.is_empty(), "{:?}", report.invalid);
    view
}

pub const TWO_ENDPOINTS: [(&str, &str); 2] = [("10.244.1.5", NODE), ("10.244.2.9", "node-b")];

/// Two namespaces joined by a veth: the client reaches ClusterIPs routed to the node,
/// where they are local addresses, so that traffic the rules leave alone would be
/// accepted by a listener there.
pub fn node_and_client() -> (Netns, Netns) {
    let node = Netns::new("apnd").expect("node namespace");
    let client = Netns::new("apcl").expect("client namespace");
    netns::veth(&node, "eth0", &client, "eth0").expect("veth");
    node.ip(&["addr", "add", "10.0.0.1/24", "dev", "eth0"])
        .expect("node address");
    client
        .ip(&["addr", "add", "10.0.0.2/24", "dev", "eth0"])
        .expect("client address");
    client
        .ip(&["route", "add", "10.96.0.0/16", "via", "10.0.0.1"])
        .expect("service route");
    node.ip(&["route", "add", "local", "10.96.0.0/16", "dev", "lo"])
        .expect("local service route");
    (node, client)
}

/// What each dispatch chain of the listing DNATs to: the `addr . port` elements of its
/// key block (`numgen random mod N offset K map @M`), by chain name. A key of a block
/// missing from its map shows as `missing <key>`, so a rule never points at nothing or at
/// another service's endpoints unnoticed.
pub fn dispatch_targets(listing: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut maps: BTreeMap<String, BTreeMap<u32, String>> = BTreeMap::new();
    let mut current_map: Option<String> = None;
    let mut rules: Vec<(String, String, u32, u32)> = Vec::new();
    let mut current_chain: Option<String> = None;
    let mut in_elements = false;
    for line in listing.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("map ").and_then(|l| l.strip_suffix(" {")) {
            // The maps of a key block per chain (`endpoints-v4-1f`), not those of a port
            // per endpoint count (`endpoints-v4-n2`), which no chain of a port names.
            let blocks = name.starts_with("endpoints-") && !name.contains("-n");
            current_map = blocks.then(|| name.to_string());
            current_chain = None;
            continue;
        }
        if let Some(name) = line
            .strip_prefix("chain ")
            .and_then(|l| l.strip_suffix(" {"))
        {
            current_chain = Some(name.to_string());
            current_map = None;
            continue;
        }
        if let Some(map) = &current_map {
            let text = match line.strip_prefix("elements = {") {
                Some(rest) => {
                    in_elements = true;
                    rest
                }
                None if in_elements => line,
                None => continue,
            };
            let text = match text.strip_suffix('}') {
                Some(last) => {
                    in_elements = false;
                    last
                }
                None => text,
            };
            for element in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let (key, data) = element.split_once(" : ").expect("key : data");
                maps.entry(map.clone())
                    .or_default()
                    .insert(key.parse().expect("integer key"), data.to_string());
            }
            continue;
        }
        if let (Some(chain), Some(dnat)) = (&current_chain, line.split_once("numgen random mod ")) {
            let Some((numbers, map)) = dnat.1.split_once(" map @") else {
                continue;
            };
            let mut words = numbers.split_whitespace();
            let count: u32 = words.next().and_then(|n| n.parse().ok()).expect("mod N");
            let offset: u32 = match (words.next(), words.next()) {
                (Some("offset"), Some(k)) => k.parse().expect("offset K"),
                _ => 0,
            };
            // The map's name ends the rule, unless the chain's comment follows it.
            let map = map.split_whitespace().next().unwrap_or_default();
            rules.push((chain.clone(), map.to_string(), count, offset));
        }
    }
    let mut targets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (chain, map, count, offset) in rules {
        let elements = maps.get(&map);
        let entry = targets.entry(chain).or_default();
        for key in offset..offset + count {
            entry.insert(
                elements
                    .and_then(|e| e.get(&key))
                    .cloned()
                    .unwrap_or_else(|| format!("missing {key}")),
            );
        }
    }
    targets
}

/// [`dispatch_targets`] of the chain whose name contains `needle`.
pub fn targets_of(targets: &BTreeMap<String, BTreeSet<String>>, needle: &str) -> Vec<String> {
    let found: Vec<_> = targets
        .iter()
        .filter(|(chain, _)| chain.contains(needle))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one dispatch chain with {needle} in {targets:#?}"
    );
    found[0].1.iter().cloned().collect()
}
