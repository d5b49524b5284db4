//! The policy part of the view: every Pod (as [`PolicyPod`]), every Namespace's labels
//! and every NetworkPolicy, each keyed by a hash of its namespace and name.
//!
//! Every change names the pods of this node whose verdicts it may change (`dirty`), so
//! that only those are resolved again: a policy, the pods it selects; a pod, itself and
//! the pods the policies it is a peer of select; a namespace, the pods the policies that
//! select it by labels select. Finding them costs a pass over the policies, not the pods.

use super::{LabelSet, NetworkPolicy, PolicyPod, SharedLabels, release_labels};
use crate::intern::{Interner, Sym};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

/// The keys of `map` a relist did not deliver (the view's pod index uses it too).
pub(crate) fn unseen<T>(map: &HashMap<u64, T>, seen: &HashSet<u64>) -> Vec<u64> {
    map.keys()
        .filter(|key| !seen.contains(key))
        .copied()
        .collect()
}

/// Keys of this node's pods whose verdicts may have changed.
pub type Dirty = BTreeSet<u64>;

/// Each distinct set of pod labels, stored once and shared by the pods that have it; a
/// set holds one reference on each of its strings, and goes with its last pod.
#[derive(Default)]
pub(crate) struct LabelSets(HashSet<SharedLabels>);

impl LabelSets {
    /// `labels` (just decoded, holding their own references), as the set stored.
    fn share(&mut self, labels: SharedLabels, strings: &mut Interner) -> SharedLabels {
        if let Some(stored) = self.0.get(&labels[..]) {
            release_labels(&labels, strings);
            return stored.clone();
        }
        self.0.insert(labels.clone());
        labels
    }

