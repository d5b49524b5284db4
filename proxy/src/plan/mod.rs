//! The planning half of the service proxy: from the node view to the desired content of
//! one `inet` table, `nodus`, for IPv4 and IPv6 together. Pure code: no sockets, no
//! runtime.
//!
//! The plan has two parts. The [`Skeleton`] is fixed: base chains, helper chains, the
//! shared sets and maps, and this node's NodePort addresses and pod ranges. A
//! [`ServicePlan`] is everything one Service adds: its chains and affinity sets, and
//! its elements in the shared maps. Services are planned one at a time, so an applier
//! re-plans only the services of a `ChangeSet`, compares [`ServicePlan::digest`]s, and
//! programs the difference with [`PlanBatch::update_service`]; a cold start streams
//! them through [`cold_start`]. [`render`] writes the same plans as `nft -f` text.
//!
//! The ruleset follows kube-proxy's nftables mode (its `pkg/proxy/nftables/README.md`); the
//! README names every chain, and `CHECKLIST.md` the behaviours with the tests that prove
//! them.

mod config;
mod keys;
mod names;
mod objects;
pub mod policy;
mod program;
mod render;
mod rule;
mod service;
mod skeleton;
mod trace;

#[cfg(test)]
mod tests;

pub use config::{
    DEFAULT_MASQUERADE_MARK, LocalDetector, LocalDns, NodeFacts, NodePortAddresses, PodInterface,
    ProxySettings, TableScope,
};
pub(crate) use keys::fnv1a;
pub use keys::{EndpointKeys, KeyLease};
pub(crate) use names::{join_name, split_name};
pub use objects::{
    ChainPlan, ClaimLoss, Contested, ElementPlan, KeyBlock, MAX_PORT_ENDPOINTS, NoLocalEndpoints,
    SHARDS, ServicePlan, SetDifference, SetPlan, SharedKind, SharedSet, Skeleton, UdpFlows,
};
pub use program::{ColdStart, PlanBatch, PortMapChanges, cold_start};
pub use render::{render, write_ruleset};
pub use rule::{Addr, LookupKey, RulePlan, Stmt};
pub use skeleton::PodDrop;
pub use trace::{Entry, Fate, Packet, Path, Ruleset, Step, Trace};

use std::net::IpAddr;

use nodus_view::View;
use nodus_view::policy::resolve::PodPolicy;

/// The one table the proxy owns.
pub const TABLE: &str = "nodus";

/// Plans from one state of the view; cheap to make, so make one per sync.
pub struct Planner<'v> {
    view: &'v View,
    facts: NodeFacts,
}

impl<'v> Planner<'v> {
    pub fn new(view: &'v View, config: &ProxySettings) -> Planner<'v> {
        Planner {
            view,
            facts: NodeFacts::new(view, config),
        }
    }

    /// What the plans take from the configuration and this node. When it changes (the
    /// node's addresses, pod CIDRs or zone), every service must be re-planned.
    pub fn facts(&self) -> &NodeFacts {
        &self.facts
    }

    /// The fixed part of the table, and with NetworkPolicy on, its chains and its sets,
    /// empty: the applier fills those in transactions of their own.
    pub fn skeleton(&self) -> Skeleton {
        self.skeleton_with(&[])
    }

    /// [`Planner::skeleton`] with the NetworkPolicy sets filled for this node's pods: the
    /// table as it is once programmed, for rendering and tracing.
    pub fn complete_skeleton(&self) -> Skeleton {
        if self.facts.network_policy {
            self.skeleton_with(&policy::within_element_cap(self.view.pod_policies()))
        } else {
            self.skeleton()
        }
    }

    fn skeleton_with(&self, pods: &[PodPolicy]) -> Skeleton {
        let mut skeleton = skeleton::plan_skeleton(&self.facts);
        if self.facts.network_policy {
            skeleton.chains.extend(policy::chains());
            skeleton.sets.extend(policy::sets(pods));
        }
        skeleton
    }

    /// The plan of one service, its endpoints in blocks of `keys`; empty when the view
    /// does not know it (deleted), the proxy leaves it alone, or the table carries no
    /// services.
    pub fn service(&self, namespace: &str, name: &str, keys: &mut KeyLease<'_>) -> ServicePlan {
        match self.view.service(namespace, name) {
            Some(service) if self.plans_services() => {
                service::plan_service(self.view, &service, &self.facts, keys)
            }
            _ => ServicePlan::empty(namespace, name),
        }
    }

    /// The plans of every service the proxy programs, one at a time, in no particular
    /// order, their endpoints in fresh blocks of `keys`.
    pub fn services<'a>(
        &'a self,
        keys: &'a mut EndpointKeys,
    ) -> impl Iterator<Item = ServicePlan> + 'a {
        self.view
            .services()
            .filter(|_| self.plans_services())
            .map(move |service| {
                service::plan_service(self.view, &service, &self.facts, &mut keys.lease(&[]))
            })
            .filter(|plan| !plan.is_empty())
    }

    /// The namespace and name of every service in the view, in [`Planner::services`]'s
    /// order, for plans made again one by one with [`Planner::service`].
    pub fn service_names(&self) -> impl Iterator<Item = (&'v str, &'v str)> + 'v {
        self.view
            .services()
            .map(|service| (service.namespace, service.name))
    }

    /// The UDP flows of the services `wanted` names (namespace, name), planned again with
    /// keys of their own (the flows do not depend on them): what a full sync's conntrack
    /// cleanup asks for the few addresses the kernel holds entries for.
    pub fn udp_flows(&self, wanted: impl Fn(&str, &str) -> bool) -> Vec<UdpFlows> {
        let mut keys = EndpointKeys::new();
        self.view
            .services()
            .filter(|service| self.plans_services() && wanted(service.namespace, service.name))
            .flat_map(|service| {
                service::plan_service(self.view, &service, &self.facts, &mut keys.lease(&[]))
                    .udp_flows
            })
            .collect()
    }

    /// Every address of this node's Node object, primary ones first: what [`Ruleset`]
    /// delivers here.
    /// Where `packet` goes through this node's whole planned ruleset: every service planned,
    /// then walked as the kernel would (`trace.rs`).
    pub fn trace(&self, packet: Packet) -> Trace {
        let skeleton = self.complete_skeleton();
        let plans: Vec<ServicePlan> = self.services(&mut EndpointKeys::new()).collect();
        let mut trace = Ruleset::new(&skeleton, &plans, self.node_addresses()).trace(packet);
        if self.facts.network_policy {
            trace.notes = policy::notes(self.view, &trace);
        }
        trace
    }

    pub fn node_addresses(&self) -> Vec<IpAddr> {
        let mut addresses = self.facts.node_port_ips.clone();
        if let Some(node) = self.view.this_node() {
            for address in node.addresses.iter().map(|a| a.address) {
                if !addresses.contains(&address) {
                    addresses.push(address);
                }
            }
        }
        addresses
    }

    /// Services in the view, programmed or not.
    pub fn service_count(&self) -> usize {
        self.view.services().count()
    }

    /// Whether the table carries Services at all ([`TableScope::EgressOnly`] does not).
    fn plans_services(&self) -> bool {
        self.facts.scope == TableScope::Services
    }
}
