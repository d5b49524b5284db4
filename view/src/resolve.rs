//! The resolution rules: which endpoints serve a service port on this node.
//!
//! This is kube-proxy's `endpointslicecache` and `topology.go` logic, written once as pure
//! functions over the model so that the proxy, DNS and external backends agree. Each rule
//! cites its item in the semantics checklist (`proxy/CHECKLIST.md`).

use crate::intern::Sym;
use crate::model::{EndpointRef, Family, ServicePort, Slice};
use serde::Serialize;
use std::net::IpAddr;

/// What the rules need to know about the node nodus runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeContext {
    pub name: Sym,
    pub zone: Sym,
}

/// One endpoint of one service port, as a dataplane needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Target {
    pub ip: IpAddr,
    pub port: u16,
    pub local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

/// The endpoint sets of one service port in one IP family.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PortEndpoints {
    /// For traffic under the Cluster policy: ready endpoints after topology filtering, else
    /// serving terminating ones.
    pub cluster: Vec<Target>,
    /// For traffic under a Local policy: this node's ready endpoints, else its serving
    /// terminating ones.
    pub local: Vec<Target>,
    /// Any usable endpoint anywhere (ready, or serving and terminating): without one, new
    /// connections are rejected.
    pub has_endpoints: bool,
    /// Ready endpoints on this node: what a health-check node port reports.
    pub local_ready: usize,
}

/// How topology hints narrow the cluster set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    None,
    SameNode,
    SameZone,
}

/// A candidate endpoint for one port: the stored endpoint and the port its slice gives.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    pub endpoint: EndpointRef<'a>,
    pub port: u16,
    pub local: bool,
}

/// A.5, A.6, A.7, A.9: the union of the slices of `family`, with the slice port matched by
/// name and protocol, de-duplicated by IP:port where the live copy wins (see below). Sorted
/// by IP and port so that every consumer sees the same order.
pub fn candidates<'a>(
    slices: &'a [Slice],
    family: Family,
    port: &ServicePort,
    node: &NodeContext,
) -> Vec<Candidate<'a>> {
    let mut out = Vec::new();
    // A slice labelled `service.kubernetes.io/headless` is no proxy's, whatever its
    // service (kube-proxy's informers select it out); DNS still answers with it.
    for slice in slices
        .iter()
        .filter(|s| s.family() == family && !s.headless)
    {
        let Some(slice_port) = slice
            .ports
            .iter()
            .find(|p| p.name == port.name && p.protocol == port.protocol)
        else {
            continue;
        };
        out.extend(slice.endpoints().map(|endpoint| Candidate {
            endpoint,
            port: slice_port.port,
            local: !node.name.is_empty() && endpoint.node == node.name,
        }));
    }
    // Of two copies of one IP:port (an IP reused by a new pod while the old one is stuck
    // terminating), the live one wins, as upstream since kubernetes#135593: not
    // terminating, then serving, then ready, then local.
    let rank = |c: &Candidate<'_>| {
        (
            c.endpoint.addr,
            c.port,
            c.endpoint.is_terminating(),
            !c.endpoint.is_serving(),
            !c.endpoint.is_ready(),
            !c.local,
        )
    };
    out.sort_by_key(rank);
    out.dedup_by(|later, kept| {
        later.endpoint.addr == kept.endpoint.addr && later.port == kept.port
    });
    out
}

