//! The compact stored form of Services, EndpointSlices and Nodes.
//!
//! Sizes matter here: 100,000 endpoints must fit in a few MiB. IPs are `IpAddr`, ports
//! `u16`, conditions a bit set, repeated strings [`Sym`]s, and rare fields sit behind one
//! `Option<Box<_>>` so that the common object pays 8 bytes for them.

use crate::intern::{Interner, Sym};
use serde::Serialize;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Family {
    #[serde(rename = "IPv4")]
    V4,
    #[serde(rename = "IPv6")]
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// An address prefix such as a pod CIDR or a load-balancer source range. Ordered by
/// address, then prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn family(&self) -> Family {
        Family::of(self.addr)
    }

    /// Whether `other` lies wholly inside this range.
    pub fn contains_cidr(&self, other: &Cidr) -> bool {
        self.prefix <= other.prefix && self.contains(other.addr)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family()
            && Cidr {
                addr: ip,
                prefix: self.prefix,
            }
            .network()
                == self.network()
    }

    /// The range with its host bits cleared.
    pub fn network(self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Cidr {
            addr,
            prefix: self.prefix,
        }
    }

    /// The range's first host address, as a /32 or /128 (a gateway's, say); None for a
    /// range without hosts (/31, /32, /127, /128).
    pub fn first_host(self) -> Option<Cidr> {
        match self.network().addr {
            IpAddr::V4(a) if self.prefix < 31 => Some(Cidr {
                addr: IpAddr::V4(Ipv4Addr::from(u32::from(a) + 1)),
                prefix: 32,
            }),
            IpAddr::V6(a) if self.prefix < 127 => Some(Cidr {
                addr: IpAddr::V6(Ipv6Addr::from(u128::from(a) + 1)),
                prefix: 128,
            }),
            _ => None,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// An address as upstream's `ParseIPSloppy` reads it: IPv4 octets with leading zeros are
/// decimal (`010.1.2.3` is 10.1.2.3), as API servers before 1.33 stored them.
pub(crate) fn parse_ip_sloppy(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts.next().is_none().then(|| IpAddr::from(octets))
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (addr, prefix) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not a CIDR"))?;
        let addr =
            parse_ip_sloppy(addr).ok_or_else(|| format!("{text:?} has an invalid address"))?;
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("{text:?} has an invalid prefix length"))?;
        Ok(Cidr { addr, prefix })
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Read as written in the configuration: `10.244.0.0/16`.
impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
    ExternalName,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum TrafficDistribution {
    #[default]
    Unset,
    PreferClose,
    PreferSameZone,
    PreferSameNode,
}

/// Which traffic a policy keeps on the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub type_: ServiceType,
    /// `clusterIP: None`: DNS answers with the endpoints, the proxy programs nothing.
    pub headless: bool,
    pub cluster_ips: ClusterIps,
    pub ports: Box<[ServicePort]>,
    pub external_policy: TrafficPolicy,
    pub internal_policy: TrafficPolicy,
    pub traffic_distribution: TrafficDistribution,
    pub publish_not_ready_addresses: bool,
    /// Seconds of ClientIP affinity; 0 means no affinity.
    pub affinity_timeout: u32,
    /// 0 when the service has none.
    pub health_check_node_port: u16,
    pub extra: Option<Box<ServiceExtra>>,
}

/// A Service's cluster IPs, at most one per family as the API server allows, kept in the
/// Service itself: a boxed slice of one address took a 32-byte allocation and a 16-byte
/// pointer, and every non-headless Service has one.
#[derive(Clone, Copy, Debug)]
pub struct ClusterIps {
    ips: [IpAddr; 2],
    len: u8,
}

impl ClusterIps {
    pub const MAX: usize = 2;

    /// What fills a slot past `len`.
    const UNSET: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

    /// `ips` in their order (the first is the primary family's); None for more than
    /// [`ClusterIps::MAX`].
    pub fn new(ips: &[IpAddr]) -> Option<ClusterIps> {
        match *ips {
            [] => Some(ClusterIps::default()),
            [one] => Some(ClusterIps {
                ips: [one, ClusterIps::UNSET],
                len: 1,
            }),
            [first, second] => Some(ClusterIps {
                ips: [first, second],
                len: 2,
            }),
            _ => None,
        }
    }
}

impl Default for ClusterIps {
    fn default() -> Self {
        ClusterIps {
            ips: [ClusterIps::UNSET; 2],
            len: 0,
        }
    }
}

impl std::ops::Deref for ClusterIps {
    type Target = [IpAddr];

    fn deref(&self) -> &[IpAddr] {
        &self.ips[..usize::from(self.len)]
    }
}

/// Equal when they hold the same addresses in the same order, whatever fills the rest.
impl PartialEq for ClusterIps {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for ClusterIps {}

/// The fields most services leave empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceExtra {
    pub external_ips: Box<[IpAddr]>,
    pub load_balancer_ingress: Box<[LoadBalancerIngress]>,
    pub load_balancer_source_ranges: Box<[Cidr]>,
    pub external_name: Option<Box<str>>,
    /// The `service.kubernetes.io/service-proxy-name` label, when present: another proxy
    /// owns the service, even when the value is empty (upstream selects on the key alone).
    pub proxy_name: Option<Sym>,
    /// The `service.kubernetes.io/headless` label: no proxy programs the service, whatever
    /// its cluster IP (kube-proxy's informers select such services out). DNS still serves it.
    pub headless_label: bool,
    /// `creationTimestamp` in seconds, kept only by services that claim external
    /// addresses (0 for the others): of two that claim one address and port, the older
    /// owns it.
    pub created: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    pub ip: IpAddr,
    /// `ipMode: Proxy`: the load balancer delivers to the node itself, so the proxy must not
    /// capture the IP.
    pub proxy_mode: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: Sym,
    pub protocol: Protocol,
    pub port: u16,
    /// 0 when the port has none.
    pub node_port: u16,
}

impl Service {
    pub fn external_ips(&self) -> &[IpAddr] {
        self.extra.as_deref().map_or(&[], |e| &e.external_ips)
    }

    /// The ExternalIPs and LB IPs, which another service may claim too.
    pub fn external_addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.external_ips().iter().copied().chain(
            self.load_balancer_ingress()
                .iter()
                .map(|ingress| ingress.ip),
        )
    }

    /// Which of two services claiming one external address and port owns it: the one
    /// with the smaller rank, the older, then the first by namespace and name. Every
    /// node decides the same way.
    pub fn claim_rank<'a>(&self, namespace: &'a str, name: &'a str) -> (i64, &'a str, &'a str) {
        let created = self.extra.as_deref().map_or(i64::MAX, |e| e.created);
        (created, namespace, name)
    }

    pub fn load_balancer_ingress(&self) -> &[LoadBalancerIngress] {
        self.extra
            .as_deref()
            .map_or(&[], |e| &e.load_balancer_ingress)
    }

    pub fn load_balancer_source_ranges(&self) -> &[Cidr] {
        self.extra
            .as_deref()
            .map_or(&[], |e| &e.load_balancer_source_ranges)
    }

    pub fn external_name(&self) -> Option<&str> {
        self.extra
            .as_deref()
            .and_then(|e| e.external_name.as_deref())
    }

    pub fn cluster_ip(&self, family: Family) -> Option<IpAddr> {
        self.cluster_ips
            .iter()
            .copied()
            .find(|ip| Family::of(*ip) == family)
    }

    /// The `service.kubernetes.io/service-proxy-name` label, when present.
    pub fn proxy_name(&self) -> Option<Sym> {
        self.extra.as_ref().and_then(|extra| extra.proxy_name)
    }

    /// This proxy programs nothing for the service (A.2): another proxy owns it
    /// (`service-proxy-name`), or it carries the `service.kubernetes.io/headless` label.
    pub fn not_proxied(&self) -> bool {
        self.extra
            .as_ref()
            .is_some_and(|extra| extra.proxy_name.is_some() || extra.headless_label)
    }

    pub(crate) fn release(&self, strings: &mut Interner) {
        if let Some(name) = self.proxy_name() {
            strings.release(name);
        }
        for port in &self.ports {
            strings.release(port.name);
        }
    }
}

