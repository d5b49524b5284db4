//! The policy part of the view: every Pod (as [`PolicyPod`]), every Namespace's labels
//! and every NetworkPolicy, each keyed by a hash of its namespace and name.
//!
//! Of other nodes' pods, only the labels some policy selects peers by are kept. A policy
//! that selects by a key not kept so far matches no other node's pod by it (fails
//! closed) until the pods are listed again (`peer_keys` grows).
//!
//! Every change names the pods of this node whose verdicts it may change (`dirty`), so
//! that only those are resolved again: a policy, the pods it selects; a pod, itself and
//! the pods the policies it is a peer of select; a namespace, the pods the policies that
//! select it by labels select. Finding them costs a pass over the policies, not the pods.

use super::{LabelSet, NetworkPolicy, PolicyPod, Selector, release_labels};
use crate::intern::{Interner, Sym};
use std::collections::{BTreeSet, HashMap, HashSet};

/// The keys of `map` a relist did not deliver (the view's pod index uses it too).
pub(crate) fn unseen<T>(map: &HashMap<u64, T>, seen: &HashSet<u64>) -> Vec<u64> {
    map.keys()
        .filter(|key| !seen.contains(key))
        .copied()
        .collect()
}

/// Keys of this node's pods whose verdicts may have changed.
pub type Dirty = BTreeSet<u64>;

#[derive(Default)]
pub(crate) struct PolicyState {
    pub(super) pods: HashMap<u64, PolicyPod>,
    /// The keys of this node's pods that have an address: those policies may select.
    pub(super) local: BTreeSet<u64>,
    /// Labels by namespace name (the map holds one reference on the name).
    pub(super) namespaces: HashMap<Sym, LabelSet>,
    pub(super) policies: HashMap<u64, NetworkPolicy>,
    /// The label keys some policy selects peer pods by: of other nodes' pods, only these
    /// labels are kept. The set never shrinks, so that a key used again needs no new list
    /// of the pods; it holds one reference on each key.
    pub(crate) peer_keys: HashSet<Sym>,
    /// Keys of `peer_keys` that other nodes' pods stored before the key was tracked lack:
    /// until a list of the pods delivers them, a selector that reads one matches no pod
    /// of another node.
    unlisted_keys: HashSet<Sym>,
    /// The unlisted keys the list of pods under way delivers.
    listing_keys: HashSet<Sym>,
}

impl PolicyState {
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        (self.pods.len(), self.namespaces.len(), self.policies.len())
    }

    /// Each pod's namespace and how many labels it keeps, sorted.
    #[cfg(test)]
    pub(crate) fn pod_labels(&self, strings: &Interner) -> Vec<(String, usize)> {
        let pods = self.pods.values();
        let mut labelled: Vec<(String, usize)> = pods
            .map(|pod| (strings.resolve(pod.namespace).into(), pod.labels.len()))
            .collect();
        labelled.sort();
        labelled
    }

    /// Whether other nodes' pods carry every label `selector` reads, as far as it matters.
    pub(super) fn all_listed(&self, selector: &Selector) -> bool {
        self.unlisted_keys.is_empty() || selector.keys().all(|k| !self.unlisted_keys.contains(&k))
    }

    /// A list of every pod begins: it delivers the labels of every key tracked now.
    pub(crate) fn pods_listing(&mut self) {
        self.listing_keys.clone_from(&self.unlisted_keys);
    }

    /// That list is complete: the pods selected by the policies that read its keys may
    /// have more peers now.
    pub(crate) fn pods_listed(&mut self, dirty: &mut Dirty) {
        let listed = std::mem::take(&mut self.listing_keys);
        if listed.is_empty() {
            return;
        }
        self.unlisted_keys.retain(|key| !listed.contains(key));
        for policy in self.policies.values() {
            if policy.peer_label_keys().any(|key| listed.contains(&key)) {
                self.dirty_selected(policy, dirty);
            }
        }
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
        pod: PolicyPod,
        strings: &mut Interner,
        dirty: &mut Dirty,
    ) {
        if self.pods.get(&key) == Some(&pod) {
            pod.release(strings);
            return;
        }
        self.pod_changes(key, self.pods.get(&key), Some(&pod), dirty);
        match pod.local && !pod.ips.is_empty() {
            true => self.local.insert(key),
            false => self.local.remove(&key),
        };
        if let Some(old) = self.pods.insert(key, pod) {
            old.release(strings);
        }
    }

    pub(crate) fn remove_pod(&mut self, key: u64, strings: &mut Interner, dirty: &mut Dirty) {
        if let Some(old) = self.pods.remove(&key) {
            self.pod_changes(key, Some(&old), None, dirty);
            self.local.remove(&key);
            old.release(strings);
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
        for label in policy.peer_label_keys() {
            if self.peer_keys.insert(label) {
                strings.retain(label);
                self.unlisted_keys.insert(label);
            }
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

    /// Marks what a change of a namespace's labels from `old` to `new` may change.
    fn namespace_changes(&self, old: &[(Sym, Sym)], new: &[(Sym, Sym)], dirty: &mut Dirty) {
        for policy in self.policies.values() {
            if policy.selects_namespace(old) || policy.selects_namespace(new) {
                self.dirty_selected(policy, dirty);
            }
        }
    }

    pub(crate) fn put_namespace(
        &mut self,
        name: &str,
        labels: LabelSet,
        strings: &mut Interner,
        dirty: &mut Dirty,
    ) {
        let current = strings.lookup(name).and_then(|n| self.namespaces.get(&n));
        if current == Some(&labels) {
            release_labels(&labels, strings);
            return;
        }
        self.namespace_changes(current.map_or(&[], |l| &l[..]), &labels, dirty);
        let name = strings.intern(name);
        if let Some(old) = self.namespaces.insert(name, labels) {
            release_labels(&old, strings);
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
        self.namespace_changes(&old, &[], dirty);
        release_labels(&old, strings);
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
