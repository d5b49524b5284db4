//! The fixed part of the `nodus` table, after kube-proxy's `setupNFTables`: base chains on
//! the hooks, the helper chains they jump to, and the shared sets and maps that services
//! fill. See the README for the role of each chain. A table of
//! [`TableScope::EgressOnly`] has only the egress masquerade's part of it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use nodus_view::model::{Cidr, Family};

use super::config::{NodeFacts, TableScope};
use super::objects::{ChainPlan, SetPlan, SharedKind, SharedSet, Skeleton, family_suffix};
use super::policy::is_policy_set;
use super::rule::{Addr, LookupKey, RulePlan, Stmt, address_type, ip_value};
use crate::nft::{Chain, ChainType, Element, Hook, Set, SetFlags, Verdict, priority};
use nodus_view::ranges::merged_ranges;

pub const SERVICES: &str = "services";
pub const MASQUERADING: &str = "masquerading";
pub const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
pub const REJECT: &str = "reject-chain";
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
pub const FIREWALL_CHECK: &str = "firewall-check";
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";

pub const POD_SOURCE_CHECK: &str = "pod-source-check";

/// What [`POD_SOURCE_CHECK`] drops, each counted in a set of its own: a forged source of
/// either family, and IPv6 router messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodDrop {
    ForgedSource(Family),
    RouterMessage,
}

impl PodDrop {
    pub const ALL: [PodDrop; 3] = [
        PodDrop::ForgedSource(Family::V4),
        PodDrop::ForgedSource(Family::V6),
        PodDrop::RouterMessage,
    ];

    /// The counted set: one element, every address of the family, whose counter is the
    /// drops'.
    pub fn set(self) -> String {
        match self {
            PodDrop::ForgedSource(family) => {
                format!("pod-forged-sources-{}", family_suffix(family))
            }
            PodDrop::RouterMessage => "pod-router-messages-v6".to_string(),
        }
    }

    fn family(self) -> Family {
        match self {
            PodDrop::ForgedSource(family) => family,
            PodDrop::RouterMessage => Family::V6,
        }
    }

    /// The drop's `reason` in `/metrics`.
    pub fn reason(self) -> &'static str {
        match self {
            PodDrop::ForgedSource(_) => "forged-source",
            PodDrop::RouterMessage => "router-message",
        }
    }

    /// The drop's `family` in `/metrics`.
    pub fn family_label(self) -> &'static str {
        self.family().as_str()
    }

    fn counted(self) -> SetPlan {
        let family = self.family();
        let unspecified = match family {
            Family::V4 => IpAddr::from(Ipv4Addr::UNSPECIFIED),
            Family::V6 => IpAddr::from(Ipv6Addr::UNSPECIFIED),
        };
        let whole = Cidr {
            addr: unspecified,
            prefix: 0,
        };
        let mut plan = ranges_set(self.set(), family, &[whole]);
        plan.set = plan.set.with_counter();
        plan
    }

    /// The source's match that counts the drop.
    fn count(self) -> Stmt {
        Stmt::AddrInSet {
            addr: Addr::Source,
            family: self.family(),
            set: self.set(),
            negated: false,
        }
    }
}

/// Source validation for pods, before conntrack, DNAT, NetworkPolicy and the node's own
/// listeners see a packet: what comes in through a pod's link (nodus-cni puts its node
/// end in `group`) must come from an address whose route leaves through that same link,
/// which only the pod's own addresses do (nodus-cni routes each of them there, and no
/// other); and IPv6 router advertisements and redirects from pods are dropped, whatever
/// the link's `accept_ra` says.
fn pod_source_check(group: u32) -> (ChainPlan, Vec<SetPlan>) {
    let pod_link = Stmt::IifGroup(group);
    let forged = Family::ALL.map(|family| {
        let drop = PodDrop::ForgedSource(family);
        RulePlan::new([
            pod_link.clone(),
            Stmt::SourceNotRoutedBack,
            drop.count(),
            Stmt::Verdict(Verdict::Drop),
        ])
    });
    // ND router advertisement (134) and redirect (137).
    let router_messages = [134, 137].map(|kind| {
        RulePlan::new([
            pod_link.clone(),
            Stmt::Icmpv6Type(kind),
            PodDrop::RouterMessage.count(),
            Stmt::Verdict(Verdict::Drop),
        ])
    });
    let chain = base(
        POD_SOURCE_CHECK,
        ChainType::Filter,
        Hook::Prerouting,
        priority::RAW,
        router_messages.into_iter().chain(forged).collect(),
    );
    (chain, PodDrop::ALL.map(PodDrop::counted).to_vec())
}