/// Endpoint condition bits, with Kubernetes' nil defaults already applied.
pub mod conditions {
    pub const READY: u8 = 1;
    pub const SERVING: u8 = 2;
    pub const TERMINATING: u8 = 4;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    /// The slice's name, hashed: nodus never prints it, it only needs to find it again.
    pub name_hash: u64,
    /// Labelled `service.kubernetes.io/headless`: the proxy skips it, DNS answers with it.
    pub headless: bool,
    pub ports: Box<[SlicePort]>,
    pub endpoints: Endpoints,
    /// Hostnames, target pods and hints of the few endpoints that have any, sorted by the
    /// endpoint's index: kept apart so that the common endpoint does not pay for them.
    pub extras: EndpointExtras,
}

/// A slice's [`EndpointExtra`]s by endpoint index, behind one thin pointer, null when no
/// endpoint has any (most slices): a boxed slice took 16 bytes of every slice, which made
/// a `Slice` 72 bytes, an allocation of 80; it is 64 this way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointExtras(Option<Box<Box<[IndexedExtra]>>>);

/// An endpoint's index in its slice, and its extras.
pub type IndexedExtra = (u32, EndpointExtra);

impl From<Vec<IndexedExtra>> for EndpointExtras {
    fn from(extras: Vec<IndexedExtra>) -> Self {
        EndpointExtras((!extras.is_empty()).then(|| Box::new(extras.into_boxed_slice())))
    }
}

