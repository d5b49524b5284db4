//! The proxy's section of the configuration file (`proxy:`), spelled as kube-proxy's
//! configuration spells its fields, and what it becomes: the planner's
//! [`ProxySettings`], the host's [`Sysctls`] and where health checks listen.

use crate::plan::{
    DEFAULT_MASQUERADE_MARK, LocalDetector, LocalDns, NodePortAddresses, ProxySettings, TableScope,
};
use crate::sysctls::{ConntrackSettings, Sysctls};
use nodus_view::config::{Cluster, Invalid, check};
use nodus_view::model::Cidr;
use serde::{Deserialize, Deserializer};
use std::net::{IpAddr, Ipv4Addr};

/// The service proxy. Off by default, so that `nodus run` on a workstation never takes
/// over the host's nftables; `deploy/` turns it on.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub enabled: bool,
    /// Where health-check node ports listen (every address, as kube-proxy does).
    pub health_check_address: IpAddr,
    /// kube-proxy's `masqueradeAll`: every connection to a ClusterIP is masqueraded, not
    /// only those from outside the pod network.
    pub masquerade_all: bool,
    /// kube-proxy's `masqueradeBit`: the bit of the packet mark (0 to 31) that flags a
    /// connection for masquerade. No other program on the node may use it.
    pub masquerade_bit: u8,
    /// kube-proxy's `conntrack` settings.
    pub conntrack: ConntrackConfig,
    /// kube-proxy's `detectLocalMode`: how pod traffic is told from other traffic.
    pub detect_local_mode: DetectLocalMode,
    /// kube-proxy's `detectLocal`: the interface of the two interface modes.
    pub detect_local: DetectLocalConfig,
    /// kube-proxy's `nodePortAddresses`: `[primary]` (the default: the node's primary
    /// addresses), or ranges of this host's addresses that accept NodePorts
    /// (`0.0.0.0/0` and `::/0` for all).
    #[serde(deserialize_with = "node_port_addresses")]
    pub node_port_addresses: NodePortAddresses,
    /// NodePorts on 127.0.0.1 as well, for this host's clients (iptables mode's
    /// `localhost-nodeports`; nftables mode has none): sets `route_localnet` and drops
    /// packets to 127.0.0.0/8 that arrive from other machines.
    pub localhost_node_ports: bool,
    /// The ranges whose addresses a Service's `externalIPs` may capture on this node;
    /// none by default, as with the API server's `DenyServiceExternalIPs`: whoever may
    /// write a Service could otherwise take any address for every pod (CVE-2020-8554).
    /// `["0.0.0.0/0", "::/0"]` honours them all, as kube-proxy does.
    pub external_ips: Vec<Cidr>,
}

/// kube-proxy's `detectLocalMode` values, spelled as kube-proxy spells them.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
pub enum DetectLocalMode {
    /// `cluster_cidrs`, or without them this node's pod CIDRs.
    #[default]
    #[serde(rename = "ClusterCIDR")]
    ClusterCidr,
    #[serde(rename = "NodeCIDR")]
    NodeCidr,
    BridgeInterface,
    InterfaceNamePrefix,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DetectLocalConfig {
    /// For `BridgeInterface`: the bridge pods are attached to (`cni0`).
    pub bridge_interface: String,
    /// For `InterfaceNamePrefix`: how the names of pods' interfaces start (`veth`).
    pub interface_name_prefix: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            enabled: false,
            health_check_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            masquerade_all: false,
            masquerade_bit: DEFAULT_MASQUERADE_MARK.trailing_zeros() as u8,
            conntrack: ConntrackConfig::default(),
            detect_local_mode: DetectLocalMode::default(),
            detect_local: DetectLocalConfig::default(),
            node_port_addresses: NodePortAddresses::Primary,
            localhost_node_ports: false,
            external_ips: Vec::new(),
        }
    }
}

/// kube-proxy's `conntrack.maxPerCore`, `min`, `tcpEstablishedTimeout` and
/// `tcpCloseWaitTimeout` (in seconds), with its defaults; 0 leaves a setting alone.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConntrackConfig {
    pub max_per_core: u32,
    pub min: u32,
    pub tcp_established_timeout_seconds: u32,
    pub tcp_close_wait_timeout_seconds: u32,
}

impl Default for ConntrackConfig {
    fn default() -> Self {
        let defaults = ConntrackSettings::default();
        ConntrackConfig {
            max_per_core: defaults.max_per_core,
            min: defaults.min,
            tcp_established_timeout_seconds: defaults.tcp_established_timeout_seconds,
            tcp_close_wait_timeout_seconds: defaults.tcp_close_wait_timeout_seconds,
        }
    }
}

