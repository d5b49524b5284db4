//! I.53: the UDP conntrack entries a sync deletes. An entry is stale when a client sent
//! it to a service address that a sync touched and the endpoint answering it does not
//! serve that address any more (or never did: the flow began before the address had
//! endpoints). As upstream's `conntrack/cleanup.go`, the decision reads only the current
//! services and the kernel's entries, so a full sync after a restart cleans up what the
//! previous process left pinned. Nothing is kept between syncs but what the next cleanup
//! checks: the addresses a service had are read back from its footprint
//! ([`addresses_of`]), and the endpoints that serve an address are planned again from the
//! view when the cleanup runs, for the addresses the conntrack table holds entries for.
//! So the checks of syncs that follow each other closely merge into one cleanup
//! ([`StaleFlows::merge`]): each cleanup walks the kernel's whole conntrack hash, about
//! 10 ms at 262,144 buckets, and the applier runs at most one a second, as kube-proxy's
//! syncs come at most once a second (`minSyncPeriod`).
//!
//! What a sync gathers is kept as 64-bit hashes in sorted vectors: 16 bytes per address
//! checked (its hash and the key of a service that claims it). At 10,000 UDP services with
//! 10 endpoints a full sync keeps 0.2 MiB, where the addresses and endpoint lists
//! themselves were 6. Two addresses with one hash would keep a stale entry until it times
//! out, no worse.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;

use nodus_view::model::Family;
use tracing::warn;

use super::footprint::service_key;
use crate::nft::{Socket, UdpEntry, Value};
use crate::plan::{ElementPlan, NodeFacts, Planner, ServicePlan, SharedKind};

/// Stale entries collected from one dump before they are deleted: a bound on the memory
/// a cleanup takes whatever the size of the conntrack table. A dump that fills it is
/// followed by another, up to [`MAX_DUMPS`].
const DELETE_CHUNK: usize = 4_096;
const MAX_DUMPS: usize = 16;

/// What a sync gathers for its cleanup: the UDP addresses the services it programs or
/// changes had and have, and which services claim them now.
#[derive(Debug, Default)]
pub(super) struct UdpCheck {
    flows: StaleFlows,
}

impl UdpCheck {
    /// The flows `plan` programs: their addresses are checked, and `plan`'s service
    /// claims them.
    pub(super) fn planned(&mut self, plan: &ServicePlan) {
        let owner = service_key(&plan.namespace, &plan.name);
        for flows in &plan.udp_flows {
            self.had(flows.service_addresses.iter().copied());
            let claims = flows.service_addresses.iter();
            (self.flows.owners).extend(claims.map(|address| (address_hash(*address), owner)));
        }
    }

    /// Addresses a service had (read back from its footprint): checked too.
    pub(super) fn had(&mut self, addresses: impl IntoIterator<Item = (IpAddr, u16)>) {
        for address in addresses {
            self.flows.families[Family::of(address.0) as usize] = true;
            self.flows.touched.push(address_hash(address));
        }
    }

    pub(super) fn stale_flows(mut self) -> StaleFlows {
        self.flows.sort();
        self.flows
    }
}

/// `items` sorted for binary searches, each once, in no more memory than they need.
fn sort_dedup<T: Ord>(items: &mut Vec<T>) {
    items.sort_unstable();
    items.dedup();
    items.shrink_to_fit();
}

/// The service addresses one or more syncs checked, and which services claim them; see
/// the module doc for the hashes.
#[derive(Debug, Default)]
pub(super) struct StaleFlows {
    /// The addresses checked, sorted.
    touched: Vec<u64>,
    /// (address, service key) of every claim, sorted: the services whose endpoints are
    /// planned again for an address with conntrack entries (an address two services
    /// share keeps the endpoints of both).
    owners: Vec<(u64, u64)>,
    /// By family (`Family as usize`): whether any address checked is of that family.
    families: [bool; 2],
}

/// The endpoints that serve each address the conntrack table held entries for when it
/// was first dumped.
type Resolved = HashMap<(IpAddr, u16), Vec<(IpAddr, u16)>>;

impl StaleFlows {
    pub(super) fn is_empty(&self) -> bool {
        self.touched.is_empty()
    }

    /// Takes in what a later sync checked: one cleanup then covers both.
    pub(super) fn merge(&mut self, later: StaleFlows) {
        self.touched.extend(later.touched);
        self.owners.extend(later.owners);
        for (family, checked) in self.families.iter_mut().zip(later.families) {
            *family |= checked;
        }
        self.sort();
    }

    fn sort(&mut self) {
        sort_dedup(&mut self.touched);
        sort_dedup(&mut self.owners);
    }

    fn is_touched(&self, address: (IpAddr, u16)) -> bool {
        self.touched.binary_search(&address_hash(address)).is_ok()
    }

    /// Whether `entry` is stale by `resolved`, where an address that had no entry at the
    /// first dump counts as served (its flows began after the sync).
    fn is_stale(&self, entry: &UdpEntry, resolved: &Resolved) -> bool {
        let destination = entry.original.destination;
        self.is_touched(destination)
            && resolved
                .get(&destination)
                .is_some_and(|serving| !serving.contains(&entry.reply_source))
    }

