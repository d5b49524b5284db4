//! Validation and compaction: wire objects into the stored model.
//!
//! Everything that can fail is checked before the first string is interned, so a rejected
//! object leaves the string table exactly as it was. An error names the object and the
//! field; the caller skips the object, logs once and counts it.

use crate::intern::{Interner, Sym};
use crate::model::{
    Cidr, ClusterIps, EndpointExtra, Endpoints, Family, LoadBalancerIngress, LocalPod, Node,
    NodeAddress, NodeAddressKind, Protocol, Service, ServiceExtra, ServicePort, ServiceType, Slice,
    SlicePort, TrafficDistribution, TrafficPolicy, conditions,
};
use crate::wire;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;

/// Why an object was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {object}: {reason}")]
pub struct InvalidObject {
    pub kind: &'static str,
    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub object: String,
    pub reason: String,
}

/// Default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours), as in the API.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;
const MAX_AFFINITY_TIMEOUT: i64 = 86_400;

pub(crate) fn object_name<L>(meta: &wire::Meta<L>) -> String {
    match &meta.namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", meta.name),
        _ => meta.name.clone(),
    }
}

pub(crate) fn invalid<L>(
    kind: &'static str,
    meta: &wire::Meta<L>,
    reason: String,
) -> InvalidObject {
    InvalidObject {
        kind,
        object: object_name(meta),
        reason,
    }
}

fn parse_ip(field: &str, text: &str) -> Result<IpAddr, String> {
    crate::model::parse_ip_sloppy(text.trim())
        .ok_or_else(|| format!("{field}: {text:?} is not an IP address"))
}

/// Parses each of a list's entries, leaving out (and noting in `skipped`) those that do
/// not parse: one bad entry costs that entry, not the object (as upstream).
fn each_valid<T>(
    entries: impl IntoIterator<Item = Result<T, String>>,
    skipped: &mut Vec<String>,
) -> Box<[T]> {
    entries
        .into_iter()
        .filter_map(|entry| entry.map_err(|reason| skipped.push(reason)).ok())
        .collect()
}

pub(crate) fn parse_protocol(field: &str, text: Option<&str>) -> Result<Protocol, String> {
    match text {
        None | Some("TCP") => Ok(Protocol::Tcp),
        Some("UDP") => Ok(Protocol::Udp),
        Some("SCTP") => Ok(Protocol::Sctp),
        Some(other) => Err(format!("{field}: unknown protocol {other:?}")),
    }
}

pub(crate) fn parse_port(field: &str, value: i64) -> Result<u16, String> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{field}: port {value} is out of range 1-65535"))
}

/// A port that may be absent (0 or null means "none").
fn parse_optional_port(field: &str, value: Option<i64>) -> Result<u16, String> {
    match value {
        None | Some(0) => Ok(0),
        Some(v) => parse_port(field, v),
    }
}

