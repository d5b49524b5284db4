//! I.53: the UDP conntrack entries a sync deletes. An entry is stale when a client sent
//! it to a service address that the sync touched and the endpoint answering it does not
//! serve that address any more (or never did: the flow began before the address had
//! endpoints). As upstream's `conntrack/cleanup.go`, the decision reads only the current
//! services and the kernel's entries, so a full sync after a restart cleans up what the
//! previous process left pinned. Nothing is kept between syncs: the addresses a service
//! had are read back from its footprint ([`addresses_of`]), the endpoints that serve an
//! address now come from this sync's plans.
//!
//! What a sync gathers is kept as 64-bit hashes in sorted vectors. A partial sync keeps
//! its few services' (address, serving endpoint) pairs. A full sync checks every UDP
//! address of the node, so it keeps 16 bytes per address (its hash and the key of the
//! service that claims it), and plans the endpoints again only for the addresses the
//! conntrack table holds entries for: at 10,000 UDP services with 10 endpoints, 0.2 MiB
//! where the pairs were 1 MiB and the addresses and endpoint lists themselves 6. Two
//! pairs or addresses with one hash would keep a stale entry until it times out, no
//! worse.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;

use nodus_view::model::Family;
use tracing::warn;

use super::footprint::service_key;
use crate::nft::{Socket, UdpEntry, Value};
use crate::plan::{ElementPlan, NodeFacts, Planner, ServicePlan, SharedKind, UdpFlows};

/// Stale entries collected from one dump before they are deleted: a bound on the memory
/// a cleanup takes whatever the size of the conntrack table. A dump that fills it is
/// followed by another, up to [`MAX_DUMPS`].
const DELETE_CHUNK: usize = 4_096;
const MAX_DUMPS: usize = 16;

/// What a sync gathers for its cleanup: the UDP addresses the services it programs or
/// changes had and have, and which endpoints serve them now.
#[derive(Debug, Default)]
pub(super) struct UdpCheck {
    flows: StaleFlows,
}

impl UdpCheck {
    /// A full sync's check: the serving endpoints are planned again when needed.
    pub(super) fn full() -> UdpCheck {
        UdpCheck {
            flows: StaleFlows {
                serving: Serving::Owners(Vec::new()),
                ..StaleFlows::default()
            },
        }
    }

    /// The flows `plan` programs: their addresses are checked, their endpoints serve.
    pub(super) fn planned(&mut self, plan: &ServicePlan) {
        for flows in &plan.udp_flows {
            self.had(flows.service_addresses.iter().copied());
            match &mut self.flows.serving {
                Serving::Pairs(_) => self.serves(flows),
                Serving::Owners(owners) => {
                    let owner = service_key(&plan.namespace, &plan.name);
                    let claims = flows.service_addresses.iter();
                    owners.extend(claims.map(|address| (address_hash(*address), owner)));
                }
            }
        }
    }

    /// Addresses a service had (read back from its footprint): checked too.
    pub(super) fn had(&mut self, addresses: impl IntoIterator<Item = (IpAddr, u16)>) {
        for address in addresses {
            self.flows.families[Family::of(address.0) as usize] = true;
            self.flows.touched.push(address_hash(address));
        }
    }

    /// The endpoints of `flows` serve its addresses, which are not checked for that.
    fn serves(&mut self, flows: &UdpFlows) {
        if let Serving::Pairs(pairs) = &mut self.flows.serving {
            for address in &flows.service_addresses {
                let serving = flows.serving.iter();
                pairs.extend(serving.map(|endpoint| pair_hash(*address, *endpoint)));
            }
        }
    }

    pub(super) fn stale_flows(mut self) -> StaleFlows {
        sort_dedup(&mut self.flows.touched);
        match &mut self.flows.serving {
            Serving::Pairs(pairs) => sort_dedup(pairs),
            Serving::Owners(owners) => sort_dedup(owners),
        }
        self.flows
    }
}

/// `items` sorted for binary searches, each once, in no more memory than they need.
fn sort_dedup<T: Ord>(items: &mut Vec<T>) {
    items.sort_unstable();
    items.dedup();
    items.shrink_to_fit();
}