    /// The keys of the services that claimed `address` in the syncs checked.
    fn claimants(&self, address: (IpAddr, u16)) -> impl Iterator<Item = u64> + '_ {
        let hash = address_hash(address);
        let first = self.owners.partition_point(|(claimed, _)| *claimed < hash);
        self.owners[first..]
            .iter()
            .take_while(move |(claimed, _)| *claimed == hash)
            .map(|(_, owner)| *owner)
    }

    fn families(&self) -> impl Iterator<Item = Family> + '_ {
        Family::ALL
            .into_iter()
            .filter(|family| self.families[*family as usize])
    }

    /// Dumps the table once for the checked addresses that have entries, and plans the
    /// endpoints of the services that claim them, in one pass over the view.
    fn resolve(&self, socket: &mut Socket, planner: &Planner<'_>) -> Resolved {
        let mut resolved = Resolved::new();
        for family in self.families() {
            let dumped = socket.udp_conntrack_entries(family, |entry| {
                let destination = entry.original.destination;
                if resolved.len() < DELETE_CHUNK && self.is_touched(destination) {
                    resolved.entry(destination).or_default();
                }
            });
            if let Err(error) = dumped {
                warn!(%error, "UDP conntrack cleanup failed");
            }
        }
        if resolved.is_empty() {
            return resolved;
        }
        let mut wanted: Vec<u64> = resolved
            .keys()
            .flat_map(|address| self.claimants(*address))
            .collect();
        sort_dedup(&mut wanted);
        let flows = planner.udp_flows(|namespace, name| {
            wanted.binary_search(&service_key(namespace, name)).is_ok()
        });
        for flows in flows {
            for address in &flows.service_addresses {
                if let Some(serving) = resolved.get_mut(address) {
                    serving.extend(&flows.serving);
                }
            }
        }
        resolved
    }

    /// Deletes the stale entries from the kernel: how many were deleted. A failure is
    /// logged and costs only the cleanup: the rules are in place, and entries time out.
    /// One dump when no checked address has entries, two when one has.
    pub(super) fn delete(&self, socket: &mut Socket, planner: &Planner<'_>) -> usize {
        let resolved = self.resolve(socket, planner);
        if resolved.is_empty() {
            return 0;
        }
        let mut deleted = 0;
        for family in self.families() {
            for _ in 0..MAX_DUMPS {
                let mut stale = Vec::new();
                let dumped = socket.udp_conntrack_entries(family, |entry| {
                    if stale.len() < DELETE_CHUNK && self.is_stale(&entry, &resolved) {
                        stale.push(entry);
                    }
                });
                if let Err(error) = dumped {
                    warn!(%error, "UDP conntrack cleanup failed");
                    break;
                }
                for entry in &stale {
                    match socket.delete_conntrack_entry(entry) {
                        Ok(true) => deleted += 1,
                        Ok(false) => {}
                        Err(error) => warn!(%error, "UDP conntrack cleanup failed"),
                    }
                }
                if stale.len() < DELETE_CHUNK {
                    break;
                }
            }
        }
        deleted
    }
}

fn address_hash(address: (IpAddr, u16)) -> u64 {
    let mut hasher = DefaultHasher::new();
    address.hash(&mut hasher);
    hasher.finish()
}