fn parse_policy(field: &str, text: Option<&str>) -> Result<TrafficPolicy, String> {
    match text {
        None | Some("") | Some("Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(other) => Err(format!("{field}: unknown traffic policy {other:?}")),
    }
}

fn parse_service_type(text: Option<&str>) -> Result<ServiceType, String> {
    match text {
        None | Some("") | Some("ClusterIP") => Ok(ServiceType::ClusterIP),
        Some("NodePort") => Ok(ServiceType::NodePort),
        Some("LoadBalancer") => Ok(ServiceType::LoadBalancer),
        Some("ExternalName") => Ok(ServiceType::ExternalName),
        Some(other) => Err(format!("spec.type: unknown service type {other:?}")),
    }
}

/// Unknown distributions are ignored rather than rejected: newer API servers add values,
/// and kube-proxy treats an unknown one as unset.
fn parse_traffic_distribution(text: Option<&str>) -> TrafficDistribution {
    match text {
        Some("PreferClose") => TrafficDistribution::PreferClose,
        Some("PreferSameZone") => TrafficDistribution::PreferSameZone,
        Some("PreferSameNode") => TrafficDistribution::PreferSameNode,
        _ => TrafficDistribution::Unset,
    }
}

fn parse_ips(field: &str, texts: &[String], skipped: &mut Vec<String>) -> Box<[IpAddr]> {
    each_valid(texts.iter().map(|t| parse_ip(field, t)), skipped)
}

pub(crate) fn hash_name(name: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    name.hash(&mut hasher);
    hasher.finish()
}

///
/// Entries of lists that do not parse (an external IP, a load-balancer IP, a source range)
/// are left out and described in `skipped`; the rest of the service stands.
pub fn service(
    wire: &wire::Service,
    strings: &mut Interner,
    skipped: &mut Vec<String>,
) -> Result<Service, InvalidObject> {
    check_service(wire, skipped)
        .map(|checked| checked.intern(strings))
        .map_err(|reason| invalid("Service", &wire.metadata, reason))
}

/// What `skipped` entries of an otherwise valid object are reported as.
pub fn partly_invalid(kind: &'static str, meta: &wire::Meta, skipped: &[String]) -> InvalidObject {
    invalid(
        kind,
        meta,
        format!("entries left out: {}", skipped.join("; ")),
    )
}

/// A validated service whose strings are not interned yet.
struct CheckedService<'a> {
    service: Service,
    port_names: Vec<&'a str>,
    proxy_name: Option<&'a str>,
}

impl CheckedService<'_> {
    fn intern(mut self, strings: &mut Interner) -> Service {
        for (port, name) in self.service.ports.iter_mut().zip(self.port_names) {
            port.name = strings.intern(name);
        }
        if let Some(name) = self.proxy_name {
            let extra = self.service.extra.get_or_insert_with(Default::default);
            extra.proxy_name = Some(strings.intern(name));
        }
        self.service
    }
}

/// `spec.sessionAffinity` as the seconds a client sticks to its endpoint; 0 for none.
fn affinity_timeout(spec: &wire::ServiceSpec) -> Result<u32, String> {
    Ok(match spec.session_affinity.as_deref() {
        None | Some("") | Some("None") => 0,
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match timeout {
                None => DEFAULT_AFFINITY_TIMEOUT,
                Some(t @ 1..=MAX_AFFINITY_TIMEOUT) => t as u32,
                Some(t) => {
                    return Err(format!(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds: {t} is out of range 1-{MAX_AFFINITY_TIMEOUT}"
                    ));
                }
            }
        }
        Some(other) => return Err(format!("spec.sessionAffinity: unknown value {other:?}")),
    })
}

/// The load balancers' IPs (those with `ipMode: Proxy` marked); one that does not parse
/// is skipped and named in `skipped`.
fn load_balancer_ingress(
    status: &wire::ServiceStatus,
    skipped: &mut Vec<String>,
) -> Box<[LoadBalancerIngress]> {
    each_valid(
        status
            .load_balancer
            .ingress
            .iter()
            .filter_map(|ing| {
                ing.ip
                    .as_deref()
                    .filter(|ip| !ip.is_empty())
                    .map(|ip| (ip, ing))
            })
            .map(|(ip, ing)| {
                Ok(LoadBalancerIngress {
                    ip: parse_ip("status.loadBalancer.ingress.ip", ip)?,
                    proxy_mode: ing.ip_mode.as_deref() == Some("Proxy"),
                })
            }),
        skipped,
    )
}

/// The ports, with their names apart (interned once the service is valid).
fn service_ports(spec: &wire::ServiceSpec) -> Result<(Vec<ServicePort>, Vec<&str>), String> {
    let mut ports = Vec::with_capacity(spec.ports.len());
    let mut port_names = Vec::with_capacity(spec.ports.len());
    for (i, p) in spec.ports.iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        ports.push(ServicePort {
            name: Sym::EMPTY,
            protocol: parse_protocol(&field, p.protocol.as_deref())?,
            port: parse_port(&field, p.port)?,
            node_port: parse_optional_port(&format!("{field}.nodePort"), p.node_port)?,
        });
        port_names.push(p.name.as_deref().unwrap_or(""));
    }
    Ok((ports, port_names))
}

