//! The proxy's settings, and the facts about this node that every plan depends on.

use std::net::IpAddr;

use nodus_view::View;
use nodus_view::model::{Cidr, Family};
use nodus_view::resolve::{NodeContext, Target};

/// kube-proxy's default masquerade bit 14 (checklist D.30). Not an API: other components
/// must not rely on it.
pub const DEFAULT_MASQUERADE_MARK: u32 = 0x4000;

/// What the `nodus` table carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TableScope {
    /// The service proxy: every chain of kube-proxy's nftables mode, and the egress
    /// masquerade when it is on.
    #[default]
    Services,
    /// Only the pod network's egress masquerade (`nat-postrouting`, `masquerading` and
    /// the pod and cluster ranges), for a node where another proxy (kube-proxy) serves
    /// Services beside nodus's mesh: no service, filter or reject rules that could meet
    /// that proxy's traffic.
    EgressOnly,
}

/// How ClusterIP traffic from this node's pods is told from other traffic (kube-proxy's
/// `detectLocalMode`, checklist D.29): the latter is masqueraded, and pods short-circuit
/// to the cluster chain of an external address under the Local policy (F.45).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum LocalDetector {
    /// Sources in [`ProxySettings::cluster_cidrs`], or without them in this node's pod CIDRs.
    #[default]
    ClusterCidr,
    /// Sources in this node's pod CIDRs, whatever `cluster_cidrs` says.
    NodeCidr,
    /// Packets that arrive through this bridge (`detectLocal.bridgeInterface`).
    BridgeInterface(String),
    /// Packets that arrive through an interface whose name starts so
    /// (`detectLocal.interfaceNamePrefix`, `veth` for many plugins).
    InterfaceNamePrefix(String),
}

/// Which addresses of this node accept NodePorts (kube-proxy's `nodePortAddresses`,
/// checklist E.34).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum NodePortAddresses {
    /// The node's primary address per family, from its Node object.
    #[default]
    Primary,
    /// Every address of this host's interfaces inside one of the ranges (`0.0.0.0/0`:
    /// all of them), loopback excepted ([`ProxySettings::interface_addresses`]).
    Cidrs(Vec<Cidr>),
}

/// How the proxy is set up; the equivalent of kube-proxy's flags that nodus keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxySettings {
    /// The whole proxy, or the egress masquerade alone.
    pub scope: TableScope,
    /// Pod address ranges of the whole cluster: traffic from them is "local" to the
    /// cluster (D.29, F.45). Empty: the pod CIDRs of this node's Node object.
    pub cluster_cidrs: Vec<Cidr>,
    /// The packet mark bit that asks `nat-postrouting` to masquerade.
    pub masquerade_mark: u32,
    /// Masquerade every connection to a ClusterIP (D.28).
    pub masquerade_all: bool,
    /// Masquerade pod traffic that leaves the cluster (nodus is the pod network: the
    /// mesh is on).
    pub egress_masquerade: bool,
    /// The cluster DNS Service whose ClusterIP:53 goes to this node's own DNS listener
    /// instead of its endpoints (`dns.serve_cluster_dns_ip`).
    pub local_dns: Option<LocalDns>,
    pub local_detector: LocalDetector,
    pub node_port_addresses: NodePortAddresses,
    /// NodePorts also on 127.0.0.1 (E.35; iptables mode's `localhost-nodeports`), for
    /// this host's own clients; IPv6 has no such thing.
    pub localhost_node_ports: bool,
    /// Enforce NetworkPolicies for this node's pods (`policy.rs`).
    pub network_policy: bool,
    /// The addresses of this host's interfaces, as last read: the applier keeps them
    /// current when [`NodePortAddresses::Cidrs`] needs them.
    pub interface_addresses: Vec<IpAddr>,
    /// The interface group of pod links (nodus-cni's): what arrives through one must come
    /// from an address routed back through it, and carry no router message.
    pub pod_link_group: Option<u32>,
    /// The ranges a Service's ExternalIPs are honoured in; `None`: all of them.
    pub external_ips: Option<Vec<Cidr>>,
}