impl ConntrackConfig {
    pub fn settings(&self) -> ConntrackSettings {
        ConntrackSettings {
            max_per_core: self.max_per_core,
            min: self.min,
            tcp_established_timeout_seconds: self.tcp_established_timeout_seconds,
            tcp_close_wait_timeout_seconds: self.tcp_close_wait_timeout_seconds,
        }
    }
}

/// What the proxy's table carries besides this section: it comes from the other
/// sections of the configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Neighbours {
    /// The mesh is the pod network and masquerades pod traffic leaving the cluster.
    pub egress_masquerade: bool,
    /// The cluster DNS Service whose ClusterIP:53 goes to this node's DNS listener.
    pub local_dns: Option<LocalDns>,
    /// NetworkPolicy is enforced in the table.
    pub network_policy: bool,
    /// The interface group of the pod plugin's links, whose sources the table checks.
    pub pod_link_group: Option<u32>,
}

impl Config {
    /// Whether nodus programs its table at all: for the service proxy, or for the mesh's
    /// egress masquerade alone.
    pub fn programs_table(&self, neighbours: &Neighbours) -> bool {
        self.enabled || neighbours.egress_masquerade
    }

    /// The section's own rules; those that involve other sections are the caller's.
    pub fn validate(&self) -> Result<(), Invalid> {
        check(self.masquerade_bit <= 31, || {
            format!(
                "proxy.masquerade_bit: {} is not a bit of the 32-bit packet mark (0 to 31)",
                self.masquerade_bit
            )
        })?;
        let (key, interface) = match self.detect_local_mode {
            DetectLocalMode::BridgeInterface => {
                ("bridge_interface", &self.detect_local.bridge_interface)
            }
            DetectLocalMode::InterfaceNamePrefix => (
                "interface_name_prefix",
                &self.detect_local.interface_name_prefix,
            ),
            DetectLocalMode::ClusterCidr | DetectLocalMode::NodeCidr => return Ok(()),
        };
        check(
            !interface.is_empty() && interface.len() < 16 && !interface.contains(['/', ' ', '"']),
            || {
                format!(
                    "proxy.detect_local.{key}: {interface:?} is not an interface name (1 to 15 \
                     bytes) that proxy.detect_local_mode {:?} needs",
                    self.detect_local_mode
                )
            },
        )
    }

    /// The planner's settings. With the proxy off and the mesh's egress masquerade on,
    /// the table carries that masquerade alone: another proxy serves Services.
    pub fn settings(&self, cluster: &Cluster, neighbours: &Neighbours) -> ProxySettings {
        let scope = if self.enabled || !neighbours.egress_masquerade {
            TableScope::Services
        } else {
            TableScope::EgressOnly
        };
        ProxySettings {
            scope,
            cluster_cidrs: cluster.cluster_cidrs.clone(),
            masquerade_mark: 1 << self.masquerade_bit,
            masquerade_all: self.masquerade_all,
            egress_masquerade: neighbours.egress_masquerade,
            local_dns: neighbours.local_dns.clone(),
            local_detector: match self.detect_local_mode {
                DetectLocalMode::ClusterCidr => LocalDetector::ClusterCidr,
                DetectLocalMode::NodeCidr => LocalDetector::NodeCidr,
                DetectLocalMode::BridgeInterface => {
                    LocalDetector::BridgeInterface(self.detect_local.bridge_interface.clone())
                }
                DetectLocalMode::InterfaceNamePrefix => LocalDetector::InterfaceNamePrefix(
                    self.detect_local.interface_name_prefix.clone(),
                ),
            },
            node_port_addresses: self.node_port_addresses.clone(),
            localhost_node_ports: self.localhost_node_ports,
            network_policy: neighbours.network_policy,
            interface_addresses: Vec::new(),
            pod_link_group: neighbours.pod_link_group,
            external_ips: Some(self.external_ips.clone()),
        }
    }

    /// What the service proxy sets on the host (none for the egress masquerade alone).
    pub fn sysctls(&self) -> Option<Sysctls> {
        self.enabled.then(|| Sysctls {
            conntrack: self.conntrack.settings(),
            route_localnet: self.localhost_node_ports,
        })
    }
}

/// `[primary]`, `[]` or CIDRs; `primary` among CIDRs is refused, as kube-proxy does.
fn node_port_addresses<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<NodePortAddresses, D::Error> {
    let entries = Vec::<String>::deserialize(deserializer)?;
    if entries.is_empty() || entries == ["primary"] {
        return Ok(NodePortAddresses::Primary);
    }
    entries
        .iter()
        .map(|text| match text.as_str() {
            "primary" => Err(serde::de::Error::custom(
                "`primary` stands alone: it cannot be mixed with CIDRs",
            )),
            _ => text.parse().map_err(serde::de::Error::custom),
        })
        .collect::<Result<Vec<Cidr>, D::Error>>()
        .map(NodePortAddresses::Cidrs)
}
