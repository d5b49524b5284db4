//! NetworkPolicy in the applier: the policy sets' elements per pod of this node, in
//! transactions of their own, after the services'.
//!
//! The applier keeps what it committed per pod as the view resolved it ([`PodPolicy`],
//! compact), never the elements: a pod's old elements are planned again from it when
//! they must go. A full sync reads the policy sets back and sends what differs, in one
//! transaction; a partial one replaces the elements of the pods the view names. When the
//! kernel refuses a transaction, each pod is tried alone, and a pod refused alone fails
//! closed: it stays isolated and is allowed nothing but itself until its policies change
//! or the next full sync, and it is reported. A refusal never holds back the services or the other pods.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use nodus_view::View;
use nodus_view::model::Family;
use nodus_view::policy::resolve::{Direction, PodPolicy};
use tracing::{error, warn};

use super::{Error, Proxy, SyncReport};
use crate::nft::{self, Table};
use crate::plan::{PlanBatch, TABLE, policy};

/// A pod of this node whose allowances the kernel refused, or whose policies allow more
/// than the view keeps ([`nodus_view::policy::resolve::ALLOWANCES_MAX`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedPod {
    pub addresses: Vec<IpAddr>,
    /// The kernel's refusal.
    pub reason: String,
}

/// Packets dropped for one isolated pod address in one direction since its element was
/// added (it stays while the pod is isolated, through full syncs and restarts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denials {
    pub pod: IpAddr,
    pub direction: Direction,
    pub packets: u64,
}

/// What the policy sets hold, per pod of this node (by the view's key).
#[derive(Debug, Default)]
pub(super) struct PolicyRecords {
    committed: HashMap<u64, Box<[PodPolicy]>>,
    refused: BTreeMap<u64, RefusedPod>,
}

impl PolicyRecords {
    pub(super) fn refused(&self) -> impl Iterator<Item = &RefusedPod> {
        self.refused.values()
    }

    /// Pods with at least one isolated direction.
    pub(super) fn isolated_pods(&self) -> usize {
        self.committed.len()
    }

    fn committed(&self, pod: u64) -> &[PodPolicy] {
        self.committed.get(&pod).map_or(&[], |p| &p[..])
    }

    fn record(&mut self, pod: u64, policies: Vec<PodPolicy>) {
        if policies.is_empty() {
            self.committed.remove(&pod);
        } else {
            self.committed.insert(pod, policies.into_boxed_slice());
        }
    }

    /// `policies` of `pod` are in the kernel as the view resolved them: no longer refused
    /// by the kernel, and reported while they are over the view's cap.
    fn committed_in_full(&mut self, pod: u64, policies: Vec<PodPolicy>) {
        match over_cap(&policies) {
            Some(refused) => self.refused.insert(pod, refused),
            None => self.refused.remove(&pod),
        };
        self.record(pod, policies);
    }

    /// The sets hold `policies` (sorted by pod) and nothing else.
    fn refilled(policies: Vec<PodPolicy>) -> PolicyRecords {
        let mut records = PolicyRecords::default();
        for (pod, policies) in by_pod(policies) {
            records.committed_in_full(pod, policies);
        }
        records
    }
}

/// A pod whose policies allow more than the view keeps, as reported: it fails closed in
/// those directions (the view resolved nothing there).
fn over_cap(policies: &[PodPolicy]) -> Option<RefusedPod> {
    let directions: BTreeSet<Direction> = policies
        .iter()
        .flat_map(|p| p.over_cap.iter().copied())
        .collect();
    if directions.is_empty() {
        return None;
    }
    let named: Vec<&str> = directions.iter().map(|d| d.as_str()).collect();
    Some(RefusedPod {
        addresses: policies.iter().map(|p| p.ip).collect(),
        reason: format!(
            "its NetworkPolicies allow it more than {} peer and port ranges, or more than \
             {} kernel elements, in {}; it is allowed nothing there until they allow fewer",
            nodus_view::policy::resolve::ALLOWANCES_MAX,
            policy::ELEMENTS_MAX,
            named.join(" and ")
        ),
    })
}

/// The view's answer grouped by pod.
fn by_pod(policies: Vec<PodPolicy>) -> BTreeMap<u64, Vec<PodPolicy>> {
    let mut pods: BTreeMap<u64, Vec<PodPolicy>> = BTreeMap::new();
    for policy in policies {
        pods.entry(policy.pod).or_default().push(policy);
    }
    pods
}

/// `policies` failing closed: each governed direction allows nothing (but the pod
/// itself, which the planner always adds).
fn closed(policies: &[PodPolicy]) -> Vec<PodPolicy> {
    policies
        .iter()
        .map(|p| PodPolicy {
            ingress: p.ingress.as_ref().map(|_| Vec::new()),
            egress: p.egress.as_ref().map(|_| Vec::new()),
            ..p.clone()
        })
        .collect()
}

/// The kernel's refusal, told in full; `None` for other failures.
fn refusal(failure: &nft::Error) -> Option<String> {
    matches!(failure, nft::Error::Refused { .. }).then(|| failure.to_string())
}

