//! I.53: the UDP conntrack entries a sync deletes. An entry is stale when a client sent
//! it to a service address that the sync touched and the endpoint answering it does not
//! serve that address any more (or never did: the flow began before the address had
//! endpoints). As upstream's `conntrack/cleanup.go`, the decision reads only the current
//! services and the kernel's entries, so a full sync after a restart cleans up what the
//! previous process left pinned. Nothing is kept between syncs: the addresses a service
//! had are read back from its footprint ([`addresses_of`]), the endpoints that serve an
//! address now come from this sync's plans.

use std::collections::HashMap;
use std::net::IpAddr;

use nodus_view::model::Family;
use tracing::warn;

use crate::nft::{Socket, UdpEntry, Value};
use crate::plan::{NodeFacts, ServicePlan, SharedKind, UdpFlows};

/// Stale entries collected from one dump before they are deleted: a bound on the memory
/// a cleanup takes whatever the size of the conntrack table. A dump that fills it is
/// followed by another, up to [`MAX_DUMPS`].
const DELETE_CHUNK: usize = 4_096;
const MAX_DUMPS: usize = 16;

/// What a sync gathers for its cleanup: the UDP addresses the services it programs or
/// changes had and have, and their flows now.
#[derive(Debug, Default)]
pub(super) struct UdpCheck {
    touched: Vec<(IpAddr, u16)>,
    current: Vec<UdpFlows>,
}

impl UdpCheck {
    /// The flows `plan` programs: their addresses are checked, their endpoints serve.
    pub(super) fn planned(&mut self, plan: &ServicePlan) {
        for flows in &plan.udp_flows {
            self.touched.extend(&flows.service_addresses);
            self.current.push(flows.clone());
        }
    }

    /// Addresses a service had (read back from its footprint): checked too.
    pub(super) fn had(&mut self, addresses: impl IntoIterator<Item = (IpAddr, u16)>) {
        self.touched.extend(addresses);
    }

    pub(super) fn stale_flows(self) -> StaleFlows {
        StaleFlows::of(self.touched, &self.current)
    }
}

/// The service addresses a sync checks, each with the endpoints that may answer it.
#[derive(Debug, Default)]
pub(super) struct StaleFlows {
    answers: HashMap<(IpAddr, u16), Vec<(IpAddr, u16)>>,
}

impl StaleFlows {
    /// Checks the `touched` addresses (the old and new UDP addresses of the services a
    /// sync changed) against the serving endpoints of every service in `current` that
    /// claims them: an address two services share keeps the endpoints of both.
    pub(super) fn of<'a>(
        touched: impl IntoIterator<Item = (IpAddr, u16)>,
        current: impl IntoIterator<Item = &'a UdpFlows>,
    ) -> StaleFlows {
        let mut answers: HashMap<(IpAddr, u16), Vec<(IpAddr, u16)>> = touched
            .into_iter()
            .map(|address| (address, Vec::new()))
            .collect();
        for flows in current {
            for address in &flows.service_addresses {
                if let Some(serving) = answers.get_mut(address) {
                    serving.extend(&flows.serving);
                }
            }
        }
        StaleFlows { answers }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    pub(super) fn is_stale(&self, entry: &UdpEntry) -> bool {
        self.answers
            .get(&entry.original.destination)
            .is_some_and(|serving| !serving.contains(&entry.reply_source))
    }

    fn families(&self) -> impl Iterator<Item = Family> + '_ {
        Family::ALL.into_iter().filter(|family| {
            self.answers
                .keys()
                .any(|(address, _)| Family::of(*address) == *family)
        })
    }

    /// Deletes the stale entries from the kernel: how many were deleted. A failure is
    /// logged and costs only the cleanup: the rules are in place, and entries time out.
    pub(super) fn delete(&self, socket: &mut Socket) -> usize {
        let mut deleted = 0;
        for family in self.families() {
            for _ in 0..MAX_DUMPS {
                let mut stale = Vec::new();
                let dumped = socket.udp_conntrack_entries(family, |entry| {
                    if stale.len() < DELETE_CHUNK && self.is_stale(&entry) {
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

/// The UDP service addresses `plan`'s elements lead clients in at: the ClusterIPs,
/// ExternalIPs and LB IPs of its service and no-endpoint map elements, and its NodePorts on
/// the addresses `facts` gives them. For a plan read back from a footprint, whose elements
/// keep their keys.
pub(super) fn addresses_of(plan: &ServicePlan, facts: &NodeFacts) -> Vec<(IpAddr, u16)> {
    let udp = |proto: &Value| *proto == Value::UDP;
    let mut addresses = Vec::new();
    for element in &plan.elements {
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
        let check = StaleFlows::of(touched, [&after]);
        assert!(check.is_stale(&entry("10.96.0.10:53", "10.244.1.5:5353")));
        assert!(check.is_stale(&entry("10.0.0.1:30053", "10.244.1.5:5353")));
        assert!(!check.is_stale(&entry("10.96.0.10:53", "10.244.1.6:5353")));
        // Another port of the same address, and addresses the sync did not touch.
        assert!(!check.is_stale(&entry("10.96.0.10:54", "10.244.1.5:5353")));
        assert!(!check.is_stale(&entry("10.96.0.11:53", "10.244.1.5:5353")));
        // A flow that began before the service had endpoints is answered by nobody's.
        assert!(check.is_stale(&entry("10.96.0.10:53", "10.96.0.10:53")));
    }

    #[test]
    fn a_deleted_service_leaves_no_flow_and_a_shared_address_keeps_both_services_endpoints() {
        let gone = flows(&["10.96.0.10:53"], &["10.244.1.5:5353"]);
        let check = StaleFlows::of(gone.service_addresses.clone(), []);
        assert!(check.is_stale(&entry("10.96.0.10:53", "10.244.1.5:5353")));

        let changed = flows(&["192.0.2.1:53"], &["10.244.1.5:5353"]);
        let other = flows(&["192.0.2.1:53", "10.96.0.12:53"], &["10.244.2.9:53"]);
        let check = StaleFlows::of(changed.service_addresses.clone(), [&changed, &other]);
        assert!(!check.is_stale(&entry("192.0.2.1:53", "10.244.2.9:53")));
        assert!(!check.is_stale(&entry("192.0.2.1:53", "10.244.1.5:5353")));
        assert!(!check.is_stale(&entry("10.96.0.12:53", "10.244.1.5:5353")));
        assert_eq!(check.families().collect::<Vec<_>>(), [Family::V4]);
        assert_eq!(StaleFlows::of([], [&other]).families().count(), 0);
        assert!(StaleFlows::of([], [&other]).is_empty());
    }
}