/// Which endpoints serve the addresses a sync checks.
#[derive(Debug)]
enum Serving {
    /// (address, endpoint) pairs of the services that claim an address now, sorted: an
    /// address two services share keeps the endpoints of both.
    Pairs(Vec<u64>),
    /// (address, service key) of every claim, sorted: the services whose endpoints are
    /// planned again for an address with conntrack entries.
    Owners(Vec<(u64, u64)>),
}

impl Default for Serving {
    fn default() -> Serving {
        Serving::Pairs(Vec::new())
    }
}

/// The service addresses a sync checks, and which endpoints may answer each; see the
/// module doc for the hashes.
#[derive(Debug, Default)]
pub(super) struct StaleFlows {
    /// The addresses checked, sorted.
    touched: Vec<u64>,
    serving: Serving,
    /// By family (`Family as usize`): whether any address checked is of that family.
    families: [bool; 2],
}

/// For a full sync: the endpoints that serve each address the conntrack table held
/// entries for when it was first dumped.
type Resolved = HashMap<(IpAddr, u16), Vec<(IpAddr, u16)>>;

impl StaleFlows {
    pub(super) fn is_empty(&self) -> bool {
        self.touched.is_empty()
    }

    fn is_touched(&self, address: (IpAddr, u16)) -> bool {
        self.touched.binary_search(&address_hash(address)).is_ok()
    }

    /// Whether `entry` is stale; for a full sync, by `resolved`, where an address that
    /// had no entry at the first dump counts as served (its flows began after the sync).
    fn is_stale(&self, entry: &UdpEntry, resolved: &Resolved) -> bool {
        let destination = entry.original.destination;
        if !self.is_touched(destination) {
            return false;
        }
        match &self.serving {
            Serving::Pairs(pairs) => pairs
                .binary_search(&pair_hash(destination, entry.reply_source))
                .is_err(),
            Serving::Owners(_) => resolved
                .get(&destination)
                .is_some_and(|serving| !serving.contains(&entry.reply_source)),
        }
    }

