//! The policy part of the view: every Pod (as [`PolicyPod`]), every Namespace's labels
//! and every NetworkPolicy, each keyed by a hash of its namespace and name.

use super::{LabelSet, NetworkPolicy, PolicyPod, release_labels};
use crate::intern::{Interner, Sym};
use std::collections::{HashMap, HashSet};

#[derive(Default)]
pub(crate) struct PolicyState {
    pub(super) pods: HashMap<u64, PolicyPod>,
    /// Labels by namespace name (the map holds one reference on the name).
    pub(super) namespaces: HashMap<Sym, LabelSet>,
    pub(super) policies: HashMap<u64, NetworkPolicy>,
}

impl PolicyState {
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        (self.pods.len(), self.namespaces.len(), self.policies.len())
    }

    /// Whether a change of pods or namespaces can change what is allowed: not while no
    /// policy exists (a policy that comes resolves against them as they are then).
    pub(crate) fn governs(&self) -> bool {
        !self.policies.is_empty()
    }

    /// Stores `pod` under `key`; whether that changed anything.
    pub(crate) fn put_pod(&mut self, key: u64, pod: PolicyPod, strings: &mut Interner) -> bool {
        put(&mut self.pods, key, pod, strings)
    }

    pub(crate) fn remove_pod(&mut self, key: u64, strings: &mut Interner) -> bool {
        remove(&mut self.pods, key, strings)
    }

    pub(crate) fn put_policy(
        &mut self,
        key: u64,
        policy: NetworkPolicy,
        strings: &mut Interner,
    ) -> bool {
        put(&mut self.policies, key, policy, strings)
    }

    pub(crate) fn remove_policy(&mut self, key: u64, strings: &mut Interner) -> bool {
        remove(&mut self.policies, key, strings)
    }

    pub(crate) fn put_namespace(
        &mut self,
        name: &str,
        labels: LabelSet,
        strings: &mut Interner,
    ) -> bool {
        if let Some(current) = strings.lookup(name).and_then(|n| self.namespaces.get(&n))
            && *current == labels
        {
            release_labels(&labels, strings);
            return false;
        }
        let name = strings.intern(name);
        if let Some(old) = self.namespaces.insert(name, labels) {
            release_labels(&old, strings);
            strings.release(name);
        }
        true
    }

    pub(crate) fn remove_namespace(&mut self, name: &str, strings: &mut Interner) -> bool {
        let Some(sym) = strings.lookup(name) else {
            return false;
        };
        let Some(old) = self.namespaces.remove(&sym) else {
            return false;
        };
        release_labels(&old, strings);
        strings.release(sym);
        true
    }

    /// Removes the pods (and below, the policies) a relist did not deliver; whether there
    /// was one.
    pub(crate) fn retain_pods(&mut self, seen: &HashSet<u64>, strings: &mut Interner) -> bool {
        retain(&mut self.pods, seen, strings)
    }

    pub(crate) fn retain_policies(&mut self, seen: &HashSet<u64>, strings: &mut Interner) -> bool {
        retain(&mut self.policies, seen, strings)
    }

    /// Removes the namespaces whose names `keep` refuses; whether there was one.
    pub(crate) fn retain_namespaces(
        &mut self,
        keep: impl Fn(&str) -> bool,
        strings: &mut Interner,
    ) -> bool {
        let stale: Vec<String> = self
            .namespaces
            .keys()
            .map(|sym| strings.resolve(*sym))
            .filter(|name| !keep(name))
            .map(str::to_string)
            .collect();
        for name in &stale {
            self.remove_namespace(name, strings);
        }
        !stale.is_empty()
    }
}

/// What the maps hold: each value holds references on interned strings.
pub(crate) trait Holds: PartialEq {
    fn release(&self, strings: &mut Interner);
}

impl Holds for PolicyPod {
    fn release(&self, strings: &mut Interner) {
        PolicyPod::release(self, strings);
    }
}

impl Holds for NetworkPolicy {
    fn release(&self, strings: &mut Interner) {
        NetworkPolicy::release(self, strings);
    }
}

/// Stores `value` under `key`; whether that changed anything.
fn put<T: Holds>(map: &mut HashMap<u64, T>, key: u64, value: T, strings: &mut Interner) -> bool {
    if map.get(&key) == Some(&value) {
        value.release(strings);
        return false;
    }
    if let Some(old) = map.insert(key, value) {
        old.release(strings);
    }
    true
}

/// Whether there was a value to remove.
fn remove<T: Holds>(map: &mut HashMap<u64, T>, key: u64, strings: &mut Interner) -> bool {
    map.remove(&key).map(|old| old.release(strings)).is_some()
}

fn retain<T: Holds>(
    map: &mut HashMap<u64, T>,
    seen: &HashSet<u64>,
    strings: &mut Interner,
) -> bool {
    let stale: Vec<u64> = map.keys().filter(|k| !seen.contains(k)).copied().collect();
    for key in &stale {
        remove(map, *key, strings);
    }
    !stale.is_empty()
}