fn check_service<'w>(
    wire: &'w wire::Service,
    skipped: &mut Vec<String>,
) -> Result<CheckedService<'w>, String> {
    let spec = &wire.spec;
    let type_ = parse_service_type(spec.type_.as_deref())?;
    let mut ip_texts: Vec<&str> = spec.cluster_ips.iter().map(String::as_str).collect();
    if ip_texts.is_empty() {
        ip_texts.extend(spec.cluster_ip.as_deref());
    }
    let headless = type_ != ServiceType::ExternalName && ip_texts.first() == Some(&"None");
    let cluster_ips = if headless || type_ == ServiceType::ExternalName {
        ClusterIps::default()
    } else {
        let ips = ip_texts
            .iter()
            .filter(|t| !t.is_empty())
            .map(|t| parse_ip("spec.clusterIPs", t))
            .collect::<Result<Vec<_>, _>>()?;
        ClusterIps::new(&ips).ok_or_else(|| {
            format!(
                "spec.clusterIPs: {} addresses, more than the {} a Service may have",
                ips.len(),
                ClusterIps::MAX
            )
        })?
    };

    let (ports, port_names) = service_ports(spec)?;

    let affinity_timeout = affinity_timeout(spec)?;

    let load_balancer_ingress = load_balancer_ingress(&wire.status, skipped);
    let load_balancer_source_ranges = each_valid(
        spec.load_balancer_source_ranges.iter().map(|r| {
            r.trim()
                .parse::<Cidr>()
                .map_err(|e| format!("spec.loadBalancerSourceRanges: {e}"))
        }),
        skipped,
    );
    let external_name = spec
        .external_name
        .as_deref()
        .filter(|n| type_ == ServiceType::ExternalName && !n.is_empty())
        .map(|n| n.trim_end_matches('.').into());
    let mut extra = ServiceExtra {
        external_ips: parse_ips("spec.externalIPs", &spec.external_ips, skipped),
        load_balancer_ingress,
        load_balancer_source_ranges,
        external_name,
        // Interned with the other strings, once the service is valid.
        proxy_name: None,
        headless_label: wire.metadata.labels.headless,
        created: 0,
    };
    if !extra.external_ips.is_empty() || !extra.load_balancer_ingress.is_empty() {
        extra.created = wire.metadata.creation_timestamp.unwrap_or(i64::MAX);
    }

    let service = Service {
        type_,
        headless,
        cluster_ips,
        ports: ports.into(),
        external_policy: parse_policy(
            "spec.externalTrafficPolicy",
            spec.external_traffic_policy.as_deref(),
        )?,
        internal_policy: parse_policy(
            "spec.internalTrafficPolicy",
            spec.internal_traffic_policy.as_deref(),
        )?,
        traffic_distribution: parse_traffic_distribution(spec.traffic_distribution.as_deref()),
        publish_not_ready_addresses: spec.publish_not_ready_addresses.unwrap_or(false),
        affinity_timeout,
        health_check_node_port: parse_optional_port(
            "spec.healthCheckNodePort",
            spec.health_check_node_port,
        )?,
        extra: (extra != ServiceExtra::default()).then(|| Box::new(extra)),
    };
    Ok(CheckedService {
        service,
        port_names,
        proxy_name: wire.metadata.labels.service_proxy_name.as_deref(),
    })
}