impl std::ops::Deref for EndpointExtras {
    type Target = [IndexedExtra];

    fn deref(&self) -> &[IndexedExtra] {
        self.0.as_deref().map_or(&[], |extras| extras)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlicePort {
    pub name: Sym,
    pub protocol: Protocol,
    pub port: u16,
}

/// A slice's endpoints. A slice holds one address family, so addresses are stored at
/// their own size: an IPv4 endpoint takes 16 bytes, an IPv6 one 28.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoints {
    V4(Box<[Endpoint<Ipv4Addr>]>),
    V6(Box<[Endpoint<Ipv6Addr>]>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint<A> {
    /// `addresses[0]`, as kube-proxy uses it.
    pub addr: A,
    pub conditions: u8,
    pub node: Sym,
    pub zone: Sym,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointExtra {
    pub hostname: Option<Box<str>>,
    /// The target pod's name, kept only for headless services, whose DNS records may use it.
    pub pod: Option<Box<str>>,
    pub for_zones: Box<[Sym]>,
    pub for_nodes: Box<[Sym]>,
}

/// One endpoint of a slice with its extras, as the rules read it.
#[derive(Clone, Copy, Debug)]
pub struct EndpointRef<'a> {
    pub addr: IpAddr,
    pub conditions: u8,
    pub node: Sym,
    pub zone: Sym,
    pub extra: Option<&'a EndpointExtra>,
}

impl EndpointRef<'_> {
    pub fn is_ready(&self) -> bool {
        self.conditions & conditions::READY != 0
    }

    pub fn is_serving(&self) -> bool {
        self.conditions & conditions::SERVING != 0
    }

    pub fn is_terminating(&self) -> bool {
        self.conditions & conditions::TERMINATING != 0
    }

    pub fn hostname(&self) -> Option<&str> {
        self.extra.and_then(|e| e.hostname.as_deref())
    }

    pub fn pod(&self) -> Option<&str> {
        self.extra.and_then(|e| e.pod.as_deref())
    }

    pub fn zone_hints(&self) -> &[Sym] {
        self.extra.map_or(&[], |e| &e.for_zones)
    }

    pub fn node_hints(&self) -> &[Sym] {
        self.extra.map_or(&[], |e| &e.for_nodes)
    }
}

impl Endpoints {
    /// Stores `(address, conditions, node, zone)` of `family`; other addresses are skipped.
    pub fn collect(
        family: Family,
        items: impl IntoIterator<Item = (IpAddr, u8, Sym, Sym)>,
    ) -> Endpoints {
        let items = items.into_iter();
        match family {
            Family::V4 => Endpoints::V4(
                items
                    .filter_map(|(addr, conditions, node, zone)| match addr {
                        IpAddr::V4(addr) => Some(Endpoint {
                            addr,
                            conditions,
                            node,
                            zone,
                        }),
                        IpAddr::V6(_) => None,
                    })
                    .collect(),
            ),
            Family::V6 => Endpoints::V6(
                items
                    .filter_map(|(addr, conditions, node, zone)| match addr {
                        IpAddr::V6(addr) => Some(Endpoint {
                            addr,
                            conditions,
                            node,
                            zone,
                        }),
                        IpAddr::V4(_) => None,
                    })
                    .collect(),
            ),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Endpoints::V4(e) => e.len(),
            Endpoints::V6(e) => e.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Slice {
    pub fn family(&self) -> Family {
        match self.endpoints {
            Endpoints::V4(_) => Family::V4,
            Endpoints::V6(_) => Family::V6,
        }
    }

    fn extra(&self, index: usize) -> Option<&EndpointExtra> {
        let index = u32::try_from(index).ok()?;
        self.extras
            .binary_search_by_key(&index, |(i, _)| *i)
            .ok()
            .map(|k| &self.extras[k].1)
    }

    /// Every endpoint with its extras, in the slice's order.
    pub fn endpoints(&self) -> impl Iterator<Item = EndpointRef<'_>> {
        fn refs<'a, A: Copy + Into<IpAddr>>(
            slice: &'a Slice,
            endpoints: &'a [Endpoint<A>],
        ) -> impl Iterator<Item = EndpointRef<'a>> {
            endpoints.iter().enumerate().map(move |(i, e)| EndpointRef {
                addr: e.addr.into(),
                conditions: e.conditions,
                node: e.node,
                zone: e.zone,
                extra: slice.extra(i),
            })
        }
        let (v4, v6) = match &self.endpoints {
            Endpoints::V4(e) => (Some(refs(self, e)), None),
            Endpoints::V6(e) => (None, Some(refs(self, e))),
        };
        v4.into_iter().flatten().chain(v6.into_iter().flatten())
    }

    pub(crate) fn release(&self, strings: &mut Interner) {
        for port in &self.ports {
            strings.release(port.name);
        }
        for endpoint in self.endpoints() {
            strings.release(endpoint.node);
            strings.release(endpoint.zone);
        }
        for (_, extra) in self.extras.iter() {
            for &sym in extra.for_zones.iter().chain(extra.for_nodes.iter()) {
                strings.release(sym);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum NodeAddressKind {
    InternalIP,
    ExternalIP,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct NodeAddress {
    #[serde(rename = "type")]
    pub kind: NodeAddressKind,
    pub address: IpAddr,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub addresses: Box<[NodeAddress]>,
    pub pod_cidrs: Box<[Cidr]>,
    pub zone: Sym,
    /// The annotations nodus reads ([`crate::wire::ANNOTATION_PUBLIC_KEY`] and the
    /// others), sorted by key.
    pub annotations: Box<[(Box<str>, Box<str>)]>,
    /// When the Node object was created, in seconds since the epoch; `i64::MAX` when it
    /// has no creation time, so that it is never the older of two. Of two Nodes that claim
    /// one pod range, the older keeps it, the same on every node.
    pub created: i64,
    /// The Node is being deleted, or the cluster autoscaler has tainted it for removal:
    /// load balancers should stop sending it traffic (kube-proxy's `/healthz` says so).
    pub leaving: bool,
    /// Its `Ready` condition is `True`: its kubelet reports. A Node NotReady or stale (the
    /// node lifecycle controller sets `Unknown` when its kubelet went silent) never keeps
    /// an address, range or key from a ready one in the mesh.
    pub ready: bool,
    /// When its `Ready` condition last changed, in seconds since the epoch; `i64::MIN`
    /// when unknown. A node NotReady for a moment keeps its standing in the mesh.
    pub ready_changed: i64,
}

impl Node {
    /// The node's primary address of a family: the first InternalIP, else the first
    /// ExternalIP, as kube-proxy picks it for NodePorts.
    pub fn primary_ip(&self, family: Family) -> Option<IpAddr> {
        let of_kind = |kind| {
            self.addresses
                .iter()
                .find(|a| a.kind == kind && Family::of(a.address) == family)
                .map(|a| a.address)
        };
        of_kind(NodeAddressKind::InternalIP).or_else(|| of_kind(NodeAddressKind::ExternalIP))
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    pub(crate) fn release(&self, strings: &mut Interner) {
        strings.release(self.zone);
    }
}

/// A Pod of this node, as DNS needs it to tell who asks: its namespace, the addresses it
/// sends from, and whether its search list is kubelet's for `ClusterFirst`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPod {
    pub namespace: Sym,
    /// Its own addresses, one per family; none for a host-network pod (it sends from the
    /// node's) or a pod that has ended (its addresses may already be another's).
    pub ips: Box<[IpAddr]>,
    /// Its resolv.conf searches `<ns>.svc.<zone> svc.<zone> <zone>` and then the node's
    /// own search domains, nothing else (`dnsPolicy: ClusterFirst` without
    /// `dnsConfig.searches`).
    pub cluster_search: bool,
}

impl LocalPod {
    pub(crate) fn release(&self, strings: &mut Interner) {
        strings.release(self.namespace);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parses_and_contains() {
        let net: Cidr = "10.244.1.0/24".parse().expect("valid");
        assert!(net.contains("10.244.1.9".parse().expect("ip")));
        assert!(!net.contains("10.244.2.9".parse().expect("ip")));
        assert!(!net.contains("fd00::1".parse().expect("ip")));
        let all: Cidr = "0.0.0.0/0".parse().expect("valid");
        assert!(all.contains("192.0.2.1".parse().expect("ip")));
        let v6: Cidr = "fd00:10::/64".parse().expect("valid");
        assert!(v6.contains("fd00:10::5".parse().expect("ip")));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("10.0.0.0".parse::<Cidr>().is_err());
    }

    #[test]
    fn cluster_ips_keep_their_order_and_refuse_a_third() {
        let v4: IpAddr = "10.96.0.10".parse().expect("ip");
        let v6: IpAddr = "fd00:10::a".parse().expect("ip");
        assert!(ClusterIps::new(&[]).expect("none").is_empty());
        assert_eq!(*ClusterIps::new(&[v6, v4]).expect("two"), [v6, v4]);
        assert_eq!(ClusterIps::new(&[v4]), ClusterIps::new(&[v4]));
        assert_ne!(ClusterIps::new(&[v4]), ClusterIps::new(&[v4, v6]));
        assert!(ClusterIps::new(&[v4, v6, v4]).is_none());
    }

    #[test]
    fn endpoints_stay_small() {
        assert_eq!(size_of::<Endpoint<Ipv4Addr>>(), 16);
        assert_eq!(size_of::<Endpoint<Ipv6Addr>>(), 28);
        assert_eq!(size_of::<Slice>(), 64);
    }
}