/// The interface that pod traffic arrives through: one name, or a name prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodInterface {
    pub name: String,
    pub prefix: bool,
}

/// The cluster DNS Service (kube-system/kube-dns by default) and the port of this node's
/// DNS listener that its port 53 is redirected to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LocalDns {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

impl Default for ProxySettings {
    fn default() -> ProxySettings {
        ProxySettings {
            scope: TableScope::Services,
            cluster_cidrs: Vec::new(),
            masquerade_mark: DEFAULT_MASQUERADE_MARK,
            masquerade_all: false,
            egress_masquerade: false,
            local_dns: None,
            local_detector: LocalDetector::ClusterCidr,
            node_port_addresses: NodePortAddresses::Primary,
            localhost_node_ports: false,
            network_policy: false,
            interface_addresses: Vec::new(),
            pod_link_group: None,
            external_ips: None,
        }
    }
}

/// What the plans need from the configuration and this node's Node object, worked out
/// once per sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// From the configuration; a plan depends on it like on the node's own facts.
    pub scope: TableScope,
    pub node: NodeContext,
    /// The addresses that accept NodePorts: the node's primary address per family, or
    /// the host's addresses in `nodePortAddresses` (E.34, E.35), sorted.
    pub node_port_ips: Vec<IpAddr>,
    /// NodePorts on 127.0.0.1 too, and packets to 127.0.0.0/8 from other interfaces
    /// dropped.
    pub localhost_node_ports: bool,
    /// The pod ranges: the egress masquerade's sources, and the local-traffic detector's
    /// unless it goes by interface; a family without any has no CIDR detector.
    pub pod_cidrs: Vec<Cidr>,
    /// The detector by interface, when configured.
    pub pod_interface: Option<PodInterface>,
    /// This node's own pod ranges: an endpoint inside them runs here, whatever node its
    /// slice names (a hand-made or mirrored slice may name none).
    pub node_pod_cidrs: Vec<Cidr>,
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    /// With egress masquerade: the destinations that stay inside the cluster, the
    /// configured cluster CIDRs or else every Node's pod CIDRs. Empty without it.
    pub cluster_destinations: Vec<Cidr>,
    /// The ranges of the cluster's ServiceCIDRs: traffic to an address in them that no
    /// service holds is dropped (C.25) rather than routed on.
    pub service_cidrs: Vec<Cidr>,
    pub local_dns: Option<LocalDns>,
    pub network_policy: bool,
    /// [`ProxySettings::pod_link_group`].
    pub pod_link_group: Option<u32>,
    /// [`ProxySettings::external_ips`].
    pub external_ips: Option<Vec<Cidr>>,
}