/// Decodes a slice. `Ok(None)` means the slice carries nothing nodus uses (an `FQDN`
/// slice), which is not an error. An endpoint whose address does not parse is left out
/// and described in `skipped`.
pub fn slice(
    wire: &wire::EndpointSlice,
    strings: &mut Interner,
    skipped: &mut Vec<String>,
) -> Result<Option<Slice>, InvalidObject> {
    let family = match wire.address_type.as_str() {
        "IPv4" => Family::V4,
        "IPv6" => Family::V6,
        "FQDN" => return Ok(None),
        other => {
            return Err(invalid(
                "EndpointSlice",
                &wire.metadata,
                format!("addressType: unknown value {other:?}"),
            ));
        }
    };
    let (ports, endpoints) = check_slice(wire, family, skipped)
        .map_err(|reason| invalid("EndpointSlice", &wire.metadata, reason))?;

    let keep_pod = wire.metadata.labels.headless;
    let ports = ports
        .into_iter()
        .map(|(name, protocol, port)| SlicePort {
            name: strings.intern(name),
            protocol,
            port,
        })
        .collect();
    let mut extras = Vec::new();
    // check_slice already dropped other families, so indexes match the stored order.
    let endpoints = Endpoints::collect(
        family,
        endpoints.iter().enumerate().map(|(i, (addr, e))| {
            if let Some(extra) = intern_extra(e, keep_pod, strings) {
                extras.push((i as u32, extra));
            }
            (
                *addr,
                condition_bits(&e.conditions),
                strings.intern(e.node_name.as_deref().unwrap_or("")),
                strings.intern(e.zone.as_deref().unwrap_or("")),
            )
        }),
    );
    Ok(Some(Slice {
        name_hash: hash_name(&wire.metadata.name),
        headless: wire.metadata.labels.headless,
        ports,
        endpoints,
        extras: extras.into(),
    }))
}

type CheckedSlice<'a> = (
    Vec<(&'a str, Protocol, u16)>,
    Vec<(IpAddr, &'a wire::Endpoint)>,
);

fn check_slice<'w>(
    wire: &'w wire::EndpointSlice,
    family: Family,
    skipped: &mut Vec<String>,
) -> Result<CheckedSlice<'w>, String> {
    let mut ports = Vec::with_capacity(wire.ports.len());
    for (i, p) in wire.ports.iter().enumerate() {
        let field = format!("ports[{i}]");
        let protocol = parse_protocol(&field, p.protocol.as_deref())?;
        // kube-proxy ignores ports without a name or a number rather than the whole slice.
        let (Some(name), Some(port)) = (p.name.as_deref(), p.port) else {
            continue;
        };
        if port == 0 {
            continue;
        }
        ports.push((name, protocol, parse_port(&field, port)?));
    }
    let mut endpoints = Vec::with_capacity(wire.endpoints.len());
    for (i, e) in wire.endpoints.iter().enumerate() {
        let Some(first) = e.addresses.first() else {
            continue;
        };
        let Some(addr) = parse_ip(&format!("endpoints[{i}].addresses[0]"), first)
            .map_err(|reason| skipped.push(reason))
            .ok()
        else {
            continue;
        };
        // A wrong-family address is dropped, not fatal, as in kube-proxy.
        if Family::of(addr) == family {
            endpoints.push((addr, e));
        }
    }
    Ok((ports, endpoints))
}

fn condition_bits(c: &wire::EndpointConditions) -> u8 {
    let mut bits = 0;
    if c.ready.unwrap_or(true) {
        bits |= conditions::READY;
    }
    if c.serving.unwrap_or(true) {
        bits |= conditions::SERVING;
    }
    if c.terminating.unwrap_or(false) {
        bits |= conditions::TERMINATING;
    }
    bits
}