/// `nodeport-ips-v4`: the addresses that accept NodePorts (E.34).
fn node_port_ips_set(family: Family) -> String {
    format!("nodeport-ips-{}", family_suffix(family))
}

/// `pod-cidrs-v4`: the local-traffic detector's ranges (D.29).
pub fn pod_cidrs_set(family: Family) -> String {
    format!("pod-cidrs-{}", family_suffix(family))
}

/// `ip saddr @pod-cidrs-v4` or `iifname "veth*"` (or `!=`): the local-traffic detector.
pub fn source_is_pod(facts: &NodeFacts, family: Family, negated: bool) -> Stmt {
    match &facts.pod_interface {
        Some(interface) => Stmt::Iifname {
            name: interface.name.clone(),
            prefix: interface.prefix,
            negated,
        },
        None => Stmt::AddrInSet {
            addr: Addr::Source,
            family,
            set: pod_cidrs_set(family),
            negated,
        },
    }
}

/// D.28, D.29: ClusterIP traffic that does not come from a pod (or all of it, with
/// `masquerade_all`) is marked for masquerade, so replies return through this node. One
/// rule in `services`, ahead of the dispatch, instead of one in every service chain: at
/// 10,000 services that is 10,000 rules fewer for a cold start to commit (each rule's
/// expressions cost the kernel a walk of its expression types, and its lookup a walk of
/// the table's sets). It names the ClusterIPs, so external traffic, which shares the
/// `local-` chains under eTP=Local, is not touched; `None` without a detector.
pub fn cluster_masquerade_rule(facts: &NodeFacts, family: Family) -> Option<RulePlan> {
    let to_cluster_ip = Stmt::AddrInSet {
        addr: Addr::Destination,
        family,
        set: SharedSet::new(SharedKind::ClusterIps, family).name(),
        negated: false,
    };
    if !facts.marks_cluster_ip_traffic(family) {
        return None;
    }
    let from = (!facts.masquerade_all).then(|| source_is_pod(facts, family, true));
    Some(RulePlan::new(
        std::iter::once(to_cluster_ip)
            .chain(from)
            .chain([jump(MARK_FOR_MASQUERADE)]),
    ))
}

/// `cluster-cidrs-v4`: destinations pod traffic may reach without egress masquerade.
fn cluster_cidrs_set(family: Family) -> String {
    format!("cluster-cidrs-{}", family_suffix(family))
}

/// Filter chains run just before DNAT (`dstnat - 10`), except the checks that must see
/// the rewritten destination of host traffic (`dstnat + 10`).
const FILTER_PRIORITY: i32 = priority::DSTNAT - 10;
const FILTER_POST_DNAT_PRIORITY: i32 = priority::DSTNAT + 10;

fn jump(chain: &str) -> Stmt {
    Stmt::Verdict(Verdict::jump(chain))
}

fn new_then_jump(chain: &str) -> RulePlan {
    RulePlan::new([Stmt::CtStateNew, jump(chain)])
}

fn base(name: &str, kind: ChainType, hook: Hook, priority: i32, rules: Vec<RulePlan>) -> ChainPlan {
    ChainPlan {
        chain: Chain::base(name, kind, hook, priority),
        rules,
    }
}

fn regular(name: &str, rules: Vec<RulePlan>) -> ChainPlan {
    ChainPlan::regular(name.to_string(), rules)
}

fn vmap(family: Family, kind: SharedKind) -> Stmt {
    Stmt::Vmap {
        key: LookupKey::DaddrProtoPort(family),
        map: SharedSet::new(kind, family).name(),
    }
}