impl NodeFacts {
    pub fn new(view: &View, config: &ProxySettings) -> NodeFacts {
        let this_node = view.this_node();
        let node_port_ips = match &config.node_port_addresses {
            NodePortAddresses::Primary => this_node
                .map(|node| {
                    Family::ALL
                        .iter()
                        .filter_map(|family| node.primary_ip(*family))
                        .collect()
                })
                .unwrap_or_default(),
            NodePortAddresses::Cidrs(cidrs) => {
                let mut ips: Vec<IpAddr> = config
                    .interface_addresses
                    .iter()
                    .copied()
                    .filter(|ip| !ip.is_loopback() && cidrs.iter().any(|cidr| cidr.contains(*ip)))
                    .collect();
                ips.sort();
                ips.dedup();
                ips
            }
        };
        let node_pod_cidrs = this_node
            .map(|node| node.pod_cidrs.to_vec())
            .unwrap_or_default();
        let pod_cidrs = if config.cluster_cidrs.is_empty()
            || config.local_detector == LocalDetector::NodeCidr
        {
            node_pod_cidrs.clone()
        } else {
            config.cluster_cidrs.clone()
        };
        let pod_interface = match &config.local_detector {
            LocalDetector::BridgeInterface(name) => Some(PodInterface {
                name: name.clone(),
                prefix: false,
            }),
            LocalDetector::InterfaceNamePrefix(prefix) => Some(PodInterface {
                name: prefix.clone(),
                prefix: true,
            }),
            LocalDetector::ClusterCidr | LocalDetector::NodeCidr => None,
        };
        let cluster_destinations = match (config.egress_masquerade, config.cluster_cidrs.is_empty())
        {
            (false, _) => Vec::new(),
            (true, false) => config.cluster_cidrs.clone(),
            (true, true) => {
                let mut cidrs: Vec<Cidr> = view
                    .nodes()
                    .flat_map(|(_, node)| node.pod_cidrs.iter().copied())
                    .collect();
                cidrs.sort();
                cidrs.dedup();
                cidrs
            }
        };
        NodeFacts {
            scope: config.scope,
            node: view.node_context(),
            node_port_ips,
            localhost_node_ports: config.localhost_node_ports,
            pod_cidrs,
            pod_interface,
            node_pod_cidrs,
            masquerade_mark: config.masquerade_mark,
            masquerade_all: config.masquerade_all,
            cluster_destinations,
            service_cidrs: view.service_cidrs(),
            local_dns: config.local_dns.clone(),
            network_policy: config.network_policy && config.scope == TableScope::Services,
            pod_link_group: config.pod_link_group,
            external_ips: config.external_ips.clone(),
        }
    }

    /// Whether `other` differs from these facts only in what the skeleton alone reads:
    /// the cluster's destinations (a Node joined or left) or the ServiceCIDRs. The
    /// services' plans stay as they are.
    pub fn differs_only_in_skeleton(&self, other: &NodeFacts) -> bool {
        self != other
            && NodeFacts {
                cluster_destinations: other.cluster_destinations.clone(),
                service_cidrs: other.service_cidrs.clone(),
                ..self.clone()
            } == *other
    }

    /// Whether ClusterIP traffic of `family` is marked for masquerade, some of it (from
    /// outside the pods) or all of it, by the rule `skeleton::cluster_masquerade_rule` makes.
    pub fn marks_cluster_ip_traffic(&self, family: Family) -> bool {
        self.masquerade_all || self.detects_local(family)
    }

    /// Whether pod traffic of `family` can be told from other traffic.
    pub fn detects_local(&self, family: Family) -> bool {
        self.pod_interface.is_some() || self.has_pod_ranges(family)
    }

    /// Whether this node knows pod ranges of `family`.
    pub fn has_pod_ranges(&self, family: Family) -> bool {
        self.pod_cidrs.iter().any(|cidr| cidr.family() == family)
    }

    /// The listener port that port `port` of service `namespace/name` is redirected to,
    /// when that service is the cluster DNS this node answers for.
    pub fn local_dns_port(&self, namespace: &str, name: &str, port: u16) -> Option<u16> {
        self.local_dns
            .as_ref()
            .filter(|dns| dns.namespace == namespace && dns.name == name && port == 53)
            .map(|dns| dns.port)
    }

    /// Whether the endpoint `target` runs on this node: its slice says so, or its address
    /// is one of this node's pods'.
    pub fn runs_here(&self, target: &Target) -> bool {
        target.local
            || self
                .node_pod_cidrs
                .iter()
                .any(|cidr| cidr.contains(target.ip))
    }

    /// Whether a Service's ExternalIP `ip` is honoured at all (`proxy.external_ips`).
    pub fn honours_external_ip(&self, ip: IpAddr) -> bool {
        self.external_ips
            .as_ref()
            .is_none_or(|cidrs| cidrs.iter().any(|cidr| cidr.contains(ip)))
    }

    pub fn node_port_ips(&self, family: Family) -> impl Iterator<Item = IpAddr> + '_ {
        self.node_port_ips
            .iter()
            .copied()
            .filter(move |ip| Family::of(*ip) == family)
    }
}