fn intern_extra(
    e: &wire::Endpoint,
    keep_pod: bool,
    strings: &mut Interner,
) -> Option<EndpointExtra> {
    let pod = e
        .target_ref
        .as_ref()
        .filter(|r| keep_pod && r.kind.as_deref().is_none_or(|k| k == "Pod"))
        .and_then(|r| r.name.as_deref());
    let hostname = e.hostname.as_deref().filter(|h| !h.is_empty());
    let hints = e
        .hints
        .as_ref()
        .filter(|h| !h.for_zones.is_empty() || !h.for_nodes.is_empty());
    if pod.is_none() && hostname.is_none() && hints.is_none() {
        return None;
    }
    Some(EndpointExtra {
        hostname: hostname.map(Into::into),
        pod: pod.map(Into::into),
        for_zones: hints.map_or_else(Box::default, |h| {
            h.for_zones
                .iter()
                .map(|z| strings.intern(&z.name))
                .collect()
        }),
        for_nodes: hints.map_or_else(Box::default, |h| {
            h.for_nodes
                .iter()
                .map(|n| strings.intern(&n.name))
                .collect()
        }),
    })
}

/// The most ranges a ServiceCIDR holds, as the API allows: one per family.
pub const SERVICE_CIDR_RANGES_MAX: usize = 2;

/// A ServiceCIDR's ranges. A malformed range refuses the whole object, so that the last good
/// version stays in force: a range half applied could leave addresses that are in use to be
/// dropped as unallocated.
pub fn service_cidr(wire: &wire::ServiceCidr) -> Result<Box<[Cidr]>, InvalidObject> {
    check_service_cidr(wire).map_err(|reason| invalid("ServiceCIDR", &wire.metadata, reason))
}

fn check_service_cidr(wire: &wire::ServiceCidr) -> Result<Box<[Cidr]>, String> {
    let cidrs = &wire.spec.cidrs;
    if cidrs.len() > SERVICE_CIDR_RANGES_MAX {
        return Err(format!(
            "spec.cidrs: {} ranges, more than the {SERVICE_CIDR_RANGES_MAX} allowed",
            cidrs.len()
        ));
    }
    let parsed: Vec<Cidr> = cidrs
        .iter()
        .map(|text| text.trim().parse::<Cidr>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("spec.cidrs: {e}"))?;
    if let [a, b] = parsed.as_slice()
        && a.family() == b.family()
    {
        return Err("spec.cidrs: two ranges of one family".to_string());
    }
    Ok(parsed.into())
}

/// This node's Pod `wire`, for node `node_name`. A pod of another node, or with an address
/// that does not parse, is refused whole: an address misread would let DNS take another
/// pod's questions for this one's.
pub fn pod(
    wire: &wire::Pod,
    node_name: &str,
    strings: &mut Interner,
) -> Result<LocalPod, InvalidObject> {
    let (ips, cluster_search) =
        check_pod(wire, node_name).map_err(|reason| invalid("Pod", &wire.metadata, reason))?;
    Ok(LocalPod {
        namespace: strings.intern(wire.metadata.namespace.as_deref().unwrap_or_default()),
        ips,
        cluster_search,
    })
}

fn check_pod(wire: &wire::Pod, node_name: &str) -> Result<(Box<[IpAddr]>, bool), String> {
    let node = wire.spec.node_name.as_deref().unwrap_or_default();
    if node != node_name {
        return Err(format!("spec.nodeName {node:?} is not this node"));
    }
    let ips = pod_ips(wire)?;
    let host_network = wire.spec.host_network == Some(true);
    // kubelet's search list for these policies: the cluster's three domains, then the
    // node's; `dnsConfig.searches` would add its own after them.
    let cluster_first = match wire.spec.dns_policy.as_deref().unwrap_or("ClusterFirst") {
        "ClusterFirst" => !host_network,
        "ClusterFirstWithHostNet" => true,
        _ => false,
    };
    let own_searches = wire
        .spec
        .dns_config
        .as_ref()
        .is_some_and(|config| !config.searches.is_empty());
    Ok((ips, cluster_first && !own_searches))
}

