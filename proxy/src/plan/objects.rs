//! What a plan is made of: chains with their rules, sets, and elements of the shared
//! maps. Everything derives `Hash` and `Eq`, so an applier can keep one digest per
//! service and re-program only the services whose digest changed.

use std::borrow::Cow;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;

use nodus_view::model::{Family, Protocol};

use super::rule::{RulePlan, Stmt};
use crate::nft::{Chain, DataType, Element, Fields, Set};

/// A chain and its rules, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChainPlan {
    pub chain: Chain,
    pub rules: Vec<RulePlan>,
}

impl ChainPlan {
    pub fn regular(name: String, rules: Vec<RulePlan>) -> ChainPlan {
        ChainPlan {
            chain: Chain::regular(name),
            rules,
        }
    }

    pub fn name(&self) -> &str {
        &self.chain.name
    }

    /// A digest of the chain's rules, for this build, which the chain's first rule
    /// carries in its comment. A full sync that finds a chain with this many rules, the
    /// first carrying this digest, leaves it alone ([`ChainPlan::is_in_place`]): an
    /// adoption after a restart then writes no rule that is in place, and a commit that
    /// writes none spares the kernel a validation of the whole table. The build's version
    /// is part of it, because another build may encode the same plan otherwise.
    pub fn digest(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        self.rules.hash(&mut hasher);
        hasher.finish()
    }

    pub fn comment(&self) -> String {
        format!("{CHAIN_COMMENT}{:016x}", self.digest())
    }

    /// The digest a first rule's comment carries, if it is one of ours.
    pub fn digest_of_comment(comment: &str) -> Option<u64> {
        u64::from_str_radix(comment.strip_prefix(CHAIN_COMMENT)?, 16).ok()
    }

    /// Whether the kernel's chain, with `rules` rules and `first_digest` on the first,
    /// holds this plan's rules: a chain missing or flushed, a rule added or deleted, or
    /// rules written from another plan or by another build, are not in place.
    pub fn is_in_place(&self, rules: usize, first_digest: Option<u64>) -> bool {
        !self.rules.is_empty() && rules == self.rules.len() && first_digest == Some(self.digest())
    }
}

/// How the comment of a chain's first rule starts.
const CHAIN_COMMENT: &str = "nodus chain ";

/// The sets and maps of the skeleton that services add elements to; one of each per
/// IP family, because an address key has one width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SharedKind {
    /// `addr`: active ClusterIPs, to reject their undefined ports (C.24).
    ClusterIps,
    /// `addr . proto . port : verdict`: ClusterIP, ExternalIP and LB IP dispatch.
    ServiceIps,
    /// `proto . port : verdict`: NodePort dispatch.
    ServiceNodeports,
    /// `addr . proto . port : verdict`: reject or drop, for ports without endpoints.
    NoEndpointServices,
    /// `proto . port : verdict`: the same for NodePorts.
    NoEndpointNodeports,
    /// `addr . proto . port : verdict`: LB IPs with source ranges, to their firewall.
    FirewallIps,
    /// `addr . addr . addr`: a local endpoint, itself, and a service address it backs,
    /// for hairpin masquerade (D.27).
    Hairpin,
    /// `integer : addr . port`: the endpoints of dispatch chains, in key blocks (see
    /// `keys.rs`); one of [`SHARDS`] maps per family, created when a chain first needs
    /// it.
    Endpoints,
    /// `addr . proto . port . integer : addr . port`: the endpoints of ClusterIP ports
    /// that have no chain of their own, keyed by the service address and an index; one
    /// map per family and endpoint count (the set's `shard`), which the shared chain of
    /// that count ([`SharedSet::dispatch_chain`]) DNATs from.
    PortEndpoints,
}

impl SharedKind {
    /// The kinds the skeleton creates, one set per family.
    pub const ALL: [SharedKind; 7] = [
        SharedKind::ClusterIps,
        SharedKind::ServiceIps,
        SharedKind::ServiceNodeports,
        SharedKind::NoEndpointServices,
        SharedKind::NoEndpointNodeports,
        SharedKind::FirewallIps,
        SharedKind::Hairpin,
    ];

    /// Whether several services may want one element: hairpin pairs carry no data, and
    /// one pod behind two Services (or a host-network endpoint behind two NodePorts)
    /// gives both the same pair. The applier counts their claims rather than refusing the
    /// second service or letting the first one's removal delete the other's.
    pub fn is_shared(self) -> bool {
        self == SharedKind::Hairpin
    }