/// `ip daddr @nodeport-ips-v4 meta l4proto . th dport vmap @<kind>-v4`
fn node_port_vmap(family: Family, kind: SharedKind) -> RulePlan {
    RulePlan::new([
        Stmt::AddrInSet {
            addr: Addr::Destination,
            family,
            set: node_port_ips_set(family),
            negated: false,
        },
        Stmt::Vmap {
            key: LookupKey::ProtoPort,
            map: SharedSet::new(kind, family).name(),
        },
    ])
}

fn per_family(rule: impl Fn(Family) -> RulePlan) -> Vec<RulePlan> {
    Family::ALL.into_iter().map(rule).collect()
}

/// An interval set of the `family` addresses in `cidrs`, merged.
fn ranges_set(name: String, family: Family, cidrs: &[Cidr]) -> SetPlan {
    SetPlan {
        set: Set::new(name, address_type(family)).with_flags(SetFlags {
            interval: true,
            ..SetFlags::default()
        }),
        elements: merged_ranges(cidrs, &[], family)
            .into_iter()
            .map(|(start, end)| Element::range(ip_value(start), ip_value(end)))
            .collect(),
    }
}

/// The skeleton for this node: with [`TableScope::EgressOnly`], only the egress
/// masquerade's chains and ranges.
pub fn plan_skeleton(facts: &NodeFacts) -> Skeleton {
    // A family gets egress masquerade when it has both ranges: whose traffic, and where
    // it stays inside.
    let egress_families: Vec<Family> = Family::ALL
        .into_iter()
        .filter(|family| {
            facts.has_pod_ranges(*family)
                && facts
                    .cluster_destinations
                    .iter()
                    .any(|cidr| cidr.family() == *family)
        })
        .collect();
    let pod_ranges = |family| ranges_set(pod_cidrs_set(family), family, &facts.pod_cidrs);
    let cluster_ranges = |family| {
        ranges_set(
            cluster_cidrs_set(family),
            family,
            &facts.cluster_destinations,
        )
    };
    let nat_postrouting = base(
        "nat-postrouting",
        ChainType::Nat,
        Hook::Postrouting,
        priority::SRCNAT,
        vec![RulePlan::new([jump(MASQUERADING)])],
    );
    let masquerading = masquerading_chain(facts, &egress_families);
    let (source_check, counted) = facts
        .pod_link_group
        .map(pod_source_check)
        .map_or((None, Vec::new()), |(chain, sets)| (Some(chain), sets));
    if facts.scope == TableScope::EgressOnly {
        return Skeleton {
            sets: egress_families
                .iter()
                .flat_map(|family| [pod_ranges(*family), cluster_ranges(*family)])
                .chain(counted)
                .collect(),
            chains: source_check
                .into_iter()
                .chain([nat_postrouting, masquerading])
                .collect(),
        };
    }
    let mut chains: Vec<ChainPlan> = source_check.into_iter().collect();
    chains.extend(service_chains(facts));
    chains.extend([nat_postrouting, masquerading]);
    let mut sets = counted;
    for family in Family::ALL {
        for kind in SharedKind::ALL {
            sets.push(SetPlan {
                set: SharedSet::new(kind, family).definition(),
                elements: Vec::new(),
            });
        }
        let localhost = match family {
            Family::V4 if facts.localhost_node_ports => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            _ => None,
        };
        sets.push(SetPlan {
            set: Set::new(node_port_ips_set(family), address_type(family)),
            elements: facts
                .node_port_ips(family)
                .chain(localhost)
                .map(|ip| Element::new(ip_value(ip)))
                .collect(),
        });
        sets.push(pod_ranges(family));
        if egress_families.contains(&family) {
            sets.push(cluster_ranges(family));
        }
    }
    Skeleton { sets, chains }
}

/// Everything the skeleton has for Services: the filter and DNAT hooks, and the chains
/// they jump to.
fn service_chains(facts: &NodeFacts) -> Vec<ChainPlan> {
    let mut chains = hook_chains(facts);
    chains.extend(dispatch_chains(facts));
    chains
}