/// B.15, B.16: hints count only if every ready endpoint carries one and at least one names
/// this node (node hints, checked first) or this node's zone.
pub fn topology(candidates: &[Candidate<'_>], node: &NodeContext) -> Topology {
    let mut all_node_hints = true;
    let mut hint_for_node = false;
    let mut all_zone_hints = true;
    let mut hint_for_zone = false;
    for c in candidates.iter().filter(|c| c.endpoint.is_ready()) {
        let (nodes, zones) = (c.endpoint.node_hints(), c.endpoint.zone_hints());
        if nodes.is_empty() {
            all_node_hints = false;
        } else if !node.name.is_empty() && nodes.contains(&node.name) {
            hint_for_node = true;
        }
        if zones.is_empty() {
            all_zone_hints = false;
        } else if !node.zone.is_empty() && zones.contains(&node.zone) {
            hint_for_zone = true;
        }
    }
    if all_node_hints && hint_for_node {
        Topology::SameNode
    } else if all_zone_hints && hint_for_zone {
        Topology::SameZone
    } else {
        Topology::None
    }
}

fn in_topology(endpoint: &EndpointRef<'_>, topology: Topology, node: &NodeContext) -> bool {
    match topology {
        Topology::None => true,
        Topology::SameNode => endpoint.node_hints().contains(&node.name),
        Topology::SameZone => endpoint.zone_hints().contains(&node.zone),
    }
}

fn target(c: &Candidate<'_>) -> Target {
    Target {
        ip: c.endpoint.addr,
        port: c.port,
        local: c.local,
        ready: c.endpoint.is_ready(),
        serving: c.endpoint.is_serving(),
        terminating: c.endpoint.is_terminating(),
    }
}

fn serving_terminating(e: &EndpointRef<'_>) -> bool {
    e.is_serving() && e.is_terminating()
}

/// B.12, B.13, B.14, B.17: the cluster and local sets, each with its own terminating
/// fallback; topology narrows only the cluster set.
pub fn categorize(candidates: &[Candidate<'_>], node: &NodeContext) -> PortEndpoints {
    let topology = topology(candidates, node);
    let any_ready = candidates.iter().any(|c| c.endpoint.is_ready());
    let cluster: Vec<Target> = if any_ready {
        candidates
            .iter()
            .filter(|c| c.endpoint.is_ready() && in_topology(&c.endpoint, topology, node))
            .map(target)
            .collect()
    } else {
        candidates
            .iter()
            .filter(|c| serving_terminating(&c.endpoint))
            .map(target)
            .collect()
    };
    let local_ready = candidates
        .iter()
        .filter(|c| c.local && c.endpoint.is_ready())
        .count();
    let local: Vec<Target> = candidates
        .iter()
        .filter(|c| {
            c.local
                && if local_ready > 0 {
                    c.endpoint.is_ready()
                } else {
                    serving_terminating(&c.endpoint)
                }
        })
        .map(target)
        .collect();
    PortEndpoints {
        has_endpoints: any_ready || candidates.iter().any(|c| serving_terminating(&c.endpoint)),
        cluster,
        local,
        local_ready,
    }
}

/// The endpoint sets of one service port in one family.
pub fn port_endpoints(
    slices: &[Slice],
    family: Family,
    port: &ServicePort,
    node: &NodeContext,
) -> PortEndpoints {
    categorize(&candidates(slices, family, port, node), node)
}

/// I.53: the endpoints a UDP flow of the port may stay on: every serving one, whatever
/// topology, traffic policy or terminating state. As upstream's conntrack cleanup, a
/// change to the service must not cut the flows of an endpoint that still serves (a
/// terminating pod draining its sessions, a re-hinted zone, a new traffic policy).
pub fn serving_endpoints(
    slices: &[Slice],
    family: Family,
    port: &ServicePort,
    node: &NodeContext,
) -> Vec<(IpAddr, u16)> {
    candidates(slices, family, port, node)
        .iter()
        .filter(|c| c.endpoint.is_serving())
        .map(|c| (c.endpoint.addr, c.port))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intern::Interner;
    use crate::model::{EndpointExtra, Endpoints, Protocol, SlicePort, conditions};
    use std::net::IpAddr;

    const READY: u8 = conditions::READY | conditions::SERVING;
    const SERVING_TERMINATING: u8 = conditions::SERVING | conditions::TERMINATING;
    const TERMINATING: u8 = conditions::TERMINATING;

    struct TestEndpoint {
        addr: IpAddr,
        conditions: u8,
        node: Sym,
        extra: Option<EndpointExtra>,
    }

    struct Fixture {
        strings: Interner,
        node: NodeContext,
    }

    impl Fixture {
        fn new() -> Self {
            let mut strings = Interner::new();
            let node = NodeContext {
                name: strings.intern("node-a"),
                zone: strings.intern("zone-a"),
            };
            Fixture { strings, node }
        }

        fn endpoint(&mut self, ip: &str, cond: u8, node: &str) -> TestEndpoint {
            TestEndpoint {
                addr: ip.parse().expect("test ip"),
                conditions: cond,
                node: self.strings.intern(node),
                extra: None,
            }
        }

        fn hinted(&mut self, ip: &str, node: &str, zones: &[&str], nodes: &[&str]) -> TestEndpoint {
            let mut e = self.endpoint(ip, READY, node);
            e.extra = Some(EndpointExtra {
                for_zones: zones.iter().map(|z| self.strings.intern(z)).collect(),
                for_nodes: nodes.iter().map(|n| self.strings.intern(n)).collect(),
                ..EndpointExtra::default()
            });
            e
        }

        fn port(&mut self, name: &str) -> ServicePort {
            ServicePort {
                name: self.strings.intern(name),
                protocol: Protocol::Tcp,
                port: 80,
                node_port: 0,
            }
        }

        fn slice(&mut self, port_name: &str, port: u16, endpoints: Vec<TestEndpoint>) -> Slice {
            let extras: Vec<_> = endpoints
                .iter()
                .enumerate()
                .filter_map(|(i, e)| e.extra.clone().map(|x| (i as u32, x)))
                .collect();
            let family = endpoints.first().map_or(Family::V4, |e| Family::of(e.addr));
            let endpoints = Endpoints::collect(
                family,
                endpoints
                    .iter()
                    .map(|e| (e.addr, e.conditions, e.node, Sym::EMPTY)),
            );
            Slice {
                name_hash: self.strings.len() as u64,
                headless: false,
                ports: Box::new([SlicePort {
                    name: self.strings.intern(port_name),
                    protocol: Protocol::Tcp,
                    port,
                }]),
                endpoints,
                extras: extras.into(),
            }
        }
    }

    fn ips(targets: &[Target]) -> Vec<String> {
        targets
            .iter()
            .map(|t| format!("{}:{}", t.ip, t.port))
            .collect()
    }

    /// A.5: endpoints are the union of slices, de-duplicated by IP:port; the local copy wins.
    #[test]
    fn a5_union_dedup_local_wins() {
        let mut f = Fixture::new();
        let port = f.port("http");
        let e1 = f.endpoint("10.1.0.1", READY, "node-b");
        let e2 = f.endpoint("10.1.0.2", READY, "node-b");
        let s1 = f.slice("http", 8080, vec![e1, e2]);
        let e2_local = f.endpoint("10.1.0.2", READY, "node-a");
        let e3 = f.endpoint("10.1.0.3", READY, "node-b");
        let s2 = f.slice("http", 8080, vec![e2_local, e3]);
        let sets = port_endpoints(&[s1, s2], Family::V4, &port, &f.node);
        assert_eq!(
            ips(&sets.cluster),
            ["10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"]
        );
        assert_eq!(ips(&sets.local), ["10.1.0.2:8080"]);
    }

    /// A.6: ports match by name; the DNAT port is the slice's number.
    #[test]
    fn a6_ports_match_by_name() {
        let mut f = Fixture::new();
        let http = f.port("http");
        let metrics = f.port("metrics");
        let e = f.endpoint("10.1.0.1", READY, "node-b");
        let s = f.slice("http", 8080, vec![e]);
        let slices = [s];
        assert_eq!(
            ips(&port_endpoints(&slices, Family::V4, &http, &f.node).cluster),
            ["10.1.0.1:8080"]
        );
        assert!(
            port_endpoints(&slices, Family::V4, &metrics, &f.node)
                .cluster
                .is_empty()
        );
    }

    /// A.7 / J.57: only slices of the asked family contribute.
    #[test]
    fn a7_filtered_by_family() {
        let mut f = Fixture::new();
        let port = f.port("");
        let v4 = f.endpoint("10.1.0.1", READY, "node-b");
        let v6 = f.endpoint("fd00::1", READY, "node-b");
        let s4 = f.slice("", 80, vec![v4]);
        let s6 = f.slice("", 80, vec![v6]);
        let slices = [s4, s6];
        assert_eq!(
            ips(&port_endpoints(&slices, Family::V6, &port, &f.node).cluster),
            ["fd00::1:80"]
        );
        assert_eq!(
            ips(&port_endpoints(&slices, Family::V4, &port, &f.node).cluster),
            ["10.1.0.1:80"]
        );
    }

    /// A.9: locality is by node name, never by IP.
    #[test]
    fn a9_local_by_node_name() {
        let mut f = Fixture::new();
        let port = f.port("");
        let here = f.endpoint("10.1.0.1", READY, "node-a");
        let there = f.endpoint("10.1.0.2", READY, "node-b");
        let unnamed = f.endpoint("10.1.0.3", READY, "");
        let s = f.slice("", 80, vec![here, there, unnamed]);
        let sets = port_endpoints(&[s], Family::V4, &port, &f.node);
        assert_eq!(ips(&sets.local), ["10.1.0.1:80"]);
        assert_eq!(sets.local_ready, 1);
    }

    /// B.12, B.14: with no ready endpoint anywhere, the cluster set falls back to serving
    /// terminating endpoints; non-serving terminating ones are never used.
    #[test]
    fn b12_cluster_terminating_fallback() {
        let mut f = Fixture::new();
        let port = f.port("");
        let st = f.endpoint("10.1.0.1", SERVING_TERMINATING, "node-b");
        let dead = f.endpoint("10.1.0.2", TERMINATING, "node-b");
        let s = f.slice("", 80, vec![st, dead]);
        let sets = port_endpoints(&[s], Family::V4, &port, &f.node);
        assert_eq!(ips(&sets.cluster), ["10.1.0.1:80"]);
        assert!(sets.has_endpoints);

        let ready = f.endpoint("10.1.0.3", READY, "node-b");
        let st = f.endpoint("10.1.0.1", SERVING_TERMINATING, "node-b");
        let s = f.slice("", 80, vec![st, ready]);
        let sets = port_endpoints(&[s], Family::V4, &port, &f.node);
        assert_eq!(ips(&sets.cluster), ["10.1.0.3:80"], "ready endpoints win");
    }

    /// B.13: the local set has its own fallback, independent of the cluster set.
    #[test]
    fn b13_local_fallback_is_independent() {
        let mut f = Fixture::new();
        let port = f.port("");
        let remote_ready = f.endpoint("10.1.0.1", READY, "node-b");
        let local_st = f.endpoint("10.1.0.2", SERVING_TERMINATING, "node-a");
        let s = f.slice("", 80, vec![remote_ready, local_st]);
        let sets = port_endpoints(&[s], Family::V4, &port, &f.node);
        assert_eq!(ips(&sets.cluster), ["10.1.0.1:80"]);
        assert_eq!(ips(&sets.local), ["10.1.0.2:80"]);
        assert_eq!(
            sets.local_ready, 0,
            "terminating endpoints are not healthy for the LB"
        );
    }

    /// B.14: nothing ready or serving-terminating means no endpoints (reject).
    #[test]
    fn b14_no_usable_endpoints() {
        let mut f = Fixture::new();
        let port = f.port("");
        let dead = f.endpoint("10.1.0.2", 0, "node-a");
        let s = f.slice("", 80, vec![dead]);
        let sets = port_endpoints(&[s], Family::V4, &port, &f.node);
        assert!(!sets.has_endpoints);
        assert!(sets.cluster.is_empty() && sets.local.is_empty());
    }

    /// B.15: zone hints apply only when every ready endpoint has one and one names our zone.
    #[test]
    fn b15_zone_hints_all_or_nothing() {
        let mut f = Fixture::new();
        let port = f.port("");
        let a = f.hinted("10.1.0.1", "node-b", &["zone-a"], &[]);
        let b = f.hinted("10.1.0.2", "node-c", &["zone-b"], &[]);
        let s = f.slice("", 80, vec![a, b]);
        let sets = port_endpoints(&[s], Family::V4, &port, &f.node);
        assert_eq!(ips(&sets.cluster), ["10.1.0.1:80"]);

        let a = f.hinted("10.1.0.1", "node-b", &["zone-a"], &[]);
        let unhinted = f.endpoint("10.1.0.2", READY, "node-c");
        let s = f.slice("", 80, vec![a, unhinted]);
        let sets = port_endpoints(&[s], Family::V4, &port, &f.node);
        assert_eq!(
            sets.cluster.len(),
            2,
            "one endpoint without a hint disables hints"
        );

        let b = f.hinted("10.1.0.2", "node-c", &["zone-b"], &[]);
        let s = f.slice("", 80, vec![b]);
        let sets = port_endpoints(&[s], Family::V4, &port, &f.node);
        assert_eq!(sets.cluster.len(), 1, "no hint for our zone disables hints");
    }

    /// B.16: node hints are checked before zone hints.
    #[test]
    fn b16_node_hints_first() {
        let mut f = Fixture::new();
        let port = f.port("");
        let a = f.hinted("10.1.0.1", "node-a", &["zone-a"], &["node-a"]);
        let b = f.hinted("10.1.0.2", "node-b", &["zone-a"], &["node-b"]);
        let s = f.slice("", 80, vec![a, b]);
        let sets = port_endpoints(&[s], Family::V4, &port, &f.node);
        assert_eq!(ips(&sets.cluster), ["10.1.0.1:80"]);
    }

    /// B.17: topology never narrows the local set.
    #[test]
    fn b17_topology_only_for_cluster_set() {
        let mut f = Fixture::new();
        let port = f.port("");
        let local_other_zone = f.hinted("10.1.0.1", "node-a", &["zone-b"], &[]);
        let remote_our_zone = f.hinted("10.1.0.2", "node-b", &["zone-a"], &[]);
        let s = f.slice("", 80, vec![local_other_zone, remote_our_zone]);
        let sets = port_endpoints(&[s], Family::V4, &port, &f.node);
        assert_eq!(ips(&sets.cluster), ["10.1.0.2:80"]);
        assert_eq!(ips(&sets.local), ["10.1.0.1:80"]);
    }

    /// A.4: a port with the same name but another protocol is a different service port.
    #[test]
    fn a4_protocol_is_part_of_the_port() {
        let mut f = Fixture::new();
        let mut udp = f.port("dns");
        udp.protocol = Protocol::Udp;
        let e = f.endpoint("10.1.0.1", READY, "node-b");
        let s = f.slice("dns", 53, vec![e]);
        assert!(
            port_endpoints(&[s], Family::V4, &udp, &f.node)
                .cluster
                .is_empty()
        );
    }
}