    /// Whether an element's key may pass from one service to another in one transaction:
    /// an ExternalIP or LB IP and port that an older service takes over from a younger
    /// one, or leaves to it (F.40). Such adds go after every delete of the transaction.
    pub fn changes_hands(self) -> bool {
        matches!(
            self,
            SharedKind::ServiceIps | SharedKind::NoEndpointServices | SharedKind::FirewallIps
        )
    }

    fn base_name(self) -> &'static str {
        match self {
            SharedKind::ClusterIps => "cluster-ips",
            SharedKind::ServiceIps => "service-ips",
            SharedKind::ServiceNodeports => "service-nodeports",
            SharedKind::NoEndpointServices => "no-endpoint-services",
            SharedKind::NoEndpointNodeports => "no-endpoint-nodeports",
            SharedKind::FirewallIps => "firewall-ips",
            SharedKind::Hairpin => "hairpin",
            SharedKind::Endpoints | SharedKind::PortEndpoints => "endpoints",
        }
    }
}

/// Endpoint maps per IP family (why several: `keys.rs`).
pub const SHARDS: u16 = 512;

/// A block of keys one chain took in one endpoint map (allocated in `keys.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyBlock {
    pub map: SharedSet,
    pub offset: u32,
    /// log2 of the block's size.
    pub class: u8,
    /// The FNV-1a hash of the chain's name, and the place of its rule in the chain (the
    /// port's, where a service's ports share a chain): a block goes back to its own rule.
    pub chain: u32,
    pub rule: u16,
}

/// The largest endpoint count a ClusterIP port dispatches from a map of its count; a port
/// with more keeps a chain of its own.
pub const MAX_PORT_ENDPOINTS: u16 = 1023;

/// Maps (each with its dispatch chain) per family and endpoint count, a port's by a hash
/// of its address, protocol and port. The kernel lists a hash set's elements by walking
/// it from the start again for every message of the dump, skipping those sent: one map of
/// 200,000 elements (10,000 two-port Services of 10 endpoints) took 1.5 s of a restart
/// to read. With 64 maps a count, each holds a sixty-fourth.
pub const PORT_SHARDS: u16 = 64;

/// A map of [`SharedKind::PortEndpoints`] keeps its count above its shard.
const PORT_SHARD_BITS: u32 = PORT_SHARDS.trailing_zeros();

/// The chains of [`SharedSet::dispatch_chain`] start with this.
const DISPATCH_CHAIN: &str = "dispatch";

/// One shared set or map: its kind in one family (and its shard for the endpoint maps, or
/// its endpoint count for those of [`SharedKind::PortEndpoints`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SharedSet {
    pub kind: SharedKind,
    pub family: Family,
    pub shard: u16,
}

impl SharedSet {
    pub fn new(kind: SharedKind, family: Family) -> SharedSet {
        SharedSet {
            kind,
            family,
            shard: 0,
        }
    }

    /// Whether this is one of the endpoint maps rather than a set of the skeleton.
    pub fn is_endpoint_map(self) -> bool {
        matches!(self.kind, SharedKind::Endpoints | SharedKind::PortEndpoints)
    }

    /// The map of the ClusterIP ports with `count` endpoints (1 to
    /// [`MAX_PORT_ENDPOINTS`]) whose hash falls in `shard` (below [`PORT_SHARDS`]).
    pub fn port_endpoints(family: Family, count: u16, shard: u16) -> SharedSet {
        SharedSet {
            kind: SharedKind::PortEndpoints,
            family,
            shard: (count << PORT_SHARD_BITS) | (shard % PORT_SHARDS),
        }
    }

    /// The endpoint count of a map of [`SharedKind::PortEndpoints`].
    pub fn endpoint_count(self) -> u16 {
        self.shard >> PORT_SHARD_BITS
    }

    /// `n10-3f`: the count and shard of a map of [`SharedKind::PortEndpoints`], in its name
    /// and its dispatch chain's.
    fn port_suffix(self) -> String {
        format!(
            "n{}-{:02x}",
            self.endpoint_count(),
            self.shard % PORT_SHARDS
        )
    }

    /// For a map of [`SharedKind::PortEndpoints`], the chain its ports' dispatch entries go
    /// to: one rule per protocol, `meta l4proto tcp dnat ip addr . port to ip daddr . meta
    /// l4proto . th dport . numgen random mod N map @endpoints-v4-nN`. The key carries the
    /// service address and port the packet still has, so one chain serves every port of
    /// that count, and a cold start writes one rule per count instead of one chain per
    /// port (every commit walks every chain of the namespace).
    pub fn dispatch_chain(self) -> Option<ChainPlan> {
        if self.kind != SharedKind::PortEndpoints {
            return None;
        }
        let rules = [Protocol::Tcp, Protocol::Udp]
            .into_iter()
            .map(|protocol| {
                RulePlan::new([
                    Stmt::L4Proto(protocol),
                    Stmt::DnatFromPortMap {
                        family: self.family,
                        map: self.name(),
                        endpoints: u32::from(self.endpoint_count()),
                    },
                ])
            })
            .collect();
        Some(ChainPlan::regular(self.dispatch_chain_name(), rules))
    }