/// With localhost NodePorts, `route_localnet` lets other machines reach 127.0.0.0/8
/// (CVE-2020-8558): what does not come in through loopback is dropped, as kube-proxy's
/// iptables mode does.
fn loopback_guard(facts: &NodeFacts) -> Option<RulePlan> {
    facts.localhost_node_ports.then(|| {
        RulePlan::new([
            Stmt::Iifname {
                name: "lo".into(),
                prefix: false,
                negated: true,
            },
            Stmt::AddrInRanges {
                addr: Addr::Destination,
                family: Family::V4,
                ranges: vec![(
                    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)),
                    IpAddr::V4(Ipv4Addr::new(127, 255, 255, 255)),
                )],
                negated: false,
            },
            Stmt::Verdict(Verdict::Drop),
        ])
    })
}

/// The base chains on the filter and NAT hooks, each jumping to the checks and the
/// dispatch that apply there.
fn hook_chains(facts: &NodeFacts) -> Vec<ChainPlan> {
    vec![
        base(
            "filter-prerouting",
            ChainType::Filter,
            Hook::Prerouting,
            FILTER_PRIORITY,
            loopback_guard(facts)
                .into_iter()
                .chain([new_then_jump(FIREWALL_CHECK)])
                .collect(),
        ),
        base(
            "filter-input",
            ChainType::Filter,
            Hook::Input,
            FILTER_PRIORITY,
            vec![
                new_then_jump(NODEPORT_ENDPOINTS_CHECK),
                new_then_jump(SERVICE_ENDPOINTS_CHECK),
            ],
        ),
        base(
            "filter-forward",
            ChainType::Filter,
            Hook::Forward,
            FILTER_PRIORITY,
            vec![
                new_then_jump(SERVICE_ENDPOINTS_CHECK),
                new_then_jump(CLUSTER_IPS_CHECK),
            ],
        ),
        base(
            "filter-output",
            ChainType::Filter,
            Hook::Output,
            FILTER_PRIORITY,
            vec![new_then_jump(FIREWALL_CHECK)],
        ),
        // After DNAT, as upstream since kubernetes#131765: the host reaches an eTP=Local
        // external address with no endpoint here through its short-circuit to the cluster
        // chain, which a check before DNAT would drop; what was not DNATed still matches.
        base(
            "filter-output-post-dnat",
            ChainType::Filter,
            Hook::Output,
            FILTER_POST_DNAT_PRIORITY,
            vec![
                new_then_jump(SERVICE_ENDPOINTS_CHECK),
                new_then_jump(CLUSTER_IPS_CHECK),
            ],
        ),
        base(
            "nat-prerouting",
            ChainType::Nat,
            Hook::Prerouting,
            priority::DSTNAT,
            vec![RulePlan::new([jump(SERVICES)])],
        ),
        base(
            "nat-output",
            ChainType::Nat,
            Hook::Output,
            priority::DSTNAT,
            vec![RulePlan::new([jump(SERVICES)])],
        ),
    ]
}

/// ClusterIPs on a port no service has are rejected; C.25: an address of a ServiceCIDR
/// that no service holds is dropped, as upstream, rather than routed on towards the
/// default gateway.
fn cluster_ips_check(facts: &NodeFacts) -> Vec<RulePlan> {
    Family::ALL
        .into_iter()
        .flat_map(|family| {
            let invalid_port = RulePlan::new([
                Stmt::AddrInSet {
                    addr: Addr::Destination,
                    family,
                    set: SharedSet::new(SharedKind::ClusterIps, family).name(),
                    negated: false,
                },
                Stmt::Reject,
            ]);
            // C.25: an address of a ServiceCIDR that no service holds. Dropped,
            // as upstream, rather than routed on towards the default gateway.
            let unallocated = merged_ranges(&facts.service_cidrs, &[], family);
            let unallocated = (!unallocated.is_empty()).then(|| {
                RulePlan::new([
                    Stmt::AddrInRanges {
                        addr: Addr::Destination,
                        family,
                        ranges: unallocated,
                        negated: false,
                    },
                    Stmt::Verdict(Verdict::Drop),
                ])
            });
            std::iter::once(invalid_port).chain(unallocated)
        })
        .collect()
}

