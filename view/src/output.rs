//! The resolved node view as JSON: what `nodus view` prints and external backends read.
//!
//! Everything here is computed from the view on demand (nothing is stored twice). Field
//! names follow the Kubernetes API's camelCase so that people can read it with the API
//! reference at hand.

use crate::intern::Interner;
use crate::model::{
    Cidr, Family, LoadBalancerIngress, Node, NodeAddress, Service, ServiceType,
    TrafficDistribution, TrafficPolicy,
};
use crate::resolve::{self, NodeContext, PortEndpoints};
use crate::view::{ChangeSet, Counts, ServiceName, ServiceView, View};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::IpAddr;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedView {
    pub node_name: String,
    pub node_zone: String,
    pub counts: Counts,
    pub services: Vec<ResolvedService>,
    pub nodes: Vec<ResolvedNode>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedService {
    pub namespace: String,
    pub name: String,
    /// Absent while only the service's EndpointSlices are known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<ResolvedSpec>,
    pub ports: Vec<ResolvedPort>,
    /// Every endpoint of every slice, for DNS-style consumers (headless services).
    pub endpoints: Vec<ResolvedEndpoint>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedSpec {
    #[serde(rename = "type")]
    pub type_: ServiceType,
    pub headless: bool,
    #[serde(rename = "clusterIPs")]
    pub cluster_ips: Vec<IpAddr>,
    #[serde(rename = "externalIPs", skip_serializing_if = "Vec::is_empty")]
    pub external_ips: Vec<IpAddr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_ingress: Vec<LoadBalancerIngress>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_source_ranges: Vec<Cidr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_name: Option<String>,
    pub external_traffic_policy: TrafficPolicy,
    pub internal_traffic_policy: TrafficPolicy,
    pub traffic_distribution: TrafficDistribution,
    pub publish_not_ready_addresses: bool,
    /// Seconds of ClientIP affinity; 0 means none.
    pub session_affinity_timeout: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub health_check_node_port: u16,
    /// Set when another proxy owns the service (`service.kubernetes.io/service-proxy-name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_proxy_name: Option<String>,
}

fn is_zero(v: &u16) -> bool {
    *v == 0
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedPort {
    pub name: String,
    pub protocol: crate::model::Protocol,
    pub port: u16,
    #[serde(skip_serializing_if = "is_zero")]
    pub node_port: u16,
    /// Per IP family the service has a cluster IP in (or both, for headless services).
    pub families: BTreeMap<Family, PortEndpoints>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedEndpoint {
    pub ip: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub zone: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedNode {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub zone: String,
    pub addresses: Vec<NodeAddress>,
    #[serde(rename = "podCIDRs")]
    pub pod_cidrs: Vec<Cidr>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The whole view, sorted by namespace and name.
pub fn resolve_view(view: &View) -> ResolvedView {
    let node = view.node_context();
    let mut services: Vec<ResolvedService> = view
        .services()
        .map(|s| resolve_service(view.strings(), &node, &s))
        .collect();
    services.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut nodes: Vec<ResolvedNode> = view
        .nodes()
        .map(|(name, n)| resolve_node(view.strings(), name, n))
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    ResolvedView {
        node_name: view.node_name().to_string(),
        node_zone: view.strings().resolve(node.zone).to_string(),
        counts: view.counts(),
        services,
        nodes,
    }
}

fn spec(strings: &Interner, svc: &Service) -> ResolvedSpec {
    ResolvedSpec {
        type_: svc.type_,
        headless: svc.headless,
        cluster_ips: svc.cluster_ips.to_vec(),
        external_ips: svc.external_ips().to_vec(),
        load_balancer_ingress: svc.load_balancer_ingress().to_vec(),
        load_balancer_source_ranges: svc.load_balancer_source_ranges().to_vec(),
        external_name: svc.external_name().map(str::to_string),
        external_traffic_policy: svc.external_policy,
        internal_traffic_policy: svc.internal_policy,
        traffic_distribution: svc.traffic_distribution,
        publish_not_ready_addresses: svc.publish_not_ready_addresses,
        session_affinity_timeout: svc.affinity_timeout,
        health_check_node_port: svc.health_check_node_port,
        service_proxy_name: svc
            .proxy_name()
            .map(|name| strings.resolve(name).to_string()),
    }
}

/// One service, resolved for the node in `node`.
pub fn resolve_service(
    strings: &Interner,
    node: &NodeContext,
    view: &ServiceView<'_>,
) -> ResolvedService {
    let ports = view.service.map_or_else(Vec::new, |svc| {
        let families: Vec<Family> = if svc.headless {
            Family::ALL.to_vec()
        } else {
            Family::ALL
                .into_iter()
                .filter(|f| svc.cluster_ip(*f).is_some())
                .collect()
        };
        svc.ports
            .iter()
            .map(|port| ResolvedPort {
                name: strings.resolve(port.name).to_string(),
                protocol: port.protocol,
                port: port.port,
                node_port: port.node_port,
                families: families
                    .iter()
                    .map(|f| (*f, resolve::port_endpoints(view.slices, *f, port, node)))
                    .collect(),
            })
            .collect()
    });
    let mut endpoints: Vec<ResolvedEndpoint> = view
        .slices
        .iter()
        .flat_map(|s| s.endpoints())
        .map(|e| ResolvedEndpoint {
            ip: e.addr,
            ready: e.is_ready(),
            serving: e.is_serving(),
            terminating: e.is_terminating(),
            node_name: strings.resolve(e.node).to_string(),
            zone: strings.resolve(e.zone).to_string(),
            hostname: e.hostname().map(str::to_string),
            pod: e.pod().map(str::to_string),
        })
        .collect();
    endpoints.sort_by_key(|e| e.ip);
    endpoints.dedup_by_key(|e| e.ip);
    ResolvedService {
        namespace: view.namespace.to_string(),
        name: view.name.to_string(),
        spec: view.service.map(|s| spec(strings, s)),
        ports,
        endpoints,
    }
}

pub fn resolve_node(strings: &Interner, name: &str, node: &Node) -> ResolvedNode {
    ResolvedNode {
        name: name.to_string(),
        zone: strings.resolve(node.zone).to_string(),
        addresses: node.addresses.to_vec(),
        pod_cidrs: node.pod_cidrs.to_vec(),
        annotations: node
            .annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// One line of `nodus view --watch` (and of `--on-change`'s stdin, and of the agent's
/// subscription socket): a service or node by name, with its resolved form, or
/// `"object": null` once it is gone. `seq` is the number of the batch of changes the line
/// is at least as new as.
#[derive(Debug, Serialize)]
pub struct ChangeLine<'a> {
    pub seq: u64,
    pub kind: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub namespace: &'a str,
    pub name: &'a str,
    pub object: Option<ChangedObject>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ChangedObject {
    Service(ResolvedService),
    Node(ResolvedNode),
}

impl ChangeLine<'_> {
    /// Appends the line, ended by a newline.
    pub fn write(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        out.write_all(b"\n")
    }
}

/// The line of a service the view holds (`view`), resolved for the node in `node`.
pub fn service_line<'a>(
    strings: &Interner,
    node: &NodeContext,
    view: &ServiceView<'a>,
    seq: u64,
) -> ChangeLine<'a> {
    ChangeLine {
        seq,
        kind: "Service",
        namespace: view.namespace,
        name: view.name,
        object: Some(ChangedObject::Service(resolve_service(strings, node, view))),
    }
}

/// The line of the service `namespace/name`: resolved, or `null` when the view has none.
pub fn named_service_line<'a>(
    view: &View,
    node: &NodeContext,
    namespace: &'a str,
    name: &'a str,
    seq: u64,
) -> ChangeLine<'a> {
    ChangeLine {
        seq,
        kind: "Service",
        namespace,
        name,
        object: view
            .service(namespace, name)
            .map(|s| ChangedObject::Service(resolve_service(view.strings(), node, &s))),
    }
}

/// The line of the node `name`: resolved, or `null` when the view has none.
pub fn node_line<'a>(view: &View, name: &'a str, seq: u64) -> ChangeLine<'a> {
    ChangeLine {
        seq,
        kind: "Node",
        namespace: "",
        name,
        object: view
            .node(name)
            .map(|n| ChangedObject::Node(resolve_node(view.strings(), name, n))),
    }
}

/// Writes what `changes` names as JSON lines (services first), each resolved as `view`
/// has it now and numbered `seq`: `nodus view --watch`'s format, which `--on-change`
/// programs and the agent's subscribers read too.
pub fn write_change_lines(
    view: &View,
    changes: &ChangeSet,
    seq: u64,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    let node = view.node_context();
    for name in &changes.services {
        named_service_line(view, &node, &name.namespace, &name.name, seq).write(out)?;
    }
    for name in &changes.nodes {
        node_line(view, name, seq).write(out)?;
    }
    out.flush()
}

/// A change set naming every service and node of the view: what a consumer that just
/// started (or whose node's labels changed) must see.
pub fn everything(view: &View) -> ChangeSet {
    ChangeSet {
        services: view
            .services()
            .map(|s| ServiceName {
                namespace: s.namespace.to_string(),
                name: s.name.to_string(),
            })
            .collect(),
        nodes: view.nodes().map(|(name, _)| name.to_string()).collect(),
        ..ChangeSet::default()
    }
}