    /// A pod gives its set back; the last one frees it.
    fn give_back(&mut self, labels: SharedLabels, strings: &mut Interner) {
        // This pod's and the table's are the last two references.
        if Arc::strong_count(&labels) == 2 {
            self.0.remove(&labels[..]);
            release_labels(&labels, strings);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

#[derive(Default)]
pub(crate) struct PolicyState {
    pub(super) pods: HashMap<u64, PolicyPod>,
    /// The keys of this node's pods that have an address: those policies may select.
    pub(super) local: BTreeSet<u64>,
    /// Labels by namespace name (the map holds one reference on the name); `None` for a
    /// namespace with more labels than nodus keeps, which only the empty selector matches.
    pub(super) namespaces: HashMap<Sym, Option<LabelSet>>,
    pub(super) policies: HashMap<u64, NetworkPolicy>,
    pub(crate) label_sets: LabelSets,
    /// The addresses nodus-cni gave pods of this node whose status does not report them
    /// yet, by pod key: policies see a pod at these too, so that it is isolated before
    /// its containers start.
    pub(crate) sandboxes: HashMap<u64, Box<[IpAddr]>>,
}

/// Why addresses nodus-cni reports for a pod cannot be taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The watch has not delivered the pod yet: worth asking again.
    #[error("the pod is not known (yet) to this node's agent")]
    Unknown,
    #[error("the pod is not scheduled to this node")]
    OtherNode,
}

impl PolicyState {
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        (self.pods.len(), self.namespaces.len(), self.policies.len())
    }

    /// Whether the Namespace `name` exists (NetworkPolicy on: every Namespace is watched).
    pub(crate) fn knows_namespace(&self, name: Sym) -> bool {
        self.namespaces.contains_key(&name)
    }

    /// Pods and namespaces with more labels than nodus keeps: they fail closed.
    pub(crate) fn over_label_cap(&self) -> usize {
        let pods = self.pods.values().filter(|pod| pod.labels.is_none());
        pods.count() + self.namespaces.values().filter(|l| l.is_none()).count()
    }

    /// Each pod's namespace and how many labels it keeps, sorted.
    #[cfg(test)]
    pub(crate) fn pod_labels(&self, strings: &Interner) -> Vec<(String, usize)> {
        let pods = self.pods.values();
        let mut labelled: Vec<(String, usize)> = pods
            .map(|pod| {
                let count = pod.labels.as_ref().map_or(0, |l| l.len());
                (strings.resolve(pod.namespace).into(), count)
            })
            .collect();
        labelled.sort();
        labelled
    }

    /// Marks the pods of this node `policy` selects.
    fn dirty_selected(&self, policy: &NetworkPolicy, dirty: &mut Dirty) {
        for key in &self.local {
            if self.pods.get(key).is_some_and(|pod| policy.selects(pod)) {
                dirty.insert(*key);
            }
        }
    }

    /// Marks what a change of the pod `key` from `old` to `new` may change.
    fn pod_changes(
        &self,
        key: u64,
        old: Option<&PolicyPod>,
        new: Option<&PolicyPod>,
        dirty: &mut Dirty,
    ) {
        let versions = || old.into_iter().chain(new);
        // Pods of this node at one of its addresses: which of them lists a shared address
        // may change.
        if versions().any(|v| v.local) {
            for other in &self.local {
                let sharing = self.pods.get(other).is_some_and(|pod| {
                    versions().any(|v| v.ips.iter().any(|ip| pod.ips.contains(ip)))
                });
                if sharing {
                    dirty.insert(*other);
                }
            }
        }
        for policy in self.policies.values() {
            if versions().any(|pod| policy.selects(pod)) {
                dirty.insert(key);
            }
            if versions().any(|pod| policy.depends_on(pod, self.namespace_labels(pod.namespace))) {
                self.dirty_selected(policy, dirty);
            }
        }
    }

    /// Stores `pod` under `key`, marking what that changes.
    pub(crate) fn put_pod(
        &mut self,
        key: u64,
        mut pod: PolicyPod,
        strings: &mut Interner,
        dirty: &mut Dirty,
    ) {
        pod.labels = pod.labels.map(|l| self.label_sets.share(l, strings));
        if self.pods.get(&key) == Some(&pod) {
            self.release_pod(pod, strings);
            return;
        }
        self.pod_changes(key, self.pods.get(&key), Some(&pod), dirty);
        if pod.local && !pod.ips.is_empty() {
            self.local.insert(key);
        } else {
            self.local.remove(&key);
        }
        if let Some(old) = self.pods.insert(key, pod) {
            self.release_pod(old, strings);
        }
    }

    fn release_pod(&mut self, pod: PolicyPod, strings: &mut Interner) {
        pod.release_but_labels(strings);
        if let Some(labels) = pod.labels {
            self.label_sets.give_back(labels, strings);
        }
    }

    /// A pod's addresses as policies see them: those its status reports and those
    /// nodus-cni gave it that the status does not report yet (a new sandbox's), sorted.
    pub(crate) fn addresses_with_sandbox(&self, key: u64, reported: &[IpAddr]) -> Box<[IpAddr]> {
        let mut ips = reported.to_vec();
        let sandbox = self.sandboxes.get(&key).into_iter().flatten();
        ips.extend(sandbox.filter(|ip| !reported.contains(ip)));
        ips.sort_unstable();
        ips.into()
    }

    /// nodus-cni gave the pod `key` of this node `ips`: it is seen at them (too) until its
    /// status reports them, marking what that changes.
    pub(crate) fn claim_sandbox(
        &mut self,
        key: u64,
        ips: &[IpAddr],
        dirty: &mut Dirty,
    ) -> Result<(), ClaimError> {
        let pod = self.pods.get(&key).ok_or(ClaimError::Unknown)?;
        if !pod.local {
            return Err(ClaimError::OtherNode);
        }
        if ips.iter().all(|ip| pod.ips.contains(ip)) {
            return Ok(());
        }
        self.sandboxes.insert(key, ips.into());
        let mut claimed = pod.clone();
        claimed.ips = self.addresses_with_sandbox(key, &pod.ips);
        self.pod_changes(key, Some(pod), Some(&claimed), dirty);
        self.local.insert(key);
        if let Some(stored) = self.pods.get_mut(&key) {
            stored.ips = claimed.ips;
        }
        Ok(())
    }

    pub(crate) fn remove_pod(&mut self, key: u64, strings: &mut Interner, dirty: &mut Dirty) {
        self.sandboxes.remove(&key);
        if let Some(old) = self.pods.remove(&key) {
            self.pod_changes(key, Some(&old), None, dirty);
            self.local.remove(&key);
            self.release_pod(old, strings);
        }
    }

    pub(crate) fn put_policy(
        &mut self,
        key: u64,
        policy: NetworkPolicy,
        strings: &mut Interner,
        dirty: &mut Dirty,
    ) {
        if self.policies.get(&key) == Some(&policy) {
            policy.release(strings);
            return;
        }
        self.dirty_selected(&policy, dirty);
        if let Some(old) = self.policies.insert(key, policy) {
            self.dirty_selected(&old, dirty);
            old.release(strings);
        }
    }

    pub(crate) fn remove_policy(&mut self, key: u64, strings: &mut Interner, dirty: &mut Dirty) {
        if let Some(old) = self.policies.remove(&key) {
            self.dirty_selected(&old, dirty);
            old.release(strings);
        }
    }

    /// Marks what a change of a namespace's labels from `old` to `new` may change (labels
    /// not known are taken as none: every selector that matches them matches none too).
    fn namespace_changes(
        &self,
        old: Option<&[(Sym, Sym)]>,
        new: Option<&[(Sym, Sym)]>,
        dirty: &mut Dirty,
    ) {
        let (old, new) = (old.unwrap_or_default(), new.unwrap_or_default());
        for policy in self.policies.values() {
            if policy.selects_namespace(old) || policy.selects_namespace(new) {
                self.dirty_selected(policy, dirty);
            }
        }
    }

    /// Stores a namespace's labels; `None` when it has more than nodus keeps.
    pub(crate) fn put_namespace(
        &mut self,
        name: &str,
        labels: Option<LabelSet>,
        strings: &mut Interner,
        dirty: &mut Dirty,
    ) {
        let current = strings.lookup(name).and_then(|n| self.namespaces.get(&n));
        if current == Some(&labels) {
            release_labels(labels.as_deref().unwrap_or_default(), strings);
            return;
        }
        let old = current.map(|l| l.as_deref().unwrap_or_default());
        self.namespace_changes(old, labels.as_deref(), dirty);
        let name = strings.intern(name);
        if let Some(old) = self.namespaces.insert(name, labels) {
            release_labels(old.as_deref().unwrap_or_default(), strings);
            strings.release(name);
        }
    }

    pub(crate) fn remove_namespace(
        &mut self,
        name: &str,
        strings: &mut Interner,
        dirty: &mut Dirty,
    ) {
        let Some(sym) = strings.lookup(name) else {
            return;
        };
        let Some(old) = self.namespaces.remove(&sym) else {
            return;
        };
        self.namespace_changes(old.as_deref(), None, dirty);
        release_labels(old.as_deref().unwrap_or_default(), strings);
        strings.release(sym);
    }

    /// Removes the pods (and below, the policies) a relist did not deliver.
    pub(crate) fn retain_pods(
        &mut self,
        seen: &HashSet<u64>,
        strings: &mut Interner,
        dirty: &mut Dirty,
    ) {
        for key in unseen(&self.pods, seen) {
            self.remove_pod(key, strings, dirty);
        }
    }

    pub(crate) fn retain_policies(
        &mut self,
        seen: &HashSet<u64>,
        strings: &mut Interner,
        dirty: &mut Dirty,
    ) {
        for key in unseen(&self.policies, seen) {
            self.remove_policy(key, strings, dirty);
        }
    }

    /// Removes the namespaces whose names `keep` refuses.
    pub(crate) fn retain_namespaces(
        &mut self,
        keep: impl Fn(&str) -> bool,
        strings: &mut Interner,
        dirty: &mut Dirty,
    ) {
        let stale: Vec<String> = self
            .namespaces
            .keys()
            .map(|sym| strings.resolve(*sym))
            .filter(|name| !keep(name))
            .map(str::to_string)
            .collect();
        for name in &stale {
            self.remove_namespace(name, strings, dirty);
        }
    }
}