/// The addresses a pod sends from, one per family: none for a host-network pod (it sends
/// from its node's) or one that has ended (its addresses may already be another's).
pub(crate) fn pod_ips(wire: &wire::Pod) -> Result<Box<[IpAddr]>, String> {
    let host_network = wire.spec.host_network == Some(true);
    let ended = matches!(wire.status.phase.as_deref(), Some("Succeeded" | "Failed"));
    let mut texts: Vec<&str> = wire.status.pod_ips.iter().map(|p| p.ip.as_str()).collect();
    if texts.is_empty() {
        texts.extend(wire.status.pod_ip.as_deref().filter(|ip| !ip.is_empty()));
    }
    let mut ips = Vec::with_capacity(texts.len());
    for text in texts {
        let ip = parse_ip("status.podIPs", text)?;
        if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
            return Err(format!("status.podIPs: {ip} cannot be a pod's address"));
        }
        if ips
            .iter()
            .any(|other: &IpAddr| other.is_ipv4() == ip.is_ipv4())
        {
            return Err("status.podIPs: two addresses of one family".to_string());
        }
        ips.push(ip);
    }
    if host_network || ended {
        ips.clear();
    }
    Ok(ips.into())
}

pub fn node(wire: &wire::Node, strings: &mut Interner) -> Result<Node, InvalidObject> {
    let checked = check_node(wire).map_err(|reason| invalid("Node", &wire.metadata, reason))?;
    Ok(Node {
        zone: strings.intern(wire.metadata.labels.zone.as_deref().unwrap_or("")),
        ..checked
    })
}