    fn families(&self) -> impl Iterator<Item = Family> + '_ {
        Family::ALL
            .into_iter()
            .filter(|family| self.families[*family as usize])
    }

    /// For a full sync: dumps the table once for the checked addresses that have
    /// entries, and plans the endpoints of the services that claim them, in one pass
    /// over the view.
    fn resolve(&self, socket: &mut Socket, planner: &Planner<'_>) -> Resolved {
        let Serving::Owners(owners) = &self.serving else {
            return Resolved::new();
        };
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
        let claimants = |address: &(IpAddr, u16)| {
            let hash = address_hash(*address);
            let first = owners.partition_point(|(claimed, _)| *claimed < hash);
            owners[first..]
                .iter()
                .take_while(move |(claimed, _)| *claimed == hash)
                .map(|(_, owner)| *owner)
        };
        let mut wanted: Vec<u64> = resolved.keys().flat_map(claimants).collect();
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
    pub(super) fn delete(&self, socket: &mut Socket, planner: &Planner<'_>) -> usize {
        let resolved = self.resolve(socket, planner);
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

fn pair_hash(address: (IpAddr, u16), endpoint: (IpAddr, u16)) -> u64 {
    let mut hasher = DefaultHasher::new();
    (address, endpoint).hash(&mut hasher);
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

    fn at(text: &str) -> (IpAddr, u16) {
        let address: std::net::SocketAddr = text.parse().expect("test address");
        (address.ip(), address.port())
    }

    fn flows(addresses: &[&str], serving: &[&str]) -> UdpFlows {
        UdpFlows {
            service_addresses: addresses.iter().map(|a| at(a)).collect(),
            serving: serving.iter().map(|e| at(e)).collect(),
        }
    }

    /// The check of a sync that touched `touched` and planned `current`.
    fn stale_flows_of<'a>(
        touched: Vec<(IpAddr, u16)>,
        current: impl IntoIterator<Item = &'a UdpFlows>,
    ) -> StaleFlows {
        let mut check = UdpCheck::default();
        check.had(touched);
        current.into_iter().for_each(|flows| check.serves(flows));
        check.stale_flows()
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

    #[test]
    fn an_entry_is_stale_when_its_endpoint_no_longer_serves_the_address_it_was_sent_to() {
        let before = flows(&["10.96.0.10:53", "10.0.0.1:30053"], &["10.244.1.5:5353"]);
        let after = flows(&["10.96.0.10:53", "10.0.0.1:30053"], &["10.244.1.6:5353"]);
        let touched = [&before, &after]
            .map(|f| f.service_addresses.clone())
            .concat();
        let check = stale_flows_of(touched, [&after]);
        assert!(check.is_stale(&entry("10.96.0.10:53", "10.244.1.5:5353"), &Resolved::new()));
        assert!(check.is_stale(
            &entry("10.0.0.1:30053", "10.244.1.5:5353"),
            &Resolved::new()
        ));
        assert!(!check.is_stale(&entry("10.96.0.10:53", "10.244.1.6:5353"), &Resolved::new()));
        // Another port of the same address, and addresses the sync did not touch.
        assert!(!check.is_stale(&entry("10.96.0.10:54", "10.244.1.5:5353"), &Resolved::new()));
        assert!(!check.is_stale(&entry("10.96.0.11:53", "10.244.1.5:5353"), &Resolved::new()));
        // A flow that began before the service had endpoints is answered by nobody's.
        assert!(check.is_stale(&entry("10.96.0.10:53", "10.96.0.10:53"), &Resolved::new()));
    }

    #[test]
    fn a_full_sync_keeps_owners_and_judges_by_the_endpoints_planned_again() {
        let mut plan = ServicePlan::empty("kube-system", "kube-dns");
        plan.udp_flows
            .push(flows(&["10.96.0.10:53"], &["10.244.1.6:53"]));
        let mut check = UdpCheck::full();
        check.planned(&plan);
        let check = check.stale_flows();
        let Serving::Owners(owners) = &check.serving else {
            panic!("a full sync keeps owners: {:?}", check.serving);
        };
        assert_eq!(
            owners[..],
            [(
                address_hash(at("10.96.0.10:53")),
                service_key("kube-system", "kube-dns")
            )]
        );
        // What the first dump found and the plans gave.
        let resolved = Resolved::from([(at("10.96.0.10:53"), vec![at("10.244.1.6:53")])]);
        assert!(check.is_stale(&entry("10.96.0.10:53", "10.244.1.5:53"), &resolved));
        assert!(!check.is_stale(&entry("10.96.0.10:53", "10.244.1.6:53"), &resolved));
        // An address without entries at the first dump: flows that began after the sync.
        assert!(!check.is_stale(&entry("10.96.0.10:53", "10.244.1.5:53"), &Resolved::new()));
    }

    #[test]
    fn a_deleted_service_leaves_no_flow_and_a_shared_address_keeps_both_services_endpoints() {
        let gone = flows(&["10.96.0.10:53"], &["10.244.1.5:5353"]);
        let check = stale_flows_of(gone.service_addresses.clone(), []);
        assert!(check.is_stale(&entry("10.96.0.10:53", "10.244.1.5:5353"), &Resolved::new()));

        let changed = flows(&["192.0.2.1:53"], &["10.244.1.5:5353"]);
        let other = flows(&["192.0.2.1:53", "10.96.0.12:53"], &["10.244.2.9:53"]);
        let check = stale_flows_of(changed.service_addresses.clone(), [&changed, &other]);
        assert!(!check.is_stale(&entry("192.0.2.1:53", "10.244.2.9:53"), &Resolved::new()));
        assert!(!check.is_stale(&entry("192.0.2.1:53", "10.244.1.5:5353"), &Resolved::new()));
        assert!(!check.is_stale(&entry("10.96.0.12:53", "10.244.1.5:5353"), &Resolved::new()));
        assert_eq!(check.families().collect::<Vec<_>>(), [Family::V4]);
        assert_eq!(stale_flows_of(Vec::new(), [&other]).families().count(), 0);
        assert!(stale_flows_of(Vec::new(), [&other]).is_empty());
    }
}