    /// `dispatch-v4-n10-3f`: the name of [`SharedSet::dispatch_chain`].
    pub fn dispatch_chain_name(self) -> String {
        format!(
            "{DISPATCH_CHAIN}-{}-{}",
            family_suffix(self.family),
            self.port_suffix()
        )
    }

    pub fn endpoints(family: Family, shard: u16) -> SharedSet {
        SharedSet {
            kind: SharedKind::Endpoints,
            family,
            shard,
        }
    }

    /// `service-ips-v4`, `no-endpoint-nodeports-v6`, `endpoints-v4-1f`, `endpoints-v4-n10`, …
    pub fn name(self) -> String {
        let (base, family) = (self.kind.base_name(), family_suffix(self.family));
        match self.kind {
            SharedKind::Endpoints => format!("{base}-{family}-{:02x}", self.shard),
            SharedKind::PortEndpoints => format!("{base}-{family}-{}", self.port_suffix()),
            _ => format!("{base}-{family}"),
        }
    }

    /// The endpoint map (of either kind) a table's set name denotes, if it is one:
    /// `endpoints-v4-1f`, `endpoints-v6-n10-3f`.
    pub fn endpoints_from_name(name: &str) -> Option<SharedSet> {
        let rest = name.strip_prefix("endpoints-")?;
        let (suffix, rest) = rest.split_once('-')?;
        let family = Family::ALL
            .into_iter()
            .find(|family| family_suffix(*family) == suffix)?;
        let set = match rest.strip_prefix('n') {
            Some(port) => {
                let (count, shard) = port.split_once('-')?;
                let (count, shard): (u16, u16) =
                    (count.parse().ok()?, u16::from_str_radix(shard, 16).ok()?);
                ((1..=MAX_PORT_ENDPOINTS).contains(&count) && shard < PORT_SHARDS)
                    .then(|| SharedSet::port_endpoints(family, count, shard))?
            }
            None => {
                let shard = u16::from_str_radix(rest, 16).ok()?;
                (shard < SHARDS).then(|| SharedSet::endpoints(family, shard))?
            }
        };
        // One spelling per map: no leading zeros or signs.
        (set.name() == name).then_some(set)
    }

    /// The set's definition, without elements.
    pub fn definition(self) -> Set {
        let addr = super::rule::address_type(self.family);
        let addr_proto_port = Fields::new([addr, DataType::InetProto, DataType::InetService]);
        let proto_port = Fields::new([DataType::InetProto, DataType::InetService]);
        match self.kind {
            SharedKind::ClusterIps => Set::new(self.name(), addr),
            SharedKind::ServiceIps | SharedKind::NoEndpointServices | SharedKind::FirewallIps => {
                Set::verdict_map(self.name(), addr_proto_port)
            }
            SharedKind::ServiceNodeports | SharedKind::NoEndpointNodeports => {
                Set::verdict_map(self.name(), proto_port)
            }
            SharedKind::Hairpin => Set::new(self.name(), Fields::new([addr, addr, addr])),
            SharedKind::Endpoints => Set::data_map(
                self.name(),
                DataType::Integer32,
                Fields::new([addr, DataType::InetService]),
            ),
            SharedKind::PortEndpoints => Set::data_map(
                self.name(),
                Fields::new([
                    addr,
                    DataType::InetProto,
                    DataType::InetService,
                    DataType::Integer32,
                ]),
                Fields::new([addr, DataType::InetService]),
            ),
        }
    }
}

pub fn family_suffix(family: Family) -> &'static str {
    match family {
        Family::V4 => "v4",
        Family::V6 => "v6",
    }
}

/// An element a service contributes to a shared set or map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ElementPlan {
    pub set: SharedSet,
    pub element: Element,
}

/// A set with the elements it is created with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetPlan {
    pub set: Set,
    pub elements: Vec<Element>,
}

/// The fixed part of the table: base chains, helper chains, shared sets and maps, and
/// the node's own sets (NodePort addresses, pod ranges). It changes only with the
/// configuration or this node's Node object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Skeleton {
    pub sets: Vec<SetPlan>,
    pub chains: Vec<ChainPlan>,
}

/// What turns a set's elements in the kernel into its plan's: those to delete, then those
/// to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetDifference<'p> {
    pub gone: Vec<Element>,
    pub came: Cow<'p, [Element]>,
}