/// The UDP service addresses a service's `elements` lead clients in at: the ClusterIPs,
/// ExternalIPs and LB IPs of its service and no-endpoint map elements, and its NodePorts on
/// the addresses `facts` gives them. Keys are enough: elements read back from a footprint
/// serve.
pub(super) fn addresses_of(elements: &[ElementPlan], facts: &NodeFacts) -> Vec<(IpAddr, u16)> {
    let udp = |proto: &Value| *proto == Value::UDP;
    let mut addresses = Vec::new();
    for element in elements {
        match (element.set.kind, &element.element.key.0[..]) {
            (
                SharedKind::ServiceIps | SharedKind::NoEndpointServices,
                [ip, proto, Value::InetService(port)],
            ) if udp(proto) => {
                let ip = match ip {
                    Value::Ipv4(ip) => IpAddr::V4(*ip),
                    Value::Ipv6(ip) => IpAddr::V6(*ip),
                    _ => continue,
                };
                addresses.push((ip, *port));
            }
            (
                SharedKind::ServiceNodeports | SharedKind::NoEndpointNodeports,
                [proto, Value::InetService(port)],
            ) if udp(proto) => {
                let ips = facts.node_port_ips(element.set.family);
                addresses.extend(ips.map(|ip| (ip, *port)));
            }
            _ => {}
        }
    }
    addresses.sort_unstable();
    addresses.dedup();
    addresses
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::FlowTuple;
    use crate::plan::UdpFlows;

    fn at(text: &str) -> (IpAddr, u16) {
        let address: std::net::SocketAddr = text.parse().expect("test address");
        (address.ip(), address.port())
    }

    /// The plan of `namespace/name` whose UDP flows serve `addresses` from `serving`.
    fn plan(name: &str, addresses: &[&str], serving: &[&str]) -> ServicePlan {
        let mut plan = ServicePlan::empty("kube-system", name);
        plan.udp_flows.push(UdpFlows {
            service_addresses: addresses.iter().map(|a| at(a)).collect(),
            serving: serving.iter().map(|e| at(e)).collect(),
        });
        plan
    }

    fn entry(destination: &str, answered_by: &str) -> UdpEntry {
        UdpEntry {
            original: FlowTuple {
                source: at("10.0.0.2:5000"),
                destination: at(destination),
            },
            reply_source: at(answered_by),
            zone: 0,
        }
    }

    /// What the first dump found for `address`, and the endpoints planned again for it.
    fn resolved(entries: &[(&str, &[&str])]) -> Resolved {
        entries
            .iter()
            .map(|(address, serving)| (at(address), serving.iter().map(|e| at(e)).collect()))
            .collect()
    }

    #[test]
    fn an_entry_is_stale_when_its_endpoint_no_longer_serves_the_address_it_was_sent_to() {
        let mut check = UdpCheck::default();
        check.planned(&plan(
            "kube-dns",
            &["10.96.0.10:53", "10.0.0.1:30053"],
            &["10.244.1.6:5353"],
        ));
        let check = check.stale_flows();
        let now = resolved(&[
            ("10.96.0.10:53", &["10.244.1.6:5353"]),
            ("10.0.0.1:30053", &["10.244.1.6:5353"]),
        ]);
        assert!(check.is_stale(&entry("10.96.0.10:53", "10.244.1.5:5353"), &now));
        assert!(check.is_stale(&entry("10.0.0.1:30053", "10.244.1.5:5353"), &now));
        assert!(!check.is_stale(&entry("10.96.0.10:53", "10.244.1.6:5353"), &now));
        // Another port of the same address, and addresses the sync did not touch.
        assert!(!check.is_stale(&entry("10.96.0.10:54", "10.244.1.5:5353"), &now));
        assert!(!check.is_stale(&entry("10.96.0.11:53", "10.244.1.5:5353"), &now));
        // A flow that began before the service had endpoints is answered by nobody's.
        assert!(check.is_stale(&entry("10.96.0.10:53", "10.96.0.10:53"), &now));
        // An address without entries at the first dump: flows that began after the sync.
        assert!(!check.is_stale(&entry("10.96.0.10:53", "10.244.1.5:5353"), &Resolved::new()));
    }

    #[test]
    fn the_services_that_claim_an_address_are_kept_to_plan_its_endpoints_again() {
        let mut check = UdpCheck::default();
        check.planned(&plan("kube-dns", &["10.96.0.10:53"], &["10.244.1.6:53"]));
        let check = check.stale_flows();
        assert_eq!(
            check.owners[..],
            [(
                address_hash(at("10.96.0.10:53")),
                service_key("kube-system", "kube-dns")
            )]
        );
        // A deleted service: its address is checked, and nobody claims it any more, so its
        // entries are stale whoever answers them.
        let mut gone = UdpCheck::default();
        gone.had([at("10.96.0.12:53")]);
        let gone = gone.stale_flows();
        assert_eq!(gone.claimants(at("10.96.0.12:53")).count(), 0);
        let now = resolved(&[("10.96.0.12:53", &[])]);
        assert!(gone.is_stale(&entry("10.96.0.12:53", "10.244.1.5:5353"), &now));
    }

    #[test]
    fn a_shared_address_keeps_both_services_and_later_checks_merge_into_one() {
        let mut first = UdpCheck::default();
        first.planned(&plan("a", &["192.0.2.1:53"], &["10.244.1.5:5353"]));
        let mut merged = first.stale_flows();
        assert_eq!(merged.families().collect::<Vec<_>>(), [Family::V4]);
        let mut later = UdpCheck::default();
        later.planned(&plan(
            "b",
            &["192.0.2.1:53", "[fd00::12]:53"],
            &["10.244.2.9:53"],
        ));
        later.had([at("10.96.0.12:53")]);
        merged.merge(later.stale_flows());
        let mut claimants: Vec<u64> = merged.claimants(at("192.0.2.1:53")).collect();
        claimants.sort_unstable();
        let mut expected = vec![
            service_key("kube-system", "a"),
            service_key("kube-system", "b"),
        ];
        expected.sort_unstable();
        assert_eq!(claimants, expected);
        for address in ["192.0.2.1:53", "[fd00::12]:53", "10.96.0.12:53"] {
            assert!(merged.is_touched(at(address)), "{address}");
        }
        assert!(!merged.is_touched(at("10.96.0.13:53")));
        assert_eq!(
            merged.families().collect::<Vec<_>>(),
            [Family::V4, Family::V6]
        );
        assert!(UdpCheck::default().stale_flows().is_empty());
    }
}