impl Proxy {
    /// Brings every policy set to what the view resolves, at a full sync, in one
    /// transaction: the sets are read back, and only the elements the view no longer
    /// wants are deleted and those missing added ([`Proxy::set_difference`]). An adoption
    /// after a restart that finds them right sends none (refilling 10,000 took seconds),
    /// and the isolated sets' counters of the pods that stay keep counting.
    pub(super) fn program_policies(
        &mut self,
        view: &View,
        report: &mut SyncReport,
    ) -> Result<(), Error> {
        let wanted = policy::within_element_cap(view.pod_policies());
        let mut batch = PlanBatch::new();
        for set in policy::sets(&wanted) {
            match self.set_difference(&set)? {
                Some(difference) => batch.converge_set(&set.set, &difference),
                None => batch.refill_sets(std::slice::from_ref(&set)),
            }
        }
        let failure = match self.commit_policy(batch, report) {
            Ok(()) => {
                self.policy = PolicyRecords::refilled(wanted);
                return Ok(());
            }
            Err(failure) => failure,
        };
        let Some(message) = refusal(&failure) else {
            return Err(Error::netlink("filling the policy sets")(failure));
        };
        warn!(refused = %message, "policy sets refused as a whole; every isolated pod fails closed, then each is tried alone");
        let closed = closed(&wanted);
        let mut batch = PlanBatch::new();
        batch.refill_sets(&policy::sets(&closed));
        self.commit_policy(batch, report)
            .map_err(Error::netlink("closing the isolated pods"))?;
        self.policy = PolicyRecords::refilled(closed);
        self.update_pods_alone(by_pod(wanted), report)
    }

    /// Brings the pods `pods` names (by key) to what the view resolves for them now.
    pub(super) fn update_policies(
        &mut self,
        view: &View,
        pods: &BTreeSet<u64>,
        report: &mut SyncReport,
    ) -> Result<(), Error> {
        let mut wanted = by_pod(policy::within_element_cap(view.pod_policies_of(pods)));
        let mut changed: BTreeMap<u64, Vec<PodPolicy>> = BTreeMap::new();
        for pod in pods {
            let policies = wanted.remove(pod).unwrap_or_default();
            if self.policy.committed(*pod) != policies || self.policy.refused.contains_key(pod) {
                changed.insert(*pod, policies);
            }
        }
        if changed.is_empty() {
            return Ok(());
        }
        let mut batch = PlanBatch::new();
        for (pod, policies) in &changed {
            self.replace(&mut batch, *pod, policies);
        }
        match self.commit_policy(batch, report) {
            Ok(()) => {
                for (pod, policies) in changed {
                    self.policy.committed_in_full(pod, policies);
                }
                Ok(())
            }
            Err(failure) if refusal(&failure).is_some() => self.update_pods_alone(changed, report),
            Err(failure) => Err(Error::netlink("updating the policy sets")(failure)),
        }
    }

    /// Updates each pod of `pods` in a transaction of its own; a pod the kernel refuses
    /// fails closed and is reported.
    fn update_pods_alone(
        &mut self,
        pods: BTreeMap<u64, Vec<PodPolicy>>,
        report: &mut SyncReport,
    ) -> Result<(), Error> {
        for (pod, policies) in pods {
            let mut batch = PlanBatch::new();
            self.replace(&mut batch, pod, &policies);
            let failure = match self.commit_policy(batch, report) {
                Ok(()) => {
                    self.policy.committed_in_full(pod, policies);
                    continue;
                }
                Err(failure) => failure,
            };
            let Some(reason) = refusal(&failure) else {
                return Err(Error::netlink("updating a pod's policy elements")(failure));
            };
            let closed = closed(&policies);
            let mut batch = PlanBatch::new();
            self.replace(&mut batch, pod, &closed);
            self.commit_policy(batch, report)
                .map_err(Error::netlink("closing a pod the kernel refused"))?;
            let refused = RefusedPod {
                addresses: policies.iter().map(|p| p.ip).collect(),
                reason,
            };
            error!(pod = ?refused.addresses, refused = %refused.reason,
                   "the kernel refused what policies allow this pod; it stays isolated");
            report.policy_refused.push(refused.clone());
            self.policy.refused.insert(pod, refused);
            self.policy.record(pod, closed);
        }
        Ok(())
    }

    /// Adds to `batch` what turns the committed elements of `pod` into those of
    /// `policies`.
    fn replace(&self, batch: &mut PlanBatch, pod: u64, policies: &[PodPolicy]) {
        batch.update_set_elements(
            &policy::sets(self.policy.committed(pod)),
            &policy::sets(policies),
        );
    }

    /// What the isolated sets' counters hold.
    pub fn policy_denials(&mut self) -> Result<Vec<Denials>, Error> {
        let table = Table::inet(TABLE);
        let mut denials = Vec::new();
        for direction in Direction::ALL {
            for family in Family::ALL {
                let set = policy::isolated_set(direction, family);
                let elements = self
                    .socket
                    .list_elements(&table, &set)
                    .map_err(Error::netlink(format!("reading the counters of {set}")))?;
                for element in elements {
                    let pod = match element.key.len() {
                        4 => <[u8; 4]>::try_from(&element.key[..]).map(IpAddr::from),
                        _ => <[u8; 16]>::try_from(&element.key[..]).map(IpAddr::from),
                    };
                    if let (Ok(pod), Some(packets)) = (pod, element.packets) {
                        denials.push(Denials {
                            pod,
                            direction,
                            packets,
                        });
                    }
                }
            }
        }
        Ok(denials)
    }

    fn commit_policy(
        &mut self,
        batch: PlanBatch,
        report: &mut SyncReport,
    ) -> Result<(), nft::Error> {
        if batch.is_empty() {
            return Ok(());
        }
        self.commit(&batch.into_batch(), report)
    }
}