/// The regular chains the hooks jump to: the service dispatch, the checks for services
/// without endpoints, the firewall and the ClusterIP ranges, reject and masquerade.
fn dispatch_chains(facts: &NodeFacts) -> Vec<ChainPlan> {
    vec![
        regular(
            SERVICES,
            Family::ALL
                .into_iter()
                .flat_map(|family| {
                    cluster_masquerade_rule(facts, family).into_iter().chain([
                        RulePlan::new([vmap(family, SharedKind::ServiceIps)]),
                        node_port_vmap(family, SharedKind::ServiceNodeports),
                    ])
                })
                .collect(),
        ),
        regular(
            SERVICE_ENDPOINTS_CHECK,
            per_family(|family| RulePlan::new([vmap(family, SharedKind::NoEndpointServices)])),
        ),
        regular(
            NODEPORT_ENDPOINTS_CHECK,
            per_family(|family| node_port_vmap(family, SharedKind::NoEndpointNodeports)),
        ),
        regular(
            FIREWALL_CHECK,
            per_family(|family| RulePlan::new([vmap(family, SharedKind::FirewallIps)])),
        ),
        regular(CLUSTER_IPS_CHECK, cluster_ips_check(facts)),
        // `reject` is a statement, not a verdict, so maps reach it through this chain.
        regular(REJECT, vec![RulePlan::new([Stmt::Reject])]),
        regular(
            MARK_FOR_MASQUERADE,
            vec![RulePlan::new([Stmt::MarkOr(facts.masquerade_mark)])],
        ),
    ]
}

/// `masquerading`, after `nat-postrouting`: marks hairpin connections (only for
/// Services) and pod traffic leaving the cluster, then masquerades what carries the mark.
fn masquerading_chain(facts: &NodeFacts, egress_families: &[Family]) -> ChainPlan {
    let mark = facts.masquerade_mark;
    let hairpin_families = match facts.scope {
        TableScope::Services => &Family::ALL[..],
        TableScope::EgressOnly => &[],
    };
    regular(
        MASQUERADING,
        // D.27: hairpin connections are marked here, after DNAT has chosen the
        // endpoint, instead of in a chain per endpoint before it.
        hairpin_families
            .iter()
            .map(|family| {
                RulePlan::new([
                    Stmt::Hairpin {
                        family: *family,
                        set: SharedSet::new(SharedKind::Hairpin, *family).name(),
                    },
                    Stmt::MarkOr(mark),
                ])
            })
            // Egress: pods leaving the cluster, as the pod network must.
            .chain(egress_families.iter().map(|&family| {
                RulePlan::new([
                    Stmt::AddrInSet {
                        addr: Addr::Source,
                        family,
                        set: pod_cidrs_set(family),
                        negated: false,
                    },
                    Stmt::AddrInSet {
                        addr: Addr::Destination,
                        family,
                        set: cluster_cidrs_set(family),
                        negated: true,
                    },
                    Stmt::MarkOr(mark),
                ])
            }))
            .chain([
                RulePlan::new([Stmt::MarkClear(mark), Stmt::Verdict(Verdict::Return)]),
                RulePlan::new([Stmt::MarkXor(mark)]),
                RulePlan::new([Stmt::Masquerade]),
            ])
            .collect(),
    )
}

impl Skeleton {
    /// The sets whose elements the skeleton itself holds (NodePort addresses, pod and
    /// cluster ranges): not the shared maps, which services fill, nor the NetworkPolicy
    /// sets, which their own transactions fill.
    pub fn own_sets(&self) -> impl Iterator<Item = &SetPlan> {
        self.sets.iter().filter(|set| set.is_skeletons_own())
    }
}

impl SetPlan {
    /// Whether the skeleton itself holds this set's elements ([`Skeleton::own_sets`]).
    pub fn is_skeletons_own(&self) -> bool {
        let shared = SharedKind::ALL.iter().any(|kind| {
            Family::ALL
                .iter()
                .any(|f| SharedSet::new(*kind, *f).name() == self.set.name)
        });
        !shared && !is_policy_set(&self.set.name)
    }
}