fn check_node(wire: &wire::Node) -> Result<Node, String> {
    let mut addresses = Vec::new();
    for a in &wire.status.addresses {
        let kind = match a.type_.as_str() {
            "InternalIP" => NodeAddressKind::InternalIP,
            "ExternalIP" => NodeAddressKind::ExternalIP,
            // Hostname and DNS entries are names, not addresses.
            _ => continue,
        };
        addresses.push(NodeAddress {
            kind,
            address: parse_ip("status.addresses", &a.address)?,
        });
    }
    let mut cidr_texts: Vec<&str> = wire.spec.pod_cidrs.iter().map(String::as_str).collect();
    if cidr_texts.is_empty() {
        cidr_texts.extend(wire.spec.pod_cidr.as_deref().filter(|c| !c.is_empty()));
    }
    let pod_cidrs = cidr_texts
        .iter()
        .map(|t| t.parse::<Cidr>().map_err(|e| format!("spec.podCIDRs: {e}")))
        .collect::<Result<_, _>>()?;
    let mut annotations: Vec<(Box<str>, Box<str>)> = wire
        .metadata
        .annotations
        .0
        .iter()
        // The mesh's: a slice's trigger time means nothing on a Node.
        .filter(|(k, _)| k != wire::ANNOTATION_LAST_CHANGE_TRIGGER_TIME)
        .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
        .collect();
    annotations.sort();
    Ok(Node {
        addresses: addresses.into(),
        pod_cidrs,
        zone: Sym::EMPTY,
        annotations: annotations.into(),
        created: wire.metadata.creation_timestamp.unwrap_or(i64::MAX),
        ready: wire
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        ready_changed: wire
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.last_transition_time)
            .unwrap_or(i64::MIN),
        leaving: wire.metadata.deletion_timestamp
            || wire
                .spec
                .taints
                .iter()
                .any(|t| t.key == wire::TAINT_TO_BE_DELETED),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service_json(spec: &str) -> wire::Service {
        serde_json::from_str(&format!(
            r#"{{"metadata":{{"name":"web","namespace":"default"}},"spec":{spec}}}"#
        ))
        .expect("test json")
    }

    #[test]
    fn bad_ip_names_the_object_and_leaves_no_strings() {
        let mut strings = Interner::new();
        let wire =
            service_json(r#"{"clusterIP":"10.0.0.300","ports":[{"name":"http","port":80}]}"#);
        let err = service(&wire, &mut strings, &mut Vec::new()).expect_err("bad ip");
        assert_eq!(err.object, "default/web");
        assert!(err.reason.contains("10.0.0.300"), "{err}");
        assert!(strings.is_empty());
    }

    #[test]
    fn port_range_and_protocol_are_checked() {
        let mut strings = Interner::new();
        let wire = service_json(r#"{"clusterIP":"10.0.0.1","ports":[{"port":70000}]}"#);
        assert!(service(&wire, &mut strings, &mut Vec::new()).is_err());
        let wire =
            service_json(r#"{"clusterIP":"10.0.0.1","ports":[{"port":53,"protocol":"ICMP"}]}"#);
        let err = service(&wire, &mut strings, &mut Vec::new()).expect_err("bad protocol");
        assert!(err.reason.contains("ICMP"));
    }

    #[test]
    fn headless_and_dual_stack() {
        let mut strings = Interner::new();
        let headless = service(
            &service_json(r#"{"clusterIP":"None"}"#),
            &mut strings,
            &mut Vec::new(),
        )
        .expect("valid");
        assert!(headless.headless);
        assert!(headless.cluster_ips.is_empty());
        let dual = service(
            &service_json(r#"{"clusterIP":"10.0.0.1","clusterIPs":["10.0.0.1","fd00::1"]}"#),
            &mut strings,
            &mut Vec::new(),
        )
        .expect("valid");
        assert_eq!(
            dual.cluster_ip(Family::V6),
            Some("fd00::1".parse().expect("ip"))
        );
    }

    #[test]
    fn a_third_cluster_ip_refuses_the_service() {
        let mut strings = Interner::new();
        let wire = service_json(
            r#"{"clusterIP":"10.0.0.1","clusterIPs":["10.0.0.1","fd00::1","10.0.0.2"]}"#,
        );
        let err = service(&wire, &mut strings, &mut Vec::new()).expect_err("three addresses");
        assert!(err.reason.contains("spec.clusterIPs: 3 addresses"), "{err}");
        assert!(strings.is_empty());
    }

    #[test]
    fn a_bad_list_entry_costs_the_entry_and_leading_zeros_are_decimal() {
        let mut strings = Interner::new();
        let mut skipped = Vec::new();
        let svc = service(
            &service_json(
                r#"{"clusterIP":"10.0.0.1","externalIPs":["192.0.2.1","nonsense"],
                    "loadBalancerSourceRanges":["010.020.0.0/16","bad"]}"#,
            ),
            &mut strings,
            &mut skipped,
        )
        .expect("valid");
        assert_eq!(
            svc.external_ips(),
            ["192.0.2.1".parse::<IpAddr>().expect("ip")]
        );
        assert_eq!(
            svc.load_balancer_source_ranges(),
            ["10.20.0.0/16".parse::<Cidr>().expect("cidr")]
        );
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(
            skipped.iter().any(|s| s.contains("nonsense")),
            "{skipped:?}"
        );
        // Not an address however read: too many octets, an octet over 255, signs.
        for text in ["1.2.3.4.5", "1.2.3.256", "1.2.+3.4", "1..2.3", "0001.2.3.4"] {
            assert_eq!(crate::model::parse_ip_sloppy(text), None, "{text}");
        }
    }

    #[test]
    fn affinity_defaults_to_three_hours() {
        let mut strings = Interner::new();
        let svc = service(
            &service_json(r#"{"clusterIP":"10.0.0.1","sessionAffinity":"ClientIP"}"#),
            &mut strings,
            &mut Vec::new(),
        )
        .expect("valid");
        assert_eq!(svc.affinity_timeout, DEFAULT_AFFINITY_TIMEOUT);
    }

    /// Checklist A.8: nil conditions mean ready, serving, not terminating.
    #[test]
    fn a8_nil_conditions_default() {
        let mut strings = Interner::new();
        let wire: wire::EndpointSlice = serde_json::from_str(
            r#"{"metadata":{"name":"web-1","namespace":"default",
                "labels":{"kubernetes.io/service-name":"web"}},
               "addressType":"IPv4",
               "endpoints":[{"addresses":["10.1.0.1"]},
                            {"addresses":["10.1.0.2"],"conditions":{"ready":false,"terminating":true}}],
               "ports":[{"name":"http","port":8080}]}"#,
        )
        .expect("json");
        let slice = slice(&wire, &mut strings, &mut Vec::new())
            .expect("valid")
            .expect("IPv4");
        let endpoints: Vec<_> = slice.endpoints().collect();
        assert!(endpoints[0].is_ready() && endpoints[0].is_serving());
        assert!(!endpoints[0].is_terminating());
        assert!(!endpoints[1].is_ready());
        assert!(endpoints[1].is_serving() && endpoints[1].is_terminating());
    }

    /// Checklist A.7: wrong-family addresses are dropped; only addresses[0] counts.
    #[test]
    fn a7_wrong_family_dropped() {
        let mut strings = Interner::new();
        let wire: wire::EndpointSlice = serde_json::from_str(
            r#"{"metadata":{"name":"s","namespace":"default"},"addressType":"IPv4",
               "endpoints":[{"addresses":["fd00::1"]},{"addresses":["10.1.0.1","10.1.0.2"]}],
               "ports":[{"name":"","port":80},{"port":81},{"name":"x"}]}"#,
        )
        .expect("json");
        let slice = slice(&wire, &mut strings, &mut Vec::new())
            .expect("valid")
            .expect("IPv4");
        let endpoints: Vec<_> = slice.endpoints().collect();
        assert_eq!(endpoints.len(), 1);
        assert_eq!(endpoints[0].addr, "10.1.0.1".parse::<IpAddr>().expect("ip"));
        assert_eq!(
            slice.ports.len(),
            1,
            "ports without name or number are ignored"
        );
    }

    #[test]
    fn fqdn_slices_are_not_errors() {
        let mut strings = Interner::new();
        let wire: wire::EndpointSlice =
            serde_json::from_str(r#"{"metadata":{"name":"s"},"addressType":"FQDN"}"#)
                .expect("json");
        assert_eq!(slice(&wire, &mut strings, &mut Vec::new()), Ok(None));
    }

    #[test]
    fn node_primary_ip_prefers_internal() {
        let mut strings = Interner::new();
        let wire: wire::Node = serde_json::from_str(
            r#"{"metadata":{"name":"n1","labels":{"topology.kubernetes.io/zone":"a"}},
               "spec":{"podCIDRs":["10.244.1.0/24","fd00:1::/64"]},
               "status":{"addresses":[{"type":"Hostname","address":"n1"},
                                      {"type":"ExternalIP","address":"192.0.2.1"},
                                      {"type":"InternalIP","address":"10.0.0.1"}]}}"#,
        )
        .expect("json");
        let node = node(&wire, &mut strings).expect("valid");
        assert_eq!(
            node.primary_ip(Family::V4),
            Some("10.0.0.1".parse().expect("ip"))
        );
        assert_eq!(node.primary_ip(Family::V6), None);
        assert_eq!(node.pod_cidrs.len(), 2);
        assert_eq!(strings.resolve(node.zone), "a");
    }

    #[test]
    fn a_node_being_deleted_or_tainted_for_removal_is_leaving() {
        let mut strings = Interner::new();
        let mut leaving = |json: &str| {
            let wire: wire::Node = serde_json::from_str(json).expect("json");
            node(&wire, &mut strings).expect("valid").leaving
        };
        assert!(!leaving(r#"{"metadata":{"name":"n"}}"#));
        assert!(!leaving(
            r#"{"metadata":{"name":"n","deletionTimestamp":null},
               "spec":{"taints":[{"key":"node.kubernetes.io/unschedulable","effect":"NoSchedule"}]}}"#
        ));
        assert!(leaving(
            r#"{"metadata":{"name":"n","deletionTimestamp":"2026-11-24T10:00:00Z"}}"#
        ));
        assert!(leaving(
            r#"{"metadata":{"name":"n"},"spec":{"taints":[
               {"key":"ToBeDeletedByClusterAutoscaler","value":"1732442400","effect":"NoSchedule"}]}}"#
        ));
    }
}