/// The UDP flows one service port steers, in one family: the addresses clients send to
/// and the endpoints that may answer them. Conntrack keeps a UDP flow on its endpoint for
/// as long as packets keep coming, so the applier deletes the entries of these addresses
/// that another endpoint answers (I.53). Nothing of this goes into the table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UdpFlows {
    /// The ClusterIP first, then ExternalIPs, LB IPs and NodePort addresses.
    pub service_addresses: Vec<(IpAddr, u16)>,
    /// Every serving endpoint of the port (not only those new flows are sent to).
    pub serving: Vec<(IpAddr, u16)>,
}

/// Everything one Service puts in the table: its chains (per port and family), its own
/// sets and maps (endpoint maps with their elements, affinity sets), and its elements in
/// the shared maps. Empty for services the proxy
/// leaves alone (headless, ExternalName, owned by another proxy, no spec yet).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePlan {
    pub namespace: String,
    pub name: String,
    pub sets: Vec<SetPlan>,
    pub chains: Vec<ChainPlan>,
    pub elements: Vec<ElementPlan>,
    /// The key blocks its endpoint elements occupy, one per dispatch chain without
    /// affinity.
    pub blocks: Vec<KeyBlock>,
    pub udp_flows: Vec<UdpFlows>,
    /// External addresses and ports the service claims but may not have: left out of
    /// the plan, and reported.
    pub contested: Vec<Contested>,
    /// Service ports (per family) whose Local-policy traffic is dropped for want of a local
    /// endpoint while others exist: kube-proxy's `no_local_endpoints_total`.
    pub no_local: NoLocalEndpoints,
}

/// An ExternalIP or LB IP and port a service claims and is not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Contested {
    pub address: IpAddr,
    pub port: u16,
    pub loss: ClaimLoss,
}

/// Why a service is not given an external address it claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimLoss {
    /// F.40: an older service claims the same address and port.
    OlderService,
    /// The address is a ClusterIP, or lies in a ServiceCIDR: a ClusterIP always wins,
    /// on every node, whatever order the services came in.
    ClusterIp,
    /// An ExternalIP outside `proxy.external_ips`.
    NotAllowed,
}

impl ClaimLoss {
    pub const ALL: [ClaimLoss; 3] = [
        ClaimLoss::OlderService,
        ClaimLoss::ClusterIp,
        ClaimLoss::NotAllowed,
    ];

    /// The `reason` label of `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimLoss::OlderService => "older-service",
            ClaimLoss::ClusterIp => "cluster-ip",
            ClaimLoss::NotAllowed => "not-allowed",
        }
    }

    /// What the warning says.
    pub fn explain(self) -> &'static str {
        match self {
            ClaimLoss::OlderService => {
                "external address and port claimed by an older service too; left to it"
            }
            ClaimLoss::ClusterIp => {
                "external address is a ClusterIP or in a ServiceCIDR; left to ClusterIPs"
            }
            ClaimLoss::NotAllowed => "ExternalIP outside proxy.external_ips; not honoured",
        }
    }
}

/// Ports of a service under a Local traffic policy with endpoints elsewhere but none on
/// this node, for internal (ClusterIP) and external traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct NoLocalEndpoints {
    pub internal: u16,
    pub external: u16,
}

impl ServicePlan {
    pub fn empty(namespace: &str, name: &str) -> ServicePlan {
        ServicePlan {
            namespace: namespace.to_string(),
            name: name.to_string(),
            sets: Vec::new(),
            chains: Vec::new(),
            elements: Vec::new(),
            blocks: Vec::new(),
            udp_flows: Vec::new(),
            contested: Vec::new(),
            no_local: NoLocalEndpoints::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.chains.is_empty() && self.elements.is_empty()
    }

    /// A compact summary for change detection: equal plans have equal digests. The value
    /// is stable within one build of the agent, which is all an in-memory diff needs;
    /// it is not meant to be stored.
    pub fn digest(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }

    /// The endpoint maps its elements need, each once: those of its key blocks, and those
    /// of the ports that dispatch by endpoint count.
    pub fn endpoint_maps(&self) -> Vec<SharedSet> {
        let mut maps: Vec<SharedSet> = self
            .blocks
            .iter()
            .map(|block| block.map)
            .chain(
                self.elements
                    .iter()
                    .map(|element| element.set)
                    .filter(|set| set.kind == SharedKind::PortEndpoints),
            )
            .collect();
        maps.sort();
        maps.dedup();
        maps
    }

    /// The elements this service puts in `set`.
    pub fn elements_in(&self, set: SharedSet) -> impl Iterator<Item = &Element> {
        self.elements
            .iter()
            .filter(move |element| element.set == set)
            .map(|element| &element.element)
    }
}
